"""TRL's ``GRPOTrainer(environment_factory=...)`` on the agentrl envs.

::

    from trl import GRPOConfig, GRPOTrainer
    from agentrl_envs.integrations.trl import environment_factory, train_dataset

    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=GRPOConfig(...),
        train_dataset=train_dataset("AgentRL/SQL-v0", n=64),
        environment_factory=environment_factory("AgentRL/SQL-v0"),
    )

:func:`environment_factory` returns a class (TRL calls it with no arguments, once per concurrent
rollout) with:

- one public method per tool of ``info["tools"]`` (``sql(query)``, ``finish(answer)``, ...) whose
  signature, type hints and Google-style docstring come from the tool's JSON schema, so TRL (through
  ``transformers.utils.get_json_schema``) shows the model exactly the env's schema. Each call becomes
  one env step; the method returns the observation text. A call with a wrong, extra or missing
  argument is not a Python ``TypeError``: the arguments go to the env as they came, which answers
  with its ``bad_arguments`` error and the format penalty, as for any malformed text action.
  numpy values count as the Python values they hold (``np.int64(1)`` is the int 1). A value JSON
  cannot hold at all (bytes, an arbitrary object, a circular list) is no model's doing, since TRL
  passes the model's JSON arguments: the call raises ``TypeError`` or ``ValueError`` naming the
  argument, and the env is not stepped;
- ``reset(**row)``: reads ``seed`` and ``split`` from the dataset row (other columns are ignored),
  starts the episode and returns the instruction, which TRL appends to the last user message;
- ``get_reward()``: the episode's return (the sum of its step rewards so far; an episode the model
  did not finish keeps what it earned). TRL logs it as ``rewards/<class name>/mean``.

Calls after the episode ended do not step the env: they return a note saying so. TRL runs
several calls of one turn one by one, so each is its own env step here (the env's refusal of
several calls in one action applies to text actions, which TRL never sends). Arguments that spell
``<tool_call>`` reach the tool as written (the call is written with
:func:`~agentrl_envs.core.actions.format_call`, which escapes the markers). Observations come back
verbatim; TRL tokenizes them into the prompt, so text in a tool result that spells the tokenizer's
special tokens (``<|im_start|>``) becomes those tokens unless the tokenizer keeps content text as text.
This module imports neither TRL nor torch; :func:`train_dataset` imports ``datasets``.
"""

from __future__ import annotations

import inspect
import json
import numbers
from typing import Any

import gymnasium as gym
import numpy as np

import agentrl_envs
from agentrl_envs.core.actions import format_call
from agentrl_envs.errors import ConfigError
from agentrl_envs.tasks.sampler import SPLITS

__all__ = ["environment_factory", "train_dataset"]

_PY_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict}

ENDED = "The episode has ended; no more tool calls are needed."


def environment_factory(env_id: str, **make_kwargs: Any) -> type:
    """A class for ``GRPOTrainer(environment_factory=...)`` that plays ``env_id``.

    Args:
        env_id: a registered id, e.g. ``"AgentRL/SQL-v0"``.
        **make_kwargs: passed to ``gym.make`` (``error_profile``, ``max_steps``, ...); ``split`` is the
            default for rows without a ``split`` column.

    Raises:
        ConfigError: unknown ``env_id``.
    """
    if not isinstance(env_id, str) or env_id not in agentrl_envs.ALL_IDS:
        raise ConfigError(f"unknown environment {str(env_id)[:80]!r}; available: {', '.join(agentrl_envs.ENV_IDS)}")
    probe = gym.make(env_id, **make_kwargs)
    try:
        core = probe.unwrapped
        schemas = [tool.schema()["function"] for tool in core.tools.values()]  # type: ignore[attr-defined]
        default_split = str(core.options.split)  # type: ignore[attr-defined]
        env_name = type(core).__name__
    finally:
        probe.close()

    namespace: dict[str, Any] = {
        "__init__": _init,
        "reset": _reset,
        "get_reward": _get_reward,
        "_step": _step,
        "_env": _get_env,
        "__doc__": f"``{env_id}`` for TRL's GRPOTrainer: tools {', '.join(s['name'] for s in schemas)}.",
        "env_id": env_id,
        "make_kwargs": dict(make_kwargs),
        "default_split": default_split,
        "__module__": __name__,
    }
    for schema in schemas:
        namespace[schema["name"]] = _tool_method(schema)
    return type(f"{env_name}ForTRL", (), namespace)


def _init(self: Any) -> None:
    self._envs = {}
    self.env = None
    self.episode_return = 0.0
    self.done = True
    self.info = {}


def _get_env(self: Any, split: str) -> gym.Env[str, str]:
    if split not in SPLITS:
        raise ConfigError(f"split={split!r} in the dataset row: use one of {', '.join(SPLITS)}")
    if split not in self._envs:
        self._envs[split] = gym.make(self.env_id, **{**self.make_kwargs, "split": split})
    return self._envs[split]


def _reset(self: Any, **row: Any) -> str:
    """Start the episode of a dataset row (its ``seed`` and ``split``) and return the instruction."""
    seed = row.get("seed")
    # Checked here, not by Gymnasium: its refusal of a negative seed leaves the cached env unable to step.
    if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0):
        raise ConfigError(f"seed={seed!r:.80} in the dataset row: use an int >= 0 (train_dataset() writes one per row)")
    if seed is not None:
        seed = int(seed)  # a numpy int (a row read through numpy or pandas) is that int; Gymnasium refuses it
    self.env = self._env(str(row.get("split") or self.default_split))
    observation, self.info = self.env.reset(seed=seed)
    self.episode_return = 0.0
    self.done = False
    return str(observation)


def _get_reward(self: Any) -> float:
    """The episode's return: the sum of its step rewards so far."""
    return float(self.episode_return)


def _step(self: Any, name: str, arguments: dict[str, Any]) -> str:
    if self.env is None:
        raise ConfigError("call reset() before a tool (TRL does this for every rollout)")
    if self.done:
        return ENDED
    action = _action_text(name, arguments)  # before any change: a refused call leaves the episode as it was
    observation, reward, terminated, truncated, self.info = self.env.step(action)
    self.episode_return += float(reward)
    self.done = bool(terminated or truncated)
    return str(observation)


def _action_text(name: str, arguments: dict[str, Any]) -> str:
    """The call as the env's canonical text; TypeError or ValueError, naming the argument, for a value JSON cannot hold.

    Built from the method's arguments with :func:`~agentrl_envs.core.actions.format_call`, which escapes the
    ``<tool_call>`` markers inside JSON strings: the env parses back exactly these arguments, so code or
    a query that mentions ``<tool_call>`` runs as written (a plain ``json.dumps`` would make it read as
    a second call, a format error). A value JSON cannot hold is an error, never its ``repr`` string,
    which a string argument would accept: ``sql(query=b"SELECT 1")`` would run the SQL ``b'SELECT 1'``.
    """
    try:
        return format_call(name, arguments, default=_numpy_value)
    except (TypeError, ValueError, RecursionError):
        pass
    for key, value in arguments.items():
        try:
            json.dumps(value, default=_numpy_value)
        except TypeError as exc:
            raise TypeError(
                f"{name}({key}=...): {exc}; pass JSON values (str, int, float, bool, None, list, dict), "
                "as TRL does with the model's arguments"
            ) from None
        except (ValueError, RecursionError):
            raise ValueError(f"{name}({key}=...): the value is circular or nested too deeply to send as JSON") from None
    raise AssertionError("unreachable: the arguments encode one by one but not together")  # pragma: no cover


def _numpy_value(value: Any) -> Any:
    """``json.dumps``'s hook: a numpy scalar or array as the Python value it holds."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _tool_method(schema: dict[str, Any]) -> Any:
    name = schema["name"]
    properties: dict[str, Any] = schema["parameters"].get("properties", {})
    required = set(schema["parameters"].get("required", []))

    def method(self: Any, *args: Any, **kwargs: Any) -> str:
        # Positional arguments have no name to send; they reach the env as a malformed call.
        arguments = dict(kwargs) if not args else {**kwargs, "_positional": list(args)}
        return self._step(name, arguments)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for key, spec in properties.items():
        hint = _hint(spec)
        annotations[key] = hint
        default = inspect.Parameter.empty if key in required else None
        if default is None:
            annotations[key] = hint | None
        params.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotations[key]))
    params.sort(key=lambda p: p.kind != inspect.Parameter.POSITIONAL_OR_KEYWORD)
    annotations["return"] = str
    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    args_doc = "\n".join(f"    {key}: {spec.get('description') or key}" for key, spec in properties.items())
    method.__doc__ = f"{schema['description']}\n\nArgs:\n{args_doc}\n\nReturns:\n    The tool's result as text.\n"
    return method


def _hint(spec: dict[str, Any]) -> Any:
    kinds = spec.get("type")
    hints: list[Any] = []
    for kind in kinds if isinstance(kinds, list) else [kinds]:
        if kind == "array":
            item = _PY_TYPES.get(str(spec.get("items", {}).get("type", "string")), str)
            hints.append(list[item])  # type: ignore[valid-type]
        else:
            hints.append(_PY_TYPES.get(str(kind), str))
    out: Any = hints[0]
    for h in hints[1:]:
        out = out | h
    return out


def train_dataset(env_id: str, n: int, split: str = "train", *, seed: int = 0) -> Any:
    """``n`` prompt rows for ``GRPOTrainer``: the system prompt, an empty user turn, ``seed`` and ``split``.

    Row ``i`` has ``seed = seed + i``; ``reset(**row)`` of the :func:`environment_factory` class starts
    that episode and TRL appends its instruction to the user turn.

    Returns:
        A ``datasets.Dataset`` with columns ``prompt``, ``seed`` and ``split``.
    """
    from datasets import Dataset

    from agentrl_envs.integrations.chat import system_prompt

    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"n={n!r}: use a positive number of rows")
    if split not in SPLITS:
        raise ConfigError(f"split={split!r}: use one of {', '.join(SPLITS)}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed={seed!r}: use an int >= 0 (row i gets seed + i)")
    system = system_prompt(env_id)
    rows = {
        "prompt": [[{"role": "system", "content": system}, {"role": "user", "content": ""}] for _ in range(n)],
        "seed": [seed + i for i in range(n)],
        "split": [split] * n,
    }
    return Dataset.from_dict(rows)
