"""Simulated company REST service (CRM and ticketing) for the ``http`` tool, and its request checks."""

from simulators.http.request import METHODS, HTTPCall, RequestError, check_call
from simulators.http.service import CompanyAPI

__all__ = ["METHODS", "CompanyAPI", "HTTPCall", "RequestError", "check_call"]
