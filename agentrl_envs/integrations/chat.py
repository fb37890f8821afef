"""Episodes as OpenAI-format chat messages, for ``apply_chat_template`` and TRL's SFT trainer.

:func:`to_messages` takes an episode in any of the forms the project produces:

- a :class:`~agentrl_envs.data.Trajectory` (what :class:`~agentrl_envs.wrappers.record_trajectories.RecordTrajectories`
  writes, what a :class:`~agentrl_envs.data.ReplayBuffer` returns, what shards and JSONL read back);
- its dict form (:func:`~agentrl_envs.data.trajectory_to_dict`, a JSON line);
- a live transcript: the reset observation (the instruction) and a list of ``(action, observation)``
  pairs or ``{"action", "observation"}`` mappings collected while stepping an env.

and returns::

    [{"role": "system", "content": <the env's system prompt>},
     {"role": "user", "content": <the instruction>},
     {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function",
          "function": {"name": "sql", "arguments": {"query": "SELECT ..."}}}]},
     {"role": "tool", "tool_call_id": "call_0", "name": "sql", "content": <the tool's result>},
     ...]

An action the env could not parse is kept as an assistant message with the raw text as
``content`` and no ``tool_calls``, and the env's error comes back as a ``user`` message (there is
no tool call to answer), so SFT data shows exactly what the agent said and heard.

``arguments`` is an object by default, as Hugging Face chat templates (Qwen, Llama, Hermes) need;
``arguments_as="json"`` gives the JSON string of OpenAI's wire format, which is also how
:func:`export_sft` stores it in Parquet (a column of objects with different keys per tool would be
widened by Arrow to every key of every tool). :func:`load_sft_messages` turns a stored row back.

Content is copied verbatim and never re-read: a tool result or an instruction that spells chat markup
(``<|im_start|>``, ``<|im_end|>``, ``<tool_call>``) stays text inside its message's ``content``; only
the agent's own action is parsed into ``tool_calls``, exactly as the env parsed it. This module does
not tokenize. Whoever renders and tokenizes these messages must keep content text as text, e.g.
tokenize each ``content`` with ``split_special_tokens=True`` and only the template's own markup as
special tokens: ``apply_chat_template(..., tokenize=True)`` on the whole rendered string turns such
text into real special tokens, i.e. forged turns.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl_envs.core.actions import parse_action
from agentrl_envs.errors import ActionError, ConfigError

__all__ = ["SFT_COLUMNS", "export_sft", "load_sft_messages", "system_prompt", "to_messages", "tool_schemas"]

#: Columns of the Parquet file :func:`export_sft` writes.
SFT_COLUMNS = ("messages", "tools", "env_id", "task_id", "split", "seed", "success", "episode_return")


@functools.lru_cache(maxsize=16)
def _env_card(env_id: str) -> tuple[str, str]:
    import gymnasium as gym

    import agentrl_envs

    if env_id not in agentrl_envs.ALL_IDS:
        raise ConfigError(f"unknown environment {env_id[:80]!r}; available: {', '.join(agentrl_envs.ENV_IDS)}")
    env: Any = gym.make(env_id).unwrapped
    try:
        return env.system_prompt(), json.dumps([tool.schema() for tool in env.tools.values()])
    finally:
        env.close()


def system_prompt(env_id: str) -> str:
    """The system prompt the env puts in ``info["system_prompt"]``."""
    return _env_card(env_id)[0]


def tool_schemas(env_id: str) -> list[dict[str, Any]]:
    """The env's ``info["tools"]``: OpenAI function schemas for ``apply_chat_template(tools=...)``."""
    return json.loads(_env_card(env_id)[1])


def to_messages(
    episode: Any,
    steps: Iterable[Any] | None = None,
    *,
    env_id: str | None = None,
    system: str | None = None,
    arguments_as: str = "object",
) -> list[dict[str, Any]]:
    """An episode as OpenAI-format chat messages.

    Args:
        episode: a ``Trajectory``, its dict form, or (with ``steps``) the instruction text.
        steps: for a live transcript: ``(action, observation)`` pairs or mappings with those keys.
        env_id: the env, for the system prompt (default: the trajectory's ``env_id``).
        system: the system prompt to use instead (``""`` for none).
        arguments_as: ``"object"`` (default, for chat templates) or ``"json"`` (OpenAI's string).

    Raises:
        ConfigError: the episode is none of the accepted forms, or ``arguments_as`` is unknown.
    """
    if arguments_as not in ("object", "json"):
        raise ConfigError(f"arguments_as={arguments_as!r}: use 'object' (chat templates) or 'json' (OpenAI wire format)")
    instruction, pairs, env_id = _normalize(episode, steps, env_id)
    if system is None:
        system = system_prompt(env_id) if env_id else ""
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": instruction})
    for i, (action, observation) in enumerate(pairs):
        try:
            call = parse_action(action)
        except ActionError:
            messages.append({"role": "assistant", "content": action})
            messages.append({"role": "user", "content": observation})
            continue
        arguments: Any = call.arguments if arguments_as == "object" else json.dumps(call.arguments, ensure_ascii=False)
        call_id = f"call_{i}"
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": call.name, "arguments": arguments}}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "name": call.name, "content": observation})
    return messages


def _normalize(episode: Any, steps: Iterable[Any] | None, env_id: str | None) -> tuple[str, list[tuple[str, str]], str]:
    if steps is not None:
        if not isinstance(episode, str):
            raise ConfigError("with steps=..., pass the instruction (the reset observation) as the first argument")
        return episode, [_pair(s) for s in steps], env_id or ""
    if isinstance(episode, Mapping):
        from agentrl_envs.data import trajectory_from_dict

        episode = trajectory_from_dict(dict(episode))
    if hasattr(episode, "steps") and hasattr(episode, "env_id"):
        traj_steps = list(episode.steps)
        if not traj_steps:
            raise ConfigError("the trajectory has no steps")
        pairs = [(s.action, _text(s.observation)) for s in traj_steps]
        return traj_steps[0].prompt, pairs, env_id or str(episode.env_id)
    raise ConfigError(
        f"cannot read an episode from {type(episode).__name__}: pass a Trajectory, its dict form, "
        "or the instruction and steps=[(action, observation), ...]"
    )


def _pair(step: Any) -> tuple[str, str]:
    if isinstance(step, Mapping):
        action, observation = step.get("action"), step.get("observation")
    elif isinstance(step, Sequence) and not isinstance(step, str) and len(step) == 2:
        action, observation = step
    else:
        raise ConfigError(f"a step must be (action, observation) or a mapping with those keys, got {type(step).__name__}")
    if not isinstance(action, str):
        raise ConfigError(f"a step's action must be a str, got {type(action).__name__}")
    return action, _text(observation)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else str(value)


def load_sft_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A row of an :func:`export_sft` file as messages for ``apply_chat_template`` (arguments as objects)."""
    out = []
    for message in row["messages"]:
        message = {k: v for k, v in dict(message).items() if v is not None}
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}
                for call in message["tool_calls"]
            ]
        else:
            message.pop("tool_calls", None)
        out.append(message)
    return out


def export_sft(
    env_id: str, path: str | Path, *, episodes: int, agent: str = "oracle", seed: int = 0, split: str = "train"
) -> dict[str, Any]:
    """Run ``agent`` for ``episodes`` episodes (seeds ``seed..``) and write them as an SFT Parquet file.

    Columns (:data:`SFT_COLUMNS`): ``messages`` (:func:`to_messages` with ``arguments_as="json"``;
    every message has ``role``, ``content``, ``tool_calls``, ``tool_call_id`` and ``name``, null
    where unused), ``tools`` (the JSON of ``info["tools"]``), ``env_id``, ``task_id``, ``split``,
    ``seed``, ``success``, ``episode_return``. ``datasets.load_dataset("parquet", data_files=path)``
    reads it; :func:`load_sft_messages` gives a row's messages for a chat template.

    Returns:
        A summary: ``episodes``, ``solved``, ``messages`` and ``path``.
    """
    import gymnasium as gym
    import pyarrow as pa
    import pyarrow.parquet as pq

    from agentrl_envs.agents import OracleAgent, RandomAgent

    if agent not in ("oracle", "random"):
        raise ConfigError(f"agent={agent!r}: use 'oracle' or 'random'")
    if not isinstance(episodes, int) or episodes < 1:
        raise ConfigError(f"episodes={episodes!r}: use a positive int")
    rows: dict[str, list[Any]] = {name: [] for name in SFT_COLUMNS}
    tools = json.dumps(tool_schemas(env_id))
    env = gym.make(env_id, split=split)
    player = OracleAgent(env) if agent == "oracle" else RandomAgent(env, seed=seed)
    try:
        for n in range(episodes):
            observation, info = env.reset(seed=seed + n)
            instruction, pairs, total, done = observation, [], 0.0, False
            while not done:
                action = player.act(observation, info)
                observation, reward, terminated, truncated, info = env.step(action)
                pairs.append((action, observation))
                total += float(reward)
                done = terminated or truncated
            messages = to_messages(instruction, pairs, env_id=env_id, arguments_as="json")
            rows["messages"].append([_full_message(m) for m in messages])
            rows["tools"].append(tools)
            rows["env_id"].append(env_id)
            rows["task_id"].append(str(info["task_id"]))
            rows["split"].append(split)
            rows["seed"].append(seed + n)
            rows["success"].append(bool(info["success"]))
            rows["episode_return"].append(total)
    finally:
        env.close()
    call = pa.struct([("name", pa.string()), ("arguments", pa.string())])
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.list_(pa.struct([("id", pa.string()), ("type", pa.string()), ("function", call)]))),
            ("tool_call_id", pa.string()),
            ("name", pa.string()),
        ]
    )
    schema = pa.schema(
        [
            ("messages", pa.list_(message)),
            ("tools", pa.string()),
            ("env_id", pa.string()),
            ("task_id", pa.string()),
            ("split", pa.string()),
            ("seed", pa.int64()),
            ("success", pa.bool_()),
            ("episode_return", pa.float64()),
        ]
    )
    from agentrl_envs._output import write_atomically

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(rows, schema=schema)
    write_atomically(Path(path), lambda tmp: pq.write_table(table, tmp), flag="path")
    return {"episodes": episodes, "solved": sum(rows["success"]), "messages": sum(map(len, rows["messages"])), "path": str(path)}


def _full_message(message: Mapping[str, Any]) -> dict[str, Any]:
    return {key: message.get(key) for key in ("role", "content", "tool_calls", "tool_call_id", "name")}
