"""Rollouts: the policy acting in a vector env, one transition per sub-env per step.

The vector env runs with autoreset disabled and the trainer resets a finished sub-env itself
(``reset(seed=..., options={"reset_mask": ...})``), so that episode ``e`` of global env ``k`` always
gets the seed ``episode_seed(run_seed, k, e)``, and each env has its own sampling generator. A run
with 2 ranks x N envs and one with 1 rank x 2N envs therefore play the same episodes with the same
actions, and a checkpoint can restore every env exactly by replaying its current episode's actions.
There are no reset rows: every row of a rollout is a transition (``valid`` marks the rest).

A truncated episode is bootstrapped from V(final observation) (``truncation_values``), a terminated
one from 0; the last row of a rollout from V(current state) (``last_values``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import agentrl_envs  # noqa: F401  (registers the ids)
from agentrl_envs.errors import ConfigError

__all__ = [
    "EnvPool",
    "EpisodeStates",
    "Rollout",
    "Transition",
    "act",
    "act_many",
    "action_text",
    "candidate_logprobs",
    "candidate_policy",
    "collect",
    "episode_seed",
    "sub_info",
]


def episode_seed(run_seed: int, env_index: int, episode: int) -> int:
    """The seed of episode ``episode`` of global env ``env_index`` (independent of the world size)."""
    return int(
        np.random.SeedSequence([abs(run_seed), env_index, episode, 0 if run_seed >= 0 else 1]).generate_state(1)[0] & 0x7FFFFFFF
    )


@dataclass
class Transition:
    """One action of one sub-env, with what the update needs to recompute its log-probs."""

    env_index: int  #: global env index k
    prompt_ids: list[int]
    action_text: str
    cand_ids: list[list[int]] = field(default_factory=list)  #: candidates mode: token ids of each candidate
    action: int = -1  #: candidates mode: index of the chosen candidate
    new_ids: list[int] = field(default_factory=list)  #: generate mode: the sampled token ids
    logprob: float = 0.0  #: candidates: log pi(a); generate: sum of token log-probs
    token_logprobs: list[float] = field(default_factory=list)  #: generate mode: per token
    ref_logprobs: list[float] = field(default_factory=list)  #: per unit (1 in candidates mode, per token in generate)
    value: float = 0.0
    baseline_scores: list[float] = field(
        default_factory=list
    )  #: candidates mode, score_baseline=reference: the reference's scores
    version: int = -1  #: the adapter version a rollout server sampled it with (-1: the trainer's own model)


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


class EpisodeStates:
    """What the policy acts on, per env: the episode's messages, tools, last info, token stream,
    kept prompt keys/values and sampling generator.

    Rollouts (:class:`EnvPool`) and evaluation (:func:`agentrl_train.evaluate.evaluate`) both keep
    their episodes here and go through the same :meth:`prompt` and :meth:`advance`, so in generate
    mode evaluation sees exactly the token ids training sees (no re-tokenized text).
    """

    def __init__(self, n: int, first_index: int = 0) -> None:
        self.first_index = first_index  #: global index of env 0
        self.messages: list[list[dict[str, str]]] = [[] for _ in range(n)]
        self.tools: list[Any] = [None] * n
        self.infos: list[dict[str, Any]] = [{} for _ in range(n)]
        self.streams: list[list[int]] = [[] for _ in range(n)]  #: generate mode: the token stream (token in, token out)
        #: each env's prompt keys/values under the policy and the reference, kept between its steps (``act``)
        self.prompt_states: list[dict[str, Any]] = [{} for _ in range(n)]
        self.generators = [torch.Generator() for _ in range(n)]

    def start(self, i: int, obs: Any, info: dict[str, Any]) -> None:
        """Env i begins an episode with observation ``obs``."""
        self.infos[i] = info
        self.tools[i] = info["tools"]
        self.messages[i] = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": str(obs)}]
        self.streams[i] = []
        self.prompt_states[i] = {}

    def prompt(self, policy: Any, i: int, cfg: Any) -> list[int]:
        """Env i's current prompt: its token stream in generate mode (begun from the template), else the template's encoding."""
        if cfg.env.mode == "generate":
            if not self.streams[i]:
                self.streams[i] = policy.encode_prompt(self.messages[i], self.tools[i], cfg.ppo.max_prompt_tokens)
            return self.streams[i]
        return policy.encode_prompt(self.messages[i], self.tools[i], cfg.ppo.max_prompt_tokens)

    def advance(self, policy: Any, i: int, tr: Transition, obs: Any, info: dict[str, Any], cfg: Any) -> None:
        """Env i took ``tr`` and the env answered ``obs``: the messages and the token stream move on."""
        self.infos[i] = info
        self.messages[i] += [{"role": "assistant", "content": tr.action_text}, {"role": "tool", "content": str(obs)}]
        if cfg.env.mode == "generate":
            self.streams[i] = policy.continue_stream(
                tr.prompt_ids, self.messages[i], self.tools[i], tr.new_ids, cfg.ppo.max_prompt_tokens
            )


class EnvPool(EpisodeStates):
    """A vector env plus the trainer's per-env episode state (:class:`EpisodeStates`, seeds, returns).

    Args:
        env_id: registered id.
        num_envs: local sub-envs.
        first_index: global index of local env 0 (rank x num_envs under DDP).
        run_seed: the run's seed.
        vectorization: ``async`` or ``sync``.
        make_kwargs: for ``gym.make`` (split, candidates, error_profile, ...).
        wrap: optional callable applied to the vector env (e.g. a trajectory recorder).
        group_size: G > 0: global envs ``G g .. G g + G - 1`` form group ``g`` and play the same
            episode seeds (the same task), each with its own sampling generator (0: every env its own seeds).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        first_index: int = 0,
        run_seed: int = 0,
        vectorization: str = "async",
        make_kwargs: dict[str, Any] | None = None,
        wrap: Any = None,
        group_size: int = 0,
    ) -> None:
        if env_id not in gym.registry:
            near = [k for k in gym.registry if k.startswith("AgentRL/")]
            raise ConfigError(f"--env {env_id!r}: no such env id; use one of {', '.join(sorted(near))}")
        self.env_id = env_id
        self.num_envs = num_envs
        self.first_index = first_index
        self.run_seed = run_seed
        self.group_size = group_size
        kwargs = dict(make_kwargs or {})
        vec: Any = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode=vectorization,
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.DISABLED},
            wrappers=[Replayable],
            **kwargs,
        )
        super().__init__(num_envs, first_index)
        vec.set_attr("replay_index", [first_index + i for i in range(num_envs)])
        self.vec = vec  #: the plain vector env (call / set_attr); ``envs`` may be wrapped by a recorder
        self.envs: Any = wrap(vec) if wrap is not None else vec
        self.episode = [0] * num_envs  #: episodes started per env
        self.actions: list[list[str]] = [[] for _ in range(num_envs)]  #: current episode's actions (for exact resume)
        self.returns = [0.0] * num_envs
        self.lengths = [0] * num_envs
        self.last_subtask = [0] * num_envs
        self.generators = [
            torch.Generator().manual_seed(episode_seed(run_seed, first_index + i, 1 << 30)) for i in range(num_envs)
        ]

    def reset(self, mask: np.ndarray | None = None) -> None:
        """(Re)start the masked envs on their next episode seed."""
        mask = np.ones(self.num_envs, dtype=bool) if mask is None else mask
        seeds = [self.seed_of(i, self.episode[i]) if mask[i] else None for i in range(self.num_envs)]
        obs, info = self.envs.reset(seed=seeds, options={"reset_mask": mask})
        for i in map(int, np.flatnonzero(mask)):
            self.episode[i] += 1
            self.start(i, obs[i], sub_info(info, i))
            self.actions[i] = []
            self.returns[i] = 0.0
            self.lengths[i] = 0
            self.last_subtask[i] = -1

    def seed_of(self, i: int, episode: int) -> int:
        """The seed of local env i's episode ``episode``: its group's under ``group_size``, else its own."""
        k = self.first_index + i
        return episode_seed(self.run_seed, k // self.group_size if self.group_size else k, episode)

    def took(self, policy: Any, i: int, tr: Transition, obs: Any, info: dict[str, Any], reward: float, cfg: Any) -> None:
        """Env i took ``tr``, answered ``obs`` and paid ``reward``: its action log, stream, return and length move on."""
        self.actions[i].append(tr.action_text)
        self.advance(policy, i, tr, obs, info, cfg)
        self.returns[i] += float(reward)
        self.lengths[i] += 1

    def summary(self, i: int, info: dict[str, Any], *, truncated: bool) -> dict[str, Any]:
        """Env i's episode that just ended (``info``: its last step's), as the rollout reports it."""
        stats = info.get("fault_stats")
        return {
            "env_index": self.first_index + i,
            "return": self.returns[i],
            "length": self.lengths[i],
            "success": bool(info.get("success", False)),
            "truncated": truncated,
            "faults": int(stats.get("faults", 0)) if isinstance(stats, dict) else 0,
        }

    def hold(self, mask: np.ndarray) -> None:
        """Park the masked envs, whose episodes just ended, until their next :meth:`reset`.

        A parked env is not stepped: the vector env's steps return its last observation, reward 0
        and neither flag, and the rollout ignores them. The vector env needs a reset after an
        episode's end before its next step (autoreset is off); this is that reset, made on the
        plain vector env so that the recorder, which closed the episode when it ended, sees
        nothing of the wait.
        """
        self.vec.reset(options={"reset_mask": np.asarray(mask, dtype=bool), "hold": True})

    def set_training_step(self, step: int) -> None:
        self.vec.call("set_training_step", int(step))

    def close(self) -> None:
        self.envs.close()

    # -- exact resume ------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "episode": list(self.episode),
            "actions": [list(a) for a in self.actions],
            "messages": [list(m) for m in self.messages],
            "streams": [list(x) for x in self.streams],
            "returns": list(self.returns),
            "lengths": list(self.lengths),
            "last_subtask": list(self.last_subtask),
            "tools": list(self.tools),
            "generators": [g.get_state() for g in self.generators],
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Put every env back where the checkpoint left it: reset on the episode's seed, replay its actions."""
        if len(state["episode"]) != self.num_envs:
            raise ConfigError(
                f"checkpoint has {len(state['episode'])} local envs, this run {self.num_envs}: resume with the same --num-envs"
            )
        self.episode = list(state["episode"])
        plan = {
            self.first_index + i: (self.seed_of(i, self.episode[i] - 1), list(state["actions"][i])) for i in range(self.num_envs)
        }
        results = self.vec.call("replay", plan)
        for i, (obs, info) in enumerate(results):
            if str(obs) != state["messages"][i][-1]["content"]:
                raise ConfigError(
                    f"resume: replaying env {self.first_index + i}'s actions did not reproduce its last observation; "
                    "the env's version or backend changed since the checkpoint"
                )
            self.infos[i] = info
            self.tools[i] = state["tools"][i]
        self.actions = [list(a) for a in state["actions"]]
        self.messages = [list(m) for m in state["messages"]]
        self.streams = [list(x) for x in state["streams"]]
        self.returns, self.lengths = list(state["returns"]), list(state["lengths"])
        self.last_subtask = list(state["last_subtask"])
        for g, s in zip(self.generators, state["generators"]):
            g.set_state(s)


class Replayable(gym.Wrapper[Any, Any, Any, Any]):
    """Lets the trainer put a sub-env back into a recorded state: reset on a seed, replay actions.

    ``replay_index`` is set per sub-env (``vec.set_attr("replay_index", [...])``), so one
    ``vec.call("replay", plan)`` with ``plan = {index: (seed, actions)}`` restores every sub-env.
    """

    replay_index: int = -1
    _last: tuple[Any, dict[str, Any]] | None = None  #: the final (observation, info) of the episode that just ended
    _parked: bool = False  #: parked by EnvPool.hold: steps leave the env alone until the next reset

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if options and options.get("hold"):
            if self._last is None:
                raise ConfigError("EnvPool.hold: only an env whose episode has just ended can be parked")
            self._parked = True
            return self._last
        self._last, self._parked = None, False
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        if self._parked and self._last is not None:
            obs, info = self._last
            return obs, 0.0, False, False, info
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._last = (obs, info) if terminated or truncated else None
        return obs, reward, terminated, truncated, info

    def replay(self, plan: dict[int, tuple[int, list[str]]]) -> tuple[Any, dict[str, Any]]:
        seed, actions = plan[self.replay_index]
        self._last, self._parked = None, False
        obs, info = self.env.reset(seed=seed)
        for a in actions:
            obs, _, term, trunc, info = self.env.step(a)
            if term or trunc:
                raise ConfigError("resume: a replayed episode ended early; the checkpoint does not match this env")
        return obs, info


def sub_info(info: dict[str, Any], i: int) -> dict[str, Any]:
    """Sub-env i's view of a vector env's merged info (keys its ``_key`` mask leaves out are dropped)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not mask[i]:
            continue
        if isinstance(value, dict):
            out[key] = sub_info(value, i)
        else:
            out[key] = value[i]
    return out


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
