"""Command-line parsing shared by ``agentrl-envs`` and ``agentrl-train``: a misspelt flag gets "did you mean".

argparse answers ``agentrl-train ppo --lrr 0.1`` with ``unrecognized arguments: --lrr 0.1`` and no
hint, while the same typo in a ``--config`` file names ``lr``. :func:`parse_args` parses as
``parser.parse_args`` does and, for an unknown ``--flag``, names the closest flag of the command it
was given to.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

__all__ = ["parse_args"]

#: How much of an unknown argument the message shows (argparse showed all of it, a megabyte included).
_SHOWN = 60


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, with "did you mean --X?" for an unknown flag; exits 2 on an error as argparse does."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = _command_parser(parser, args)
        shown = " ".join(_cut(a) for a in extras[:5]) + (" ..." if len(extras) > 5 else "")
        hint = _suggestion(command, extras)
        command.error(f"unrecognized arguments: {shown}{hint}")
    return args


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command ``args`` was parsed for: its flags are the ones to suggest."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None) if action.dest != argparse.SUPPRESS else None
            if isinstance(chosen, str) and chosen in action.choices:
                return _command_parser(action.choices[chosen], args)
    return parser


def _suggestion(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """``; did you mean --lr?`` (one unknown flag), ``; did you mean --lr (for --lrr), --seed (for --sed)?``, or ''."""
    flags = [f for f in parser._option_string_actions if f.startswith("--")]
    found: dict[str, str] = {}
    for arg in extras:
        typed = arg.partition("=")[0]
        # a flag is --word; "--" ends options, and a megabyte-long "flag" is no typo
        if not typed.startswith("--") or not typed[2:3].isalnum() or len(typed) > 100 or typed in found:
            continue
        near = difflib.get_close_matches(typed, flags, n=1, cutoff=0.6)
        if near:
            found[typed] = near[0]
    if len(found) == 1:
        return f"; did you mean {next(iter(found.values()))}?"
    if found:
        return "; did you mean " + ", ".join(f"{flag} (for {typed})" for typed, flag in list(found.items())[:5]) + "?"
    return ""


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."
