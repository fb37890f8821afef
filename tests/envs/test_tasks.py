"""Tasks: deterministic by seed, disjoint splits, ground truth from the episode's own data."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl_envs import ConfigError
from agentrl_envs.tasks import HELDOUT_DOMAINS, KINDS, TRAIN_DOMAINS, TaskSampler
from agentrl_envs.tasks.domains import DOMAINS
from agentrl_envs.tasks.templates import TEMPLATES


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_task(kind: str) -> None:
    a, b = TaskSampler(kind), TaskSampler(kind)
    for seed in range(10):
        ta, tb = a.sample(seed), b.sample(seed)
        assert ta.instruction == tb.instruction and ta.subtasks == tb.subtasks and ta.files == tb.files


@pytest.mark.parametrize("kind", KINDS)
def test_train_and_test_are_disjoint(kind: str) -> None:
    train, test = TaskSampler(kind, "train"), TaskSampler(kind, "test")
    tr = [train.sample(s) for s in range(150)]
    te = [test.sample(s) for s in range(150)]
    key = lambda t: {(s.template, s.params) for s in t.subtasks}  # noqa: E731
    train_params = set().union(*map(key, tr))
    test_params = set().union(*map(key, te))
    assert train_params and test_params and not train_params & test_params
    assert not {t.data.fingerprint for t in tr} & {t.data.fingerprint for t in te}
    assert {t.domain for t in tr} <= set(TRAIN_DOMAINS)


def test_heldout_domain_never_in_train() -> None:
    assert not set(HELDOUT_DOMAINS) & set(TRAIN_DOMAINS)
    sampler = TaskSampler("sql", "heldout")
    assert {sampler.sample(s).domain for s in range(30)} <= set(HELDOUT_DOMAINS)


def test_five_templates_per_kind_in_every_domain() -> None:
    for kind, templates in TEMPLATES.items():
        assert len(templates) >= 5
        for split in ("train", "test", "heldout"):
            for domain in TRAIN_DOMAINS if split != "heldout" else HELDOUT_DOMAINS:
                sampler = TaskSampler(kind, split, domain)
                seen = {sampler.sample(s).subtasks[0].template for s in range(120)}
                assert len(seen) == len(templates), (kind, split, domain, seen)


def test_ground_truth_comes_from_the_data() -> None:
    """The same template and parameters on another data seed give another expected figure."""
    sampler = TaskSampler("sql", "train", "retail")
    by_key: dict[tuple[object, ...], set[float]] = {}
    for seed in range(400):
        task = sampler.sample(seed)
        sub = task.subtasks[0]
        if sub.figures:
            by_key.setdefault((sub.template, sub.params), set()).add(sub.figures[0])
    assert any(len(v) > 1 for v in by_key.values())


def test_gold_sql_reproduces_the_answer() -> None:
    sampler = TaskSampler("sql", "test", "hr")
    for seed in range(20):
        task = sampler.sample(seed)
        sub = task.subtasks[0]
        _, rows = sampler.runner.query(task.data, sub.gold_sql)
        assert str(rows[0][0]) in (sub.answer, f"{rows[0][0]:.2f}" if isinstance(rows[0][0], float) else "")


def test_long_horizon_has_five_subtasks_and_sixteen_gold_calls() -> None:
    sampler = TaskSampler("pipeline", long_horizon=True)
    task = sampler.sample(0)
    assert len(task.subtasks) >= 5
    assert sum(len(s.steps) for s in task.subtasks) + 1 >= 16
    assert len({s.template for s in task.subtasks}) == 5


def test_domains_generate_deterministic_data() -> None:
    for domain in DOMAINS.values():
        assert domain.generate(3) == domain.generate(3)
        assert domain.generate(3) != domain.generate(4)


def test_sampler_rejects_bad_config() -> None:
    with pytest.raises(ConfigError):
        TaskSampler("chess")
    with pytest.raises(ConfigError):
        TaskSampler("sql", "valid")
    with pytest.raises(ConfigError):
        TaskSampler("sql", long_horizon=True)


def test_gold_python_reads_its_input_from_memory_and_writes_nothing(tmp_path: Any, monkeypatch: Any) -> None:
    """Gold code sees its CSV at GOLD_INPUT through its own ``open``; the runner makes no files, so a
    sampler that is never closed (or a killed worker) leaves nothing in the temp folder."""
    import tempfile

    from agentrl_envs.tasks.base import CSV_PLACEHOLDER, GOLD_INPUT, GoldRunner

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sampler = TaskSampler("pipeline")
    tasks = [sampler.sample(seed) for seed in range(1000, 1012)]  # seeds no other test made: gold code runs
    assert any(s.gold_code for t in tasks for s in t.subtasks)
    runner = GoldRunner()
    code = f"with open({CSV_PLACEHOLDER}, newline='') as f:\n    print(repr(f.read()))\n"
    assert runner.run_code(code, "a,b\r\n1,2\r\n") == repr("a,b\r\n1,2\r\n") + "\n"  # as a file opened with newline=''
    for hostile in (f"open({GOLD_INPUT!r}, 'w')", "open('/etc/passwd')", f"open({GOLD_INPUT!r}, 'rb')"):
        with pytest.raises(OSError, match="gold code reads its input file"):
            runner.run_code(hostile, "x\n")
    assert list(tmp_path.iterdir()) == []
