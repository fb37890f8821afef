"""agentrl_envs.integrations.verifiers_env: verifiers' own eval runner against a scripted oracle endpoint on loopback.

Each rollout's transcript is replayed through ``gym.make`` with the task's seed: the return, the reward
components and success must be what verifiers recorded as the reward and metrics.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl_envs.errors import ConfigError
from agentrl_envs.integrations.oracle_chat import OracleChat, transcript_actions
from agentrl_envs.testing import free_port, serve_in_thread

from ..conftest import ENV_IDS
from .conftest import ROOT, run_example
from .frameworks import gym_twin, import_or_skip, replay

vf = import_or_skip("verifiers.v1", "verifiers")
from verifiers.v1.cli.eval.runner import run_eval  # noqa: E402
from verifiers.v1.configs.cli.eval import EvalConfig  # noqa: E402
from verifiers.v1.dialects.chat import message_to_wire  # noqa: E402
from verifiers.v1.runtimes import SubprocessConfig  # noqa: E402

from agentrl_envs.integrations.verifiers_env import TASKSET_ID, AgentRLTasksetConfig, load_environment  # noqa: E402

TASKS = 2


@pytest.fixture(scope="module", autouse=True)
def hub_package_on_path() -> Iterator[None]:
    """The Environments Hub package, importable as ``agentrl_env`` without ``pip install -e environments/agentrl_env``."""
    sys.path.insert(0, str(ROOT / "environments" / "agentrl_env"))
    yield
    sys.path.remove(str(ROOT / "environments" / "agentrl_env"))


def evaluate(base_url: str, env_id: str, tmp_path: Path, **make_kwargs: Any) -> list[Any]:
    """verifiers' eval runner (what ``vf-eval`` runs) over TASKS seeded tasks; the traces."""
    taskset = AgentRLTasksetConfig(id=TASKSET_ID, env_id=env_id, num_tasks=TASKS, make_kwargs=make_kwargs)
    agent = vf.AgentConfig(harness=vf.HarnessConfig(id=TASKSET_ID), runtime=SubprocessConfig())
    config = EvalConfig(
        env=vf.SingleAgentEnvConfig(taskset=taskset, agent=agent),
        model="oracle",
        client=vf.EvalClientConfig(base_url=f"{base_url}/v1", api_key_var="AGENTRL_TEST_NO_KEY"),
        rich=None,
        push=False,
        output_dir=tmp_path,
    )
    episodes = asyncio.run(run_eval(config))
    return [trace for episode in episodes for trace in episode.traces]


def wire(trace: Any) -> list[dict[str, Any]]:
    return [message_to_wire(message) for message in trace.messages]


@pytest.mark.parametrize("profile", ["none", "flaky"])
def test_vf_eval_rewards_equal_the_transcript_replayed_through_gym_make(env_id: str, profile: str, tmp_path: Path) -> None:
    oracle = OracleChat(env_id, range(TASKS), error_profile=profile)
    with serve_in_thread(oracle.app(), free_port()) as url:
        traces = evaluate(url, env_id, tmp_path, error_profile=profile)
    assert len(traces) == TASKS
    for trace in traces:
        assert trace.ok, trace.last_error
        seed = trace.task.data.seed
        twin, instruction, info = gym_twin(env_id, seed, error_profile=profile)
        twin.close()
        messages = wire(trace)
        assert messages[:2] == [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": instruction}]
        played = replay(env_id, seed, transcript_actions(messages), error_profile=profile)
        assert played["success"] is True and trace.metrics["success"] == 1.0
        assert trace.reward == pytest.approx(played["return"]) and trace.rewards["agentrl_return"].score == pytest.approx(
            played["return"]
        )
        assert {k: trace.metrics[f"reward_{k}"] for k in played["components"]} == pytest.approx(played["components"])
        assert trace.metrics["steps"] == len(played["observations"])
        # the model saw exactly the env's observations (the last one ends the episode, after the last request)
        tool_results = [m["content"] for m in messages if m["role"] == "tool"]
        assert tool_results == played["observations"][: len(tool_results)]


def test_flaky_faults_reach_the_verifiers_rollouts(tmp_path: Path) -> None:
    oracle = OracleChat("AgentRL/Workplace-v1", range(TASKS), error_profile="flaky")
    with serve_in_thread(oracle.app(), free_port()) as url:
        traces = evaluate(url, "AgentRL/Workplace-v1", tmp_path, error_profile="flaky")
    faults = [
        replay("AgentRL/Workplace-v1", t.task.data.seed, transcript_actions(wire(t)), error_profile="flaky")["faults"]
        for t in traces
    ]
    assert sum(faults) > 0 and all(t.metrics["success"] == 1.0 for t in traces)
    assert min(t.metrics["reward_fault"] for t in traces) < 0


HOSTILE_CALLS = [
    ("sql", "{not json"),
    ("rm_rf", "{}"),
    ("sql", json.dumps({"query": "x" * 250_000})),
    ("sql", "[1, 2, 3]"),
]


def scripted_app(replies: list[dict[str, Any]]) -> Callable[..., Any]:
    """A chat endpoint that answers turn ``i`` (counted by assistant messages) with ``replies[i]``."""

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            event = await receive()
            body += event.get("body", b"")
            if not event.get("more_body"):
                break
        turn = sum(m["role"] == "assistant" for m in json.loads(body)["messages"])
        choice = {"index": 0, "message": {"role": "assistant", **replies[min(turn, len(replies) - 1)]}, "finish_reason": "stop"}
        data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})

    return app


def test_hostile_tool_calls_get_an_error_to_the_model_and_the_rollout_goes_on(tmp_path: Path) -> None:
    calls = [
        {"tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}]}
        for i, (n, a) in enumerate(HOSTILE_CALLS)
    ]
    two_at_once = {"tool_calls": [{"id": "a", "type": "function", "function": {"name": "sql", "arguments": "{}"}}] * 2}
    replies = [
        *calls,
        two_at_once,
        {"content": "no call at all"},
        {"tool_calls": [{"id": "f", "type": "function", "function": {"name": "finish", "arguments": '{"answer": "0"}'}}]},
    ]
    with serve_in_thread(scripted_app(replies), free_port()) as url:
        (trace, _) = evaluate(url, "AgentRL/SQL-v0", tmp_path)
    assert trace.ok, trace.last_error
    results = [m["content"] for m in wire(trace) if m["role"] in ("tool", "user")][1:]
    codes = [r.split("]")[0] for r in results]
    assert codes[:4] == [
        "action error [bad_json",
        "action error [unknown_tool",
        "action error [too_long",
        "action error [bad_arguments",
    ]
    assert codes[4:6] == ["action error [multiple_calls"] * 2 and codes[6] == "action error [no_call"
    assert trace.metrics["reward_format"] == pytest.approx(-0.1 * 6) and trace.metrics["success"] == 0.0


def test_load_environment_builds_the_hub_taskset_and_refuses_bad_ids() -> None:
    env = load_environment("AgentRL/SMTP-v0", num_tasks=3, seed=10, split="test", error_profile="flaky")
    tasks = list(env.taskset)
    assert [t.data.seed for t in tasks] == [10, 11, 12] and {t.data.split for t in tasks} == {"test"}
    assert tasks[0].data.prompt == gym_twin("AgentRL/SMTP-v0", 10, split="test", error_profile="flaky")[1]
    assert tasks[0].data.make_kwargs == {"error_profile": "flaky"}
    with pytest.raises(ConfigError, match="unknown environment"):
        load_environment("AgentRL/Nope-v0")


def test_every_id_loads() -> None:
    for env_id in ENV_IDS:
        (task,) = list(load_environment(env_id, num_tasks=1).taskset)
        assert task.data.env_id == env_id and task.data.system_prompt


def test_verifiers_eval_example() -> None:
    out = run_example("verifiers_eval.py", "--num-tasks", "2")
    assert "success 2/2" in out
