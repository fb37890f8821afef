"""The resource map of a run: per stage and phase (rollout, update, checkpoint), measured on every rank.

Each rank keeps a :class:`ResourceMeter`; at the end of a run the meters are gathered on rank 0 and
written to ``resources.json`` (one entry per stage, the stage being the trained adapter's name, so
the stages of one run folder accumulate), and :func:`table` renders them as the summary's table
(``agentrl-train resources --run DIR`` prints it). Per phase and rank:

- ``seconds`` / ``calls`` / ``mean_s``: wall time in the phase, how often it ran, seconds per call.
- ``peak_rss_mb``: the process's peak resident memory at the end of the phase (a running peak, so
  the phase that first reaches it is the one that raised it). ``peak_gpu_mb``: CUDA peak allocated
  during the phase, ``null`` without a GPU.
- ``tokens``, ``env_steps``, ``io_bytes``: what the phase processed; the table shows them per second.
  IO is the bytes this process wrote (``wchar`` of ``/proc/self/io``: checkpoints, logs) plus the
  replay records appended (an mmap, which ``wchar`` does not see); env worker processes are not counted.
- ``comm_s``: time in collectives: statistics and barriers from launch to completion, and DDP's
  gradient all-reduce as the time the backward waited on it after its last gradient was ready (DDP's
  own timer; the part that overlaps the compute is not counted); its share of the phase is the time
  spent waiting on the other ranks and the wire.
"""

from __future__ import annotations

import contextlib
import json
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl_envs.errors import ConfigError

__all__ = ["CountingSink", "ResourceMeter", "load", "table"]

PHASES = ("rollout", "update", "checkpoint")
_COUNTERS = ("tokens", "env_steps", "io_bytes")


def _wchar() -> int:
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class CountingSink:
    """The recorder's sink: the run's replay buffer and/or shard writer, counting the bytes it records.

    Each trajectory is encoded once (``encode`` checks it); the replay buffer takes those bytes and
    the shard writer the message.
    """

    def __init__(self, replay: Any = None, shards: Any = None) -> None:
        self.replay, self.shards, self.bytes = replay, shards, 0

    def append(self, traj: Any) -> None:
        from agentrl_envs.data import encode

        payload = encode(traj)
        self.bytes += len(payload)
        if self.replay is not None:
            self.replay.append_bytes(payload)
        if self.shards is not None:
            self.shards.append(traj)

    def close(self) -> None:
        try:
            if self.shards is not None:
                self.shards.close()
        finally:
            if self.replay is not None:
                self.replay.close()


class ResourceMeter:
    """One rank's time, memory, throughput, IO and communication per phase."""

    def __init__(self, dist: Any, device: Any = None, sink: CountingSink | None = None) -> None:
        self.dist, self.device, self.sink = dist, device, sink
        self.phases: dict[str, dict[str, Any]] = {}

    def _gpu(self) -> Any:
        import torch

        return torch.cuda if self.device is not None and getattr(self.device, "type", "") == "cuda" else None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[dict[str, float]]:
        """Measure a block; the yielded dict takes the counters (``tokens``, ``env_steps``)."""
        counts: dict[str, float] = {}
        gpu = self._gpu()
        if gpu is not None:
            gpu.reset_peak_memory_stats(self.device)
        t0, comm0, io0 = time.perf_counter(), self.dist.comm_s, _wchar() + (self.sink.bytes if self.sink else 0)
        try:
            yield counts
        finally:
            row = self.phases.setdefault(
                name,
                {
                    "calls": 0,
                    "seconds": 0.0,
                    "comm_s": 0.0,
                    "peak_rss_mb": 0.0,
                    "peak_gpu_mb": None,
                    **dict.fromkeys(_COUNTERS, 0),
                },
            )
            row["calls"] += 1
            row["seconds"] += time.perf_counter() - t0
            row["comm_s"] += self.dist.comm_s - comm0
            row["io_bytes"] += _wchar() + (self.sink.bytes if self.sink else 0) - io0
            row["peak_rss_mb"] = max(row["peak_rss_mb"], _rss_mb())
            if gpu is not None:
                row["peak_gpu_mb"] = max(row["peak_gpu_mb"] or 0.0, gpu.max_memory_allocated(self.device) / 2**20)
            for k, v in counts.items():
                row[k] = row.get(k, 0) + v

    def write(self, out: Path, stage: str) -> dict[str, Any]:
        """Gather every rank's phases (a collective: every rank calls it); rank 0 writes resources.json.

        Returns this stage's entry (on every rank).
        """
        ranks = self.dist.gather({"rank": self.dist.rank, "phases": self.phases})
        entry = {"world": self.dist.world, "ranks": ranks, "phases": _aggregate(ranks)}
        if self.dist.is_main:
            path = out / "resources.json"
            data = load(out) if path.exists() else {"stages": {}}
            data["stages"][stage] = entry
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(data, indent=2))
            tmp.replace(path)
        return entry


def _aggregate(ranks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per phase over ranks: the slowest rank's time, summed throughput, max memory, mean comm share."""
    out: dict[str, dict[str, Any]] = {}
    names = [p for p in PHASES if any(p in r["phases"] for r in ranks)]
    names += sorted({p for r in ranks for p in r["phases"]} - set(names))
    for name in names:
        rows = [r["phases"][name] for r in ranks if name in r["phases"]]
        seconds = max(r["seconds"] for r in rows)
        calls = max(r["calls"] for r in rows)
        gpus = [r["peak_gpu_mb"] for r in rows if r.get("peak_gpu_mb") is not None]
        agg = {
            "calls": calls,
            "seconds": seconds,
            "mean_s": seconds / calls if calls else 0.0,
            "peak_rss_mb_per_rank": [round(r["peak_rss_mb"], 1) for r in rows],
            "peak_gpu_mb": max(gpus) if gpus else None,
            "comm_share": sum(r["comm_s"] / r["seconds"] for r in rows if r["seconds"] > 0) / len(rows),
        }
        for k in _COUNTERS:
            agg[f"{k}_per_s"] = sum(r.get(k, 0) for r in rows) / seconds if seconds > 0 else 0.0
        out[name] = agg
    return out


def load(run: str | Path) -> dict[str, Any]:
    """A run folder's resources.json.

    Raises:
        ConfigError: the folder has none, or it is not valid JSON.
    """
    path = Path(run) / "resources.json"
    if Path(run).exists() and not Path(run).is_dir():
        raise ConfigError(f"--run {run}: not a folder; point at a ppo run folder (the one holding resources.json)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--run {run}: no resources.json there; point at a ppo run folder (written when a run ends)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--run {run}: resources.json is not valid JSON ({exc}); rerun the stage to rewrite it") from None
    if not isinstance(data, dict) or not isinstance(data.get("stages"), dict):
        raise ConfigError(f"--run {run}: resources.json has no 'stages' mapping; rerun the stage to rewrite it")
    return data


def table(data: dict[str, Any]) -> str:
    """The resource map as a Markdown table: one row per stage and phase."""
    head = (
        "| stage | phase | ranks | calls | mean s | peak RSS MB (per rank) | peak GPU MB | tokens/s | env steps/s "
        "| IO KB/s | comm share |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for stage, entry in data["stages"].items():
        for phase, r in entry.get("phases", {}).items():
            gpu = "-" if r.get("peak_gpu_mb") is None else f"{r['peak_gpu_mb']:.0f}"
            rss = " / ".join(f"{x:.0f}" for x in r.get("peak_rss_mb_per_rank", []))
            lines.append(
                f"| {stage} | {phase} | {entry.get('world', 1)} | {r['calls']} | {r['mean_s']:.3f} | {rss} | {gpu} "
                f"| {r['tokens_per_s']:.0f} | {r['env_steps_per_s']:.1f} | {r['io_bytes_per_s'] / 1024:.1f} | {r['comm_share']:.1%} |"
            )
    return head + "\n".join(lines) + "\n"
