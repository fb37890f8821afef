"""OpenAIChatAgent end to end over real HTTP: a uvicorn server on a free loopback port that answers with
the oracle's actions, driving full episodes to success; and ``agentrl-envs eval --agent openai``."""

from __future__ import annotations

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401
from agentrl_envs.agents import OpenAIChatAgent
from agentrl_envs.cli.main import main
from tests.agents.oracle_replay import OracleReplay, asgi_app, serve_in_thread
from tests.integration.servers import free_port


@pytest.mark.parametrize("native", [True, False])
def test_full_episodes_to_success_over_http(native: bool) -> None:
    env_id = "AgentRL/SQLPythonSMTP-v1"
    replay = OracleReplay(env_id, native=native)
    env = gym.make(env_id)
    try:
        with serve_in_thread(asgi_app(replay), free_port()) as url:
            agent = OpenAIChatAgent(url, "policy", seed=0, feedback=True, temperature=0.0)
            for seed in range(2):
                obs, info = env.reset(seed=seed)
                done = False
                while not done:
                    obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
                    done = terminated or truncated
                assert info["success"], obs
                agent.report_outcome(info)
            agent.close()
    finally:
        env.close()
        replay.close()
    assert replay.problems == []
    assert len(replay.episodes) == 2 and len(set(replay.episodes)) == 2
    assert [f["success"] for f in replay.feedback] == [True, True]
    assert [f["episode_id"] for f in replay.feedback] == replay.episodes
    assert agent.stats.retries == 0 and agent.stats.parse_failures == 0
    assert agent.stats.requests == len(replay.bodies) + 2


def test_eval_command_with_the_openai_agent(capsys: pytest.CaptureFixture[str]) -> None:
    replay = OracleReplay("AgentRL/SQL-v0", split="train")
    try:
        with serve_in_thread(asgi_app(replay), free_port()) as url:
            argv = ["eval", "AgentRL/SQL-v0", "--agent", "openai", "--base-url", url, "--model", "policy"]
            code = main([*argv, "--split", "train", "--episodes", "3", "--feedback"])
    finally:
        replay.close()
    out, err = capsys.readouterr()
    assert code == 0, err
    assert replay.problems == []
    assert "openai agent on AgentRL/SQL-v0: 3 episodes" in out
    assert [line for line in out.splitlines() if line.startswith("all ")][-1].split()[3] == "100.0%"
    assert "endpoint: requests" in err and "retries 0" in err
    assert len(replay.feedback) == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--agent", "openai", "--model", "m"], "needs --base-url"),
        (["--agent", "openai", "--base-url", "http://127.0.0.1:9"], "needs --base-url URL and --model"),
        (["--agent", "oracle", "--base-url", "http://127.0.0.1:9"], "only apply to --agent openai"),
        (["--agent", "random", "--feedback"], "only apply to --agent openai"),
        (["--agent", "openai", "--base-url", "127.0.0.1:9", "--model", "m"], "http:// or https://"),
        (
            ["--agent", "openai", "--base-url", "http://127.0.0.1:9", "--model", "m", "--api-key-env", "AGENTRL_TEST_UNSET_KEY"],
            "not set",
        ),
    ],
)
def test_eval_openai_bad_options(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "AgentRL/SQL-v0", "--episodes", "1", "--no-progress", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
