"""PPO maths: schedules, advantages, the losses and per-layer clipping as small pure functions, and
:class:`PPOLoss`, a micro-batch's loss built from them.

Everything here is called from :mod:`agentrl_train.train`'s loop and tested on its own.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from agentrl_envs.rewards.advantages import gae, hierarchical_gae
from agentrl_train.config import TrainConfig
from agentrl_train.episodes import Transition
from agentrl_train.rollout import candidate_logprobs

if TYPE_CHECKING:
    from agentrl_train.policy import Policy

__all__ = [
    "PPOLoss",
    "advantages",
    "clip_gradients",
    "clip_range",
    "critic_warmup_steps",
    "critic_weight",
    "entropy_coef",
    "episode_group_advantages",
    "group_advantages",
    "k3_kl",
    "lr_factor",
    "normalize_rewards",
    "optimizer_steps_per_epoch",
    "policy_loss",
    "resolve_loss_agg",
    "return_to_go_group_advantages",
    "should_stop_early",
    "step_unit_norms",
    "unit_norms",
    "unit_terms",
    "unit_terms_many",
    "value_loss",
    "whiten",
]


def entropy_coef(update: int, updates: int, start: float = 0.01, end: float = 0.001) -> float:
    """Logarithmic decay from ``start`` (update 0) to ``end`` (the last update)."""
    if updates <= 1 or start <= 0 or end <= 0:
        return start if updates <= 1 else start + (end - start) * min(update / (updates - 1), 1.0)
    frac = min(max(update / (updates - 1), 0.0), 1.0)
    return math.exp(math.log(start) + (math.log(end) - math.log(start)) * frac)


#: the default critic warmup spans this share of the run's optimizer steps ...
CRITIC_WARMUP_SHARE = 0.2
#: ... and at least this many steps (fewer only when the whole run is shorter)
CRITIC_WARMUP_MIN_STEPS = 4


def optimizer_steps_per_epoch(samples: int, micro_batch: int, micro_batches_per_step: int) -> int:
    """Optimizer steps in one epoch over ``samples`` transitions cut into micro-batches of ``micro_batch``.

    ``micro_batches_per_step`` 0 means the whole rollout is one step (as ``--accumulation 0``).
    """
    mbs = math.ceil(samples / micro_batch)
    return math.ceil(mbs / (micro_batches_per_step or mbs)) if mbs else 0


def lr_factor(step: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the learning rates at optimizer step ``step`` (0-based) of a run of ``total_steps``.

    ``constant``: 1. ``linear``: ``1 - step / total_steps``, the value of a line that falls from 1 at the
    start of the run to 0 at its end, read at the start of each step: the first step uses 1, the last
    ``1 / total_steps``, and the run ends at 0. Steps are counted as planned (an epoch cut short by
    ``--target-kl`` still counts its steps), so the schedule depends on the update number only and a
    resumed run follows it exactly. Outside the run it is clamped to [0, 1].
    """
    if schedule == "linear" and total_steps > 0:
        return min(max(1.0 - step / total_steps, 0.0), 1.0)
    return 1.0


def critic_warmup_steps(critic_warmup: int, total_steps: int) -> int:
    """Optimizer steps over which the value-loss weight rises to 1: ``critic_warmup`` when > 0, else a default.

    Why a warmup: the value head starts at zero, so its first losses are as large as the returns, and
    with ``--critic-grad shared`` their gradient flows into the LoRA weights the policy shares (norm 27
    before clipping was measured at full weight). The default is :data:`CRITIC_WARMUP_SHARE` (a fifth)
    of the run's optimizer steps, at least :data:`CRITIC_WARMUP_MIN_STEPS` so that short runs (the
    default 5 updates of 2 steps) still ramp over several steps, and never more than the run, so the
    weight reaches 1 before it ends. Counted in optimizer steps, not updates: an update holds
    ``epochs x`` (rollout / step size) steps, and a cap in updates was a single update (no warmup) at
    the defaults.
    """
    if critic_warmup > 0:
        return critic_warmup
    return max(1, min(total_steps, max(CRITIC_WARMUP_MIN_STEPS, math.ceil(CRITIC_WARMUP_SHARE * total_steps))))


def critic_weight(step: int, warmup: int) -> float:
    """Value-loss weight at optimizer step ``step`` (0-based): ``(step + 1) / warmup``, 1 from step ``warmup - 1`` on."""
    return 1.0 if warmup <= 0 else min(1.0, (max(step, 0) + 1) / warmup)


def should_stop_early(epoch_kls: Any, target: float, stats: Any = None) -> bool:
    """Whether an update stops after this epoch: the epoch's mean approximate KL to the rollout policy > ``target``.

    ``epoch_kls`` are this epoch's per-sample values only (earlier epochs' values would drag the mean
    towards the first epoch's, near 0, and delay the stop). ``stats`` is ``(count, sum, sum_sq)`` over
    all ranks (DDP), so every rank decides the same. ``target`` 0 never stops.
    """
    if target <= 0:
        return False
    if stats is None:
        kls = np.asarray(epoch_kls, dtype=float)
        stats = (kls.size, kls.sum(), (kls * kls).sum())
    n, s, _ = stats
    return bool(n > 0 and s / n > target)


def normalize_rewards(
    rewards: np.ndarray, valid: np.ndarray, mode: str = "zscore", min_sigma: float = 0.1, stats: Any = None
) -> np.ndarray:
    """Batch normalization of the valid rewards, with the std floored at ``min_sigma``.

    ``zscore``: ``(r - mean) / std``. ``scale``: ``r / std`` (no shift). Shifting every step's reward by
    the batch mean is a per-step penalty when most steps earn nothing, and a policy can dodge it by
    ending episodes early (a wrong ``finish``): on SQLPythonSMTP the z-scored run collapsed onto short
    episodes, so ``scale`` is the default. ``none``: unchanged.

    ``stats``, when given, is ``(count, sum, sum_sq)`` over the global batch (all-reduced by DDP).
    """
    if mode == "none":
        return rewards.copy()
    if stats is None:
        r = rewards[valid]
        stats = (r.size, r.sum(), (r * r).sum())
    n, s, ss = stats
    if n == 0:
        return rewards.copy()
    mean = s / n
    var = max(ss / n - mean * mean, 0.0)
    out = (rewards - (mean if mode == "zscore" else 0.0)) / max(math.sqrt(var), min_sigma)
    return np.where(valid, out, 0.0)


def advantages(rollout: Any, rewards: np.ndarray, kind: str, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """GAE or hierarchical GAE over a rollout's ``[T, N]`` arrays; returns ``(advantages, returns)``."""
    args = dict(
        rewards=rewards,
        values=rollout.values_TN,
        terminated=rollout.terminated_TN,
        truncated=rollout.truncated_TN,
        gamma=gamma,
        lam=lam,
        last_values=rollout.last_values_N,
        truncation_values=rollout.truncation_values_TN,
    )
    if kind == "hierarchical":
        return hierarchical_gae(boundaries=rollout.boundaries_TN, **args)
    return gae(**args)


def whiten(x: np.ndarray, stats: Any = None, eps: float = 1e-8) -> np.ndarray:
    """Zero mean, unit std; ``stats`` = ``(count, sum, sum_sq)`` when global (DDP)."""
    if stats is None:
        stats = (x.size, x.sum(), (x * x).sum())
    n, s, ss = stats
    if n == 0:
        return x
    mean = s / n
    std = math.sqrt(max(ss / n - mean * mean, 0.0))
    return (x - mean) / (std + eps)


def policy_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip: float, clip_high: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-unit clipped surrogate ``max(-A r, -A clip(r, 1 - clip, 1 + clip_high))``; also the ratio and
    whether it was outside the clip range.

    ``clip_high`` None: ``clip`` on both sides. DAPO's "clip-higher" (0.2 below, 0.28 above) lets an
    unlikely action's probability rise further before the clip stops its gradient.
    """
    high = clip if clip_high is None else clip_high
    ratio = torch.exp(logp - old_logp)
    loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + high))
    return loss, ratio, ((ratio < 1 - clip) | (ratio > 1 + high)).float()


def clip_range(clip: float, clip_low: float, clip_high: float) -> tuple[float, float]:
    """``(low, high)`` of the ratio clip: ``--clip-low`` / ``--clip-high``, each ``--clip`` when 0."""
    return (clip_low or clip), (clip_high or clip)


def group_advantages(returns_N: np.ndarray, group_size: int, kind: str, eps: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """Group-relative advantages of ``N`` episodes in consecutive groups of ``group_size``.

    ``grpo``: ``(R - mean) / (std + eps)`` with the sample std (ddof 1, as TRL). ``dr_grpo``:
    ``R - mean``. ``rloo``: ``R - mean of the other G - 1``, that is ``G / (G - 1) * (R - mean)``.
    A group whose returns are all equal (to 1e-9 of their size) gets exactly 0: it carries no
    signal, and float rounding in the mean would otherwise leave a gradient of noise.

    Returns:
        ``(advantages_N, flat_G)``: one advantage per episode, and whether each group was all equal.

    Raises:
        ValueError: ``group_size`` < 2 or not a divisor of ``N``, or an unknown ``kind``.
    """
    returns_N = np.asarray(returns_N, dtype=np.float64)
    if group_size < 2 or returns_N.size % group_size:
        raise ValueError(f"group_size={group_size}: use at least 2, a divisor of the {returns_N.size} episodes")
    r_GM = returns_N.reshape(-1, group_size)
    centred_GM = r_GM - r_GM.mean(axis=1, keepdims=True)
    if kind == "grpo":
        adv_GM = centred_GM / (r_GM.std(axis=1, ddof=1, keepdims=True) + eps)
    elif kind == "dr_grpo":
        adv_GM = centred_GM
    elif kind == "rloo":
        adv_GM = centred_GM * group_size / (group_size - 1)
    else:
        raise ValueError(f"unknown group advantage {kind!r}: use grpo, dr_grpo or rloo")
    flat_G = np.ptp(r_GM, axis=1) <= 1e-9 * np.maximum(1.0, np.abs(r_GM).max(axis=1))
    adv_GM[flat_G] = 0.0
    return adv_GM.reshape(-1), flat_G


def episode_group_advantages(
    rewards_TN: np.ndarray, valid_TN: np.ndarray, group_size: int, kind: str
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`group_advantages` of a group rollout (one episode per env), broadcast to each episode's steps.

    An episode's score is its undiscounted return over its valid rows: its whole return, or its return
    so far when the rollout window cut it. Returns ``(advantages_TN, flat_G)``; invalid rows get 0.
    """
    adv_N, flat_G = group_advantages(np.where(valid_TN, rewards_TN, 0.0).sum(axis=0), group_size, kind)
    return np.where(valid_TN, adv_N[None, :], 0.0), flat_G


def return_to_go_group_advantages(
    rewards_TN: np.ndarray, valid_TN: np.ndarray, group_size: int, kind: str, eps: float = 1e-4
) -> tuple[np.ndarray, np.ndarray]:
    """Per-step group advantages of a group rollout: each step scored by its return-to-go (``--group-score return-to-go``).

    A step's score is its episode's undiscounted return from that step on (over valid rows). At step
    index ``t`` the baseline is taken over the episodes of the group still running at ``t`` (valid
    there): an episode that already ended has no step ``t`` and is left out, not counted as 0 (a 0
    would make a late step's advantage depend on how many of its peers had stopped, and on whether
    they stopped with a reward or a penalty). With ``n`` episodes running at ``t``: ``grpo``
    ``(G_t - mean) / (std + eps)`` (ddof 1), ``dr_grpo`` ``G_t - mean``, ``rloo`` ``n / (n - 1) (G_t -
    mean)``. A step with fewer than 2 running episodes in its group, or whose running episodes' scores
    are all equal (to 1e-9 of their size), gets 0. Every episode runs at ``t = 0``, so the first
    step's advantage is :func:`group_advantages` of the episode returns.

    Returns:
        ``(advantages_TN, flat_G)``: invalid rows get 0; ``flat_G``: whether each group got 0 on every
        step (no policy gradient), the group counted in ``zero_adv_groups``.

    Raises:
        ValueError: ``group_size`` < 2 or not a divisor of ``N``, or an unknown ``kind``.
    """
    valid_TN = np.asarray(valid_TN, dtype=bool)
    T, N = valid_TN.shape
    if group_size < 2 or N % group_size:
        raise ValueError(f"group_size={group_size}: use at least 2, a divisor of the {N} episodes")
    if kind not in ("grpo", "dr_grpo", "rloo"):
        raise ValueError(f"unknown group advantage {kind!r}: use grpo, dr_grpo or rloo")
    r_TN = np.where(valid_TN, np.asarray(rewards_TN, dtype=np.float64), 0.0)
    rtg_TN = np.flip(np.cumsum(np.flip(r_TN, axis=0), axis=0), axis=0)  # sum of r[t:] per env
    shape = (T, N // group_size, group_size)
    g_TGM, v_TGM = rtg_TN.reshape(shape), valid_TN.reshape(shape)
    n_TG1 = v_TGM.sum(axis=2, keepdims=True)
    mean_TG1 = np.where(v_TGM, g_TGM, 0.0).sum(axis=2, keepdims=True) / np.maximum(n_TG1, 1)
    centred_TGM = np.where(v_TGM, g_TGM - mean_TG1, 0.0)
    if kind == "grpo":
        std_TG1 = np.sqrt((centred_TGM**2).sum(axis=2, keepdims=True) / np.maximum(n_TG1 - 1, 1))
        adv_TGM = centred_TGM / (std_TG1 + eps)
    elif kind == "dr_grpo":
        adv_TGM = centred_TGM
    else:
        adv_TGM = centred_TGM * n_TG1 / np.maximum(n_TG1 - 1, 1)
    hi_TG1 = np.where(v_TGM, g_TGM, -np.inf).max(axis=2, keepdims=True)
    lo_TG1 = np.where(v_TGM, g_TGM, np.inf).min(axis=2, keepdims=True)
    size_TG1 = np.maximum(1.0, np.where(v_TGM, np.abs(g_TGM), 0.0).max(axis=2, keepdims=True))
    silent_TG1 = (n_TG1 < 2) | (hi_TG1 - lo_TG1 <= 1e-9 * size_TG1)
    adv_TGM = np.where(silent_TG1 | ~v_TGM, 0.0, adv_TGM)
    return adv_TGM.reshape(T, N), silent_TG1[:, :, 0].all(axis=0)


def resolve_loss_agg(loss_agg: str, advantage: str) -> str:
    """``--loss-agg auto``: the papers' choice, seq-mean-token-sum-norm for Dr. GRPO, token-mean for the rest."""
    if loss_agg != "auto":
        return loss_agg
    return "seq-mean-token-sum-norm" if advantage == "dr_grpo" else "token-mean"


def unit_norms(units: list[int], seqs: list[Any], loss_agg: str, budget: int, dist_sum: Any = None) -> list[float]:
    """The divisor of each sample's summed unit losses in one optimizer step's loss.

    ``units``: each sample's unit count (1 in candidates mode, its tokens in generate mode);
    ``seqs``: each sample's sequence key (sequences never straddle ranks); ``budget``: the constant
    of ``seq-mean-token-sum-norm``, the most units a sequence can have. ``dist_sum`` sums a count
    over all ranks (DDP), so every divisor is global and any split of the step into ranks and
    micro-batches gives the same gradient.

    - ``token-mean``: all units of the step.
    - ``seq-mean-token-mean``: sequences x the units of the sample's sequence in the step.
    - ``seq-mean-token-sum-norm``: sequences x ``budget`` (Dr. GRPO: a constant, so a long
      sequence's tokens weigh as much as a short one's).
    """
    dist_sum = dist_sum or (lambda x: x)
    if loss_agg == "token-mean":
        total = float(dist_sum(sum(units)))
        return [total] * len(units)
    n_seqs = float(dist_sum(len(set(seqs))))
    if loss_agg == "seq-mean-token-sum-norm":
        return [n_seqs * budget] * len(units)
    if loss_agg == "seq-mean-token-mean":
        per_seq: dict[Any, int] = defaultdict(int)
        for n, key in zip(units, seqs):
            per_seq[key] += n
        return [n_seqs * per_seq[key] for key in seqs]
    raise ValueError(f"unknown loss aggregation {loss_agg!r}")


def value_loss(value: torch.Tensor, old_value: torch.Tensor, ret: torch.Tensor, clip: float) -> torch.Tensor:
    """Per-sample ``0.5 * max((v - R)^2, (v_clipped - R)^2)``; unclipped when ``clip`` is 0."""
    unclipped = (value - ret) ** 2
    if clip <= 0:
        return 0.5 * unclipped
    clipped = old_value + torch.clamp(value - old_value, -clip, clip)
    return 0.5 * torch.maximum(unclipped, (clipped - ret) ** 2)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float = 10.0) -> torch.Tensor:
    """k3 estimator of KL(pi || ref) per unit: ``exp(d) - 1 - d`` with ``d = ref - logp`` clamped."""
    d = torch.clamp(ref_logp - logp, -clamp, clamp)
    return torch.exp(d) - 1 - d


# -- the loss of a micro-batch: the policy's terms recomputed with grad, then the functions above ---------


def step_unit_norms(trs: list[Transition], cfg: TrainConfig, dist_sum: Any = None) -> list[float]:
    """:func:`unit_norms` of one optimizer step's transitions under ``--loss-agg``.

    A transition's units are 1 in candidates mode and its sampled tokens (at least 1) in generate
    mode; the budget of a sequence is ``rollout_steps`` of them (``max_new_tokens`` per step).
    """
    loss_agg = resolve_loss_agg(cfg.ppo.loss_agg, cfg.ppo.advantage)
    budget = cfg.ppo.rollout_steps * (1 if cfg.env.mode == "candidates" else cfg.ppo.max_new_tokens)
    units = [1 if cfg.env.mode == "candidates" else max(len(tr.new_ids), 1) for tr in trs]
    return unit_norms(units, [tr.env_index for tr in trs], loss_agg, budget, dist_sum)


def unit_terms(
    policy: Policy, tr: Transition, cfg: TrainConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Recompute (with grad) one transition's per-unit log-probs and entropies, and its value.

    A unit is the chosen candidate (candidates mode) or a sampled token (generate mode). Returns
    ``(logp_U, entropy_U, value, old_logp_U, drift)``; ``drift`` is the mean squared distance of the
    K candidates' scores from the reference model's (candidates mode with reference scores; else 0).
    """
    return unit_terms_many(policy, [tr], cfg)[0]


def unit_terms_many(
    policy: Policy, trs: list[Transition], cfg: TrainConfig
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """:func:`unit_terms` of many transitions; an episode's transitions share one encoding of their prompts."""
    dev = policy.device
    if cfg.env.mode != "candidates":
        outs = policy.sequence_logprobs_many([(tr.prompt_ids, tr.new_ids) for tr in trs])
        zero = torch.zeros((), device=dev)
        return [(lp, ent, v, torch.tensor(tr.token_logprobs, device=dev), zero) for (lp, ent, v), tr in zip(outs, trs)]
    terms = []
    for out, tr in zip(policy.score_candidates_many([(tr.prompt_ids, tr.cand_ids) for tr in trs], cfg.ppo.scoring), trs):
        logp_K = candidate_logprobs(out.scores_K, tr.baseline_scores or None, cfg.ppo)
        entropy = -(logp_K.exp() * logp_K).sum().reshape(1)
        drift = torch.zeros((), device=dev)
        if tr.baseline_scores:
            base_K = torch.tensor(tr.baseline_scores, device=out.scores_K.device, dtype=out.scores_K.dtype)
            drift = ((out.scores_K - base_K) ** 2).mean()
        old = torch.tensor([tr.logprob], device=dev)
        terms.append((logp_K[tr.action : tr.action + 1], entropy, out.value, old, drift))
    return terms


class PPOLoss(torch.nn.Module):
    """A micro-batch's PPO loss as a module's forward, so DDP can wrap it; its parameters are the policy's."""

    def __init__(self, policy: Policy, cfg: TrainConfig) -> None:
        super().__init__()
        self.policy, self.cfg = policy, cfg

    def forward(
        self,
        batch: list[tuple[Transition, float, float]],
        ent_coef: float,
        critic_w: float,
        unit_norms: list[float],
        n_samples: float,
        stats: dict[str, list[float]],
    ) -> torch.Tensor:
        """The summed loss of ``batch``: each sample's unit losses over its ``unit_norms`` entry
        (:func:`unit_norms`), the value loss (when the policy has a value head) over ``n_samples``."""
        cfg, policy = self.cfg, self.policy
        clip_low, clip_high = clip_range(cfg.ppo.clip, cfg.ppo.clip_low, cfg.ppo.clip_high)
        loss = torch.zeros((), device=policy.device)
        terms = unit_terms_many(policy, [b[0] for b in batch], cfg)
        for (tr, adv, ret), (logp, ent, value, old, drift), norm in zip(batch, terms, unit_norms):
            pg, ratio, clipped = policy_loss(logp, old, torch.full_like(logp, adv), clip_low, clip_high)
            kl = k3_kl(logp, torch.tensor(tr.ref_logprobs, device=logp.device), cfg.ppo.kl_clamp)
            unit_loss = pg + cfg.ppo.kl_coef * kl - ent_coef * ent + cfg.ppo.anchor_coef * drift
            loss = loss + unit_loss.sum() / norm
            vl = None
            if policy.value_head is not None:  # no critic under a group advantage
                vl = value_loss(value, torch.tensor(tr.value), torch.tensor(ret), cfg.ppo.value_clip)
                loss = loss + cfg.ppo.vf_coef * critic_w * vl / n_samples
            with torch.no_grad():
                if vl is not None:
                    stats["vf"].append(float(vl))
                stats["pg"].append(float(pg.mean()))
                stats["entropy"].append(float(ent.mean()))
                stats["kl_ref"].append(float(kl.mean()))
                stats["approx_kl"].append(float(((ratio - 1) - torch.log(ratio)).mean()))
                stats["clipfrac"].append(float(clipped.mean()))
                stats.setdefault("drift", []).append(float(drift))
        return loss


_LAYER = re.compile(r"\.layers\.(\d+)\.")


def clip_groups(named: list[tuple[str, torch.nn.Parameter]]) -> dict[str, list[torch.nn.Parameter]]:
    """Parameters by transformer block (``layer.3``), the value head, and the rest."""
    groups: dict[str, list[torch.nn.Parameter]] = defaultdict(list)
    for name, p in named:
        m = _LAYER.search(name)
        key = f"layer.{m.group(1)}" if m else ("value_head" if name.startswith("value_head") else "other")
        groups[key].append(p)
    return dict(groups)


def clip_gradients(groups: dict[str, list[torch.nn.Parameter]], max_norm: float, mode: str = "per-layer") -> dict[str, float]:
    """Clip per block (each group to ``max_norm`` on its own) or globally; returns norms before clipping."""
    if mode == "global":
        params = [p for ps in groups.values() for p in ps if p.grad is not None]
        return {"global": float(torch.nn.utils.clip_grad_norm_(params, max_norm))}
    norms = {}
    for key, ps in groups.items():
        ps = [p for p in ps if p.grad is not None]
        if ps:
            norms[key] = float(torch.nn.utils.clip_grad_norm_(ps, max_norm))
    return norms
