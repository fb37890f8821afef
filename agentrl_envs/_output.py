"""Output files of the command line (``fit-profile -o``, ``export-sft -o``): checked before the work, written whole.

:func:`check_output` refuses, before a command spends minutes on its work, a path it could not
write in the end: a directory, a symbolic link, a missing or unwritable folder, a name the file
system refuses, or an existing file without ``--force``. :func:`write_atomically` writes through a
fresh temporary file in the same folder and renames it over the output, so a failed write (a full
disk, a killed process) leaves the old file or none, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from agentrl_envs.errors import ConfigError

__all__ = ["check_output", "write_atomically"]


def check_output(text: str, *, force: bool, flag: str = "-o", example: str = "out.yaml") -> Path:
    """The path of an output file the command can write; a :class:`ConfigError` naming ``flag`` otherwise.

    Nothing is left behind: the folder is tested with a temporary file that is removed at once.
    """
    shown = f"{flag} {text[:200]!r}"
    output = Path(text)
    if not text.strip() or "\x00" in text:
        raise ConfigError(f"{shown}: give a file name such as {example}")
    try:
        if output.is_symlink():
            raise ConfigError(f"{shown} is a symbolic link; give the path of a regular file (it is not followed)")
        if output.is_dir():
            raise ConfigError(f"{shown} is a directory; give a file name such as {example}")
        if output.exists() and not force:
            raise ConfigError(f"{shown} exists; pass --force to overwrite it")
        if not output.parent.is_dir():
            raise ConfigError(f"{shown}: directory {str(output.parent)[:200]!r} does not exist; create it first")
        fd, probe = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    except OSError as exc:
        raise ConfigError(f"{shown} cannot be written: {_reason(exc)}") from None
    os.close(fd)
    os.unlink(probe)
    return output


def write_atomically(output: Path, write: Callable[[str], None], *, flag: str = "-o") -> None:
    """Call ``write(temporary path)`` and rename that file over ``output``; on failure remove it.

    The temporary name is unpredictable and created with O_CREAT | O_EXCL | O_NOFOLLOW
    (``tempfile.mkstemp``), so a file or symbolic link planted where it would go is never opened,
    and the rename replaces ``output`` itself: a link planted there after the check is replaced,
    not followed.

    Raises:
        ConfigError: the file could not be written (its folder went away, the disk is full, ...).
    """
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    except OSError as exc:
        raise ConfigError(f"{flag} {str(output)[:200]!r} cannot be written: {_reason(exc)}") from None
    try:
        os.close(fd)
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, output)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ConfigError(f"{flag} {str(output)[:200]!r} could not be written: {_reason(exc)} (nothing was written)") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)[:200] or type(exc).__name__
