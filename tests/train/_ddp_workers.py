"""Worker functions for the in-process 2-rank gloo tests (spawned; module level so they pickle)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from agentrl_train.distributed import wrap_trainable


class TwoAdapters(nn.Module):
    """A frozen base and two 'adapters'; the loss of a batch is its forward (like ppo.PPOLoss)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.base, self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.base.requires_grad_(False)
        self.b.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((self.base(x) + self.a(x) + self.b(x)) ** 2).sum()

    def trainable_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.named_parameters() if p.requires_grad]


def _init(rank: int, world: int, port: int) -> None:
    import torch.distributed as td

    # A forked rank computes on one thread, as DataLoader workers do: the OpenMP pool the parent may
    # have started (another test's torch work) is not fork-safe, and two ranks on 2 cores gain nothing.
    torch.set_num_threads(1)
    td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def _finish() -> None:
    """Leave the rank without Python's teardown (after a barrier: every collective is done).

    A forked rank need not run the parent's teardown. (This once also dodged a deadlock: dropping
    the last reference to the gloo group right after a DDP backward hung the rank in
    ``~ProcessGroupGloo``; the product fixes that, and ``test_ranks_exit_when_the_group_is_dropped_
    right_after_a_ddp_backward`` exits normally to show it.)
    """
    import os
    import sys

    import torch.distributed as td

    td.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _step(tr: object, model: TwoAdapters, x: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    loss = tr(x)  # type: ignore[operator]
    tr.backward(loss)  # type: ignore[attr-defined]
    with torch.no_grad():
        for _, p in model.trainable_parameters():
            p -= 0.1 * p.grad


def _stage_switch(dist: object, rank: int, rebuild: bool) -> dict[str, object]:
    """Train adapter a one step, switch the trainable set to b, train one more step; report b's drift."""

    model = TwoAdapters()
    dist.check_same_weights(model)  # type: ignore[attr-defined]
    x = torch.full((3, 4), float(rank + 1))  # each rank has its own data
    tr = wrap_trainable(model, dist)  # type: ignore[arg-type]
    same = wrap_trainable(model, dist, tr) is tr  # type: ignore[arg-type]
    _step(tr, model, x)
    diff_a = dist.max_weight_diff(model)  # type: ignore[attr-defined]
    model.a.requires_grad_(False)
    model.b.requires_grad_(True)
    rebuilt = False
    if rebuild:
        tr2 = wrap_trainable(model, dist, tr)  # type: ignore[arg-type]
        rebuilt, tr = tr2 is not tr, tr2
    _step(tr, model, x)
    return {"same": same, "rebuilt": rebuilt, "diff_a": diff_a, "diff_b": dist.max_weight_diff(model)}  # type: ignore[attr-defined]


def _comm_timing(dist: object, rank: int) -> dict[str, float]:
    """What a local (no_sync) and a syncing backward add to ``dist.comm_s`` (rank 1 arrives late)."""
    import time

    model = TwoAdapters()
    tr = wrap_trainable(model, dist)  # type: ignore[arg-type]
    x = torch.full((3, 4), float(rank + 1))
    t0 = dist.comm_s  # type: ignore[attr-defined]
    with tr.no_sync(last=False):
        tr.backward(tr(x))
    t1 = dist.comm_s  # type: ignore[attr-defined]
    loss = tr(x)
    if rank == 1:
        time.sleep(0.2)  # so that rank 0's all-reduce has something to wait for
    with tr.no_sync(last=True):
        tr.backward(loss)
    return {"no_sync_s": t1 - t0, "synced_s": dist.comm_s - t1}  # type: ignore[attr-defined]


def _mismatch(dist: object, rank: int) -> str:
    """Rank 1 holds slightly different weights (same sum): the check must refuse on every rank."""
    from agentrl_envs.errors import AgentRLError

    model = TwoAdapters()
    if rank == 1:
        with torch.no_grad():
            w = model.a.weight
            w[0, 0], w[0, 1] = w[0, 1].clone(), w[0, 0].clone()
    try:
        dist.check_same_weights(model)  # type: ignore[attr-defined]
    except AgentRLError as exc:
        return str(exc)
    return ""


def scenarios(rank: int, world: int, port: int, out: str) -> None:
    """One 2-rank group for every scenario (a process group costs seconds to start on a busy machine)."""

    from agentrl_train.distributed import Dist

    _init(rank, world, port)
    dist = Dist(rank, world)
    result = {
        "timing": _comm_timing(dist, rank),
        "kept": _stage_switch(dist, rank, rebuild=False),
        "rebuilt": _stage_switch(dist, rank, rebuild=True),
        "mismatch": _mismatch(dist, rank),
        # objects of different sizes and types per rank (one empty), through Dist.gather's byte rows
        "gathered": [
            dist.gather({"rank": rank, "text": "é" * 3000}),
            dist.gather("" if rank else [1.5, None]),
            dist.gather(rank),
        ],
    }
    Path(f"{out}.{rank}").write_text(json.dumps(result))
    _finish()


def ppo_grads(rank: int, world: int, port: int, policy: object, cfg: object, samples: list, out: str) -> None:
    """Rank r takes its half of a fixed batch in micro-batches of 1 (no_sync on all but the last) through
    the real PPO loss under DDP; rank 0 saves the summed gradients."""

    from agentrl_train.accumulation import accumulate, wrap_trainable
    from agentrl_train.distributed import Dist

    _init(rank, world, port)
    dist = Dist(rank, world)
    mine = samples[rank * len(samples) // world : (rank + 1) * len(samples) // world]
    policy.zero_grad(set_to_none=True)  # type: ignore[attr-defined]
    stats: dict[str, list[float]] = {k: [] for k in ("pg", "vf", "entropy", "kl_ref", "approx_kl", "clipfrac")}
    trainable = wrap_trainable(policy, cfg, dist)  # type: ignore[arg-type]
    accumulate(policy, mine, [[j] for j in range(len(mine))], cfg, 0.01, 0.5, dist, stats, trainable)  # type: ignore[arg-type]
    grads = {n: p.grad.clone() for n, p in policy.trainable_parameters() if p.grad is not None}  # type: ignore[attr-defined]
    if rank == 0:
        torch.save({"grads": grads, "comm_s": dist.comm_s}, out)
    _finish()


def drop_after_backward(rank: int, world: int, port: int, rounds: int) -> None:
    """``rounds`` times: a process group, a DDP backward through ``wrap_trainable``, the group destroyed and
    the wrapper dropped at once (its reducer holds the last reference: ``~ProcessGroupGloo`` runs right
    there, holding the GIL); then a normal exit, without :func:`_finish`. Before the fix a rank hung in
    that destructor within a few rounds (gloo's run loop waiting for the GIL to free a finished work)."""
    import datetime

    import torch.distributed as td

    from agentrl_train.distributed import Dist, wrap_trainable

    torch.set_num_threads(1)
    store = td.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=300))
    for i in range(rounds):
        td.init_process_group("gloo", store=td.PrefixStore(f"round{i}/", store), rank=rank, world_size=world)
        model = TwoAdapters()
        tr = wrap_trainable(model, Dist(rank, world))
        tr.backward(tr(torch.full((3, 4), float(rank + 1))))
        grad = model.a.weight.grad.clone()  # type: ignore[union-attr]
        td.destroy_process_group()
        del tr
        print(f"round {i} grad {float(grad.abs().sum()):.6g}", flush=True)
    print("exited cleanly", flush=True)


if __name__ == "__main__":
    import sys

    drop_after_backward(*(int(a) for a in sys.argv[1:5]))
