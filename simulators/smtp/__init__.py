"""Simulated mail service: strict validation and a record of deliveries."""

from simulators.smtp.mailbox import Delivery, Mailbox, SMTPError, check_wire, validate_address

__all__ = ["Delivery", "Mailbox", "SMTPError", "check_wire", "validate_address"]
