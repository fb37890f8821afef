"""Fault profiles shipped with agentrl (YAML, one profile per file)."""

from __future__ import annotations

from importlib import resources

__all__ = ["available", "read_text"]


def available() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir() if p.name.endswith(".yaml"))


def read_text(name: str) -> str:
    return (resources.files(__name__) / f"{name}.yaml").read_text(encoding="utf-8")
