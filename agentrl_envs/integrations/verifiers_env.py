"""verifiers (``verifiers.v1``, 0.4): the agentrl envs as a taskset with its own in-process tool harness.

::

    from agentrl_envs.integrations.verifiers_env import load_environment

    env = load_environment("AgentRL/SQL-v0", num_tasks=8, error_profile="flaky")  # a verifiers.v1 Env

or, with the Environments Hub package installed (``pip install -e environments/agentrl_env``)::

    vf-eval agentrl-env --env.taskset.env-id AgentRL/SQL-v0 --env.agent.runtime.type subprocess \\
        --model my-model --client.base-url http://127.0.0.1:8000/v1

The pieces, as verifiers splits them:

- :class:`AgentRLTaskset` yields one :class:`AgentRLTask` per seed (``seed``, ``seed + 1``, ...): its
  prompt is the env's instruction for that seed and its system prompt the env's, tool schemas included;
- :class:`AgentRLTask` owns the episode: ``setup`` makes the env and resets it with the task's seed
  when the rollout starts, ``finalize`` closes it (the harness's ``cleanup`` closes it too, for a
  rollout that failed before ``finalize``). Its rubric is the env's reward: the reward
  ``agentrl_return`` is the episode's return (the sum of the env's step rewards) and each reward
  component is a metric (``reward_task``, ``reward_aux``, ``reward_fault``, ``reward_format``), with
  ``success`` and ``steps``;
- :class:`AgentRLHarness` is the agent program: a chat loop run in the eval process (no sandbox, no
  ``uv``; the tools run in agentrl's own simulator) that asks the rollout's model endpoint for each
  turn with the env's tool schemas and plays the reply in the episode, as
  :class:`~agentrl_envs.agents.openai_chat.OpenAIChatAgent` does: native ``tool_calls`` become the env's
  action text (several calls in one turn are one action, which the env answers with its
  ``multiple_calls`` penalty, and each call id gets the observation); a reply without calls is
  played as text. Whatever the model wrote (arguments that are not JSON, an unknown tool, a
  200,000-character argument) reaches the env, which answers with an error that says what to do and
  its format penalty; the rollout goes on.

The episode's calls run on one thread of their own, so a rollout's simulator work does not hold up the
event loop that serves the other rollouts. The module imports verifiers; ``import agentrl_envs`` does not.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym
import httpx
import verifiers.v1 as vf
from pydantic import Field, PrivateAttr
from verifiers.v1.clients import ModelContext
from verifiers.v1.runtimes import ProgramResult, Runtime, SubprocessConfig

import agentrl_envs
from agentrl_envs.core.actions import format_native_call
from agentrl_envs.errors import ConfigError
from agentrl_envs.tasks.sampler import SPLITS

__all__ = ["TASKSET_ID", "AgentRLHarness", "AgentRLTask", "AgentRLTaskset", "AgentRLTasksetConfig", "load_environment"]

#: The id verifiers imports the taskset by: the Environments Hub package in environments/agentrl_env.
TASKSET_ID = "agentrl-env"
#: Longest wait for one model turn through the rollout's endpoint, in seconds.
TURN_TIMEOUT_S = 600.0


class AgentRLData(vf.TaskData):
    """One episode: the env, its seed and split, and the ``gym.make`` keyword arguments."""

    env_id: str
    seed: int
    split: str
    make_kwargs: dict[str, Any] = Field(default_factory=dict)


class AgentRLState(vf.State):
    """The rollout's episode and what the rubric reads of it."""

    tools: list[dict[str, Any]] = Field(default_factory=list)
    episode_return: float = 0.0
    components: dict[str, float] = Field(default_factory=dict)
    steps: int = 0
    done: bool = False
    success: bool = False
    _env: Any = PrivateAttr(default=None)
    _thread: Any = PrivateAttr(default=None)

    async def start(self, data: AgentRLData) -> str:
        """Make the env and reset it with the task's seed; returns the instruction."""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrl-episode")

        def start() -> tuple[str, dict[str, Any]]:
            self._env = gym.make(data.env_id, split=data.split, **data.make_kwargs)
            return self._env.reset(seed=data.seed)  # type: ignore[no-any-return]

        observation, info = await self._run(start)
        self.tools = info["tools"]
        return str(observation)

    async def step(self, action: str) -> str:
        """Play one action; returns the observation and adds the step's reward terms to the totals."""
        observation, reward, terminated, truncated, info = await self._run(self._env.step, action)
        self.steps += 1
        self.episode_return += float(reward)
        for name, value in info["reward_components"].items():
            self.components[name] = self.components.get(name, 0.0) + float(value)
        self.done = bool(terminated or truncated)
        self.success = bool(info.get("success", self.success))
        return str(observation)

    async def close(self) -> None:
        """Close the env and its thread (idempotent)."""
        env, self._env = self._env, None
        thread, self._thread = self._thread, None
        if env is not None:
            await asyncio.get_running_loop().run_in_executor(thread, env.close)
        if thread is not None:
            thread.shutdown(wait=False)

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._thread is None:
            raise RuntimeError("the episode is not running: the task's setup starts it")
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)


class AgentRLTask(vf.Task[AgentRLData, AgentRLState]):
    """One seeded episode; its rubric is the env's reward."""

    async def setup(self, trace: vf.Trace, runtime: Runtime) -> None:
        instruction = await trace.state.start(self.data)
        if instruction != self.data.prompt:
            raise vf.TaskError(f"{self.data.env_id} seed {self.data.seed} reset to another task than the taskset loaded")

    async def finalize(self, trace: vf.Trace, runtime: Runtime) -> None:
        await trace.state.close()

    @vf.reward
    async def agentrl_return(self, trace: vf.Trace) -> float:
        """The episode's return: the sum of the env's step rewards."""
        return float(trace.state.episode_return)

    @vf.metric
    async def agentrl(self, trace: vf.Trace) -> dict[str, float]:
        """Each reward component's sum over the episode, success and the number of steps."""
        state = trace.state
        metrics = {f"reward_{name}": value for name, value in state.components.items()}
        return {**metrics, "success": float(state.success), "steps": float(state.steps)}


class AgentRLTasksetConfig(vf.TasksetConfig):
    """What ``--env.taskset.*`` sets."""

    env_id: str = "AgentRL/SQL-v0"
    """A registered agentrl id."""
    split: str = "train"
    """The task split: train, test or heldout."""
    seed: int = Field(0, ge=0)
    """The first task's seed; task ``i`` has ``seed + i``."""
    num_tasks: int = Field(16, ge=1)
    """How many seeded tasks the taskset yields."""
    make_kwargs: dict[str, Any] = Field(default_factory=dict)
    """More ``gym.make`` keyword arguments: ``error_profile``, ``backend``, ``max_steps``, ..."""


class AgentRLTaskset(vf.Taskset[AgentRLTask, AgentRLTasksetConfig]):
    """``num_tasks`` seeded episodes of one agentrl env."""

    def load(self) -> Iterator[AgentRLTask]:
        config = self.config
        if config.env_id not in agentrl_envs.ALL_IDS:
            raise ConfigError(f"env_id={config.env_id!r:.80}: use one of {', '.join(agentrl_envs.ENV_IDS)}")
        if config.split not in SPLITS:
            raise ConfigError(f"split={config.split!r:.80}: use one of {', '.join(SPLITS)}")
        env = gym.make(config.env_id, split=config.split, **config.make_kwargs)
        try:
            for seed in range(config.seed, config.seed + config.num_tasks):
                observation, info = env.reset(seed=seed)
                data = AgentRLData(
                    id=f"{config.env_id}/{config.split}/{seed}",
                    name=str(info["task_id"]),
                    prompt=str(observation),
                    system_prompt=str(info["system_prompt"]),
                    env_id=config.env_id,
                    seed=seed,
                    split=config.split,
                    make_kwargs=dict(config.make_kwargs),
                )
                yield AgentRLTask(data, config.task)
        finally:
            env.close()


class AgentRLHarness(vf.Harness[vf.HarnessConfig]):
    """The chat loop that plays the model's replies in the rollout's episode (see the module docstring)."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx: ModelContext,
        trace: vf.Trace,
        runtime: Runtime,
        endpoint: str,
        secret: str,
        mcp_urls: dict[str, str],
        data: vf.TaskData,
        tool_interception_url: str | None = None,
    ) -> ProgramResult:
        state: AgentRLState = trace.state
        system, prompt = self.resolve_text_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(base_url=endpoint, headers=headers, timeout=TURN_TIMEOUT_S) as client:
            while not state.done:
                body = {"model": ctx.model, "messages": messages, "tools": state.tools}
                response: httpx.Response | None = None
                try:
                    response = await client.post("/chat/completions", json=body)
                    message = response.json()["choices"][0]["message"]
                    if response.status_code != 200 or not isinstance(message, dict):
                        raise ValueError(f"status {response.status_code}")
                except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                    text = response.text[:500] if response is not None else ""
                    return ProgramResult(
                        exit_code=1, stdout="", stderr=f"model endpoint {endpoint}: {type(exc).__name__}: {exc}; body {text}"
                    )
                messages.extend(await self._play(state, message))
        return ProgramResult(exit_code=0, stdout="", stderr="")

    @staticmethod
    async def _play(state: AgentRLState, message: dict[str, Any]) -> list[dict[str, Any]]:
        """The assistant message and the env's answer to it, as chat messages."""
        content = message.get("content") if isinstance(message.get("content"), str) else ""
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict) and isinstance(c.get("function"), dict)]
        if not calls:
            observation = await state.step(content or "")
            return [{"role": "assistant", "content": content}, {"role": "user", "content": observation}]
        named = [
            (str(c.get("id") or f"call_{i}"), str(c["function"].get("name")), c["function"].get("arguments"))
            for i, c in enumerate(calls)
        ]
        observation = await state.step("".join(format_native_call(name, arguments) for _, name, arguments in named))
        reply = {
            "role": "assistant",
            "content": content or None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": _arguments_text(arguments)}}
                for call_id, name, arguments in named
            ],
        }
        return [reply, *({"role": "tool", "tool_call_id": call_id, "content": observation} for call_id, _, _ in named)]

    async def cleanup(self, trace: vf.Trace, runtime: Runtime) -> None:
        await trace.state.close()


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps({} if arguments is None else arguments)


def load_environment(
    env_id: str = "AgentRL/SQL-v0", *, num_tasks: int = 16, seed: int = 0, split: str = "train", **make_kwargs: Any
) -> vf.Env:
    """A verifiers ``Env`` that plays ``num_tasks`` seeded episodes of ``env_id`` with :class:`AgentRLHarness`.

    The agent runs in the eval process (verifiers' ``subprocess`` runtime: no container, no sandbox
    service). Needs the Environments Hub package importable as ``agentrl_env``.

    Args:
        env_id: a registered agentrl id.
        num_tasks: how many tasks (seeds ``seed`` .. ``seed + num_tasks - 1``).
        seed: the first task's seed.
        split: the task split.
        **make_kwargs: passed to ``gym.make`` for every episode (``error_profile``, ``backend``, ...).

    Raises:
        ConfigError: unknown ``env_id`` or ``split``, or the ``agentrl_env`` package is not installed.
    """
    if env_id not in agentrl_envs.ALL_IDS:
        raise ConfigError(f"unknown environment {str(env_id)[:80]!r}; available: {', '.join(agentrl_envs.ENV_IDS)}")
    taskset = AgentRLTasksetConfig(
        id=TASKSET_ID, env_id=env_id, split=split, seed=seed, num_tasks=num_tasks, make_kwargs=make_kwargs
    )
    agent = vf.AgentConfig(harness=vf.HarnessConfig(id=TASKSET_ID), runtime=SubprocessConfig())
    try:
        return vf.load_environment(vf.SingleAgentEnvConfig(taskset=taskset, agent=agent))
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"verifiers imports the taskset {TASKSET_ID!r} as the package agentrl_env ({exc}); "
            "install it: pip install -e environments/agentrl_env"
        ) from None
