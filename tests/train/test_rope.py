"""``--rope-scaling``: the setting parsed and refused, applied to the config, used by the loaded model."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, GPT2Config

from agentrl_envs.errors import ConfigError
from agentrl_train.check_model import check_model, format_report
from agentrl_train.cli import main
from agentrl_train.config_io import load_config
from agentrl_train.models import load_base, resolve_model
from agentrl_train.rope import apply_rope_scaling, check_rope_applied, ntk_exponent, parse_rope_scaling
from agentrl_train.tiny import TinySpec

from .conftest import SMALL

SPEC = TinySpec(pretrain_steps=SMALL["tiny_pretrain_steps"], corpus_episodes=SMALL["tiny_corpus_episodes"])
CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_folder() -> Path:
    return Path(resolve_model("tiny", tiny_spec=SPEC, log=lambda *_: None))


def _config(folder: Path) -> AutoConfig:
    return AutoConfig.from_pretrained(folder, local_files_only=True)


def test_parse_keeps_a_good_setting_and_reads_empty_as_off() -> None:
    assert parse_rope_scaling({}) is None and parse_rope_scaling(None) is None
    assert parse_rope_scaling({"type": "linear", "factor": 2}) == {"type": "linear", "factor": 2.0}
    assert parse_rope_scaling({"type": "ntk", "factor": 4, "exponent": 1.5, "original_context": 512}) == {
        "type": "ntk",
        "factor": 4.0,
        "exponent": 1.5,
        "original_context": 512,
    }


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("linear", "use a mapping"),
        ([1, 2], "use a mapping"),
        ({"type": "linear"}, "factor is missing"),
        ({"type": "bogus", "factor": 2}, "use one of linear, dynamic, yarn, ntk"),
        ({"type": "linear", "factor": 1}, "above 1"),
        ({"type": "linear", "factor": 0.5}, "above 1"),
        ({"type": "linear", "factor": 1e9}, "at most 64"),
        ({"type": "linear", "factor": float("nan")}, "use a number"),
        ({"type": "linear", "factor": True}, "use a number"),
        ({"type": "linear", "factor": "2"}, "use a number"),
        ({"type": "linear", "factor": 2, "exponent": 1.0}, "only type ntk"),
        ({"type": "ntk", "factor": 2, "exponent": 0}, "above 0"),
        ({"type": "linear", "factor": 2, "original_context": 8}, "original_context"),
        ({"type": "linear", "factor": 2, "original_context": 2.5}, "original_context"),
        ({"type": "linear", "factor": 2, "scale": 2}, "unknown key"),
        ({"type": "x" * 100_000, "factor": 2}, "use one of"),
    ],
)
def test_bad_settings_are_clear_errors(value: object, words: str) -> None:
    with pytest.raises(ConfigError, match="--rope-scaling") as err:
        parse_rope_scaling(value)
    assert words in str(err.value)
    assert len(str(err.value)) < 400  # a huge value is not echoed whole


def test_each_kind_on_the_config(tiny_folder: Path) -> None:
    base = _config(tiny_folder)
    assert base.max_position_embeddings == 4096
    c = _config(tiny_folder)
    assert apply_rope_scaling(c, parse_rope_scaling({"type": "linear", "factor": 2})) == 8192
    assert c.max_position_embeddings == 8192 and c.rope_parameters["rope_type"] == "linear"
    c = _config(tiny_folder)
    assert apply_rope_scaling(c, parse_rope_scaling({"type": "dynamic", "factor": 4, "original_context": 512})) == 2048
    assert c.max_position_embeddings == 512  # dynamic NTK starts scaling past it
    c = _config(tiny_folder)
    assert apply_rope_scaling(c, parse_rope_scaling({"type": "yarn", "factor": 2})) == 8192
    assert c.rope_parameters["original_max_position_embeddings"] == 4096
    c = _config(tiny_folder)
    d = base.hidden_size // base.num_attention_heads
    assert ntk_exponent(base) == pytest.approx(d / (d - 2))
    apply_rope_scaling(c, parse_rope_scaling({"type": "ntk", "factor": 4}))
    assert c.rope_parameters == {"rope_type": "default", "rope_theta": pytest.approx(10000.0 * 4 ** (d / (d - 2)))}
    c = _config(tiny_folder)
    apply_rope_scaling(c, parse_rope_scaling({"type": "ntk", "factor": 4, "exponent": 1.0}))
    assert c.rope_parameters["rope_theta"] == pytest.approx(40000.0)
    c = _config(tiny_folder)
    assert apply_rope_scaling(c, None) == 4096 and c.to_dict() == base.to_dict()


def test_a_model_without_rope_or_already_scaled_is_refused(tiny_folder: Path) -> None:
    with pytest.raises(ConfigError, match="no rotary position embeddings"):
        apply_rope_scaling(GPT2Config(n_layer=1), {"type": "linear", "factor": 2.0}, "gpt2")
    c = _config(tiny_folder)
    apply_rope_scaling(c, {"type": "linear", "factor": 2.0})
    with pytest.raises(ConfigError, match="already scaled"):
        apply_rope_scaling(c, {"type": "linear", "factor": 2.0})


def test_a_rotary_module_that_ignores_the_setting_is_refused() -> None:
    class Rotary(torch.nn.Module):
        rope_type = "default"

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("inv_freq", torch.ones(2))

    with pytest.raises(ConfigError, match="does not use it"):
        check_rope_applied(torch.nn.Sequential(Rotary()), {"type": "linear", "factor": 2.0})
    check_rope_applied(torch.nn.Sequential(Rotary()), {"type": "ntk", "factor": 2.0})  # ntk: a default rotary, new theta
    with pytest.raises(ConfigError, match="uses none"):
        check_rope_applied(torch.nn.Linear(2, 2), {"type": "yarn", "factor": 2.0})


def test_the_loaded_model_uses_it(tiny_folder: Path) -> None:
    plain, tok = load_base(str(tiny_folder), CPU, log=lambda *a: None)
    linear, _ = load_base(str(tiny_folder), CPU, log=lambda *a: None, rope_scaling={"type": "linear", "factor": 2})
    inv = {n: next(m for m in lm.modules() if hasattr(m, "inv_freq")).inv_freq for n, lm in (("p", plain), ("l", linear))}
    assert torch.allclose(inv["l"], inv["p"] / 2)
    ids = torch.tensor([tok("SELECT name FROM users WHERE id = 1", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        a, b = plain(input_ids=ids).logits, linear(input_ids=ids).logits
    assert not torch.allclose(a, b)  # positions mean something else now
    # the first position is position 0 under any scaling: the same logits there
    assert torch.allclose(a[0, 0], b[0, 0], atol=1e-5)
    with pytest.raises(ConfigError, match="--rope-scaling"):
        load_base(str(tiny_folder), CPU, log=lambda *a: None, rope_scaling={"type": "nope", "factor": 2})


def test_a_train_config_validates_it() -> None:
    cfg = load_config(None, {"rope_scaling": {"type": "yarn", "factor": 2}})
    assert cfg.model.rope_scaling == {"type": "yarn", "factor": 2}
    with pytest.raises(ConfigError, match="--rope-scaling type"):
        load_config(None, {"rope_scaling": {"type": "cubic", "factor": 2}})


def test_check_model_reports_the_scaled_context(tiny_folder: Path, tmp_path: Path) -> None:
    short = tmp_path / "short"
    shutil.copytree(tiny_folder, short)
    config = json.loads((short / "config.json").read_text())
    config["max_position_embeddings"] = 64
    (short / "config.json").write_text(json.dumps(config))
    one = {"envs": ["AgentRL/SQL-v0"], "episodes": 1, "long_horizon": False}
    plain = check_model(str(short), **one)
    scaled = check_model(str(short), rope_scaling={"type": "linear", "factor": 64}, **one)
    assert plain["prompts"]["AgentRL/SQL-v0"]["fits"] is False
    assert scaled["context"]["context"] == 4096 and scaled["context"]["max_position_embeddings"] == 64
    assert scaled["prompts"]["AgentRL/SQL-v0"]["fits"] is True
    assert "with --rope-scaling" in format_report(scaled)


def test_the_cli_refuses_a_bad_setting(tiny_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("{type: linear, factor: 1}", "[1, 2]", "{: :", "a" * 10_000):
        with pytest.raises(SystemExit) as exit_:
            main(["check-model", str(tiny_folder), "--rope-scaling", bad])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "--rope-scaling" in err and len(err) < 2000
    with pytest.raises(SystemExit):
        main(["serve", "--model", "tiny", "--rope-scaling", "{type: bogus, factor: 2}"])
    assert "use one of linear" in capsys.readouterr().err
    argv = ["check-model", str(tiny_folder), "--envs", "AgentRL/SQL-v0", "--episodes", "1", "--no-long-horizon"]
    assert main([*argv, "--json", "--rope-scaling", "{type: ntk, factor: 2}"]) == 0
    assert json.loads(capsys.readouterr().out)["context"]["context"] == 8192


def test_the_benchmark_runs_small(tiny_folder: Path, tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_rope_scaling
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    md = tmp_path / "rope.md"
    argv = ["--model", str(tiny_folder), "--env", "AgentRL/SQL-v0", "--lengths", "16", "32", "--windows", "1"]
    rows = bench_rope_scaling.main([*argv, "--kinds", "linear", "ntk", "--factor", "2", "--md", str(md)])
    assert [r["scaling"] for r in rows] == ["none", "linear x2", "ntk x2"]
    assert all(0 < r[n] < 20 for r in rows for n in (16, 32))
    assert "| none |" in md.read_text() and "Command: `python benchmarks/bench_rope_scaling.py" in md.read_text()
