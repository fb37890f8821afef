"""Remapping LoRA adapters between fused (Phi-3) and split (Llama) layouts on two models computing one function."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import copy
import json
from pathlib import Path

import torch
from peft import PeftModel

from agentrl_envs.errors import ConfigError
from agentrl_train.adapters import AdapterMismatchError, AdapterNotFoundError, RemapError, load_adapter, remap_adapter
from agentrl_train.adapters.cli import add_remap_parser, remap_main
from tests.train._adapter_models import logits, phi3_twin, probe, random_lora, tiny_llama

# Both layouts do the same float32 operations on the same numbers, so remapped logits match to rounding
# (measured: exactly 0); the bound leaves room for other BLAS kernels.
ATOL = 1e-5
SPLIT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FUSED_TARGETS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("remap")
    llama = tiny_llama(seed=0)
    phi3 = phi3_twin(llama)
    llama.save_pretrained(root / "llama")
    phi3.save_pretrained(root / "phi3")
    return {"root": root, "llama": llama, "phi3": phi3}


def with_adapter(model: torch.nn.Module, folder: Path, input_ids: torch.Tensor) -> torch.Tensor:
    return logits(PeftModel.from_pretrained(copy.deepcopy(model), str(folder)), input_ids)


def test_twins_compute_the_same_function(twins: dict) -> None:
    x = probe()
    assert float((logits(twins["llama"], x) - logits(twins["phi3"], x)).abs().max()) <= 1e-6
    assert "qkv_proj" in dict(twins["phi3"].named_modules())["model.layers.0.self_attn"]._modules


def test_split_to_fused_is_exact(twins: dict, tmp_path: Path) -> None:
    src = random_lora(
        twins["llama"],
        tmp_path / "src",
        seed=1,
        r=4,
        alpha=8,
        targets=SPLIT_TARGETS,
        rank_pattern={"model.layers.0.self_attn.k_proj": 2, "up_proj": 6},
        alpha_pattern={"v_proj": 3},
    )
    report = remap_adapter(src, twins["root"] / "phi3", tmp_path / "out")
    x = probe()
    reference = with_adapter(twins["llama"], src, x)
    assert float((reference - logits(twins["llama"], x)).abs().max()) > 0.05
    assert float((with_adapter(twins["phi3"], tmp_path / "out", x) - reference).abs().max()) <= ATOL
    assert report.source_layout == "split" and report.target_layout == "fused"
    assert report.ranks["model.layers.0.self_attn.qkv_proj"] == 4 + 2 + 4  # ranks add
    assert report.ranks["model.layers.0.mlp.gate_up_proj"] == 4 + 6
    assert report.exact_max_abs_diff <= 1e-6
    assert "stack A, block-diagonal B rows 64:96" in report.table()


def test_fused_to_split_is_exact(twins: dict, tmp_path: Path) -> None:
    src = random_lora(
        twins["phi3"], tmp_path / "src", seed=2, r=6, alpha=3, targets=FUSED_TARGETS, rank_pattern={"gate_up_proj": 5}
    )
    report = remap_adapter(src, twins["root"] / "llama", tmp_path / "out")
    x = probe()
    reference = with_adapter(twins["phi3"], src, x)
    assert float((reference - logits(twins["phi3"], x)).abs().max()) > 0.05
    assert float((with_adapter(twins["llama"], tmp_path / "out", x) - reference).abs().max()) <= ATOL
    assert report.ranks["model.layers.1.self_attn.v_proj"] == 6 and report.ranks["model.layers.1.mlp.up_proj"] == 5
    out = load_adapter(tmp_path / "out")
    q, k = out.modules["model.layers.0.self_attn.q_proj"], out.modules["model.layers.0.self_attn.k_proj"]
    assert torch.equal(q.lora_A, k.lora_A)  # A is shared, B is sliced by rows
    assert (q.out_features, k.out_features) == (64, 32)


def test_partial_split_adapter_gets_zero_rows_for_untrained_parts(twins: dict, tmp_path: Path) -> None:
    src = random_lora(twins["llama"], tmp_path / "src", seed=3, r=4, alpha=8, targets=["q_proj", "v_proj"])
    report = remap_adapter(src, twins["root"] / "phi3", tmp_path / "out")
    x = probe()
    assert float((with_adapter(twins["phi3"], tmp_path / "out", x) - with_adapter(twins["llama"], src, x)).abs().max()) <= ATOL
    fused = load_adapter(tmp_path / "out").modules["model.layers.0.self_attn.qkv_proj"]
    assert torch.count_nonzero(fused.delta()[64:96]) == 0  # k rows
    assert any(row.op.startswith("zero rows") for row in report.mapping)


def test_svd_reduced_remap_reports_its_error(twins: dict, tmp_path: Path) -> None:
    src = random_lora(twins["phi3"], tmp_path / "src", seed=4, r=6, alpha=12, targets=FUSED_TARGETS)
    report = remap_adapter(src, twins["root"] / "llama", tmp_path / "out", rank=2)
    source = load_adapter(src).modules
    written = load_adapter(tmp_path / "out").modules
    assert set(report.rel_errors) == set(written) and all(m.rank == 2 for m in written.values())
    for name, module in written.items():
        parent, _, leaf = name.rpartition(".")
        if leaf in ("q_proj", "k_proj", "v_proj"):
            start, stop = {"q_proj": (0, 64), "k_proj": (64, 96), "v_proj": (96, 128)}[leaf]
            exact = source[f"{parent}.qkv_proj"].delta()[start:stop]
        elif leaf in ("gate_proj", "up_proj"):
            start, stop = {"gate_proj": (0, 128), "up_proj": (128, 256)}[leaf]
            exact = source[f"{parent}.gate_up_proj"].delta()[start:stop]
        else:
            exact = source[name].delta()
        direct = float(torch.linalg.norm(exact - module.delta()) / torch.linalg.norm(exact))
        assert report.rel_errors[name] > 0.05
        assert report.rel_errors[name] == pytest.approx(direct, abs=1e-5)
    assert "relative Frobenius error" in report.summary()
    assert json.loads((tmp_path / "out" / "remap_report.json").read_text())["rel_errors"] == report.rel_errors


def test_rank_at_or_above_the_adapters_rank_loses_nothing(twins: dict, tmp_path: Path) -> None:
    src = random_lora(twins["phi3"], tmp_path / "src", seed=5, r=3, alpha=6, targets=["qkv_proj", "down_proj"])
    report = remap_adapter(src, twins["root"] / "llama", tmp_path / "out", rank=8)
    assert report.max_rel_error <= 1e-6
    x = probe()
    assert float((with_adapter(twins["llama"], tmp_path / "out", x) - with_adapter(twins["phi3"], src, x)).abs().max()) <= ATOL


# ----------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------


def test_unmappable_shapes_name_the_module(twins: dict, tmp_path: Path) -> None:
    src = random_lora(twins["phi3"], tmp_path / "src", seed=6, r=2, alpha=2, targets=["qkv_proj"])
    other_heads = tiny_llama(seed=0, num_key_value_heads=4)  # k/v rows 64 each: qkv (128 rows) cannot split
    with pytest.raises(RemapError, match=r"model\.layers\.0\.self_attn\.qkv_proj"):
        remap_adapter(src, other_heads, tmp_path / "out")
    wider = tiny_llama(seed=0, hidden_size=96)
    with pytest.raises(RemapError, match="differ in width"):
        remap_adapter(src, wider, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unknown_modules_name_the_module(twins: dict, tmp_path: Path) -> None:
    src = random_lora(twins["llama"], tmp_path / "src", seed=7, r=2, alpha=2, targets=["q_proj"])
    shallow = tiny_llama(seed=0, num_hidden_layers=1)
    with pytest.raises(RemapError, match=r"model\.layers\.1\.self_attn\.q_proj"):
        remap_adapter(src, shallow, tmp_path / "out")


def test_bad_arguments(twins: dict, tmp_path: Path) -> None:
    src = random_lora(twins["llama"], tmp_path / "src", seed=8, r=2, alpha=2, targets=["q_proj"])
    with pytest.raises(ConfigError, match="positive integer"):
        remap_adapter(src, twins["root"] / "phi3", tmp_path / "out", rank=0)
    with pytest.raises(AdapterNotFoundError, match="does not exist"):
        remap_adapter(tmp_path / "nope", twins["root"] / "phi3", tmp_path / "out")
    with pytest.raises(AdapterNotFoundError, match=r"no config\.json"):
        remap_adapter(src, tmp_path / "no-model", tmp_path / "out")
    with pytest.raises(AdapterMismatchError, match="from-model"):
        remap_adapter(src, twins["root"] / "phi3", tmp_path / "out", from_model=twins["root"] / "phi3")


def test_remap_cli(twins: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = random_lora(twins["phi3"], tmp_path / "src", seed=9, r=4, alpha=4, targets=["qkv_proj"])
    argv = [str(src), "--to-model", str(twins["root"] / "llama"), "--out", str(tmp_path / "out"), "--rank", "2"]
    assert remap_main(argv) == 0
    out = capsys.readouterr().out
    assert "share A, slice B rows 0:64" in out and "max relative error" in out
    assert remap_main([str(src), "--to-model", str(twins["root"] / "llama"), "--out", str(tmp_path / "out")]) == 2
    assert "not empty" in capsys.readouterr().err

    import argparse

    parser = argparse.ArgumentParser(prog="agentrl-train")
    add_remap_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["remap-adapter", "SRC", "--to-model", "M", "--out", "D", "--rank", "3"])
    assert (args.src, args.to_model, args.out, args.rank) == ("SRC", "M", "D", 3) and callable(args.func)
