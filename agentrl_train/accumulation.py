"""One optimizer step's gradient: its samples cut into micro-batches, each forwarded and backwarded under DDP.

The loop (:func:`agentrl_train.train.train`) takes an optimizer step over ``--micro-batch`` sized
pieces of its samples: :func:`micro_batches_per_step` says how many make a step (``--sync-batch`` or
``--accumulation``), :func:`episode_micro_batches` cuts a step's samples so that each env's
transitions stay together, and :func:`accumulate` sums their gradients, across ranks through the
DDP wrapper of :func:`wrap_trainable`.
"""

from __future__ import annotations

from typing import Any

from agentrl_envs.errors import ConfigError
from agentrl_train import distributed, ppo
from agentrl_train.config import GROUP_ADVANTAGES, TrainConfig
from agentrl_train.distributed import Trainable
from agentrl_train.episodes import Transition
from agentrl_train.policy import Policy

__all__ = ["accumulate", "episode_micro_batches", "micro_batches_per_step", "wrap_trainable"]


def episode_micro_batches(
    indices: list[int], samples: list[tuple[Transition, float, float]], size: int, max_tokens: int = 0
) -> list[list[int]]:
    """One optimizer step's transitions cut into micro-batches of at most ``size`` (and ``max_tokens``), each env's in a row.

    The step's gradient is the sum over its micro-batches, so how they are cut changes nothing but
    float rounding; keeping an env's successive transitions together lets them share one encoding
    of their prompts (:func:`ppo.unit_terms_many`). A transition counts its prompt, candidates and
    action tokens (an upper bound: a chain's prompts are encoded once); one over ``max_tokens`` goes alone.
    """
    ordered = sorted(indices, key=lambda j: (samples[j][0].env_index, j))
    if not max_tokens:
        return [ordered[j : j + size] for j in range(0, len(ordered), size)]
    out: list[list[int]] = []
    tokens = 0
    for j in ordered:
        tr = samples[j][0]
        n = len(tr.prompt_ids) + sum(len(c) for c in tr.cand_ids) + len(tr.new_ids)
        if not out or len(out[-1]) == size or tokens + n > max_tokens:
            out.append([])
            tokens = 0
        out[-1].append(j)
        tokens += n
    return out


def wrap_trainable(policy: Policy, cfg: TrainConfig, dist: Any, current: Trainable | None = None) -> Trainable:
    """The policy's loss module under DDP over its trainable parameters (LoRA + value head).

    The seam for stages: returns ``current`` while the trainable set is unchanged, a new wrapper when
    the trained adapter changed (DDP must be rebuilt then, or ranks drift apart silently).
    """
    if current is not None and current.module.policy is policy:
        return distributed.wrap_trainable(current.module, dist, current)
    return distributed.wrap_trainable(ppo.PPOLoss(policy, cfg), dist)


def accumulate(
    policy: Policy,
    samples: list[tuple[Transition, float, float]],
    group: list[Any],
    cfg: TrainConfig,
    ent_coef: float,
    critic_w: float,
    dist: Any,
    stats: dict[str, list[float]],
    trainable: Trainable | None = None,
) -> None:
    """Forward and backward the micro-batches of one optimizer step; gradients summed across ranks.

    Every policy loss is divided by a global count of the step (``--loss-agg``: its units, or its
    sequences and their units or budget; :func:`ppo.unit_norms`), the value loss by its global number
    of samples, so any split of the step into micro-batches and ranks gives the same gradient. DDP's
    all-reduce runs on the last micro-batch only (``no_sync`` on the others).
    """
    trainable = wrap_trainable(policy, cfg, dist, trainable)
    flat = [j for mb in group for j in mb]
    norms = dict(zip(flat, ppo.step_unit_norms([samples[j][0] for j in flat], cfg, dist.sum)))
    n_samples = dist.sum(len(flat))
    for m_i, mb in enumerate(group):
        with trainable.no_sync(last=m_i == len(group) - 1):
            loss = trainable([samples[j] for j in mb], ent_coef, critic_w, [norms[j] for j in mb], n_samples, stats)
            trainable.backward(loss)  # summed across ranks on the last micro-batch


def micro_batches_per_step(cfg: TrainConfig, world: int) -> int:
    """Micro-batches per optimizer step on each rank (0: the whole rollout), from ``--sync-batch`` or ``--accumulation``.

    ``--sync-batch`` is the global number of transitions per optimizer step, the same update on any
    world size; it must split into ``world x micro_batch`` pieces.
    """
    p = cfg.ppo
    if world > 1 and p.advantage in GROUP_ADVANTAGES and (p.sync_batch or p.accumulation):
        # a group rollout's length varies by rank (envs idle once their episode ended), so would the
        # number of optimizer steps, and the ranks' all-reduces would no longer pair up
        raise ConfigError(
            f"--advantage {p.advantage} on {world} ranks takes the whole rollout as one optimizer step per epoch: "
            "drop --sync-batch and --accumulation (or run on one rank)"
        )
    if not p.sync_batch:
        return p.accumulation
    if p.sync_batch % (world * p.micro_batch):
        raise ConfigError(
            f"--sync-batch={p.sync_batch}: use a multiple of ranks x --micro-batch = {world} x {p.micro_batch} "
            f"(e.g. {world * p.micro_batch * max(1, round(p.sync_batch / (world * p.micro_batch)))})"
        )
    acc = p.sync_batch // (world * p.micro_batch)
    if p.accumulation and p.accumulation != acc:
        raise ConfigError(
            f"--accumulation={p.accumulation} contradicts --sync-batch={p.sync_batch} on {world} rank(s) with "
            f"--micro-batch={p.micro_batch} (that is {acc} micro-batches per step); give only one of the two"
        )
    return acc
