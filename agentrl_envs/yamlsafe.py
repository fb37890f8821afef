"""The one loader for YAML a user hands the project: ``--config``, a run folder's ``config.yaml``,
``--plan`` stage plans, error-profile files.

``yaml.safe_load`` builds no objects but plain ones, yet it is not safe against a small hostile
file: aliases share one object, so 326 bytes of nested anchors (the "billion laughs") load at once
into a value whose ``repr``, ``json.dumps`` or validation walks 10**9 nodes, as an error message
quoting the value would. :func:`load_yaml` therefore refuses, while composing and before any value
is built:

- a text over ``max_bytes`` (default :data:`MAX_YAML_BYTES`, 1 MiB; configs and plans are a few KB);
- more than :data:`MAX_YAML_ALIASES` aliases, or an alias of an anchor still being composed (a
  recursive document);
- a document whose size with every alias expanded (a node counts 1, a scalar its characters too)
  exceeds :data:`MAX_YAML_EXPANDED`: the value never becomes larger than a plain file of that size;
- nesting deeper than :data:`MAX_YAML_DEPTH` (the composer recurses).

Each refusal is a :class:`~agentrl_envs.errors.ConfigError` that names the source and the limit.
:func:`read_yaml_file` reads a file for it: regular files only (a FIFO would block the reader
forever), checked on the opened descriptor, and never more than ``max_bytes`` + 1 bytes.
:func:`short_repr` is the bounded ``repr`` for error messages about values that came from such a file.
"""

from __future__ import annotations

import os
import reprlib
import stat
from pathlib import Path
from typing import Any

import yaml

from agentrl_envs.errors import ConfigError

__all__ = [
    "MAX_YAML_ALIASES",
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_EXPANDED",
    "load_yaml",
    "read_yaml_file",
    "short_repr",
]

MAX_YAML_BYTES = 1 << 20
#: Aliases per document; hand-written files use a few (``<<: *defaults``).
MAX_YAML_ALIASES = 1000
#: The document's size with aliases expanded: nodes plus scalar characters (a plain file's is below its byte size).
MAX_YAML_EXPANDED = 2 << 20
#: Nested collections; a config nests three levels.
MAX_YAML_DEPTH = 64


class _CappedLoader(yaml.SafeLoader):
    """SafeLoader that weighs every composed node (aliases expanded) and refuses past the caps."""

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self.source = source
        self.aliases = 0
        self.depth = 0
        # id(node) -> (node, expanded weight); the node is held so that its id is never reused
        self.weights: dict[int, tuple[yaml.Node, int]] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                raise ConfigError(f"{self.source}: more than {MAX_YAML_ALIASES} YAML aliases (*name); write the values out")
            target = self.anchors.get(anchor)
            if target is not None and id(target) not in self.weights:
                raise ConfigError(f"{self.source}: the YAML alias *{str(anchor)[:40]} refers to itself; write the value out")
        self.depth += 1
        if self.depth > MAX_YAML_DEPTH:
            raise ConfigError(f"{self.source}: YAML nested too deeply (over {MAX_YAML_DEPTH} levels; a config nests a few)")
        node = super().compose_node(parent, index)
        self.depth -= 1
        assert node is not None  # None only at the end of the stream, which compose_document checks first
        if id(node) not in self.weights:
            self.weights[id(node)] = (node, self._weigh(node))
        if self.weights[id(node)][1] > MAX_YAML_EXPANDED:
            raise ConfigError(
                f"{self.source}: the YAML expands (aliases resolved) past {MAX_YAML_EXPANDED:,} nodes and characters; "
                "it is an alias bomb or far larger than a config"
            )
        return node

    def _weigh(self, node: yaml.Node) -> int:
        if isinstance(node, yaml.ScalarNode):
            return 1 + len(node.value)
        if isinstance(node, yaml.SequenceNode):
            return 1 + sum(self.weights[id(child)][1] for child in node.value)
        assert isinstance(node, yaml.MappingNode)
        return 1 + sum(self.weights[id(key)][1] + self.weights[id(value)][1] for key, value in node.value)


def load_yaml(text: str | bytes, source: str, *, max_bytes: int = MAX_YAML_BYTES) -> Any:
    """The value of one YAML document, built only after the caps above are checked.

    Args:
        text: the document (bytes are decoded as UTF-8).
        source: names the file or option in every message (``--config run.yaml``).
        max_bytes: the size cap.

    Raises:
        ConfigError: over a cap, not UTF-8, or not valid YAML (the first line of PyYAML's message).
    """
    if len(text) > max_bytes or (isinstance(text, str) and len(text.encode("utf-8", "surrogatepass")) > max_bytes):
        raise ConfigError(f"{source}: larger than {_size(max_bytes)}; a config, plan or profile is a small YAML file")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{source}: not valid YAML (not UTF-8 text at byte {exc.start}; save it as UTF-8)") from None
    loader = _CappedLoader(text, source)
    try:
        return loader.get_single_data()
    except ConfigError:
        raise
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{source}: not valid YAML ({first[:200]})") from None
    except RecursionError:  # a cap above should fire first; this keeps the promise if the stack is already deep
        raise ConfigError(f"{source}: YAML nested too deeply") from None
    except (ValueError, OverflowError) as exc:  # a scalar PyYAML's constructors refuse (an int of 5,000 digits)
        raise ConfigError(f"{source}: a YAML value cannot be read ({str(exc)[:200]})") from None
    finally:
        loader.dispose()


def read_yaml_file(path: str | os.PathLike[str], source: str, *, max_bytes: int = MAX_YAML_BYTES) -> Any:
    """:func:`load_yaml` of the file at ``path``: a regular file of at most ``max_bytes``.

    Raises:
        FileNotFoundError, IsADirectoryError: as ``open`` (callers word these themselves).
        ConfigError: not a regular file (a FIFO, a device), too large, unreadable, or refused by :func:`load_yaml`.
    """
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of blocking; the fstat then refuses it.
    fd = os.open(Path(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{source}: not a regular file (a pipe or a device); point at a YAML file")
        if info.st_size > max_bytes:
            raise ConfigError(f"{source}: larger than {_size(max_bytes)}; a config, plan or profile is a small YAML file")
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            data = f.read(max_bytes + 1)  # the file may grow after the fstat
    except OSError as exc:
        if isinstance(exc, (FileNotFoundError, IsADirectoryError)):
            raise
        raise ConfigError(f"{source}: cannot read it ({exc.strerror or exc})") from None
    finally:
        if fd >= 0:
            os.close(fd)
    return load_yaml(data, source, max_bytes=max_bytes)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n and n % (1 << 20) == 0 else f"{n:,} bytes"


_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = 80
_REPR.maxother = 80
_REPR.maxlong = 40


def short_repr(value: Any, limit: int = 100) -> str:
    """``repr(value)`` cut to about ``limit`` characters, at a cost bounded whatever ``value`` holds."""
    try:
        text = _REPR.repr(value)
    except ValueError:  # an int past Python's 4,300-digit str() limit
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
