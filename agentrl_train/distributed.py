"""Several processes with torchrun: one rank per process, global statistics all-reduced.

``setup()`` reads torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); without it the
run is a single process and every hook is a no-op. Gradients of the trainable parameters (LoRA and
value head) are summed across ranks once per optimizer step; because the loop normalizes each loss
by the *global* count of valid units, that sum is the gradient of the whole batch whatever its split
across ranks and micro-batches.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from agentrl_envs.errors import AgentRLError, ConfigError

__all__ = ["Dist", "exec_torchrun", "setup"]


class Dist:
    """Rank, world size and the collective operations the training loop needs."""

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self.rank, self.world = rank, world
        self.is_main = rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def _reduce(self, values: list[float], op: Any = None) -> list[float]:
        if not self.active:
            return values
        import torch.distributed as td

        t = torch.tensor(values, dtype=torch.float64)
        td.all_reduce(t, op=op or td.ReduceOp.SUM)
        return t.tolist()

    def sum(self, x: float) -> float:
        return self._reduce([float(x)])[0]

    def moments(self, x: np.ndarray) -> tuple[int, float, float]:
        n, s, ss = self._reduce([float(x.size), float(x.sum()), float((x * x).sum())])
        return int(n), s, ss

    def decide(self, flag: bool) -> bool:
        """One decision for all ranks (true if any rank says so)."""
        return self._reduce([1.0 if flag else 0.0])[0] > 0

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as td

            td.barrier()

    def check_same_weights(self, policy: Any) -> None:
        """Every rank must start from identical trainable weights (the model seed is shared)."""
        if not self.active:
            return
        import torch.distributed as td

        local = torch.tensor(
            [float(sum(p.detach().double().sum() for _, p in policy.trainable_parameters()))], dtype=torch.float64
        )
        lo, hi = local.clone(), local.clone()
        td.all_reduce(lo, op=td.ReduceOp.MIN)
        td.all_reduce(hi, op=td.ReduceOp.MAX)
        if float(lo) != float(hi):
            raise AgentRLError(
                f"rank {self.rank}: trainable weights differ across ranks at start; every rank must use the same --seed and --model"
            )

    def all_reduce_grads(self, policy: Any) -> None:
        """Sum the trainable parameters' gradients across ranks (one flat all-reduce)."""
        if not self.active:
            return
        import torch.distributed as td

        params = [p for _, p in policy.trainable_parameters()]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        td.all_reduce(flat)
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n

    def no_sync(self, policy: Any, last: bool) -> Any:
        return contextlib.nullcontext()


@contextlib.contextmanager
def setup() -> Iterator[Dist]:
    """A :class:`Dist` for this process: torchrun's process group, or a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        yield Dist()
        return
    import torch.distributed as td

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = datetime.timedelta(seconds=float(os.environ.get("AGENTRL_DIST_TIMEOUT_S", "300")))
    td.init_process_group(backend=backend, timeout=timeout)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    try:
        yield Dist(td.get_rank(), td.get_world_size())
    finally:
        td.destroy_process_group()


def exec_torchrun(nproc: int, argv: list[str]) -> int:
    """``agentrl-train ppo --nproc N ...`` -> ``torchrun --nproc-per-node N -m agentrl_train ppo ...``."""
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        raise ConfigError("--nproc: torchrun is not installed next to this Python; pip install -e '.[train]'")
    args = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        args.append(a)
    os.execv(torchrun, [torchrun, "--standalone", f"--nproc-per-node={nproc}", "-m", "agentrl_train", *args])
    return 0  # pragma: no cover
