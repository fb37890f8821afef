"""Exact LoRA fusion: fused and merged results reproduce the stacked adapters; bad input fails clearly."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import copy
import json
import pickle
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from agentrl_envs.errors import ConfigError
from agentrl_train.adapters import (
    AdapterError,
    AdapterMismatchError,
    AdapterNotFoundError,
    FusionCheckError,
    UnsupportedAdapterError,
    fuse_adapters,
    load_adapter,
)
from agentrl_train.adapters import fuse as fuse_module
from agentrl_train.adapters.cli import add_fuse_parser, fuse_main
from tests.train._adapter_models import logits, probe, random_lora, tiny_llama

ATOL = 1e-5  # float32 logits; measured differences are ~1e-7


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny Llama and three random adapters with different ranks, alphas, rank patterns and targets."""
    root = tmp_path_factory.mktemp("fuse")
    model = tiny_llama(seed=0)
    model.save_pretrained(root / "base")
    adapters = {
        "preference": random_lora(
            model,
            root / "preference",
            seed=1,
            r=4,
            alpha=8,
            targets=["q_proj", "v_proj"],
            rank_pattern={"model.layers.0.self_attn.q_proj": 2},
        ),
        "tool": random_lora(
            model,
            root / "tool",
            seed=2,
            r=8,
            alpha=4,
            targets=["q_proj", "o_proj", "up_proj"],
            rank_pattern={"up_proj": 3},
            alpha_pattern={"o_proj": 16},
        ),
        "exec": random_lora(model, root / "exec", seed=3, r=2, alpha=5, targets=["q_proj", "down_proj"], use_rslora=True),
    }
    return {"root": root, "model": model, "adapters": adapters}


def stacked(model: torch.nn.Module, dirs: list[Path], input_ids: torch.Tensor) -> torch.Tensor:
    """The test's own reference: every adapter loaded by peft and active at once."""
    names = [f"s{i}" for i in range(len(dirs))]
    peft_model = PeftModel.from_pretrained(copy.deepcopy(model), str(dirs[0]), adapter_name=names[0])
    for name, folder in zip(names[1:], dirs[1:]):
        peft_model.load_adapter(str(folder), adapter_name=name)
    peft_model.base_model.set_adapter(names)
    return logits(peft_model, input_ids)


def test_fused_adapter_matches_stacked_adapters(setup: dict, tmp_path: Path) -> None:
    model, adapters = setup["model"], setup["adapters"]
    x = probe()
    before = logits(model, x)
    report = fuse_adapters(model, adapters, tmp_path / "fused")
    assert report.max_abs_diff <= ATOL
    assert torch.equal(logits(model, x), before) and not hasattr(model, "peft_config")  # the base is left untouched
    reference = stacked(model, list(adapters.values()), x)
    assert float((reference - logits(model, x)).abs().max()) > 0.05, (
        "the adapters must move the logits for the test to mean anything"
    )
    fused = PeftModel.from_pretrained(copy.deepcopy(model), str(tmp_path / "fused"))
    assert float((logits(fused, x) - reference).abs().max()) <= ATOL

    # Ranks concatenate per module; scaling 1 (alpha = r); modules one adapter targets are carried.
    config = json.loads((tmp_path / "fused" / "adapter_config.json").read_text())
    q0, q1 = "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"
    assert config["rank_pattern"][q0] == 2 + 8 + 2 and config["rank_pattern"][q1] == 4 + 8 + 2
    assert config["alpha_pattern"] == config["rank_pattern"]
    assert report.sources[q0] == ["preference", "tool", "exec"]
    assert report.sources["model.layers.0.self_attn.v_proj"] == ["preference"]
    assert report.ranks["model.layers.1.mlp.up_proj"] == 3
    assert set(report.carried_modules) | set(report.fused_modules) == set(report.sources)
    assert json.loads((tmp_path / "fused" / "fuse_report.json").read_text())["max_abs_diff"] == report.max_abs_diff


def test_merged_model_matches_stacked_adapters(setup: dict, tmp_path: Path) -> None:
    model, adapters = setup["model"], setup["adapters"]
    report = fuse_adapters(setup["root"] / "base", adapters, tmp_path / "merged", merge=True)
    assert report.merged and report.max_abs_diff <= ATOL
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"))
    x = probe()
    assert float((logits(merged, x) - stacked(model, list(adapters.values()), x)).abs().max()) <= ATOL
    assert not hasattr(merged, "peft_config")


def test_bfloat16_base_is_checked_in_float32(setup: dict, tmp_path: Path) -> None:
    half = copy.deepcopy(setup["model"]).to(torch.bfloat16)
    report = fuse_adapters(half, setup["adapters"], tmp_path / "fused")
    assert report.max_abs_diff <= ATOL
    assert next(half.parameters()).dtype == torch.bfloat16


def test_adapters_from_a_live_peft_model(setup: dict, tmp_path: Path) -> None:
    model, adapters = setup["model"], setup["adapters"]
    live = PeftModel.from_pretrained(copy.deepcopy(model), str(adapters["preference"]), adapter_name="preference")
    live.load_adapter(str(adapters["tool"]), adapter_name="tool")
    report = fuse_adapters(model, {"p": (live, "preference"), "t": (live, "tool")}, tmp_path / "fused")
    x = probe()
    fused = PeftModel.from_pretrained(copy.deepcopy(model), str(tmp_path / "fused"))
    reference = stacked(model, [adapters["preference"], adapters["tool"]], x)
    assert report.max_abs_diff <= ATOL
    assert float((logits(fused, x) - reference).abs().max()) <= ATOL


def test_self_check_catches_a_wrong_fusion(setup: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = fuse_module.concat_ranks
    monkeypatch.setattr(fuse_module, "concat_ranks", lambda parts: real(parts[:1]))  # drops every adapter but the first
    with pytest.raises(FusionCheckError, match="nothing was written"):
        fuse_adapters(setup["model"], setup["adapters"], tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # no out_dir, no staging folder left behind


def test_peft_linear_weighted_adapter_is_not_exact(setup: dict) -> None:
    """Why fuse exists: add_weighted_adapter("linear") mixes A and B separately; "cat" is exact."""
    model = setup["model"]
    base = copy.deepcopy(model)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.add_adapter("b", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    x = probe()
    peft_model.base_model.set_adapter(["default", "b"])
    reference = logits(peft_model, x)
    for name, kind in (("lin", "linear"), ("cat", "cat")):
        peft_model.add_weighted_adapter(["default", "b"], [1.0, 1.0], adapter_name=name, combination_type=kind)
    peft_model.set_adapter("lin")
    linear_diff = float((logits(peft_model, x) - reference).abs().max())
    peft_model.set_adapter("cat")
    cat_diff = float((logits(peft_model, x) - reference).abs().max())
    assert linear_diff > 1e-2, linear_diff
    assert cat_diff <= ATOL, cat_diff


# ----------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------


def test_missing_adapter_folder(setup: dict, tmp_path: Path) -> None:
    with pytest.raises(AdapterNotFoundError, match="does not exist"):
        fuse_adapters(setup["model"], {"x": tmp_path / "nope"}, tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterNotFoundError, match=r"holds no adapter_config\.json"):
        load_adapter(tmp_path / "empty")
    assert not (tmp_path / "out").exists()


def test_mismatched_base_model(setup: dict, tmp_path: Path) -> None:
    wider = tiny_llama(seed=0, hidden_size=96)
    with pytest.raises(AdapterMismatchError, match="trained on another base model"):
        fuse_adapters(wider, setup["adapters"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unknown_module_names(setup: dict, tmp_path: Path) -> None:
    shallow = tiny_llama(seed=0, num_hidden_layers=1)
    with pytest.raises(AdapterMismatchError, match=r"model\.layers\.1\.self_attn\.q_proj"):
        fuse_adapters(shallow, setup["adapters"], tmp_path / "out")


def test_garbage_adapter_files(setup: dict, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterError, match="cannot be read"):
        load_adapter(bad)
    (bad / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    with pytest.raises(AdapterNotFoundError, match=r"no adapter_model\.safetensors"):
        load_adapter(bad)
    (bad / "adapter_model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(AdapterError, match="cannot be read"):
        load_adapter(bad)
    (bad / "adapter_config.json").write_text(json.dumps({"peft_type": "IA3"}))
    with pytest.raises(UnsupportedAdapterError, match="only LoRA"):
        load_adapter(bad)


def test_hostile_adapter_weights(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    cases = [
        ({f"{key}.lora_A.weight": torch.zeros(4, 64), f"{key}.lora_B.weight": torch.zeros(64, 3)}, AdapterError, "do not pair"),
        ({f"{key}.lora_A.weight": torch.zeros(4, 64)}, AdapterError, "do not pair"),
        ({f"{key}.lora_A.weight": torch.zeros(2, 64), f"{key}.lora_B.weight": torch.zeros(64, 2)}, AdapterError, "r=4"),
        ({"base_model.model.lm_head.weight": torch.zeros(256, 64)}, UnsupportedAdapterError, "not a LoRA A/B"),
        ({}, AdapterError, "no LoRA weights"),
    ]
    for tensors, error, message in cases:
        save_file(tensors, str(bad / "adapter_model.safetensors"))
        with pytest.raises(error, match=message):
            load_adapter(bad)


def test_dora_is_refused(setup: dict, tmp_path: Path) -> None:
    peft_model = get_peft_model(copy.deepcopy(setup["model"]), LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    peft_model.save_pretrained(str(tmp_path / "dora"))
    with pytest.raises(UnsupportedAdapterError, match="DoRA"):
        load_adapter(tmp_path / "dora")


def test_no_adapters_and_non_empty_out(setup: dict, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least one"):
        fuse_adapters(setup["model"], {}, tmp_path / "out")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        fuse_adapters(setup["model"], setup["adapters"], tmp_path / "out")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_a_bound_that_cannot_check_is_refused_before_fusing(setup: dict, tmp_path: Path) -> None:
    # nan passed every self-check (diff > nan is False); -1 failed only after the whole fusion
    for bad in (float("nan"), float("inf"), -1.0, 0.0, "1e-5", True):
        with pytest.raises(ConfigError, match=r"atol=.*: use a finite bound > 0"):
            fuse_adapters(setup["model"], setup["adapters"], tmp_path / "out", atol=bad)  # type: ignore[arg-type]
        assert not (tmp_path / "out").exists()


def test_errors_pickle() -> None:
    for exc in (AdapterNotFoundError("x"), AdapterMismatchError("y"), FusionCheckError("z")):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and str(again) == str(exc)


# ----------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------


def test_fuse_cli(setup: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    adapters = setup["adapters"]
    argv = ["--model", str(setup["root"] / "base"), "--out", str(tmp_path / "fused")]
    for name, path in adapters.items():
        argv += ["--adapter", f"{name}={path}"]
    assert fuse_main(argv) == 0
    out = capsys.readouterr().out
    assert "max |logit diff|" in out and "preference+tool+exec" in out
    assert (tmp_path / "fused" / "adapter_model.safetensors").is_file()

    assert (
        fuse_main(["--model", str(setup["root"] / "base"), "--adapter", f"x={tmp_path / 'nope'}", "--out", str(tmp_path / "o")])
        == 2
    )
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fuse_main(["--model", "m", "--adapter", "no-equals-sign", "--out", "o"])


def test_fuse_parser_registers_on_a_main_parser() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="agentrl-train")
    add_fuse_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["fuse", "--model", "m", "--adapter", "a=d1", "--adapter", "b=d2", "--out", "o", "--merge"])
    assert args.adapter == [("a", "d1"), ("b", "d2")] and args.merge and callable(args.func)
