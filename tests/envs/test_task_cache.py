"""Cached tasks (issue #16): made once per seed, shared read-only, never leaking between episodes."""

from __future__ import annotations

import copy
import json
import pickle

import gymnasium as gym
import pytest

from agentrl_envs.backends import EpisodeSetup, ToolRequest
from agentrl_envs.backends.direct import DirectBackend
from agentrl_envs.core.actions import format_call
from agentrl_envs.errors import ConfigError
from agentrl_envs.tasks import TaskSampler
from agentrl_envs.tasks.base import FrozenDict
from agentrl_envs.tasks.sampler import clear_task_cache
from simulators.sql import ReadOnlyDatabase, build_database


def test_a_seed_is_generated_once_and_shared_by_every_env() -> None:
    clear_task_cache()
    a, b = TaskSampler("pipeline"), TaskSampler("pipeline")
    first = a.sample(12)
    assert b.sample(12) is first  # the process-wide cache, not a copy
    clear_task_cache()
    again = b.sample(12)
    assert again is not first and again == first  # regenerated, and the same task
    assert TaskSampler("pipeline", split="test").sample(12) != first  # the split is part of the key
    a.close()
    b.close()


def test_cached_task_data_is_read_only() -> None:
    task = TaskSampler("python").sample(3)
    assert task.files and task.database is None and task.data is not None
    path = next(iter(task.files))
    with pytest.raises(TypeError, match="shared by every episode"):
        task.files[path] = "tampered"
    with pytest.raises(TypeError):
        task.files.update({"x.csv": "1"})
    with pytest.raises(TypeError):
        del task.files[path]
    tables = task.data.tables
    with pytest.raises(TypeError):
        tables["staff"]["rows"] = ()
    with pytest.raises(TypeError):
        tables.pop("staff")
    with pytest.raises((TypeError, AttributeError)):
        tables["staff"]["rows"][0][1] = "Mallory"  # rows are tuples
    # A private copy is an ordinary dict, and JSON and pickling see the same data.
    mine = dict(task.files)
    mine[path] = "mine"
    assert task.files[path] != "mine"
    assert json.loads(json.dumps(tables)) == json.loads(json.dumps(pickle.loads(pickle.dumps(tables))))
    assert isinstance(copy.deepcopy(task.files), FrozenDict)


def test_mutating_one_episode_does_not_reach_the_next_with_the_same_seed() -> None:
    env = gym.make("AgentRL/SQLPythonSMTP-v1")
    obs0, info0 = env.reset(seed=5)
    core = env.unwrapped
    task = core.task
    gold_rows = task.subtasks[0].gold_rows
    # What an episode can change: its result rows (the info dict is the caller's), its own
    # workspace (Python writes and deletes files) and mail. None of it may reach the next episode.
    action = format_call("sql", {"query": task.subtasks[0].gold_sql})
    _, _, _, _, info = env.step(action)
    info["tool_result"]["columns"].append("tampered")
    wipe = (
        "import os, shutil\nfor p in os.listdir('.'):\n    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)\nprint('gone')"
    )
    _, _, _, _, info = env.step(format_call("python", {"code": wipe}))
    assert "gone" in info["tool_result"]["stdout"]
    info0["tools"].clear()
    obs1, info1 = env.reset(seed=5)
    assert core.task is task and task.subtasks[0].gold_rows == gold_rows
    assert obs1 == obs0 and info1["tools"] and info1["task_id"] == info0["task_id"]
    _, _, _, _, info = env.step(action)
    assert info["tool_result"]["columns"][-1] != "tampered" and info["tool_result"]["csv_path"] == "results/q1.csv"
    env.close()


def test_the_episode_database_is_a_private_copy() -> None:
    """Two episodes of one seed get separate SQLite copies of one template, opened on first use."""
    task = TaskSampler("sql").sample(8)
    assert task.database is not None
    backend = DirectBackend(python_sandbox=False)
    try:
        for episode in ("ep-a", "ep-b"):
            backend.open_episode(EpisodeSetup(episode, task.database))
        assert backend.app._episodes == {}  # lazily: nothing on the service before a call
        query = ToolRequest("ep-a", "sql", {"query": "SELECT COUNT(*) FROM staff"})
        assert backend.handle(query).ok
        a = backend.app._episodes["ep-a"].database
        assert "ep-b" not in backend.app._episodes
        assert backend.handle(ToolRequest("ep-b", "sql", {"query": "SELECT 1"})).ok
        b = backend.app._episodes["ep-b"].database
        assert a is not None and b is not None and a._raw is not b._raw
        backend.close_episode("ep-a")
        backend.close_episode("never-opened")  # not an error
        assert list(backend.app._episodes) == ["ep-b"]
    finally:
        backend.close()


def test_lazy_open_still_checks_the_episode_id() -> None:
    backend = DirectBackend(python_sandbox=False)
    with pytest.raises(ConfigError, match="episode_id"):
        backend.open_episode(EpisodeSetup("bad id/..", None))
    backend.close()


def test_tables_declare_keys_and_indexes() -> None:
    """The task schema's keys reach the database: lookups by key are B-tree searches, not scans."""
    task = TaskSampler("sql").sample(1)
    assert task.database is not None
    tables = task.database.tables
    assert all(table["primary_key"] for table in tables.values())
    db = ReadOnlyDatabase(build_database(tables))
    plan = db._raw.execute("EXPLAIN QUERY PLAN SELECT * FROM staff WHERE staff_id = 3").fetchall()
    assert any("INTEGER PRIMARY KEY" in str(row) for row in plan), plan
    fact = next(name for name, table in tables.items() if table.get("indexes"))
    column = tables[fact]["indexes"][0][0]
    plan = db._raw.execute(f"EXPLAIN QUERY PLAN SELECT COUNT(*) FROM {fact} WHERE {column} = 3").fetchall()
    assert any("USING COVERING INDEX" in str(row) or "USING INDEX" in str(row) for row in plan), plan
    db.close()


def test_template_images_are_built_once_per_process() -> None:
    """Two simulators (two envs) that store the same tables share one serialized image."""
    from simulators.app import content_digest
    from simulators.sql import TemplateCache

    tables = {"t": {"columns": [["id", "INTEGER"], ["v", "TEXT"]], "rows": [[1, "a"], [2, "b"]], "primary_key": ["id"]}}
    digest = content_digest(tables)
    a, b = TemplateCache(), TemplateCache()
    a.put("t-" + digest[:16], tables, digest=digest)
    b.put("t-" + digest[:16], tables, digest=digest)
    assert a.get("t-" + digest[:16]) is b.get("t-" + digest[:16])
    c = TemplateCache()
    c.put("t-" + digest[:16], tables)  # no digest: built afresh, same content
    assert c.get("t-" + digest[:16]) == a.get("t-" + digest[:16])
