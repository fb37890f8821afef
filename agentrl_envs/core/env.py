"""The env core shared by every agentrl environment.

One text action per step (a tool call), one text observation back. The core parses the action,
sends the call across the :class:`~agentrl_envs.backends.Backend` seam, renders the result, asks
:class:`~agentrl_envs.core.progress.Progress` what it achieved and sums the reward components.
It does not know whether the backend is simulated or real.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import time
import weakref
from typing import Any, ClassVar, cast

import gymnasium as gym

from agentrl_envs.backends import Backend, EpisodeSetup, ToolRequest, make_backend
from agentrl_envs.core.actions import ToolCall, format_call, parse_action
from agentrl_envs.core.episode import (
    EpisodeStart,
    default_max_steps,
    schema_parts,
    step_info,
    task_mail_domain,
    task_seed_option,
)
from agentrl_envs.core.options import (
    OPTION_NAMES,
    RENDER_MODES,
    SETTABLE_OPTIONS,
    EnvOptions,
    keyword_signature,
    unknown_keyword,
)
from agentrl_envs.core.progress import Progress
from agentrl_envs.core.seeding import LazyNpRandom
from agentrl_envs.errors import ActionError, ConfigError, EpisodeError
from agentrl_envs.faults import load_profile
from agentrl_envs.faults.injector import FaultInjectingBackend
from agentrl_envs.faults.stats import FaultStats, classify, penalized
from agentrl_envs.rewards import RewardConfig, zero_components
from agentrl_envs.rewards.schedule import AuxRewardConfig
from agentrl_envs.tasks import TaskSampler
from agentrl_envs.tasks.base import Task
from agentrl_envs.text.observation import clip, printable
from agentrl_envs.text.spaces import UnicodeText
from agentrl_envs.tools import Tool, get_tool

__all__ = ["AUTORESET_ACTION", "SETTABLE_ATTRIBUTES", "EnvOptions", "ToolUseEnv"]

ACTION_MAX_CHARS = 200_000
OBSERVATION_MAX_CHARS = 16_000
#: ``info["sandbox_tier"]`` of an env without the python tool: it runs no Python and starts no sandbox
NO_PYTHON_TIER = "none"

#: What :meth:`ToolUseEnv.oracle_action` returns once the episode has ended: under Gymnasium's
#: NEXT_STEP autoreset the next step of that sub-env is a reset step whose action is ignored, so
#: ``vec_env.call("oracle_action")`` needs an answer there (raising would kill an async worker).
AUTORESET_ACTION = format_call("finish", {"answer": ""})

#: Attributes that may change after the env is made (``vec_env.set_attr(name, value)``,
#: ``env.set_wrapper_attr(name, value)``); each value is validated like the ``gym.make`` keyword.
SETTABLE_ATTRIBUTES = ("training_step", *SETTABLE_OPTIONS)
# Public attributes Gymnasium itself sets on an env after construction.
_GYMNASIUM_ATTRIBUTES = frozenset({"spec", "np_random"})
#: Task seeds whose episode start an env keeps (:class:`EpisodeStart`, ~1.5 kB each); emptied when full.
_STARTS_PER_ENV = 256
_ZERO_COMPONENTS = zero_components()


class ToolUseEnv(LazyNpRandom, gym.Env[str, str]):
    """Base class of the agentrl envs; subclasses set ``kind`` and ``tool_names`` and an env card."""

    metadata = {"render_modes": list(RENDER_MODES), "render_fps": 4}  # noqa: RUF012 - Gymnasium's own convention
    kind: ClassVar[str] = "pipeline"
    tool_names: ClassVar[tuple[str, ...]] = ("sql", "python", "smtp", "finish")
    #: The gold plan looks an email's recipients up in the staff table before sending it (see progress).
    oracle_lookup: ClassVar[bool] = False
    # Episode counters, set by _clear_episode and reset (through __dict__: no __setattr__ checks).
    _steps: int
    _max_steps: int
    _virtual_time: float
    _done: bool

    def __init__(self, **options: Any) -> None:
        # The keywords are EnvOptions' fields; __init__.__signature__ (set below the class) lists them.
        unknown = next((name for name in options if name not in OPTION_NAMES), None)
        if unknown is not None:
            raise unknown_keyword(type(self).__name__, unknown)
        self._options = EnvOptions(**options)
        opts = self._options
        self.profile = load_profile(opts.error_profile)
        self._sandbox_tier: str | None = None
        self._backend_facts: dict[str, Any] = {}  # what the backend says about its services (numpy)
        self._rewards = RewardConfig(format_penalty=opts.format_penalty)
        self._training_step = 0
        self.tools: dict[str, Tool] = {name: get_tool(name) for name in self.tool_names}
        self.action_space = UnicodeText(ACTION_MAX_CHARS)
        self.observation_space = UnicodeText(OBSERVATION_MAX_CHARS)
        self._sampler = TaskSampler(self.kind, opts.split, opts.domain, opts.long_horizon)  # validates split/domain
        self._backend: Backend | None = None
        self._fault_stats = FaultStats()
        self._task: Task | None = None
        self._episode_id: str | None = None
        self._progress_state: Progress | None = None  # made at the episode's first use (see _progress)
        self._transcript: list[str] = []
        self._prev_tool: str | None = None
        self._starts: dict[int, EpisodeStart] = {}  # by task seed
        self._schemas: tuple[tuple[str, dict[str, Any]], ...] = ()  # info["tools"], copied per reset
        self._clear_episode()
        self._frozen = True  # from here on, __setattr__ validates or refuses public attributes

    @property
    def options(self) -> EnvOptions:
        """The options the env was made with (its ``gym.make`` keywords), as set since by ``set_attr``."""
        return self._options

    @property
    def render_mode(self) -> str | None:  # type: ignore[override]  # gymnasium's is a plain attribute
        return self._options.render_mode

    # -- gymnasium API ---------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode. ``options={"task_seed": n}`` picks a task directly (same n, same task).

        A reset of a task seen before is a few dictionary operations: the task comes from the
        process-wide cache, its observation and the fixed part of its info from this env's
        :class:`EpisodeStart`, ``np_random`` is built only when something reads it
        (:mod:`agentrl_envs.core.seeding`) and the episode opens on an in-process service at its first call.
        """
        task_seed = task_seed_option(options)  # checked first: a refused reset leaves the episode as it was
        if type(seed) is int and seed >= 0:
            self._seed_lazily(seed)
        else:
            super().reset(seed=seed)  # seed=None keeps the stream; gymnasium refuses a bad seed
        self._close_episode()
        if task_seed is None:
            task_seed = self._draw()
        start, task = self._start_of(task_seed)
        fault_seed = self._draw()
        backend = self._get_backend()
        episode_id = "ep-" + os.urandom(10).hex()
        setup = EpisodeSetup(
            episode_id, task.database, task.files, sender=start.sender, seed=fault_seed, mail_domains=start.mail_domains
        )
        backend.open_episode(setup)
        d = self.__dict__  # private fields: no need for __setattr__'s checks
        d["_fault_stats"] = FaultStats()
        d["_task"] = task
        d["_episode_id"] = episode_id
        d["_max_steps"] = start.max_steps
        d["_transcript"] = [start.transcript_head]  # the other fields are as _close_episode left them
        info = start.info.copy()
        info["reward_components"] = _ZERO_COMPONENTS.copy()
        info["tool_result"] = {}
        info["fault"] = {}
        info["sandbox_tier"] = self._sandbox_tier or "unknown"
        info["tools"] = [{"type": kind, "function": function.copy()} for kind, function in self._schemas]
        self._add_candidates(info, task.instruction)
        return start.observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(f"an action must be a str, got {type(action).__name__}")
        if self._task is None or self._progress is None:
            raise EpisodeError("call reset() before step()")
        if self._done:
            raise EpisodeError("the episode has ended; call reset() to start a new one")
        self._steps += 1
        self._virtual_time += self.profile.think_time_s
        components = zero_components()
        terminated = False
        tool_name: str | None = None
        fault: dict[str, Any] | None = None
        call_format = "none"
        try:
            call = parse_action(action, self.tools)
        except ActionError as exc:
            components["format"] = self._rewards.format_penalty
            observation = f"action error [{exc.code}]: {exc.message}"
            result: dict[str, Any] = {"tool": None, "ok": False, "status": 400, "error_type": exc.code, "error": exc.message}
        else:
            tool_name, call_format = call.name, call.form
            if call.name == "finish":
                self._progress.finish(call.arguments["answer"])
                observation = "Episode finished."
                result = {"tool": "finish", "ok": True, "status": 200, "error_type": None, "error": None}
                terminated = True
            else:
                observation, result, fault, moved = self._call_tool(call)
                components["aux"] = self._aux(call.name, moved)
                if penalized(fault):
                    assert fault is not None
                    components["fault"] = self.profile.penalty(fault["type"])
        truncated = not terminated and (
            self._steps >= self._max_steps
            or (self._options.time_budget_s is not None and self._virtual_time >= self._options.time_budget_s)
        )
        info = self._info(tool=tool_name, result=result)
        # {} rather than None when there is no fault: vector envs merge infos key by key and
        # cannot merge None in one sub-env with a dict in another.
        info["fault"] = fault or {}
        info["call_format"] = call_format
        if terminated or truncated:
            self._done = True
            info["fault_stats"] = self._fault_stats.summary()
            task_components = self._progress.components()
            success = terminated and all(task_components.values())
            components["task"] = self._rewards.success if success else 0.0
            info["task_components"] = task_components
            info["partial_credit"] = sum(task_components.values()) / max(1, len(task_components))
            info["success"] = success
            if truncated:
                observation += (
                    f"\n[episode truncated: {'step limit' if self._steps >= self._max_steps else 'time budget'} reached]"
                )
        else:
            self._add_candidates(info, observation)
        info["reward_components"] = components
        if tool_name is not None:
            self._prev_tool = tool_name
        self._transcript.append(f"> {printable(clip(action, 2000))}\n{observation}")
        return self._observe(observation), float(sum(components.values())), terminated, truncated, info

    def render(self) -> str | None:
        """With ``render_mode="ansi"``: the transcript so far, actions prefixed with ``>``."""
        if self._options.render_mode != "ansi":
            return None
        return printable("\n\n".join(self._transcript)) + "\n"

    def close(self) -> None:
        self._close_episode()
        if self._backend is not None:
            self._backend.close()
            self._backend = None
        self._sampler.close()

    # -- oracle and candidates -------------------------------------------------------------------

    def oracle_action(self) -> str:
        """The gold plan's next action from the current state (used by :class:`OracleAgent`).

        Once the episode has ended it returns :data:`AUTORESET_ACTION` (a ``finish`` call): in a
        vector env under NEXT_STEP autoreset that sub-env's next step is a reset step and ignores
        its action, so ``vec_env.call("oracle_action")`` works on every step, sync or async.

        Raises:
            EpisodeError: before the first ``reset()``.
        """
        if self._task is None or self._progress is None:
            raise EpisodeError("no episode in progress; call reset() first")
        if self._done:
            return AUTORESET_ACTION
        name, arguments = self._progress.next_gold_call()
        return format_call(name, arguments)

    def system_prompt(self) -> str:
        """The system prompt of ``info["system_prompt"]``; it agrees with the Qwen/Hermes chat template."""
        names = ", ".join(self.tools)
        return (
            "You are an agent that solves tasks by calling tools. Each turn, make exactly one tool call: "
            "return a JSON object with the function name and arguments within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
            "Several calls in one turn are refused: make one call, read its result, then make the next.\n"
            f"Available tools: {names}. Call finish when you are done."
        )

    @property
    def task(self) -> Task | None:
        """The current episode's task (None before the first reset)."""
        return self._task

    @property
    def _progress(self) -> Progress | None:
        """The episode's :class:`Progress`, made at its first use (many episodes end before a step)."""
        progress = self._progress_state
        if progress is None and self._task is not None:
            progress = self.__dict__["_progress_state"] = Progress(self._task, self.oracle_lookup)
        return progress

    # -- internals -------------------------------------------------------------------------------

    def _aux(self, tool: str, moved: list[int]) -> float:
        """Dense reward for newly completing this tool's part of sub-tasks (see rewards.schedule)."""
        if not moved or self._task is None:
            return 0.0
        base = self.aux_reward.terms.get(tool, 0.0) * len(moved) / len(self._task.subtasks)
        return base * self.aux_weight

    @property
    def aux_weight(self) -> float:
        """The aux reward's current schedule weight (from ``training_step``)."""
        return self.aux_reward.schedule.weight(self._training_step)

    @property
    def aux_reward(self) -> AuxRewardConfig:
        """The aux reward, parsed; settable with any ``aux_reward=`` form of ``gym.make`` (validated)."""
        return cast(AuxRewardConfig, self._options.aux_reward)

    @aux_reward.setter
    def aux_reward(self, spec: Any) -> None:
        self.__dict__["_options"] = dataclasses.replace(self._options, aux_reward=spec)

    @property
    def candidates(self) -> int:
        """K of ``info["candidates"]`` (0: none); settable like the ``gym.make`` keyword (validated)."""
        return self._options.candidates

    @candidates.setter
    def candidates(self, k: Any) -> None:
        self.__dict__["_options"] = dataclasses.replace(self._options, candidates=k)

    @property
    def training_step(self) -> int:
        """The trainer's step, driving the aux reward's schedule (``vec_env.set_attr("training_step", n)``)."""
        return self._training_step

    @training_step.setter
    def training_step(self, step: Any) -> None:
        if not isinstance(step, numbers.Integral) or isinstance(step, bool) or step < 0:
            raise ConfigError(f"training_step={step!r}: use a non-negative int")
        self._training_step = int(step)

    def set_training_step(self, step: int) -> None:
        """Set the trainer's step (``vec_env.call("set_training_step", n)``)."""
        self.training_step = step

    # -- attribute guard -------------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        # Settable attributes are properties that validate; the other options are read when the env
        # is made, so a new value would silently do nothing: refuse it, and refuse names the env does not have.
        if (
            name.startswith("_")
            or not self.__dict__.get("_frozen", False)
            or name in _GYMNASIUM_ATTRIBUTES
            or name in SETTABLE_ATTRIBUTES
        ):
            super().__setattr__(name, value)
            return
        if name in OPTION_NAMES:
            raise ConfigError(f"{name} is fixed when the env is made; make a new env: gym.make(id, {name}=...)")
        if name in self.__dict__ or hasattr(type(self), name):
            raise ConfigError(f"{name} is read-only; the attributes that can change are {', '.join(SETTABLE_ATTRIBUTES)}")
        raise ConfigError(_unknown_attribute(self, name))

    def set_wrapper_attr(self, name: str, value: Any, *, force: bool = True) -> bool:
        """Set an attribute of the env, as ``vec_env.set_attr`` does; unknown names are refused.

        Gymnasium would otherwise put an unknown name (a typo) on the outermost wrapper, where
        nothing reads it.

        Raises:
            ConfigError: for a name the env does not have, a fixed attribute or a bad value.
        """
        if not name.startswith("_") and name not in (*SETTABLE_ATTRIBUTES, *OPTION_NAMES) and not hasattr(self, name):
            raise ConfigError(_unknown_attribute(self, name))
        setattr(self, name, value)
        return True

    def _call_tool(self, call: ToolCall) -> tuple[str, dict[str, Any], dict[str, Any] | None, list[int]]:
        assert self._episode_id is not None and self._progress is not None
        request = ToolRequest(self._episode_id, call.name, call.arguments, at_s=self._virtual_time)
        response = self._get_backend().handle(request)
        self._virtual_time += response.latency_s
        if self._options.realtime and response.latency_s > 0:
            time.sleep(response.latency_s)
        moved = self._progress.observe(call.name, call.arguments, response)
        tier = response.result.get("sandbox_tier") if response.ok else None  # the service that runs programs says
        if isinstance(tier, str):
            self._sandbox_tier = tier[:16]
        fault = classify(response)
        summary = self.tools[call.name].summarize(response)
        self._fault_stats.record(call.name, bool(summary["ok"]), fault)
        return self.tools[call.name].render(response), summary, fault, moved

    def _info(self, tool: str | None, result: dict[str, Any] | None) -> dict[str, Any]:
        assert self._task is not None and self._progress is not None
        return step_info(
            self._task,
            step=self._steps,
            tool=tool,
            result=result,
            virtual_time=self._virtual_time,
            subtask_index=self._progress.subtask_index(),
            boundary=tool is not None and self._prev_tool is not None and tool != self._prev_tool,
            sandbox_tier=self._sandbox_tier or "unknown",
        )

    def _add_candidates(self, info: dict[str, Any], observation: str) -> None:
        if self._options.candidates:
            from agentrl_envs.core.candidates import make_candidates

            assert self._task is not None and self._progress is not None
            info["candidates"] = make_candidates(
                self._task,
                self._progress,
                self.oracle_action(),
                self._options.candidates,
                self.np_random,
                tuple(self.tools),
                difficulty=self._options.candidates_difficulty,
                context=f"{self._task.instruction}\n{observation}",
            )

    def _observe(self, text: str) -> str:
        return clip(printable(text), OBSERVATION_MAX_CHARS - 100)

    def _get_backend(self) -> Backend:
        if self._backend is None:
            runs_python = "python" in self.tools
            opts = self._options
            backend = make_backend(
                opts.backend,
                sql_deadline_s=opts.sql_deadline_s,
                python_timeout_s=opts.python_timeout_s,
                python_sandbox=opts.python_sandbox,
                allow_unsafe_sandbox=opts.allow_unsafe_sandbox,
                lazy_python=not runs_python,  # an env without the python tool starts no sandbox
            )
            if runs_python:
                self._sandbox_tier = getattr(backend, "sandbox_tier", None)
                self._backend_facts = {"numpy": bool(getattr(backend, "numpy_available", False))}
            else:
                self._sandbox_tier = NO_PYTHON_TIER
                self._backend_facts = {"numpy": False}
            self._schemas = schema_parts(self.tools.values(), self._backend_facts)
            self._backend = FaultInjectingBackend(backend, self.profile) if self.profile.injects else backend
        return self._backend

    def _start_of(self, task_seed: int) -> tuple[EpisodeStart, Task]:
        """The task of ``task_seed`` and this env's :class:`EpisodeStart` of it, worked out at its first reset.

        A start holds its task weakly: one the process-wide task cache let go is sampled (made) again.
        """
        start = self._starts.get(task_seed)
        if start is not None:
            task = start.task_ref()
            if task is not None:
                return start, task
        task = self._sampler.sample(task_seed)
        max_steps = self._options.max_steps or default_max_steps(task, self.oracle_lookup)
        info = step_info(
            task,
            step=0,
            tool=None,
            result=None,
            virtual_time=0.0,
            subtask_index=Progress(task).subtask_index(),  # also checks every step has a progress rule
            boundary=False,
            sandbox_tier=None,
        )
        # the mutable values are made fresh by every reset: here only their places in the key order
        info.update(reward_components=None, fault=None, instruction=task.instruction, tools=None)
        info.update(system_prompt=self.system_prompt(), max_steps=max_steps)
        mail_domain = task_mail_domain(task)
        domains = (mail_domain,) if self._options.mail_domains == "company" else self._options.mail_domains
        start = EpisodeStart(
            task_ref=weakref.ref(task),
            observation=self._observe(task.instruction),
            transcript_head=f"[task {task.task_id}]\n{task.instruction}",
            sender=f"agent@{mail_domain}",
            mail_domains=tuple(domains) if domains is not None else None,
            max_steps=max_steps,
            info=info,
        )
        if len(self._starts) >= _STARTS_PER_ENV:
            self._starts.clear()
        self._starts[task_seed] = start
        return start, task

    def _clear_episode(self) -> None:
        self.__dict__.update(
            _task=None,
            _episode_id=None,
            _progress_state=None,
            _steps=0,
            _max_steps=0,
            _virtual_time=0.0,
            _prev_tool=None,
            _done=False,
            _transcript=[],
        )

    def _close_episode(self) -> None:
        if self._episode_id is not None and self._backend is not None:
            self._backend.close_episode(self._episode_id)
        self._clear_episode()

    def __getstate__(self) -> dict[str, Any]:
        # The configuration pickles; the backend and an episode in flight do not (they live in
        # services). An unpickled env starts fresh at its next reset().
        state = dict(self.__dict__)
        state["_backend"] = None
        state["_sampler"] = None
        state["_starts"] = {}
        for key in ("_task", "_episode_id", "_progress_state"):
            state[key] = None
        state["_done"] = False
        state["_transcript"] = []
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"_progress_state": None, "_starts": {}, "_schemas": (), **state})
        opts = self._options
        self._sampler = TaskSampler(self.kind, opts.split, opts.domain, opts.long_horizon)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _unknown_attribute(env: ToolUseEnv, name: str) -> str:
    return (
        f"{type(env).__name__} has no attribute {name[:80]!r}; the ones that can change after gym.make are "
        f"{', '.join(SETTABLE_ATTRIBUTES)}"
    )


ToolUseEnv.__init__.__signature__ = keyword_signature()  # type: ignore[attr-defined]
