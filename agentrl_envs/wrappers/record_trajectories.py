"""Wrappers that record every episode of an env into a replay buffer, a shard writer or a list.

:class:`RecordTrajectories` wraps a single env, :class:`RecordVectorTrajectories` a vector env. A
sink is anything with ``append(trajectory)``: a :class:`~agentrl_envs.data.ReplayBuffer`, a
:class:`~agentrl_envs.data.ShardWriter`, or a plain list. Each step stores the observation the
policy acted on as ``prompt``, the action, the next observation (capped at the codec's limit), the
reward and ``info["reward_components"]``. Policy-side numbers the env cannot know (log-prob,
value, embedding, token arrays, a full prompt) are passed with :meth:`annotate` before ``step``.

Vector envs: episodes are cut per sub-env. Under Gymnasium's default NEXT_STEP autoreset, the step
after a sub-env is done is a reset step (its action is ignored and it returns the new episode's
first observation); it starts the next episode and is never recorded as a step. SAME_STEP (the
final observation arrives in ``info["final_obs"]``) and DISABLED (the caller resets with
``reset_mask``) are handled too. Non-text observations and actions are stored as their ``str()``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

from agentrl_envs.data.codec import DEFAULT_LIMITS, Limits, Trajectory, make_step

__all__ = ["RecordTrajectories", "RecordVectorTrajectories", "TrajectorySink"]

ANNOTATIONS = ("prompt", "log_prob", "value", "advantage", "embedding", "token_log_probs", "token_ids")
_INFO_KEYS = ("task_id", "domain", "split", "reward_components", "tool", "success")


class TrajectorySink(Protocol):
    """Where recorded trajectories go: ReplayBuffer, ShardWriter, list, or your own."""

    def append(self, traj: Trajectory, /) -> Any: ...


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


#: The largest seed a trajectory can record (its ``seed`` field is an int64).
MAX_RECORDED_SEED = 2**63 - 1


def _check_seed(seed: Any, span: int = 1) -> None:
    """ValueError for an int seed the trajectory cannot store (``span``: a vector env's sub-envs get seed + i).

    Other values are the env's to judge. Raised before the env resets, so no episode runs that the
    trajectory cannot store (protobuf would refuse the seed, "Value out of range", only when writing it).
    """
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and int(seed) > MAX_RECORDED_SEED - (span - 1):
        top = MAX_RECORDED_SEED - (span - 1)
        shown = repr(seed) if int(seed).bit_length() <= 256 else f"a {int(seed).bit_length()}-bit int"
        raise ValueError(
            f"reset(seed={shown:.80}): a recorded trajectory stores its seed as an int64; use a seed from 0 to "
            f"{'2**63 - 1' if span == 1 else top}"
        )


class _Episode:
    """The steps of one episode being recorded."""

    def __init__(self, env_id: str, obs: Any, info: Mapping[str, Any], seed: int | None, policy_id: str, limits: Limits):
        self.limits = limits
        self.traj = Trajectory(
            env_id=env_id,
            task_id=_text(info.get("task_id") or ""),
            domain=_text(info.get("domain") or ""),
            split=_text(info.get("split") or ""),
            episode_id=uuid.uuid4().hex,
            policy_id=policy_id,
            created_unix_ns=time.time_ns(),
        )
        if seed is not None:
            self.traj.seed = int(seed)
        self.prompt = _text(obs)

    def add(
        self, action: Any, obs: Any, reward: Any, terminated: Any, truncated: Any, info: Mapping[str, Any], notes: dict[str, Any]
    ) -> None:
        obs_text = _text(obs)
        components = info.get("reward_components")
        self.traj.steps.append(
            make_step(
                _text(action),
                obs_text,
                float(reward),
                {k: float(v) for k, v in components.items()} if isinstance(components, Mapping) else None,
                prompt=notes.pop("prompt", self.prompt),
                terminated=bool(terminated),
                truncated=bool(truncated),
                tool=_text(info.get("tool") or ""),
                limits=self.limits,
                **notes,
            )
        )
        self.prompt = obs_text

    def finish(self, info: Mapping[str, Any]) -> Trajectory:
        if self.traj.steps:
            last = self.traj.steps[-1]
            self.traj.terminated, self.traj.truncated = last.terminated, last.truncated
        self.traj.success = bool(info.get("success", False))
        return self.traj


def _check_annotations(fields: dict[str, Any], num_envs: int | None = None) -> None:
    """Refuse what ``make_step`` would refuse, now rather than after the env has stepped.

    ``num_envs`` (vector envs): each field holds one value per sub-env.
    """
    unknown = set(fields) - set(ANNOTATIONS)
    if unknown:
        raise TypeError(f"annotate() got unknown fields {sorted(unknown)}; use {', '.join(ANNOTATIONS)}")
    for name, given in fields.items():
        values = [given]
        if num_envs is not None:
            if isinstance(given, (str, bytes)) or not hasattr(given, "__len__"):
                raise TypeError(f"annotate({name}=...) needs one value per sub-env ({num_envs}), got {type(given).__name__}")
            if len(given) != num_envs:
                raise ValueError(f"annotate({name}=...) needs one value per sub-env ({num_envs}), got {len(given)}")
            values = list(given)
        for value in values:
            if not _note_ok(name, value):
                kind = "a str" if name == "prompt" else "a number" if name in _SCALAR_NOTES else "an array of numbers"
                raise TypeError(f"annotate({name}={value!r:.60}): use {kind}")


_SCALAR_NOTES = ("log_prob", "value", "advantage")


def _note_ok(name: str, value: Any) -> bool:
    """Whether ``make_step`` takes ``value`` for the annotation ``name``."""
    if name == "prompt":
        return isinstance(value, str)
    if isinstance(value, (str, bytes)):
        return False
    try:
        if name in _SCALAR_NOTES:
            float(value)  # what make_step does with it
            return True
        return np.asarray(value).dtype.kind in "biuf"
    except (TypeError, ValueError):  # not a number, several numbers, a ragged list
        return False


class RecordTrajectories(gym.Wrapper[Any, Any, Any, Any]):
    """Record each episode of a single env as one :class:`Trajectory` appended to ``sink``.

    Args:
        env: the env to record (any Gymnasium env; text envs get the most out of it).
        sink: where finished episodes go; the wrapper never closes it.
        policy_id: stored in every trajectory (a model name, checkpoint or run id).
        record_partial: also record an episode cut short by ``reset()`` or ``close()`` (with
            ``terminated`` and ``truncated`` both False).
        limits: caps for the observation and the checks the sink applies.
    """

    def __init__(
        self,
        env: gym.Env[Any, Any],
        sink: TrajectorySink,
        *,
        policy_id: str = "",
        record_partial: bool = True,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        if isinstance(env, VectorEnv):
            raise TypeError("RecordTrajectories wraps a single env; use RecordVectorTrajectories for a vector env")
        super().__init__(env)
        self.sink = sink
        self.policy_id = policy_id
        self.record_partial = record_partial
        self.limits = limits
        self.episodes_recorded = 0
        self._episode: _Episode | None = None
        self._notes: dict[str, Any] = {}

    def annotate(self, **fields: Any) -> None:
        """Attach policy-side fields (``log_prob``, ``value``, ``embedding``, ...) to the next step."""
        _check_annotations(fields)
        self._notes.update(fields)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        _check_seed(seed)  # before the episode in progress is flushed or the env touched
        self._flush_partial()
        obs, info = self.env.reset(seed=seed, options=options)
        env_id = self.env.spec.id if self.env.spec is not None else type(self.env.unwrapped).__name__
        self._episode = _Episode(env_id, obs, info, seed, self.policy_id, self.limits)
        self._notes = {}
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        notes, self._notes = self._notes, {}
        if self._episode is not None:
            self._episode.add(action, obs, reward, terminated, truncated, info, notes)
            if terminated or truncated:
                self._emit(self._episode, info)
                self._episode = None
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        try:
            self._flush_partial()
        finally:  # a sink that refuses the partial episode (closed, NaN reward) must not keep the env open
            super().close()

    def _flush_partial(self) -> None:
        if self._episode is not None and self._episode.traj.steps and self.record_partial:
            self._emit(self._episode, {})
        self._episode = None

    def _emit(self, episode: _Episode, info: Mapping[str, Any]) -> None:
        self.sink.append(episode.finish(info))
        self.episodes_recorded += 1


class RecordVectorTrajectories(VectorWrapper):
    """Record each sub-env's episodes of a vector env, cut correctly under every autoreset mode.

    Args are those of :class:`RecordTrajectories`. :meth:`annotate` takes one value per sub-env
    (an array of ``num_envs`` log-probs, a list of embeddings, ...).
    """

    def __init__(
        self,
        env: VectorEnv[Any, Any, Any],
        sink: TrajectorySink,
        *,
        policy_id: str = "",
        record_partial: bool = True,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        if not isinstance(env, VectorEnv):
            raise TypeError("RecordVectorTrajectories wraps a vector env; use RecordTrajectories for a single env")
        super().__init__(env)
        self.sink = sink
        self.policy_id = policy_id
        self.record_partial = record_partial
        self.limits = limits
        self.episodes_recorded = 0
        self.autoreset_mode = AutoresetMode(env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        self._episodes: list[_Episode | None] = [None] * self.num_envs
        self._resetting = np.zeros(self.num_envs, dtype=bool)
        self._notes: dict[str, Any] = {}
        self._env_id = env.spec.id if env.spec is not None else type(env).__name__

    def annotate(self, **fields: Any) -> None:
        """Attach per-sub-env policy-side fields to the next step: ``annotate(log_prob=lp_N, value=v_N)``."""
        _check_annotations(fields, self.num_envs)
        self._notes.update(fields)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        _check_seed(seed, self.num_envs)
        mask = (options or {}).get("reset_mask")  # read first: the vector env pops it from options
        obs, info = self.env.reset(seed=seed, options=options)
        for i in range(self.num_envs):
            if mask is not None and not mask[i]:
                continue
            self._flush_partial(i)
            sub_seed = seed + i if isinstance(seed, int) else None  # SyncVectorEnv seeds sub-env i with seed + i
            self._episodes[i] = _Episode(self._env_id, obs[i], _sub_info(info, i), sub_seed, self.policy_id, self.limits)
            self._resetting[i] = False
        self._notes = {}
        return obs, info

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, rewards, terminations, truncations, info = self.env.step(actions)
        notes, self._notes = self._notes, {}
        for i in range(self.num_envs):
            if self._resetting[i]:  # NEXT_STEP: this step reset sub-env i; its action was ignored
                self._episodes[i] = _Episode(self._env_id, obs[i], _sub_info(info, i), None, self.policy_id, self.limits)
                continue
            episode = self._episodes[i]
            if episode is None:
                continue
            done = bool(terminations[i] or truncations[i])
            step_notes = {name: values[i] for name, values in notes.items()}
            if done and self.autoreset_mode == AutoresetMode.SAME_STEP:
                final_info = _sub_info(info.get("final_info", {}), i)
                episode.add(actions[i], info["final_obs"][i], rewards[i], terminations[i], truncations[i], final_info, step_notes)
                self._emit(episode, final_info)
                self._episodes[i] = _Episode(self._env_id, obs[i], _sub_info(info, i), None, self.policy_id, self.limits)
                continue
            sub = _sub_info(info, i)
            episode.add(actions[i], obs[i], rewards[i], terminations[i], truncations[i], sub, step_notes)
            if done:
                self._emit(episode, sub)
                self._episodes[i] = None
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            self._resetting = np.logical_or(terminations, truncations)
        return obs, rewards, terminations, truncations, info

    def close(self, **kwargs: Any) -> None:
        try:
            for i in range(self.num_envs):
                self._flush_partial(i)
        finally:  # as in RecordTrajectories.close: the env closes even if the sink refuses an episode
            super().close(**kwargs)

    def _flush_partial(self, i: int) -> None:
        episode = self._episodes[i]
        if episode is not None and episode.traj.steps and self.record_partial:
            self._emit(episode, {})
        self._episodes[i] = None

    def _emit(self, episode: _Episode, info: Mapping[str, Any]) -> None:
        self.sink.append(episode.finish(info))
        self.episodes_recorded += 1


def _sub_info(info: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Sub-env ``i``'s view of a vector info dict (values of the keys the recorder reads)."""
    out: dict[str, Any] = {}
    for key in _INFO_KEYS:
        if key not in info:
            continue
        mask = info.get("_" + key)
        if mask is not None and not mask[i]:
            continue
        value = info[key]
        if isinstance(value, Mapping):
            out[key] = {
                k: _item(v[i]) for k, v in value.items() if not k.startswith("_") and (f"_{k}" not in value or value[f"_{k}"][i])
            }
        else:
            out[key] = _item(value[i])
    return out


def _item(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value
