"""Fusion and remapping of adapters that train embedding rows (``--add-tool-tokens``), on the config-built
Llama twins of test_tool_tokens (tied and untied): the rows are carried unchanged, the fused adapter and
the merged model compute the trained policy, and what cannot be carried is refused by name."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl_envs.errors import ConfigError
from agentrl_train.adapters import (
    AdapterError,
    AdapterMismatchError,
    LoraAdapter,
    UnsupportedAdapterError,
    fuse_adapters,
    load_adapter,
    remap_adapter,
)
from agentrl_train.policy import build_policy
from agentrl_train.tool_tokens import TOKENS_FILE, TOOL_MARKERS, add_tool_tokens, read_tool_tokens
from tests.train._adapter_models import phi3_twin
from tests.train.test_tool_tokens import _cfg, _logits, _seq, _step, _twin

QUIET: Any = lambda *a: None  # noqa: E731
ATOL = 1e-5  # float32 logits of the same function computed two ways (measured: 0 to 3e-7)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A twin, a policy with added tokens after one optimizer step (rows and LoRA moved), and its saved adapter."""
    root = tmp_path_factory.mktemp("rows")
    twin = _twin(root / "twin", request.param)
    policy = build_policy(_cfg(root / "run", twin), log=QUIET)
    ids = _seq(policy)
    _step(policy, ids)
    policy.save(root / "saved")
    return {"root": root, "twin": twin, "policy": policy, "ids": ids, "adapter": root / "saved" / "exec", "tied": request.param}


def _plain_adapter(t: dict[str, Any], tmp_path: Path) -> Path:
    """An adapter without added tokens, its LoRA moved by one step on the plain base."""
    plain = build_policy(_cfg(tmp_path / "plain-run", t["twin"], add_tool_tokens=False, seed=3), log=QUIET)
    _step(plain, plain.encode_prompt([{"role": "user", "content": "Count."}], None, 64) + [5, 6, 7, 8] * 6)
    plain.save(tmp_path / "plain")
    return tmp_path / "plain" / "exec"


def test_a_fused_adapter_carries_the_rows_and_loads_as_the_trained_policy(trained: dict[str, Any], tmp_path: Path) -> None:
    t = trained
    report = fuse_adapters(str(t["twin"]), {"exec": str(t["adapter"])}, tmp_path / "fused")
    modules = ["model.embed_tokens"] if t["tied"] else ["lm_head", "model.embed_tokens"]
    ids = list(t["policy"].tool_tokens.ids)
    assert report.token_rows == {m: {"ids": ids, "from": "exec"} for m in modules}
    assert report.added_tokens == list(TOOL_MARKERS)
    assert report.max_abs_diff <= ATOL
    assert "rows [" in report.summary()
    assert read_tool_tokens(tmp_path / "fused") == t["policy"].tool_tokens
    source, fused = load_adapter(t["adapter"]).token_rows, load_adapter(tmp_path / "fused").token_rows
    assert source is not None and fused is not None
    assert all(torch.equal(fused.rows[m], source.rows[m]) for m in modules)
    # --init-adapter from the fused folder is the trained policy (its alpha = r scaling is folded in on load)
    again = build_policy(_cfg(tmp_path / "again", t["twin"], init_adapter=str(tmp_path / "fused")), log=QUIET)
    assert float((_logits(again, t["ids"]) - _logits(t["policy"], t["ids"])).abs().max()) <= ATOL


def test_the_model_server_serves_the_fused_adapter_as_the_policy_generates(trained: dict[str, Any], tmp_path: Path) -> None:
    from agentrl_train.serve.engine import Engine

    t = trained
    fuse_adapters(str(t["twin"]), {"exec": str(t["adapter"])}, tmp_path / "fused")
    engine = Engine(str(t["twin"]), log=QUIET)
    try:
        slot = engine.add_family("tool", engine.prepare(None, tmp_path / "fused"))
        assert engine.tool_tokens == t["policy"].tool_tokens
        prompt = t["ids"][:-20]
        served, _ = engine.generate(slot, prompt, 12, 0.0, 0).result()
        assert served == t["policy"].generate(prompt, 12, greedy=True)[0]
    finally:
        engine.close()


def test_a_merged_model_has_the_rows_and_the_grown_tokenizer(trained: dict[str, Any], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t = trained
    report = fuse_adapters(str(t["twin"]), {"exec": str(t["adapter"])}, tmp_path / "merged", merge=True)
    assert report.merged and report.max_abs_diff <= ATOL
    tok = AutoTokenizer.from_pretrained(tmp_path / "merged")
    assert [tok.convert_tokens_to_ids(m) for m in TOOL_MARKERS] == list(t["policy"].tool_tokens.ids)
    assert all(len(tok(m, add_special_tokens=False)["input_ids"]) == 1 for m in TOOL_MARKERS)
    lm = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    with torch.no_grad():
        merged = lm(input_ids=torch.tensor([t["ids"]])).logits[0]
    assert float((merged - _logits(t["policy"], t["ids"])).abs().max()) <= 1e-4
    # the trainer takes the merged folder as a base: the markers are single tokens already, nothing is added
    lines: list[str] = []
    base = build_policy(_cfg(tmp_path / "on-merged", tmp_path / "merged"), log=lines.append)
    assert base.tool_tokens is None and any("nothing added" in line for line in lines)
    assert float((_logits(base, t["ids"]) - merged).abs().max()) <= 1e-4


def test_rows_fuse_beside_a_plain_adapter_but_two_adapters_training_one_row_are_refused(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    t = trained
    plain = _plain_adapter(t, tmp_path)
    report = fuse_adapters(str(t["twin"]), {"exec": str(t["adapter"]), "plain": str(plain)}, tmp_path / "both")
    assert report.max_abs_diff <= ATOL and report.fused_modules
    assert {rows["from"] for rows in report.token_rows.values()} == {"exec"}
    shutil.copytree(t["adapter"], tmp_path / "copy")
    with pytest.raises(UnsupportedAdapterError, match=r"adapters 'a' and 'b' both train the row of token \d+"):
        fuse_adapters(str(t["twin"]), {"a": str(t["adapter"]), "b": str(tmp_path / "copy")}, tmp_path / "twice")
    assert not (tmp_path / "twice").exists()


def test_remap_copies_the_rows_to_the_fused_layout_and_back(trained: dict[str, Any], tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t = trained
    llama = AutoModelForCausalLM.from_pretrained(t["twin"], dtype=torch.float32)
    phi3 = phi3_twin(llama)
    phi3.save_pretrained(tmp_path / "phi3")
    AutoTokenizer.from_pretrained(t["twin"]).save_pretrained(tmp_path / "phi3")
    report = remap_adapter(str(t["adapter"]), str(tmp_path / "phi3"), tmp_path / "to-phi3")
    assert report.exact_max_abs_diff == 0.0
    assert any(row.op.startswith("copy trained rows") for row in report.mapping)
    assert read_tool_tokens(tmp_path / "to-phi3") == t["policy"].tool_tokens
    # on the Phi-3 twin grown by the same tokens, the remapped adapter computes the trained policy
    grown = copy.deepcopy(phi3)
    assert add_tool_tokens(grown, AutoTokenizer.from_pretrained(tmp_path / "phi3"), "phi3", log=QUIET) == t["policy"].tool_tokens
    on_phi3 = PeftModel.from_pretrained(grown, str(tmp_path / "to-phi3")).eval()
    with torch.no_grad():
        out = on_phi3(input_ids=torch.tensor([t["ids"]])).logits[0]
    assert float((out - _logits(t["policy"], t["ids"])).abs().max()) <= ATOL
    # and back to the split layout: the trainer loads it as the trained policy
    remap_adapter(str(tmp_path / "to-phi3"), str(t["twin"]), tmp_path / "back")
    fuse_adapters(str(t["twin"]), {"back": str(tmp_path / "back")}, tmp_path / "back-fused")  # the round trip fuses too
    assert read_tool_tokens(tmp_path / "back") == t["policy"].tool_tokens


def test_a_fused_plain_adapter_loads_exactly_with_init_adapter(trained: dict[str, Any], tmp_path: Path) -> None:
    """A fused adapter has alpha = r (scaling 1) where the preset has its own alpha: loading folds it in."""
    t = trained
    plain = _plain_adapter(t, tmp_path)
    fuse_adapters(str(t["twin"]), {"plain": str(plain)}, tmp_path / "fused")
    cfg = json.loads((tmp_path / "fused" / "adapter_config.json").read_text())
    assert set(cfg["alpha_pattern"].values()) != {32}  # not the preset's alpha: the test would not see a missing rescale
    original = build_policy(
        _cfg(tmp_path / "o", t["twin"], add_tool_tokens=False, init_adapter=str(tmp_path / "plain")), log=QUIET
    )
    fused = build_policy(_cfg(tmp_path / "f", t["twin"], add_tool_tokens=False, init_adapter=str(tmp_path / "fused")), log=QUIET)
    ids = original.encode_prompt([{"role": "user", "content": "Count the orders."}], None, 64)
    assert float((_logits(fused, ids) - _logits(original, ids)).abs().max()) <= ATOL


# ----------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------


def _edit(
    adapter: Path, out: Path, config: Any = None, drop_rows: bool = False, rows_shape: tuple[int, int] | None = None
) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(adapter, out)
    if config is not None:
        data = json.loads((out / "adapter_config.json").read_text())
        data.update(config)
        (out / "adapter_config.json").write_text(json.dumps(data))
    tensors = load_file(str(out / "adapter_model.safetensors"))
    for key in [k for k in tensors if "trainable_tokens" in k]:
        if drop_rows:
            del tensors[key]
        elif rows_shape is not None:
            tensors[key] = torch.zeros(rows_shape)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    return out


@pytest.mark.parametrize(
    "edit, match",
    [
        (dict(drop_rows=True), "trainable_token_indices but no trained rows"),
        (dict(config={"trainable_token_indices": None}), "trained embedding rows but no trainable_token_indices"),
        (dict(config={"trainable_token_indices": "all"}), "neither a list of ids nor a dict"),
        (dict(config={"trainable_token_indices": [1, 1]}), "expected a list of distinct token ids|names"),
        (dict(config={"trainable_token_indices": {"nowhere": [1, 2]}}), "names \\['nowhere'\\]"),
        (dict(rows_shape=(3, 64)), "rows of shape \\(3, 64\\) for 2 token ids"),
    ],
    ids=["ids-without-rows", "rows-without-ids", "garbage-ids", "repeated-ids", "unknown-module", "wrong-shape"],
)
def test_rows_and_ids_that_disagree_are_clear_errors(trained: dict[str, Any], tmp_path: Path, edit: dict, match: str) -> None:
    folder = _edit(trained["adapter"], tmp_path / "bad", **edit)
    with pytest.raises(AdapterError, match=match):
        load_adapter(folder)
    with pytest.raises(AdapterError, match=match):
        fuse_adapters(str(trained["twin"]), {"bad": str(folder)}, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_base_that_cannot_take_the_added_tokens_is_named(trained: dict[str, Any], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    t = trained
    as_object = AutoModelForCausalLM.from_pretrained(t["twin"], dtype=torch.float32)
    with pytest.raises(ConfigError, match="pass the base model as its folder"):
        fuse_adapters(as_object, {"exec": str(t["adapter"])}, tmp_path / "a")
    no_tokenizer = tmp_path / "no-tokenizer"
    as_object.save_pretrained(no_tokenizer)
    with pytest.raises(ConfigError, match="has no tokenizer that loads"):
        fuse_adapters(str(no_tokenizer), {"exec": str(t["adapter"])}, tmp_path / "b")
    other = _edit(t["adapter"], tmp_path / "other-ids")
    data = json.loads((other / TOKENS_FILE).read_text())
    data["base_vocab"] -= 1
    (other / TOKENS_FILE).write_text(json.dumps(data))
    with pytest.raises(AdapterMismatchError, match="trained on another base model"):
        fuse_adapters(str(t["twin"]), {"exec": str(other)}, tmp_path / "c")
    (other / TOKENS_FILE).write_bytes(b"[" * 100_000)
    with pytest.raises(ConfigError, match="save the adapter again"):
        fuse_adapters(str(t["twin"]), {"exec": str(other)}, tmp_path / "d")
    assert not any((tmp_path / x).exists() for x in "abcd")


def test_remap_to_a_model_of_another_width_and_a_live_adapter_with_rows_are_refused(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    from transformers import AutoConfig

    t = trained
    config = AutoConfig.from_pretrained(t["twin"])
    config.hidden_size, config.head_dim = 128, 32
    (tmp_path / "wide").mkdir()
    config.save_pretrained(tmp_path / "wide")
    with pytest.raises(AdapterError, match="the models differ in shape"):
        remap_adapter(str(t["adapter"]), str(tmp_path / "wide"), tmp_path / "out")
    # rows beyond the base's vocabulary with no tool_tokens.json to grow it: trained on another base
    lost = _edit(t["adapter"], tmp_path / "lost")
    (lost / TOKENS_FILE).unlink()
    with pytest.raises(
        AdapterMismatchError, match=r"but the base model's has \d+ rows of width 64; it was trained on another base"
    ):
        remap_adapter(str(lost), str(t["twin"]), tmp_path / "out")
    with pytest.raises(AdapterMismatchError, match="it was trained on another base"):
        fuse_adapters(str(t["twin"]), {"lost": str(lost)}, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(UnsupportedAdapterError, match=r"trains embedding rows .* pass the folder"):
        LoraAdapter.from_peft_model(t["policy"].lm, t["policy"].adapter)


@pytest.mark.parametrize(
    "content", [b"", b"[]", b"\xff\xfe", b'{"lora_alpha": "x"}', b"[" * 100_000], ids=["empty", "list", "bytes", "alpha", "deep"]
)
def test_init_adapter_with_a_damaged_config_is_named(trained: dict[str, Any], tmp_path: Path, content: bytes) -> None:
    folder = _edit(trained["adapter"], tmp_path / "damaged")
    (folder / "adapter_config.json").write_bytes(content)
    with pytest.raises(ConfigError, match=r"adapter_config\.json.*save the adapter again"):
        build_policy(_cfg(tmp_path / "run", trained["twin"], init_adapter=str(folder)), log=QUIET)
