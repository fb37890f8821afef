"""Episodes: each env's seeds, what the policy remembers of its episode, and the vector env that plays them.

The vector env runs with autoreset disabled and the trainer resets a finished sub-env itself
(``reset(seed=..., options={"reset_mask": ...})``), so that episode ``e`` of global env ``k`` always
gets the seed ``episode_seed(run_seed, k, e)``, and each env has its own sampling generator. A run
with 2 ranks x N envs and one with 1 rank x 2N envs therefore play the same episodes with the same
actions, and a checkpoint can restore every env exactly by replaying its current episode's actions.
An episode moves on one :class:`Transition` (one action of one env) at a time; a rollout
(:mod:`agentrl_train.rollout`) is a window of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import agentrl_envs  # noqa: F401  (registers the ids)
from agentrl_envs.errors import ConfigError

__all__ = ["EnvPool", "EpisodeStates", "Transition", "episode_seed", "sub_info"]


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
