"""Rollouts: the policy acting in a vector env, one transition per sub-env per step.

The envs and their episodes are :class:`~agentrl_train.episodes.EnvPool`'s (seeds, resets, exact
resume); here the policy acts in them (:func:`act_many`: candidates or generate mode) and
:func:`collect` gathers ``rollout_steps`` steps of every env into a :class:`Rollout`. There are no
reset rows: every row of a rollout is a transition (``valid`` marks the rest).

A truncated episode is bootstrapped from V(final observation) (``truncation_values``), a terminated
one from 0; the last row of a rollout from V(current state) (``last_values``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agentrl_envs.errors import ConfigError
from agentrl_train.episodes import EnvPool, EpisodeStates, Transition, sub_info

__all__ = [
    "Rollout",
    "act",
    "act_many",
    "action_text",
    "candidate_logprobs",
    "candidate_policy",
    "collect",
]


@dataclass
class Rollout:
    """``T`` steps of ``N`` sub-envs; arrays are ``[T, N]``."""

    transitions: list[list[Transition | None]]  #: [T][N]; None where ``valid_TN`` is False
    rewards_TN: np.ndarray
    terminated_TN: np.ndarray
    truncated_TN: np.ndarray
    values_TN: np.ndarray
    truncation_values_TN: np.ndarray
    boundaries_TN: np.ndarray  #: first step of a new sub-task (by info["subtask_index"])
    last_values_N: np.ndarray
    episodes: list[dict[str, Any]]  #: finished episodes: return, success, length, fault stats
    env_seconds: float = 0.0
    model_seconds: float = 0.0
    tokens: int = 0
    #: whether row t of env i is a transition (a group rollout leaves an env idle once its episode ended); empty: all
    valid_TN: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    #: group rollouts: each env's episode was still running when the window of rollout_steps closed
    cut_N: np.ndarray | None = None
    #: a server rollout: the prompts whose V(s) the trainer computes afterwards (:func:`score_rollout`):
    #: the final observation of each truncated episode, by ``(t, i)``, and each env's last prompt
    value_prompts: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    last_prompts: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.valid_TN.size == 0:
            self.valid_TN = np.ones(self.rewards_TN.shape, dtype=bool)


def candidate_logprobs(scores_K: torch.Tensor, base_K: torch.Tensor | list[float] | None, ppo: Any) -> torch.Tensor:
    """The candidates-mode policy: ``log_softmax((score - w * baseline) / temperature)``.

    With ``score_baseline="reference"`` the baseline is the reference model's score of the same
    candidate and ``w`` is ``reference_weight``. At ``w = 1`` only what the adapter learned moves the
    policy (the base model's preference for short candidates, or for one it already sees in its
    context, cancels out) and an untrained adapter is a uniform policy. Below 1 a share ``1 - w`` of
    the base model's preference stays: the untrained policy is ``softmax((1 - w) * base / T)``, and an
    update has to overcome those margins before it changes a greedy choice. Else no baseline.
    """
    if ppo.score_baseline == "reference" and base_K is not None:
        base = base_K if isinstance(base_K, torch.Tensor) else torch.tensor(base_K, device=scores_K.device)
        scores_K = scores_K - ppo.reference_weight * base.to(scores_K.dtype)
    return torch.log_softmax(scores_K / ppo.temperature, dim=-1)


def greedy_candidate(logp_K: torch.Tensor, base_K: torch.Tensor | None, tol: float = 1e-6) -> int:
    """The greedy choice: the policy's most likely candidate, ties going to the reference model's preference.

    Under ``score_baseline="reference"`` an untrained adapter gives every candidate the same
    probability, and a plain ``argmax`` would take the first of the env's shuffled candidates: a
    random agent, not a greedy one. Candidates within ``tol`` of the best log-prob are tied, and the
    reference model's own score (``base_K``) decides between them, so the greedy policy at update 0
    is the base model's greedy policy.
    """
    best = int(torch.argmax(logp_K))
    if base_K is None:
        return best
    tied = logp_K >= logp_K[best] - tol
    if int(tied.sum()) < 2:
        return best
    key = torch.where(tied, base_K.to(logp_K.dtype), torch.full_like(logp_K, -torch.inf))
    return int(torch.argmax(key))


def candidate_policy(
    policy: Any,
    prompt: Sequence[int],
    cand_ids: Sequence[Sequence[int]],
    ppo: Any,
    *,
    reference: bool = True,
    states: dict[str, Any] | None = None,
) -> tuple[Any, torch.Tensor | None, torch.Tensor]:
    """The candidates-mode policy in one state: the policy's scores (with V), the reference model's
    scores (None unless ``reference`` or ``score_baseline="reference"`` needs them) and the log-probs.

    ``states`` (one env's, kept between its steps): the prompts' keys/values under the policy and
    the reference, so that a step encodes only the tokens its prompt added to the last one's.
    """
    out = _score(policy, prompt, cand_ids, ppo.scoring, states, "policy")
    base_K = None
    if reference or ppo.score_baseline == "reference":
        with policy.reference():
            base_K = _score(policy, prompt, cand_ids, ppo.scoring, states, "reference").scores_K
    return out, base_K, candidate_logprobs(out.scores_K, base_K, ppo)


def _prompt_state(policy: Any, prompt: Sequence[int], states: dict[str, Any] | None, key: str) -> Any:
    """One env's prompt keys/values under ``key`` (``policy`` or ``reference``), extended to ``prompt``.

    None: encode the prompt from scratch (no ``states``, or a model whose cache cannot be cut back).
    """
    if states is None or states.get("uncached"):
        return None
    state = policy.extend_prompt(prompt, states.get(key))
    if state is None:
        states.clear()
        states["uncached"] = True
        return None
    states[key] = state
    return state


def _score(policy: Any, prompt: Sequence[int], cand_ids: Sequence[Sequence[int]], scoring: str, states: Any, key: str) -> Any:
    state = _prompt_state(policy, prompt, states, key)
    if state is None:
        return policy.score_candidates(prompt, cand_ids, scoring)
    return policy.score_candidates_on(state, cand_ids, scoring)


@torch.no_grad()
def act(policy: Any, pool: EpisodeStates, i: int, cfg: Any, *, greedy: bool = False, reference: bool = True) -> Transition:
    """The policy's action for local env i in its current state (no grad, dropout off): :func:`act_many` of one env."""
    return act_many(policy, pool, [i], cfg, greedy=greedy, reference=reference)[0]


@torch.no_grad()
def act_many(
    policy: Any,
    pool: EpisodeStates,
    envs: Sequence[int],
    cfg: Any,
    *,
    greedy: bool = False,
    reference: bool = True,
    engine: Any = None,
) -> list[Transition]:
    """The policy's actions for the local envs ``envs`` in their current states (no grad, dropout off).

    Each env's prompt keys/values are kept in ``pool.prompt_states`` between its steps. In
    generate mode all envs' tokens are decoded together (:meth:`Policy.generate_many`), or by the
    rollout servers of ``engine`` (:class:`~agentrl_train.rollout_engine.ServerEngine`): then the
    transitions carry the server's ids and log-probs only, and their values and reference
    log-probs are filled in later (:func:`~agentrl_train.rollout_engine.score_rollout`).
    """
    if cfg.env.mode == "candidates":
        return [_act_candidates(policy, pool, i, cfg, greedy=greedy, reference=reference) for i in envs]
    ppo = cfg.ppo
    prompts = [pool.prompt(policy, i, cfg) for i in envs]
    if engine is not None:
        # a server seed per env and step from the env's own generator: the same rollout on a resume
        seeds = [None if greedy else int(torch.randint(0, 2**31 - 1, (1,), generator=pool.generators[i])) for i in envs]
        return [
            Transition(
                pool.first_index + i,
                list(p),
                action_text(policy.tokenizer, ids),
                new_ids=ids,
                logprob=float(sum(lps)),
                token_logprobs=lps,
                version=engine.version,
            )
            for i, p, (ids, lps) in zip(envs, prompts, engine.sample(prompts, ppo.max_new_tokens, seeds))
        ]
    states = [_prompt_state(policy, p, pool.prompt_states[i], "policy") for p, i in zip(prompts, envs)]
    gens = [None if greedy else pool.generators[i] for i in envs]
    if all(st is not None for st in states):
        sampled = policy.generate_many(states, ppo.max_new_tokens, greedy=greedy, generators=gens)
    else:  # a model whose cache cannot be cut back: one env at a time, each prompt encoded from scratch
        sampled = [policy.generate(p, ppo.max_new_tokens, greedy=greedy, generator=g) for p, g in zip(prompts, gens)]
    out = []
    for i, prompt, (new_ids, lps, value) in zip(envs, prompts, sampled):
        ref: list[float] = []
        if reference:
            with policy.reference():
                ref_state = _prompt_state(policy, prompt, pool.prompt_states[i], "reference")
                if ref_state is None:
                    ref_lp, _, _ = policy.sequence_logprobs(prompt, new_ids)
                else:
                    ref_lp, _, _ = policy.sequence_logprobs_on(ref_state, new_ids)
            ref = ref_lp.tolist()
        out.append(
            Transition(
                pool.first_index + i,
                list(prompt),
                action_text(policy.tokenizer, new_ids),
                new_ids=new_ids,
                logprob=float(sum(lps)),
                token_logprobs=lps,
                ref_logprobs=ref,
                value=value,
            )
        )
    return out


def action_text(tokenizer: Any, new_ids: Sequence[int]) -> str:
    """The env action of sampled ids: their text without a final end-of-turn token."""
    text = tokenizer.decode(list(new_ids), skip_special_tokens=False)
    for end in ("<|im_end|>", "<|eot_id|>", "<|end|>", tokenizer.eos_token or "<|im_end|>"):
        if text.endswith(end):
            return text[: -len(end)]
    return text


def _act_candidates(policy: Any, pool: EpisodeStates, i: int, cfg: Any, *, greedy: bool, reference: bool) -> Transition:
    ppo = cfg.ppo
    prompt = pool.prompt(policy, i, cfg)
    states = pool.prompt_states[i]
    cands = list(pool.infos[i].get("candidates") or [])
    if len(cands) < 2:
        raise ConfigError("candidates mode needs info['candidates']: make the env with candidates=K (K >= 2)")
    cand_ids = [policy.encode_action(c) for c in cands]
    out, base_K, logp_K = candidate_policy(policy, prompt, cand_ids, ppo, reference=reference, states=states)
    if greedy:
        a = greedy_candidate(logp_K, base_K)
    else:
        a = int(torch.multinomial(logp_K.exp().cpu(), 1, generator=pool.generators[i]))
    ref: list[float] = []
    if base_K is not None:
        ref = [float(candidate_logprobs(base_K, base_K, ppo)[a])]
    baseline = base_K.tolist() if base_K is not None and ppo.score_baseline == "reference" else []
    return Transition(
        pool.first_index + i,
        prompt,
        cands[a],
        cand_ids=cand_ids,
        action=a,
        logprob=float(logp_K[a]),
        ref_logprobs=ref,
        value=float(out.value),
        baseline_scores=baseline,
    )


def collect(policy: Any, pool: EnvPool, cfg: Any, recorder: Any = None, engine: Any = None) -> Rollout:
    """Run ``cfg.ppo.rollout_steps`` steps of every sub-env with the sampling policy.

    With a rollout ``engine`` the trainer's model is not used here (this may run in a thread while
    it trains): the prompts whose V(s) the rollout needs are kept, for
    :func:`~agentrl_train.rollout_engine.score_rollout`.
    """
    T, N = cfg.ppo.rollout_steps, pool.num_envs
    shape = (T, N)
    rewards, term, trunc = np.zeros(shape), np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)
    values, tvalues, bounds = np.zeros(shape), np.zeros(shape), np.zeros(shape, dtype=bool)
    transitions: list[list[Transition | None]] = []
    episodes: list[dict[str, Any]] = []
    env_s = model_s = 0.0
    tokens = 0
    value_prompts: dict[tuple[int, int], list[int]] = {}
    if engine is None:
        policy.eval()
    pool.prompt_states = [{} for _ in range(N)]  # keys/values of the weights before the last update are stale
    for t in range(T):
        t0 = time.perf_counter()
        row = act_many(policy, pool, range(N), cfg, engine=engine)
        model_s += time.perf_counter() - t0
        tokens += sum(len(tr.prompt_ids) + sum(len(c) for c in tr.cand_ids) + len(tr.new_ids) for tr in row)
        for i, tr in enumerate(row):
            working = int(pool.infos[i].get("subtask_index", 0))
            bounds[t, i] = pool.last_subtask[i] != -1 and working != pool.last_subtask[i]
            pool.last_subtask[i] = working
            values[t, i] = tr.value
        if recorder is not None:
            recorder.annotate(log_prob=np.array([tr.logprob for tr in row], dtype=np.float32), value=values[t].astype(np.float32))
        t0 = time.perf_counter()
        obs, rew, te, tu, info = pool.envs.step([tr.action_text for tr in row])
        env_s += time.perf_counter() - t0
        transitions.append(list(row))
        rewards[t], term[t], trunc[t] = rew, te, tu
        done = np.logical_or(te, tu)
        for i, tr in enumerate(row):
            sub = sub_info(info, i)
            pool.took(policy, i, tr, obs[i], sub, rew[i], cfg)
            if done[i]:
                episodes.append(pool.summary(i, sub, truncated=bool(tu[i])))
                if tu[i] and not te[i]:  # V(final observation), from the same token stream as every other V(s_t)
                    value_prompts[t, i] = list(pool.prompt(policy, i, cfg))
        if done.any():
            t0 = time.perf_counter()
            pool.reset(done)
            env_s += time.perf_counter() - t0
    last_prompts = [list(pool.prompt(policy, i, cfg)) for i in range(N)]
    roll = Rollout(transitions, rewards, term, trunc, values, tvalues, bounds, np.zeros(N), episodes, env_s, model_s, tokens)
    if engine is not None:
        roll.value_prompts, roll.last_prompts = value_prompts, last_prompts
        return roll
    t0 = time.perf_counter()
    with torch.no_grad():
        for (t, i), prompt in value_prompts.items():
            roll.truncation_values_TN[t, i] = float(policy.value(prompt))
        roll.last_values_N = np.array([float(policy.value(p)) for p in last_prompts])
    roll.model_seconds += time.perf_counter() - t0
    return roll
