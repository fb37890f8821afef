"""Counterfactual reward-model data: every perturbation changes the outcome, and the counts add up."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pyarrow.parquet as pq
import pytest
import sqlglot

from agentrl_envs import ConfigError
from agentrl_envs.agents import OracleAgent
from agentrl_envs.analysis.counterfactual import (
    GOLD_LABEL,
    PERTURBED_LABEL,
    add_arguments,
    cmd_make_rm_data,
    make_rm_data,
)
from agentrl_envs.tasks.base import normalize_rows
from agentrl_envs.tasks.sampler import TaskSampler
from simulators.sql import ReadOnlyDatabase, build_database

EPISODES = 2
KIND = {"AgentRL/SQL-v0": "sql", "AgentRL/Python-v0": "python", "AgentRL/SMTP-v0": "smtp", "AgentRL/SQLPythonSMTP-v1": "pipeline"}
COLUMNS = [
    "env_id",
    "split",
    "task_id",
    "step",
    "subtask",
    "tool",
    "prompt",
    "action",
    "label",
    "perturbation",
    "detail",
    "errors",
]


@pytest.fixture(scope="module", params=list(KIND))
def made(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    env_id = str(request.param)
    summary = make_rm_data(env_id, EPISODES, tmp_path_factory.mktemp("rm"), seed=3)
    rows = pq.read_table(summary["path"]).to_pylist()
    return env_id, summary, rows


def test_files_read_back_and_counts_add_up(made: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    env_id, summary, rows = made
    table = pq.read_table(summary["path"])
    assert table.column_names == COLUMNS and table.num_rows == summary["rows"] == len(rows)
    saved = json.loads(Path(summary["path"]).with_suffix(".summary.json").read_text())
    assert saved == summary
    gold = [r for r in rows if r["perturbation"] == "gold"]
    perturbed = [r for r in rows if r["perturbation"] != "gold"]
    assert summary["gold_calls"] == len(gold) and summary["perturbations"] == len(perturbed)
    assert summary["rows"] == summary["gold_calls"] + summary["perturbations"]
    assert summary["perturbations"] == sum(summary["by_kind"].values())
    assert summary["candidates"] == summary["perturbations"] + summary["dropped_unchanged"] + summary["unused"]
    assert summary["erroring"] == sum(r["errors"] for r in perturbed)
    assert {r["label"] for r in gold} == {GOLD_LABEL} and {r["label"] for r in perturbed} == {PERTURBED_LABEL}
    # One gold row per oracle tool call: 1 per episode, 3 (sql, python, smtp) in the pipeline env.
    assert len(gold) == EPISODES * (4 if KIND[env_id] == "pipeline" else 1)  # query, program, staff lookup, email
    assert summary["short_calls"] == 0 and len(perturbed) == 3 * len(gold)
    for g in gold:  # perturbations follow their gold row, same call site, other kinds first
        mine = [r for r in perturbed if (r["task_id"], r["step"]) == (g["task_id"], g["step"])]
        assert len(mine) == 3 and all(r["tool"] == g["tool"] and r["prompt"] == g["prompt"] for r in mine)
        assert len({r["action"] for r in mine} | {g["action"]}) == 4
        assert len({r["perturbation"].split("_")[0] for r in mine}) >= 2 or g["tool"] == "python"


def test_prompts_hold_the_instruction_and_the_transcript(made: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    _, _, rows = made
    gold = [r for r in rows if r["perturbation"] == "gold"]
    for g in gold:
        earlier = [x for x in gold if x["task_id"] == g["task_id"] and x["step"] < g["step"]]
        assert all(f"> {x['action']}" in g["prompt"] for x in earlier)
        assert g["prompt"].startswith("You are an analytics agent")


def test_every_written_perturbation_changes_the_outcome(made: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    """Checked independently of the module: SQL on a fresh simulator database, Python and SMTP by
    replaying the episode in the env and asking its checker at the end."""
    env_id, _, rows = made
    env = gym.make(env_id)
    agent = OracleAgent(env)
    seeds = {}
    for i in range(EPISODES):
        _, info = env.reset(seed=3 + i)
        seeds[info["task_id"]] = 3 + i
    sampler = TaskSampler(KIND[env_id], "train")
    try:
        for row in (r for r in rows if r["perturbation"] != "gold"):
            if row["tool"] == "sql":
                task = sampler.sample(int(row["task_id"].rsplit("/", 1)[1]))
                assert task.database is not None and sqlglot.parse_one(json.loads(_args(row["action"]))["query"], read="sqlite")
                gold_sql = task.subtasks[row["subtask"]].gold_sql
                db = ReadOnlyDatabase(build_database(task.database.tables))
                try:
                    assert _rows(db, json.loads(_args(row["action"]))["query"]) != _rows(db, gold_sql), row["detail"]
                finally:
                    db.close()
                continue
            obs, info = env.reset(seed=seeds[row["task_id"]])
            for _ in range(row["step"] - 1):
                obs, *_, info = env.step(agent.act(obs, info))
            obs, *_, info = env.step(row["action"])
            *_, info = env.step('{"name": "finish", "arguments": {"answer": "done"}}')
            name = {"python": "computed", "smtp": "emailed"}[row["tool"]]
            prefix = f"s{row['subtask'] + 1}." if any(k.startswith("s1.") for k in info["task_components"]) else ""
            assert info["task_components"][prefix + name] is False, (row["perturbation"], row["detail"])
    finally:
        env.close()
        sampler.close()


def test_sql_edits_keep_the_gold_text_outside_the_mistake(made: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    _, _, rows = made
    gold = {(r["task_id"], r["step"]): json.loads(_args(r["action"])) for r in rows if r["perturbation"] == "gold"}
    for r in rows:
        if r["tool"] == "sql" and r["perturbation"] != "gold":
            before, after = gold[(r["task_id"], r["step"])]["query"], json.loads(_args(r["action"]))["query"]
            for keep in ("NUMERIC", "substr(", " f JOIN "):  # sqlglot would rewrite these if it regenerated the text
                assert (keep in before) <= (keep in after) or r["perturbation"] in ("sql.where_drop", "sql.join_table")


@pytest.mark.parametrize("episodes", [0, -1, True, 2.5, "3"])
def test_bad_episode_counts(episodes: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="episodes"):
        make_rm_data("AgentRL/SQL-v0", episodes, tmp_path)


def test_unwritable_directory_and_bad_ids(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="writable directory"):
        make_rm_data("AgentRL/SQL-v0", 1, blocker / "out")
    with pytest.raises(ConfigError, match="writable directory"):
        make_rm_data("AgentRL/SQL-v0", 1, blocker)
    with pytest.raises(ConfigError, match="writable directory"):
        make_rm_data("AgentRL/SQL-v0", 1, str(tmp_path) + "/bad\x00name")
    with pytest.raises(ConfigError, match="available"):
        make_rm_data("AgentRL/Nope-v0\x00" + "x" * 5000, 1, tmp_path)
    with pytest.raises(ConfigError, match="split"):
        make_rm_data("AgentRL/SQL-v0", 1, tmp_path / "never", split="validation")
    assert not (tmp_path / "never").exists()
    with pytest.raises(ConfigError, match="seed"):
        make_rm_data("AgentRL/SQL-v0", 1, tmp_path, seed=-1)


def test_cli_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["AgentRL/SMTP-v0", "--episodes", "2", "-o", str(tmp_path / "rm"), "--split", "heldout"])
    assert cmd_make_rm_data(args) == 0
    out = capsys.readouterr().out
    assert "8 rows" in out and "SMTP-v0-heldout.parquet" in out
    assert pq.read_table(tmp_path / "rm" / "SMTP-v0-heldout.parquet").column("split").to_pylist() == ["heldout"] * 8
    with pytest.raises(SystemExit):
        parser.parse_args(["AgentRL/SMTP-v0", "--episodes", "many", "-o", "x"])


def _args(action: str) -> str:
    payload = json.loads(action.removeprefix("<tool_call>").removesuffix("</tool_call>"))
    return json.dumps(payload["arguments"])


def _rows(db: ReadOnlyDatabase, sql: str | None) -> Any:
    try:
        return normalize_rows(db.query(sql or "").rows)
    except Exception as exc:
        return type(exc).__name__
