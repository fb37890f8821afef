"""What a run writes: metrics.jsonl, TensorBoard events, a progress bar, the learning curve, resources."""

from __future__ import annotations

import json
import math
import os
import resource
import time
from pathlib import Path
from typing import Any

__all__ = ["RunLogger", "open_replay", "progress"]


class RunLogger:
    """Rank 0's log of a run: one JSON line per update and per evaluation, mirrored to TensorBoard."""

    def __init__(self, out: Path, cfg: Any, enabled: bool = True, history: list[dict[str, Any]] | None = None) -> None:
        """``history``: the rows a resumed run's checkpoint holds; metrics.jsonl starts over from them.

        So a resumed run's metrics.jsonl holds each update once, as an uninterrupted run's does (the rows
        logged after the checkpoint by the interrupted call are logged again by this one), and a fresh
        run in a used folder does not append to the earlier run's rows.
        """
        self.out, self.enabled, self.cfg = out, enabled, cfg
        self.history: list[dict[str, Any]] = list(history or [])
        self.started = time.time()
        self.writer = None
        if enabled and cfg.run.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(out / "tensorboard"))
        self._f = None
        if enabled:
            tmp = out / "metrics.jsonl.tmp"  # replaced in one step: a kill here leaves the old file whole
            tmp.write_text("".join(json.dumps(row) + "\n" for row in self.history), encoding="utf-8")
            os.replace(tmp, out / "metrics.jsonl")
            self._f = open(out / "metrics.jsonl", "a", encoding="utf-8")

    def log(self, row: dict[str, Any]) -> None:
        row = {"kind": "update", "wall_s": round(time.time() - self.started, 3), **row}
        self._write(row)
        if self.writer is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and k not in ("update", "kind"):
                    self.writer.add_scalar(f"train/{k}", v, row["env_steps"])

    def log_eval(self, update: int, env_steps: int, table: dict[str, dict[str, Any]]) -> None:
        for split, r in table.items():
            row = {"kind": "eval", "update": update, "env_steps": env_steps, "wall_s": round(time.time() - self.started, 3), **r}
            self._write(row)
            if self.writer is not None:
                self.writer.add_scalar(f"eval/{split}/success_rate", r["success_rate"], env_steps)
                self.writer.add_scalar(f"eval/{split}/mean_return", r["mean_return"], env_steps)

    def _write(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.history.append(row)
        assert self._f is not None
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def title(self) -> str:
        """What the curve is of: env, action mode, model, algorithm and seed."""
        c = self.cfg
        algo = c.ppo.advantage if c.ppo.advantage in ("gae", "hierarchical") else f"{c.ppo.advantage}, G={c.ppo.group_size}"
        if c.ppo.group_score != "return":
            algo += f", {c.ppo.group_score}"
        profile = "" if c.env.error_profile == "none" else f", faults {c.env.error_profile}"
        return f"{c.env.env} {c.env.mode} mode{profile}: {c.model.model}, {algo}, seed {c.run.seed}"

    def plot_curve(self, path: Path) -> None:
        """Return and greedy success vs env steps: train rollouts and each evaluated split, titled with the
        run's env, mode, model, algorithm and seed; a dashed line marks each split's greedy success
        before training (the baseline the run is read against) and the oracle's 1.0."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
        upd = [r for r in self.history if r["kind"] == "update"]
        ax1.plot([r["env_steps"] for r in upd], [r["return"] for r in upd], label="rollout return (sampled)", color="0.6")
        for split in sorted({r["split"] for r in self.history if r["kind"] == "eval"}):
            ev = [r for r in self.history if r["kind"] == "eval" and r["split"] == split]
            ax1.plot([r["env_steps"] for r in ev], [r["mean_return"] for r in ev], marker="o", label=f"{split} (greedy)")
            line = ax2.plot([r["env_steps"] for r in ev], [r["success_rate"] for r in ev], marker="o", label=f"{split} (greedy)")
            start = next((r for r in ev if r["update"] == 0), None)
            if start is not None:
                ax2.axhline(start["success_rate"], ls="--", lw=0.8, color=line[0].get_color(), label=f"{split} before training")
        ax2.plot([r["env_steps"] for r in upd], [r["success"] for r in upd], label="rollout success (sampled)", color="0.6")
        ax2.axhline(1.0, ls=":", lw=0.8, color="k", label="oracle (gold plan)")
        ax1.set(xlabel="env steps", ylabel="return", title="return")
        ax2.set(xlabel="env steps", ylabel="success rate", ylim=(-0.02, 1.02), title="success")
        for ax in (ax1, ax2):
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        fig.suptitle(self.title(), fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)

    def close(self, summary: dict[str, Any]) -> None:
        if not self.enabled:
            return
        summary = {**summary, "wall_s": round(time.time() - self.started, 2), "peak_rss_mb": peak_rss_mb()}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        if self.writer is not None:
            self.writer.close()
        if self._f is not None:
            self._f.close()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Bar:
    """A tqdm bar of updates (``bar``), or with ``lines`` one printed line per update (``--no-progress``).

    ``make demo`` runs with ``--no-progress`` so that its output reads as a log; without the lines a
    first run printed nothing for minutes after the tiny model's build.
    """

    def __init__(self, total: int, initial: int, bar: bool, lines: bool = False) -> None:
        self.total, self.lines, self.bar = total, lines, None
        if bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="ppo", unit="upd", dynamic_ncols=True)

    def update(self, row: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.set_postfix(
                ret=f"{row['return']:.2f}", succ=f"{row['success']:.2f}", kl=f"{row['kl_ref']:.3f}", refresh=False
            )
            self.bar.update(1)
        elif self.lines:
            print(
                f"ppo update {row['update']}/{self.total}  return {row['return']:.2f}  success {row['success']:.2f}  "
                f"kl {row['kl_ref']:.3f}  {row['time/total_s']:.1f} s",
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def progress(cfg: Any, initial: int, enabled: bool) -> _Bar:
    """Rank 0's progress: a bar, or with ``--no-progress`` a line per update; nothing on other ranks."""
    return _Bar(cfg.ppo.updates, initial, bar=enabled and cfg.run.progress, lines=enabled and not cfg.run.progress)


def open_replay(out: Path, cfg: Any, dist: Any) -> Any:
    """This rank's replay buffer in the run folder (created, or reopened on resume)."""
    from agentrl_envs.data import ReplayBuffer

    path = out / f"replay-rank{dist.rank}.ring"
    if cfg.run.resume and path.exists():
        return ReplayBuffer.open(path)
    return ReplayBuffer.create(path, capacity_bytes=cfg.run.replay_mb << 20, overwrite=True)


def open_shards(out: Path, cfg: Any, dist: Any) -> Any:
    """This rank's Arrow shard writer: ``<out>/shards/rank<r>-NNNNN.arrow`` (a resumed run numbers on).

    A fresh run removes this rank's shards from an earlier run in the same folder, as the replay
    buffer is overwritten; trajectories are written in batches of 64 and the last batch at the end.
    """
    from agentrl_envs.data import ShardWriter

    folder = out / "shards"
    if not cfg.run.resume and folder.is_dir():
        for old in folder.glob(f"rank{dist.rank}-*.arrow"):
            old.unlink()
    return ShardWriter(folder, format="arrow", prefix=f"rank{dist.rank}", batch_size=64)
