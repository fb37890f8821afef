"""``agentrl-train eval --transcripts FILE``: every evaluated episode written out, matching the summary."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401  (registers the ids)
from agentrl_train.cli import main
from agentrl_train.train import train

from .conftest import small_config


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("evaltx")
    train(small_config(tmp, updates=1, record=False), log=lambda *a, **k: None)
    return tmp / "run"


def _eval(run, capsys, *flags: str) -> dict:  # type: ignore[no-untyped-def]
    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--split", "train", "--episodes", "3", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_transcripts_match_the_summary_and_replay_in_gym(run, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    plain = _eval(run, capsys)
    f = tmp_path / "t.jsonl"
    result = _eval(run, capsys, "--transcripts", str(f))
    assert result == plain  # recording changes nothing
    records = [json.loads(line) for line in f.read_text().splitlines()]
    assert [r["episode"] for r in records] == [0, 1, 2]
    assert sum(r["success"] for r in records) / 3 == pytest.approx(result["success_rate"])
    assert sum(r["return"] for r in records) / 3 == pytest.approx(result["mean_return"])
    for r in records:
        assert r["length"] == len(r["steps"]) and r["return"] == pytest.approx(sum(s["reward"] for s in r["steps"]))
        # the same seed and actions in a fresh env give the same observations and rewards
        env = gym.make("AgentRL/SQLPythonSMTP-v1", split="train", candidates=4)
        obs, info = env.reset(seed=r["seed"])
        assert obs == r["instruction"] and info["task_id"] == r["task_id"]
        for s in r["steps"]:
            obs, reward, *_ = env.step(s["action"])
            assert obs == s["observation"] and reward == pytest.approx(s["reward"])
        env.close()


@pytest.mark.parametrize("bad", ["", "{tmp}", "{tmp}/missing/t.jsonl"])
def test_a_bad_transcripts_path_is_refused_before_evaluating(run, tmp_path, capsys, bad: str) -> None:  # type: ignore[no-untyped-def]
    capsys.readouterr()
    argv = ["eval", "--run", str(run), "--episodes", "1", "--transcripts", bad.format(tmp=tmp_path)]
    assert main(argv) == 2
    assert "--transcripts" in capsys.readouterr().err
