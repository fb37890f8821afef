"""One agentrl episode played by tool calls: what the MCP and OpenEnv servers share.

A server turns a call ``(name, arguments)`` into the env's canonical action text with
:func:`~agentrl_envs.core.actions.format_call` and steps the env with it, so faults, the virtual clock,
the backend and the reward are the env's own: the same seed and the same calls give the same
observations and rewards as ``gym.make`` in process. A call the env refuses (unknown tool, wrong
argument types, an action over the length limit) is a step with the env's format penalty, as the
same text would be in process.

Remote clients may choose some ``gym.make`` keywords per session (:data:`SESSION_KWARGS`);
:func:`session_kwargs` checks them. Keywords that reach the server's files or network (a fault
profile given as a YAML path, a backend URL, the Python sandbox switches) are the operator's,
set when the server starts.
"""

from __future__ import annotations

import importlib
import json
import numbers
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

import agentrl_envs
from agentrl_envs.core.actions import format_call
from agentrl_envs.errors import AgentRLError, ConfigError, EpisodeError

__all__ = ["SESSION_KWARGS", "Episode", "StepOutcome", "check_env_id", "session_kwargs", "tool_result"]

#: ``gym.make`` keywords a client may set per session (OpenEnv reset keywords). The values are
#: checked by :func:`session_kwargs` and then by the env itself.
SESSION_KWARGS = (
    "split",
    "domain",
    "error_profile",
    "backend",
    "candidates",
    "candidates_difficulty",
    "max_steps",
    "time_budget_s",
    "long_horizon",
    "format_penalty",
)
#: ``backend`` values a client may pick; a real service (a URL, PostgreSQL, SMTP) is the operator's choice.
SESSION_BACKENDS = ("sim", "direct")


def check_env_id(env_id: Any) -> str:
    """``env_id`` if registered; ConfigError naming the ids otherwise."""
    if not isinstance(env_id, str) or env_id not in agentrl_envs.ALL_IDS:
        raise ConfigError(f"unknown environment {str(env_id)[:80]!r}; available: {', '.join(agentrl_envs.ENV_IDS)}")
    return env_id


def session_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``gym.make`` keywords of a client's request, checked; ConfigError names what to use instead."""
    unknown = sorted(str(k)[:40] for k in kwargs if k not in SESSION_KWARGS)
    if unknown:
        raise ConfigError(f"unknown session keyword(s) {unknown[:5]}; a client may set {', '.join(SESSION_KWARGS)}")
    profile = kwargs.get("error_profile")
    shipped = importlib.import_module("agentrl_envs.error_profiles").available()  # mapped from error_profiles/
    if profile is not None and profile not in shipped:
        raise ConfigError(
            f"error_profile={str(profile)[:80]!r}: a client may pick a shipped profile "
            f"({', '.join(shipped)}); a YAML file is the server's --error-profile"
        )
    backend = kwargs.get("backend")
    if backend is not None and backend not in SESSION_BACKENDS:
        raise ConfigError(
            f"backend={str(backend)[:80]!r}: a client may pick {' or '.join(SESSION_BACKENDS)}; "
            "a real service is the server's --backend"
        )
    return dict(kwargs)


@dataclass(frozen=True)
class StepOutcome:
    """What one call did, as JSON values (it crosses the wire as is)."""

    observation: str
    """The env's observation text (the tool's result, or the env's refusal of the call)."""
    reward: float
    """The step's reward (the sum of ``info["reward_components"]``)."""
    terminated: bool
    """The episode ended by ``finish``."""
    truncated: bool
    """The episode ended at the step limit or the time budget."""
    episode_return: float
    """The sum of the episode's rewards so far."""
    info: dict[str, Any] = field(repr=False)
    """The step's info (JSON values: task components, faults, the virtual clock, ...)."""

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def ok(self) -> bool:
        """Whether the tool answered without error (False for a refused call, an SQL error, a fault)."""
        result = self.info.get("tool_result") or {}
        return bool(result.get("ok", False))

    def as_dict(self) -> dict[str, Any]:
        return {
            "observation": self.observation,
            "reward": self.reward,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "done": self.done,
            "episode_return": self.episode_return,
            "info": self.info,
        }


class Episode:
    """A ``gym.make(env_id, **make_kwargs)`` env played by tool calls, one episode at a time.

    Not thread-safe: a server serializes the calls of one session.

    Args:
        env_id: a registered id.
        make_kwargs: ``gym.make`` keywords (checked by the env).
    """

    def __init__(self, env_id: str, **make_kwargs: Any) -> None:
        self.env_id = check_env_id(env_id)
        self.make_kwargs = dict(make_kwargs)
        self.env: gym.Env[str, str] = gym.make(env_id, **make_kwargs)
        self.instruction: str | None = None
        self.task_id: str | None = None
        self.steps = 0
        self.episode_return = 0.0
        self.done = False

    @property
    def started(self) -> bool:
        return self.instruction is not None

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The env's tools as OpenAI function schemas (``{"name", "description", "parameters"}``)."""
        core: Any = self.env.unwrapped
        return [tool.schema()["function"] for tool in core.tools.values()]

    def system_prompt(self) -> str:
        core: Any = self.env.unwrapped
        return str(core.system_prompt())

    def reset(self, seed: int | None = None, task_seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode (``seed`` as ``env.reset(seed=...)``, ``task_seed`` as ``options={"task_seed": ...}``)."""
        for name, value in (("seed", seed), ("task_seed", task_seed)):
            if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0):
                raise ConfigError(f"{name}={str(value)[:40]!r}: use an int >= 0, or leave it out")
        options = None if task_seed is None else {"task_seed": int(task_seed)}
        observation, info = self.env.reset(seed=None if seed is None else int(seed), options=options)
        self.instruction = str(observation)
        self.task_id = str(info["task_id"])
        self.steps, self.episode_return, self.done = 0, 0.0, False
        return self.instruction, _json_values(info)

    def call(self, name: str, arguments: Any) -> StepOutcome:
        """One tool call as one env step. EpisodeError before :meth:`reset` or after the episode ended."""
        if not isinstance(arguments, dict):
            # the env's own refusal of non-object arguments, as the same text gets in process
            return self.step(json.dumps({"name": str(name), "arguments": arguments}))
        return self.step(format_call(str(name), arguments))

    def step(self, action: str) -> StepOutcome:
        """One text action (any format :func:`~agentrl_envs.core.actions.parse_action` reads) as one env step."""
        if not self.started:
            raise EpisodeError("no episode in progress: call reset first")
        if self.done:
            raise EpisodeError("the episode has ended: call reset to start a new one")
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        self.episode_return += float(reward)
        self.done = bool(terminated or truncated)
        return StepOutcome(
            observation=str(observation),
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            episode_return=self.episode_return,
            info=_json_values(info),
        )

    def close(self) -> None:
        self.env.close()


def tool_result(episode: Episode, name: str, arguments: Any) -> tuple[str, dict[str, Any] | None, bool]:
    """One tool call as an MCP tool result: ``(text, structured_content, is_error)``.

    The text is the observation and the structured content :meth:`StepOutcome.as_dict`; the result
    is an error when the tool did not answer ``ok``. A call the episode cannot take (before a reset,
    after its end) is an error result with no structured content and steps nothing.
    """
    try:
        outcome = episode.call(name, arguments)
    except AgentRLError as exc:
        return f"error: {exc}", None, True
    return outcome.observation, outcome.as_dict(), not outcome.ok


def _json_values(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` as plain JSON values (numpy scalars become numbers, anything else its text)."""
    return json.loads(json.dumps(info, default=_plain))


def _plain(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
    return tolist() if callable(tolist) else str(value)
