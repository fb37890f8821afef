"""Fault injection: error profiles, the fault-injecting backend wrapper, and fitting profiles to logs."""

from agentrl_envs.faults.profile import (
    DEFAULT_PENALTIES,
    FAULT_STATUS,
    FAULT_TYPES,
    ErrorProfile,
    ProfileError,
    load_profile,
    parse_profile,
)

__all__ = [
    "DEFAULT_PENALTIES",
    "FAULT_STATUS",
    "FAULT_TYPES",
    "ErrorProfile",
    "ProfileError",
    "load_profile",
    "parse_profile",
]
