"""``agentrl-train stages``: a short bounded plan end to end (both arms), stacked frozen adapters, bad plans."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from agentrl_envs.errors import ConfigError
from agentrl_train.stages import load_plan, run_stages

from .conftest import SMALL

pytestmark = pytest.mark.timeout(1800)  # a hang detector; the work is bounded by update counts

SHORT_PLAN = {
    "model": "tiny",
    "seed": 0,
    "compare_single": True,
    "eval_split": "test",
    "eval_episodes": 1,
    "rm": {"train_episodes": 3, "test_episodes": 1, "steps": 4},
    "ppo": {**SMALL, "num_envs": 2, "rollout_steps": 2, "vectorization": "sync", "checkpoint_every": 0},
    "stages": [
        {"name": "preference", "envs": ["AgentRL/Preference-v0"], "updates": 1},
        {"name": "tool", "envs": ["AgentRL/SQL-v0"], "updates": 1},
        {"name": "exec", "envs": ["AgentRL/SQLPythonSMTP-v0"], "updates": 1},
    ],
}


@pytest.fixture(scope="module")
def stages_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    plan_file = tmp_path_factory.mktemp("plan") / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(SHORT_PLAN))
    out = tmp_path_factory.mktemp("stages")
    return run_stages(str(plan_file), str(out), log=lambda *a, **k: None)


def test_short_plan_writes_the_separation_table(stages_run: dict[str, Any]) -> None:
    out = Path(stages_run["out"])
    rows = json.loads((out / "separation.json").read_text())
    assert [(r["arm"], r["after"]) for r in rows] == [
        (arm, after) for arm in ("separate", "single") for after in ("base", "preference", "tool", "exec")
    ]
    by = {(r["arm"], r["after"]): r for r in rows}
    assert by[("separate", "exec")]["adapters"] == ["preference", "tool", "exec"]
    assert by[("separate", "tool")]["adapters"] == ["preference", "tool"]
    assert by[("single", "exec")]["adapters"] == ["single"]
    for r in rows:
        assert 0.0 <= r["tool_accuracy"] <= 1.0 and 0.0 <= r["task_success"] <= 1.0
    table = (out / "separation.md").read_text()
    assert "| separate | exec | preference, tool, exec |" in table and "| single | exec | single |" in table
    # Each stage has its own reward, data and eval in the run folder.
    assert json.loads((out / "rm" / "eval.json").read_text())["test/all"]["pairs"] > 0
    assert list((out / "rm-data").glob("*.parquet"))
    for arm in ("separate", "single"):
        for stage, env in (("preference", "Preference-v0"), ("tool", "SQL-v0"), ("exec", "SQLPythonSMTP-v0")):
            assert (out / arm / stage / env / "final").is_dir()
            assert (out / arm / stage / env / "metrics.jsonl").exists()
            assert "tool_accuracy" in json.loads((out / arm / stage / "eval.json").read_text())["summary"]


def test_exec_stage_trains_only_its_adapter_and_keeps_earlier_ones_frozen(stages_run: dict[str, Any]) -> None:
    from safetensors.torch import load_file

    from agentrl_train.config_io import config_from_dict
    from agentrl_train.policy import build_policy

    out = Path(stages_run["out"])
    cfg = config_from_dict(yaml.safe_load((out / "separate" / "exec" / "SQLPythonSMTP-v0" / "config.yaml").read_text()))
    assert [s.split("=")[0] for s in cfg.model.frozen_adapters] == ["preference", "tool"]
    policy = build_policy(cfg, log=lambda *a, **k: None)
    trainable = [n for n, _ in policy.trainable_parameters()]
    assert trainable and all(".exec." in n or n.startswith("value_head") for n in trainable)
    assert policy.lm.base_model.active_adapter == ["preference", "tool", "exec"]
    # The frozen preference adapter is the one the preference stage saved, unchanged by the later stages.
    saved = load_file(out / "separate" / "preference" / "Preference-v0" / "final" / "preference" / "adapter_model.safetensors")
    params = dict(policy.lm.named_parameters())
    key = next(k for k in saved if "lora_B" in k)
    live = next(n for n in params if n.endswith(key.replace(".weight", ".preference.weight").split("base_model.model.")[-1]))
    assert torch.equal(params[live].detach().cpu(), saved[key]) and not params[live].requires_grad
    # The stage's adapter file holds only its own adapter.
    exec_files = list((out / "separate" / "exec" / "SQLPythonSMTP-v0" / "final").rglob("adapter_model.safetensors"))
    assert [f.parent.name for f in exec_files] == ["exec"]


def test_default_plan_is_shipped_and_valid() -> None:
    plan = load_plan(None)
    assert [s["name"] for s in plan["stages"]] == ["preference", "tool", "exec"]
    assert plan["stages"][1]["envs"] == ["AgentRL/SQL-v0", "AgentRL/Python-v0", "AgentRL/SMTP-v0"]
    assert plan["compare_single"] is True


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("stages: []\n", "non-empty list"),
        ("stagez: []\n", "unknown key"),
        ("- 1\n", "top level must be a mapping"),
        ("stages: [{name: a, envs: [X], updates: 1}, {name: a, envs: [Y], updates: 1}]\n", "unique identifier"),
        ("stages: [{name: a, envs: [], updates: 1}]\n", "needs 'envs'"),
        ("stages: [{name: a, envs: [X], updates: 0}]\n", "positive int"),
        ("stages: [{name: a, envs: [X], updates: 1}]\nrm: {stepz: 3}\n", "rm: unknown key"),
        ("stages: [\n", "not valid YAML"),
        # values a run would use: each was accepted, then failed minutes later (after the reward model trained)
        ("stages: [{name: a, envs: [Nope-v0], updates: 1}]\n", r"stage 'a' \(Nope-v0\): --env 'Nope-v0': no such env id"),
        ("stages: [{name: a, envs: [AgentRL/SQL-v0], updates: 1}]\nppo: {bogus: 1}\n", "unknown option 'bogus'"),
        ("stages: [{name: a, envs: [AgentRL/SQL-v0], updates: 1, options: {lr: -1}}]\n", r"--lr=-1.0: use a value > 0"),
        ("stages: [{name: a, envs: [AgentRL/SQL-v0], updates: 1, options: 5}]\n", "options must be a mapping"),
        ("stages: [{name: a, envs: [AgentRL/SQL-v0], updates: 1}]\neval_split: nope\n", "eval_split='nope'"),
        ("stages: [{name: a, envs: [AgentRL/SQL-v0], updates: 1}]\neval_episodes: 0\n", "eval_episodes=0"),
        ("stages: [{name: a, envs: [AgentRL/SQL-v0], updates: 1}]\ncompare_single: 'yes'\n", "compare_single='yes'"),
        ("stages: [{name: a, envs: [AgentRL/SQL-v0], updates: 1}]\nmodel: 5\n", "model=5"),
        ("stages: [{name: a, envs: [AgentRL/SQL-v0], updates: 1}]\nrm: {lr: x}\n", r"rm: --lr='x': use a number"),
        ("stages: [{name: a, envs: [AgentRL/SQL-v0], updates: 1}]\nrm: {steps: -1}\n", r"rm: --steps=-1"),
        ("stages: [{name: a, envs: [AgentRL/SQL-v0], updates: 1}]\nrm: {train_episodes: 0}\n", "train_episodes=0"),
        ("stages: [{name: a, envs: [AgentRL/SQL-v0], updates: 1}]\nrm: {data_env: Nope}\n", r"rm: --env 'Nope'"),
    ],
)
def test_bad_plans_give_clear_errors(tmp_path: Path, text: str, match: str) -> None:
    f = tmp_path / "plan.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_plan(str(f))


def test_missing_plan_and_bad_frozen_adapter(tmp_path: Path, small_policy: Any) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_plan(str(tmp_path / "nope.yaml"))
    policy, _ = small_policy
    with pytest.raises(ConfigError, match=r"no adapter_config\.json"):
        policy.add_frozen_adapter("earlier", tmp_path / "missing")
    with pytest.raises(ConfigError, match="already used"):
        policy.add_frozen_adapter(policy.adapter, tmp_path)
    from agentrl_train.config_io import load_config

    with pytest.raises(ConfigError, match="NAME=DIR"):
        load_config(None, {"frozen_adapters": ["no-equals-sign"]})
