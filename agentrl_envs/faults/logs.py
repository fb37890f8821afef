"""Reading real API logs for ``fit-profile``: JSON lines and nginx/Apache combined access logs.

See :mod:`agentrl_envs.faults.fit` for the formats, the endpoint-to-tool mapping and the status
rules. Every line is read with a size cap; lines that are not usable are skipped and counted by
reason, never fatal.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from agentrl_envs.errors import ConfigError
from agentrl_envs.tools import TOOLS, service_tools

__all__ = ["MAX_LINE_BYTES", "Call", "LogReader", "parse_line"]

#: Longer lines are skipped (a log line is a few hundred bytes; this bounds memory per line).
MAX_LINE_BYTES = 1 << 20

_MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_COMBINED = re.compile(
    r"^\S+ \S+ \S+ \[(?P<time>[^\]]+)\] (?P<request>" + _QUOTED + r") (?P<status>\d{3}) \S+"
    r"(?: " + _QUOTED + " " + _QUOTED + r")?(?P<rest>(?:\s+\S+)*)\s*$"
)
_CLF_TIME = re.compile(r"^(\d{1,2})/([A-Za-z]{3})/(\d{4}):(\d{2}):(\d{2}):(\d{2}) ([+-])(\d{2})(\d{2})$")
_REQUEST_TIME = re.compile(r"^\d+(?:\.\d+)?$")


@dataclass(frozen=True)
class Call:
    """One call read from a log.

    Attributes:
        tool: ``sql``, ``python`` or ``smtp``.
        ts: when the request went out, epoch seconds.
        outcome: ``ok`` (2xx/3xx), ``client_error`` (other 4xx: the caller's doing) or a fault type.
        latency_s: how long the call took.
        retry_after_s: the Retry-After of a 429, when the log carries it.
        int_time: the latency came from an integer access-log field (unit settled per file).
    """

    tool: str
    ts: float
    outcome: str
    latency_s: float
    retry_after_s: float | None = None
    int_time: bool = False


def parse_line(raw: bytes, rules: Sequence[tuple[re.Pattern[str], str]] = ()) -> Call | str:
    """One log line as a :class:`Call`, or the reason it is skipped (a short str)."""
    if b"\x00" in raw:
        return "binary data"
    try:
        text = raw.decode("utf-8").lstrip("\ufeff").strip()
    except UnicodeDecodeError:
        return "binary data"
    if not text:
        return "empty line"
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except RecursionError:
            return "JSON nested too deeply"
        except ValueError:
            return "invalid JSON"
        return _from_json(record, rules) if isinstance(record, dict) else "invalid JSON"
    match = _COMBINED.match(text)
    if match is None:
        return "neither JSON nor a combined access log line"
    return _from_combined(match, rules)


def _from_json(record: dict[str, Any], rules: Sequence[tuple[re.Pattern[str], str]]) -> Call | str:
    for key in ("ts", "status", "latency_ms"):
        if key not in record:
            return f"missing key {key!r}"
    name = record.get("tool", record.get("endpoint"))
    if name is None:
        return "missing key 'tool' or 'endpoint'"
    if not isinstance(name, str):
        return "tool/endpoint is not a string"
    tool = _tool_of(name, rules)
    if tool is None:
        return "endpoint maps to no tool"
    ts = _json_ts(record["ts"])
    if ts is None:
        return "bad ts"
    outcome = _json_outcome(record["status"])
    if outcome is None:
        return "bad status"
    latency = _number(record["latency_ms"])
    if latency is None or not math.isfinite(latency):
        return "latency not a finite number"
    if latency < 0:
        return "negative latency"
    retry_after = None
    if record.get("retry_after") is not None:
        retry_after = _number(record["retry_after"])
        if retry_after is None or not math.isfinite(retry_after) or retry_after < 0:
            return "bad retry_after"
    return Call(tool, ts, outcome, latency / 1000.0, retry_after)


def _from_combined(match: re.Match[str], rules: Sequence[tuple[re.Pattern[str], str]]) -> Call | str:
    request = match["request"][1:-1].split()
    target = request[1] if len(request) >= 2 else (request[0] if request else "")
    tool = _tool_of(target.split("?", 1)[0], rules)
    if tool is None:
        return "endpoint maps to no tool"
    ts = _clf_time(match["time"])
    if ts is None:
        return "bad ts"
    outcome = _status_outcome(int(match["status"]))
    if outcome is None:
        return "bad status"
    rest = match["rest"].split()
    last = rest[-1].strip('"').rsplit("=", 1)[-1] if rest else ""
    if not _REQUEST_TIME.match(last):
        return "access log line without a request time"
    value = float(last)
    if not math.isfinite(value):
        return "latency not a finite number"
    if "." in last:
        return Call(tool, ts, outcome, value)
    return Call(tool, ts, outcome, value / 1e6, int_time=True)


def _tool_of(name: str, rules: Sequence[tuple[re.Pattern[str], str]]) -> str | None:
    for pattern, tool in rules:
        if pattern.search(name):
            return tool
    lowered = name.lower()
    tools = service_tools()
    if lowered in tools:
        return lowered
    for tool in tools:
        if any(n in lowered for n in TOOLS[tool].log_names):
            return tool
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) or (isinstance(value, str) and len(value) < 40):
        try:
            return float(value)
        except (ValueError, OverflowError):
            return None
    return None


def _json_ts(value: Any) -> float | None:
    if isinstance(value, str) and len(value) < 64:
        try:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
            return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
        except (ValueError, OverflowError):
            return None
    seconds = None if isinstance(value, str) else _number(value)
    if seconds is None or not math.isfinite(seconds):
        return None
    return seconds / 1000.0 if abs(seconds) > 1e11 else seconds


def _clf_time(text: str) -> float | None:
    m = _CLF_TIME.match(text)
    month = _MONTHS.get(m.group(2).lower()) if m else None
    if m is None or month is None:
        return None
    offset = timedelta(hours=int(m.group(8)), minutes=int(m.group(9))) * (1 if m.group(7) == "+" else -1)
    try:
        moment = datetime(int(m.group(3)), month, int(m.group(1)), int(m.group(4)), int(m.group(5)), int(m.group(6)))
        return moment.replace(tzinfo=timezone(offset)).timestamp()
    except (ValueError, OverflowError):
        return None


def _json_outcome(status: Any) -> str | None:
    if isinstance(status, str):
        word = status.strip().lower()
        if word in ("timeout", "timed_out"):
            return "timeout"
        if word in ("reset", "connection_reset"):
            return "connection_reset"
        if not word.isdigit() or len(word) != 3:
            return None
        status = int(word)
    if isinstance(status, float) and status.is_integer():
        status = int(status)
    if isinstance(status, bool) or not isinstance(status, int):
        return None
    return _status_outcome(status)


def _status_outcome(status: int) -> str | None:
    if 100 <= status < 400:
        return "ok"
    if status in (401, 403, 429, 500, 502, 503):
        return f"http_{status}"
    if status in (499, 504):
        return "timeout"
    if status == 599:
        return "connection_reset"
    if 400 <= status < 500:
        return "client_error"
    if 500 <= status < 600:
        return "http_500"
    return None


class LogReader:
    """Reads log files into :class:`Call` s and counts what it skips.

    Args:
        rules: ``(regex, tool)`` pairs tried before the default endpoint mapping.
    """

    def __init__(self, rules: Sequence[tuple[re.Pattern[str], str]] = ()) -> None:
        self.rules = tuple(rules)
        self.calls: list[Call] = []
        self.lines = 0
        self.skipped: Counter[str] = Counter()
        self.unmapped: Counter[str] = Counter()
        self.files: list[str] = []

    def read_path(self, path: str | Path) -> None:
        """Read one file (``-`` is stdin); a file that cannot be opened is a :class:`ConfigError`."""
        name = str(path)
        self.files.append(name)
        if name == "-":
            self.read_stream(sys.stdin.buffer)
            return
        p = Path(name)
        if not p.exists():
            raise ConfigError(f"log {name!r} does not exist")
        if p.is_dir():
            raise ConfigError(f"log {name!r} is a directory; pass the log files themselves")
        try:
            with p.open("rb") as raw:
                gz = raw.read(2) == b"\x1f\x8b"
                raw.seek(0)
                if gz:
                    with gzip.GzipFile(fileobj=raw) as unzipped:
                        self.read_stream(unzipped)  # type: ignore[arg-type]
                else:
                    self.read_stream(raw)
        except PermissionError:
            raise ConfigError(f"log {name!r} is not readable (permission denied)") from None

    def read_stream(self, stream: BinaryIO) -> None:
        start = len(self.calls)
        try:
            for raw in _capped_lines(stream):
                self.lines += 1
                if raw is None:
                    self.skipped[f"line longer than {MAX_LINE_BYTES >> 20} MiB"] += 1
                    continue
                parsed = parse_line(raw, self.rules)
                if isinstance(parsed, Call):
                    self.calls.append(parsed)
                else:
                    self.skipped[parsed] += 1
                    if parsed == "endpoint maps to no tool":
                        self.unmapped[_endpoint_hint(raw)] += 1
        except (OSError, EOFError, zlib.error):
            self.skipped["rest of file unreadable (truncated or corrupt gzip, or a read error)"] += 1
        self._settle_int_times(start)

    def _settle_int_times(self, start: int) -> None:
        ints = [i for i in range(start, len(self.calls)) if self.calls[i].int_time]
        if ints and float(np.median([self.calls[i].latency_s for i in ints])) < 1e-3:
            for i in ints:  # Apache %T: the integers were seconds, not microseconds
                self.calls[i] = replace(self.calls[i], latency_s=self.calls[i].latency_s * 1e6)


def _capped_lines(stream: BinaryIO) -> Iterator[bytes | None]:
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):
                line = stream.readline(MAX_LINE_BYTES)
            yield None
        else:
            yield line


def _endpoint_hint(raw: bytes) -> str:
    text = raw[:2000].decode("utf-8", "replace")
    m = re.search(r'"(?:tool|endpoint)"\s*:\s*"([^"]{0,60})', text) or re.search(r'"[A-Z]+ (\S{0,60})', text)
    return m.group(1) if m else "?"
