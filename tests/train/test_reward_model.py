"""The reward model: it learns on make-rm-data, consistency training closes the raw-vs-clean gap,
--domain-adapt trains only the last 2 layers, distillation weights follow the teacher's variance, and
bad input fails clearly. Bounded by step counts on a fixed seed (the same result on a busy machine).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from agentrl_envs.errors import ConfigError
from agentrl_train.reward_model import DECORATIONS, clean_action, decorate, load_rm, load_rm_data
from agentrl_train.rm_train import RMConfig, distill, domain_pairs, groups_of, score_rows, train_rm, uncertainty_weights
from agentrl_train.tiny import TinySpec, build_tiny

from .conftest import SMALL

SPEC = TinySpec(pretrain_steps=SMALL["tiny_pretrain_steps"], corpus_episodes=SMALL["tiny_corpus_episodes"])
QUIET = {"log": lambda *a, **k: None}
ENV = "AgentRL/SQLPythonSMTP-v0"  # the tolerances below were measured on v0's rows
pytestmark = pytest.mark.timeout(1800)  # a hang detector; the work is bounded by step counts


@pytest.fixture(scope="module")
def rm_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrl_envs.analysis.counterfactual import make_rm_data

    out = tmp_path_factory.mktemp("rmdata")
    make_rm_data(ENV, 12, out, seed=0, split="train")
    make_rm_data(ENV, 6, out, seed=0, split="test")
    make_rm_data(ENV, 2, out, seed=0, split="heldout")  # the held-out domain (logistics)
    return out


def _gap(rm: Any, rows: list[Any]) -> float:
    """Mean |score(decorated raw) - score(clean)| over rows, relative to the spread of the clean scores."""
    clean = np.array(score_rows(rm, rows))
    with torch.no_grad():
        raw = np.array(
            [
                float(rm.score([r.prompt], [decorate(r.action, DECORATIONS[i % len(DECORATIONS)])], clean=False)[0])
                for i, r in enumerate(rows)
            ]
        )
    return float(np.abs(raw - clean).mean() / clean.std())


@pytest.fixture(scope="module")
def trained(rm_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same 60 Bradley-Terry steps (seed 0) without (A) and with (B) the consistency term."""
    torch.set_num_threads(1)  # as measured (and as build_policy sets it)
    root = tmp_path_factory.mktemp("rm")
    a = RMConfig(data=str(rm_data), out=str(root / "a"), steps=60, consistency=0.0, device="cpu")
    res_a = train_rm(a, tiny_spec=SPEC, **QUIET)
    b = RMConfig(data=str(rm_data), out=str(root / "b"), steps=60, consistency=1.0, device="cpu")
    res_b = train_rm(b, tiny_spec=SPEC, **QUIET)
    return {"a": a.out, "b": b.out, "eval_a": res_a["eval"], "eval_b": res_b["eval"]}


def test_rm_learns_well_above_chance_on_test(trained: dict[str, Any]) -> None:
    # Measured (same data, seed and steps): test pairwise accuracy 0.685 (A) and 0.722 (B) on 54
    # gold-vs-perturbed pairs of 18 calls; chance is 0.5.
    test = trained["eval_a"]["test/all"]
    assert test["pairs"] >= 40
    assert test["accuracy"] >= 0.65, trained["eval_a"]
    assert trained["eval_b"]["test/all"]["accuracy"] >= 0.65, trained["eval_b"]
    saved = json.loads((Path(trained["a"]) / "eval.json").read_text())
    assert saved["test/all"] == test and {"train/all", "test/retail", "heldout/logistics"} <= set(saved)
    assert saved["heldout/logistics"]["pairs"] > 0 and 0.0 <= saved["heldout/logistics"]["auc"] <= 1.0


def test_decorated_inputs_score_like_clean_after_consistency_training_and_not_before(
    trained: dict[str, Any], rm_data: Path
) -> None:
    rows = [r for r in load_rm_data(rm_data) if r.split == "test"][:32]
    before = _gap(load_rm(trained["a"], device="cpu", **QUIET), rows)
    after = _gap(load_rm(trained["b"], device="cpu", **QUIET), rows)
    # Tolerance: the mean raw-vs-clean gap is at most 0.25 clean-score standard deviations
    # (measured on 40 test rows: 0.41 without the term, 0.09 with it).
    assert after <= 0.25 < before, (before, after)


def test_cleaning_is_the_envs_canonical_form(rm_data: Path) -> None:
    rows = load_rm_data(rm_data)
    for i, r in enumerate(rows[:20]):
        raw = decorate(r.action, DECORATIONS[i % len(DECORATIONS)])
        assert raw != r.action and clean_action(raw) == clean_action(r.action)
    assert clean_action("  not a call  ") == "not a call"


def test_domain_adapt_trains_only_the_last_two_layers(rm_data: Path, tmp_path: Path) -> None:
    import shutil

    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tiny = build_tiny(SPEC, **QUIET)
    tok = AutoTokenizer.from_pretrained(tiny)
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    folder = tmp_path / "four-layers"
    Qwen2ForCausalLM(cfg).save_pretrained(folder)
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, folder / f.name)
    seed = RMConfig(data=str(rm_data), model=str(folder), out=str(tmp_path / "seed"), steps=1, consistency=0.0, device="cpu")
    train_rm(seed, **QUIET)
    before = load_rm(seed.out, device="cpu", **QUIET)
    da = RMConfig(
        data=str(rm_data), model=str(folder), out=str(tmp_path / "da"), steps=3, init=seed.out, domain_adapt=True, device="cpu"
    )
    train_rm(da, **QUIET)
    after = load_rm(da.out, device="cpu", **QUIET)
    changed = {n for (n, p), (_, q) in zip(before.named_parameters(), after.named_parameters()) if not torch.equal(p, q)}
    lora_changed = {n for n in changed if "lora_" in n}
    assert lora_changed and all(".layers.2." in n or ".layers.3." in n for n in lora_changed), sorted(lora_changed)[:4]
    assert any(".layers.2." in n for n in lora_changed) and any(".layers.3." in n for n in lora_changed)
    assert "head.weight" in changed
    names = after.train_only_last_layers(2)
    assert names and all(n.startswith("head.") or ".layers.2." in n or ".layers.3." in n for n in names)
    # The mismatched base: a reward model trained on the 4-layer model refuses the tiny one.
    with pytest.raises(ConfigError, match="differs"):
        load_rm(da.out, model=str(tiny), device="cpu", **QUIET)


def test_domain_pairs_are_unfiltered_and_sensitive_contrasts(rm_data: Path) -> None:
    groups = [g for g in groups_of(load_rm_data(rm_data)) if g[0].tool == "sql"]
    pairs = domain_pairs(groups[0])
    texts = [b.action for _, b in pairs]
    assert any("email FROM staff" in t for t in texts)
    assert any("WHERE" not in t and "FROM" in t for t in texts) and "WHERE" in groups[0][0].action
    assert all(a is groups[0][0] and b.label < 0 for a, b in pairs)
    assert domain_pairs(next(g for g in groups_of(load_rm_data(rm_data)) if g[0].tool == "smtp")) == []


def test_uncertainty_weights_by_hand() -> None:
    w = uncertainty_weights(np.array([0.0, 1.0, 2.0]))  # mean var 1: exp(0), exp(-1), exp(-2), scaled to mean 1
    expected = np.exp([0.0, -1.0, -2.0])
    np.testing.assert_allclose(w, expected / expected.mean())
    np.testing.assert_allclose(uncertainty_weights(np.zeros(4)), np.ones(4))
    with pytest.raises(ConfigError, match="NaN"):
        uncertainty_weights(np.array([0.1, math.nan]))


def test_distillation_weights_follow_teacher_variance(trained: dict[str, Any], rm_data: Path, tmp_path: Path) -> None:
    data = rm_data / "SQLPythonSMTP-v0-test.parquet"
    res = distill(
        trained["b"], "tiny", str(data), str(tmp_path / "student"), steps=3, samples=4, device="cpu", student_spec=SPEC, **QUIET
    )
    var, w = np.array(res["teacher_var"]), np.array(res["weights"])
    assert var.std() > 0  # the teacher is surer of some rows than of others
    order = np.argsort(var)
    assert np.all(np.diff(w[order]) <= 1e-12) and w[order[0]] > w[order[-1]]
    np.testing.assert_allclose(w, uncertainty_weights(var))
    lines = (tmp_path / "student" / "distill_weights.jsonl").read_text().splitlines()
    assert len(lines) == len(var) and "weight" in json.loads(lines[0])
    assert (tmp_path / "student" / "rm.json").exists()


# -- bad input -----------------------------------------------------------------------------------


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from agentrl_envs.analysis.counterfactual import COLUMNS

    schema = pa.schema(
        [
            (
                c,
                pa.float32()
                if c == "label"
                else pa.int32()
                if c in ("step", "subtask")
                else pa.bool_()
                if c == "errors"
                else pa.string(),
            )
            for c in COLUMNS
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def test_bad_data_gives_clear_errors(tmp_path: Path) -> None:
    row = dict(env_id=ENV, split="train", task_id="t/retail/train/1", step=1, subtask=0, tool="sql", prompt="p", action="a")
    row.update(label=1.0, perturbation="gold", detail="", errors=False)
    with pytest.raises(ConfigError, match="no such file or folder"):
        load_rm_data(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"no \*\.parquet"):
        load_rm_data(tmp_path)
    with pytest.raises(ConfigError, match="empty"):
        load_rm_data(_write(tmp_path / "empty.parquet", []))
    with pytest.raises(ConfigError, match="finite"):
        load_rm_data(_write(tmp_path / "nan.parquet", [row, {**row, "label": math.nan}]))
    (tmp_path / "junk.parquet").write_bytes(b"\x00not parquet" * 100)
    with pytest.raises(ConfigError, match="not a readable Parquet"):
        load_rm_data(tmp_path / "junk.parquet")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["p"]}), tmp_path / "cols.parquet")
    with pytest.raises(ConfigError, match="missing column"):
        load_rm_data(tmp_path / "cols.parquet")
    only_test = tmp_path / "only"
    only_test.mkdir()
    _write(only_test / "t.parquet", [{**row, "split": "test"}, {**row, "split": "test", "label": -0.5}])
    with pytest.raises(ConfigError, match="splits present: test"):
        train_rm(RMConfig(data=str(only_test), out=str(tmp_path / "o"), device="cpu"), tiny_spec=SPEC, **QUIET)
    with pytest.raises(ConfigError, match="--loss"):
        RMConfig(data="x", loss="hinge").validate()
    with pytest.raises(ConfigError, match=r"no rm\.json"):
        load_rm(tmp_path, **QUIET)


def test_bad_settings_are_refused_before_any_work(tmp_path: Path) -> None:
    from agentrl_train.models import pick_device

    with pytest.raises(ConfigError, match=r"--lr=inf: use a finite value > 0"):  # trained to accuracy 0 before
        RMConfig(data="x", lr=math.inf).validate()
    with pytest.raises(ConfigError, match=r"--device='gpu': use auto, cpu or cuda"):  # a raw torch RuntimeError before
        pick_device("gpu")
    with pytest.raises(ConfigError, match=r"--device='gpu'"):
        RMConfig(data="x", device="gpu").validate()
    missing = str(tmp_path / "nowhere")  # the settings are checked before the teacher or the data are read
    bad: list[tuple[dict[str, Any], str]] = [
        ({"samples": 0}, "--samples=0"),
        ({"batch": -1}, "--batch=-1"),
        ({"steps": True}, "--steps=True"),
        ({"rank": 1.5}, "--rank=1.5"),
        ({"lr": math.nan}, "--lr=nan"),
        ({"seed": -1}, "--seed=-1"),  # numpy's default_rng(-1) was a raw ValueError after loading the teacher
    ]
    for kwargs, match in bad:
        with pytest.raises(ConfigError, match=match):
            distill(missing, "tiny", missing, str(tmp_path / "out"), **kwargs, **QUIET)
    assert not (tmp_path / "out").exists()


def test_cli_rm_eval_json(trained: dict[str, Any], rm_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentrl_train.cli import main

    assert (
        main(
            [
                "rm-eval",
                "--rm",
                trained["a"],
                "--data",
                str(rm_data / "SQLPythonSMTP-v0-test.parquet"),
                "--json",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    table = json.loads(capsys.readouterr().out)
    assert table["test/all"]["accuracy"] == pytest.approx(trained["eval_a"]["test/all"]["accuracy"])
    assert main(["rm-eval", "--rm", str(rm_data), "--data", str(rm_data)]) == 2
    assert "no rm.json" in capsys.readouterr().err


def test_build_rm_computes_on_one_cpu_thread() -> None:
    """As the trainer: torch's default of one OpenMP thread per core stalls beside any other job."""
    from agentrl_train.reward_model import build_rm

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        build_rm("tiny", device="cpu", tiny_spec=SPEC, **QUIET)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
