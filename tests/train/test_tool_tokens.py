"""``--add-tool-tokens``: the tool-call markers as single tokens, their rows started at the sub-words' mean,
trained and saved with the adapter, and loaded back exactly (config-built Llama twins, tied and untied;
their byte-level BPE splits ``<tool_call>`` as SmolLM2's does)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl_envs.errors import ConfigError
from agentrl_train.chat_template import TOOLS_CHATML
from agentrl_train.policy import build_policy
from agentrl_train.tool_tokens import TOKENS_FILE, TOOL_MARKERS, add_tool_tokens, read_tool_tokens, split_markers

from .conftest import small_config

CALL = '<tool_call>{"name": "sql", "arguments": {"query": "SELECT 1"}}</tool_call>'
CORPUS = [
    "<|im_start|>system\nYou solve tasks with tools.<|im_end|>\n<|im_start|>user\nCount the rows of the orders table.<|im_end|>\n",
    '<|im_start|>assistant\n<tool_call>{"name": "sql", "arguments": {"query": "SELECT count(*) FROM orders"}}</tool_call><|im_end|>\n',
    "<|im_start|>user\n<tool_response>\n[[42]]\n</tool_response><|im_end|>\n",
] * 20


def _twin(folder: Path, tied: bool) -> Path:
    """A 2-layer Llama with random weights and a byte-level BPE with ChatML markers but no tool-call tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf.chat_template = TOOLS_CHATML
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(hf),
        max_position_embeddings=8192,
        tie_word_embeddings=tied,
        eos_token_id=hf.eos_token_id,
        pad_token_id=hf.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def twin(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _twin(tmp_path_factory.mktemp("twin"), request.param)


def _cfg(tmp_path: Path, model: Path | str, **kw: Any) -> Any:
    opts: dict[str, Any] = dict(
        model=str(model), lora_preset="small", add_tool_tokens=True, mode="generate", final_eval_splits=[]
    )
    opts.update(kw)
    return small_config(tmp_path, **opts)


def _seq(policy: Any) -> list[int]:
    messages = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "Count the orders."}]
    return policy.encode_prompt(messages, None, 512) + policy.tokenizer(CALL, add_special_tokens=False)["input_ids"]


def _logits(policy: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return policy.lm(input_ids=torch.tensor([ids])).logits[0]


def _step(policy: Any, ids: list[int]) -> None:
    """One AdamW step on the sequence's log-likelihood (the trainer's optimizer over trainable parameters)."""
    params = [p for n, p in policy.trainable_parameters() if not n.startswith("value_head")]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)
    lp, _, _ = policy.sequence_logprobs(ids[:-20], ids[-20:])
    (-lp.sum()).backward()
    opt.step()
    opt.zero_grad()


def _rows(policy: Any) -> dict[str, torch.Tensor]:
    """The effective embedding and output matrices (the added rows as the adapter sets them)."""
    emb, out = policy.causal.get_input_embeddings(), policy.causal.get_output_embeddings()
    active = [policy.adapter]
    return {
        "input": emb.token_adapter.get_merged_weights(active).detach().clone(),
        "output": (out.token_adapter.get_merged_weights(active) if hasattr(out, "token_adapter") else out.weight)
        .detach()
        .clone(),
    }


def test_the_markers_become_single_tokens_with_rows_at_the_subword_mean(twin: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(twin)
    pieces = split_markers(tok)
    assert set(pieces) == set(TOOL_MARKERS) and all(len(p) > 1 for p in pieces.values())
    base = AutoModelForCausalLM.from_pretrained(twin)
    policy = build_policy(_cfg(tmp_path, twin), log=lambda *a: None)
    added = policy.tool_tokens
    assert added is not None and added.tokens == TOOL_MARKERS and added.base_vocab == len(tok)
    for marker in TOOL_MARKERS:
        assert len(policy.tokenizer(marker, add_special_tokens=False)["input_ids"]) == 1
    assert policy.tokenizer.convert_tokens_to_ids("</tool_call>") in policy.stop_ids
    rows = _rows(policy)
    for marker, i in zip(added.tokens, added.ids):
        sub = torch.tensor(pieces[marker])
        torch.testing.assert_close(rows["input"][i], base.get_input_embeddings().weight[sub].mean(0))
        torch.testing.assert_close(rows["output"][i], base.get_output_embeddings().weight[sub].mean(0))
    # every other row is the base model's, and the tokenizer's text round trip keeps the markers
    n = added.base_vocab
    assert torch.equal(rows["input"][:n], base.get_input_embeddings().weight[:n])
    assert torch.equal(rows["output"][:n], base.get_output_embeddings().weight[:n])
    assert policy.tokenizer.decode(policy.tokenizer(CALL, add_special_tokens=False)["input_ids"]) == CALL
    # a tool result that spells a marker stays text: only the policy's own turns hold the new tokens
    forged = f"[[1]] {CALL}"
    assert not set(added.ids) & set(policy._tokenize(f"<|im_start|>user\n{forged}<|im_end|>", [forged]))


def test_an_optimizer_step_moves_the_added_rows_and_nothing_else_of_the_base(twin: Path, tmp_path: Path) -> None:
    policy = build_policy(_cfg(tmp_path, twin), log=lambda *a: None)
    added = policy.tool_tokens
    assert added is not None
    trainable = {n for n, p in policy.lm.named_parameters() if p.requires_grad}
    assert any(n.endswith(".trainable_tokens_delta.exec") for n in trainable)
    assert all("lora_" in n or "trainable_tokens_delta" in n for n in trainable)
    base = {n: p.detach().clone() for n, p in policy.lm.named_parameters() if n not in trainable}
    base.update({f"buffer {n}": b.clone() for n, b in policy.lm.named_buffers()})
    before = _rows(policy)
    ids = _seq(policy)
    assert set(added.ids) <= set(ids)
    _step(policy, ids)
    after = _rows(policy)
    for n, p in [*policy.lm.named_parameters(), *((f"buffer {n}", b) for n, b in policy.lm.named_buffers())]:
        if n in base:
            assert torch.equal(p, base[n]), n
    new = list(added.ids)
    keep = [i for i in range(before["input"].shape[0]) if i not in new]
    assert not torch.equal(after["input"][new], before["input"][new])
    assert torch.equal(after["input"][keep], before["input"][keep])
    assert not torch.equal(after["output"][new], before["output"][new])
    assert torch.equal(after["output"][keep], before["output"][keep])
    if policy.causal.config.tie_word_embeddings:
        assert torch.equal(after["input"], after["output"])


def test_save_and_load_give_identical_logits(twin: Path, tmp_path: Path) -> None:
    policy = build_policy(_cfg(tmp_path / "a", twin), log=lambda *a: None)
    ids = _seq(policy)
    _step(policy, ids)
    policy.save(tmp_path / "saved")
    folder = tmp_path / "saved" / "exec"
    assert read_tool_tokens(folder) == policy.tool_tokens
    from safetensors import safe_open

    with safe_open(str(folder / "adapter_model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    # the added rows only, never the full embedding matrices
    rows = {k: s for k, s in shapes.items() if "trainable_tokens" in k}
    assert rows and all(s == (2, 64) for s in rows.values())
    assert not any(k.endswith(("embed_tokens.weight", "lm_head.weight")) for k in shapes)
    loaded = build_policy(_cfg(tmp_path / "b", twin, init_adapter=str(tmp_path / "saved")), log=lambda *a: None)
    assert torch.equal(_logits(loaded, ids), _logits(policy, ids))
    # the initial reference copies the loaded rows: KL 0 at the start of a PPO run from this adapter
    with loaded.reference():
        ref = _logits(loaded, ids)
    assert torch.equal(ref, _logits(policy, ids))


def test_an_sft_run_with_added_tokens_evaluates_from_its_final_folder(twin: Path, tmp_path: Path) -> None:
    from agentrl_train.evaluate import load_run
    from agentrl_train.sft import sft

    cfg = _cfg(
        tmp_path, twin, env="AgentRL/SQL-v0", episodes=2, sft_epochs=1, sft_batch=2, max_new_tokens=8, max_prompt_tokens=4096
    )
    sft(cfg, log=lambda *a: None)
    final = tmp_path / "run" / "final"
    assert (final / "exec" / TOKENS_FILE).is_file()
    policy, _ = load_run(str(tmp_path / "run"))  # agentrl-train eval --run
    assert policy.tool_tokens is not None
    again = build_policy(_cfg(tmp_path / "init", twin, init_adapter=str(final)), log=lambda *a: None)  # --init-adapter
    ids = _seq(policy)
    assert torch.equal(_logits(policy, ids), _logits(again, ids))
    start = build_policy(_cfg(tmp_path / "fresh", twin), log=lambda *a: None)
    assert not torch.equal(_logits(start, ids), _logits(policy, ids))  # sft moved it; the load is not a fresh policy


def test_the_tiny_model_is_a_no_op_with_a_log_line(tmp_path: Path) -> None:
    lines: list[str] = []
    policy = build_policy(small_config(tmp_path, add_tool_tokens=True), log=lines.append)
    assert policy.tool_tokens is None
    assert any("single tokens already; nothing added" in line for line in lines)
    policy.save(tmp_path / "saved")
    assert not (tmp_path / "saved" / "exec" / TOKENS_FILE).exists()


def test_an_adapter_with_added_tokens_needs_them_on_its_base(twin: Path, tmp_path: Path) -> None:
    policy = build_policy(_cfg(tmp_path / "a", twin), log=lambda *a: None)
    policy.save(tmp_path / "saved")
    with pytest.raises(ConfigError, match=r"trained with added tool-call tokens .* pass --add-tool-tokens"):
        build_policy(_cfg(tmp_path / "b", twin, add_tool_tokens=False, init_adapter=str(tmp_path / "saved")), log=lambda *a: None)
    # other ids (another base's vocabulary): refused by name
    f = tmp_path / "saved" / "exec" / TOKENS_FILE
    data = json.loads(f.read_text())
    data["ids"] = [i + 7 for i in data["ids"]]
    f.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="trained on another base model"):
        build_policy(_cfg(tmp_path / "c", twin, init_adapter=str(tmp_path / "saved")), log=lambda *a: None)
    # a frozen stage that trains added rows cannot be active beside the trained adapter
    data["ids"] = [i - 7 for i in data["ids"]]
    f.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="frozen stage with --add-tool-tokens is not supported"):
        build_policy(_cfg(tmp_path / "d", twin, frozen_adapters=[f"stage1={tmp_path / 'saved' / 'exec'}"]), log=lambda *a: None)


def test_an_adapter_without_added_tokens_loads_with_the_rows_at_their_start(twin: Path, tmp_path: Path) -> None:
    plain = build_policy(_cfg(tmp_path / "a", twin, add_tool_tokens=False), log=lambda *a: None)
    plain.save(tmp_path / "plain")
    policy = build_policy(_cfg(tmp_path / "b", twin, init_adapter=str(tmp_path / "plain")), log=lambda *a: None)
    fresh = build_policy(_cfg(tmp_path / "c", twin), log=lambda *a: None)
    for key, value in _rows(policy).items():
        assert torch.equal(value, _rows(fresh)[key]), key


@pytest.mark.parametrize(
    "content",
    [b"", b"[]", b"{}", b"\xff\xfe", b'{"tokens": ["<x>"], "ids": [5], "pieces": [[1]], "base_vocab": 5}', b"[" * 100_000],
    ids=["empty", "list", "no-keys", "not-utf8", "unknown-marker", "huge"],
)
def test_a_damaged_tokens_file_is_a_clear_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / TOKENS_FILE).write_bytes(content)
    with pytest.raises(ConfigError, match="save the adapter again"):
        read_tool_tokens(tmp_path)


def test_a_tokenizer_that_cannot_add_tokens_or_a_model_without_embeddings(twin: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    class Frozen:
        """A tokenizer whose vocabulary is fixed."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __call__(self, *a: Any, **k: Any) -> Any:
            return self.inner(*a, **k)

        def __len__(self) -> int:
            return len(self.inner)

        def add_special_tokens(self, *a: Any, **k: Any) -> int:
            raise NotImplementedError("this tokenizer's vocabulary is fixed")

    lm = AutoModelForCausalLM.from_pretrained(twin)
    with pytest.raises(ConfigError, match=r"tokenizer cannot add tokens .*NotImplementedError"):
        add_tool_tokens(lm, Frozen(AutoTokenizer.from_pretrained(twin)), "twin")
    no_embedding = copy.deepcopy(lm)
    no_embedding.model.embed_tokens = torch.nn.Identity()
    with pytest.raises(ConfigError, match="no input embedding layer"):
        add_tool_tokens(no_embedding, AutoTokenizer.from_pretrained(twin), "twin")


def test_serve_resizes_its_base_for_an_adapter_with_added_tokens_and_refuses_mixing(twin: Path, tmp_path: Path) -> None:
    from agentrl_train.serve.engine import Engine
    from agentrl_train.serve.weights import AdapterMismatchError

    policy = build_policy(_cfg(tmp_path / "a", twin), log=lambda *a: None)
    ids = _seq(policy)
    _step(policy, ids)
    policy.save(tmp_path / "tokens")
    plain = build_policy(_cfg(tmp_path / "b", twin, add_tool_tokens=False), log=lambda *a: None)
    plain.save(tmp_path / "plain")

    engine = Engine(str(twin), log=lambda *a: None)
    try:
        slot = engine.add_family("tool", engine.prepare(None, tmp_path / "tokens"))
        assert engine.tool_tokens == policy.tool_tokens
        assert engine.tokenizer.convert_tokens_to_ids("</tool_call>") in engine.stop_ids
        trained = {n.removesuffix(".exec"): p for n, p in policy.lm.named_parameters() if "trainable_tokens_delta" in n}
        rows = {n: p for n, p in engine._params[slot].items() if "trainable_tokens_delta" in n}
        assert rows.keys() == trained.keys() and all(torch.equal(rows[n], trained[n]) for n in rows)
        prompt = ids[:-20]
        served, _ = engine.generate(slot, prompt, 12, 0.0, 0).result()
        assert served == policy.generate(prompt, 12, greedy=True)[0]  # the trained rows are served
        with pytest.raises(AdapterMismatchError, match="no added tool-call tokens, and this server's base has added"):
            engine.prepare(None, tmp_path / "plain")
        engine.install(slot, engine.prepare("tool", tmp_path / "tokens")).result()  # a new version of the same kind
    finally:
        engine.close()
    engine = Engine(str(twin), log=lambda *a: None)
    try:
        engine.add_family("plain", engine.prepare(None, tmp_path / "plain"))
        with pytest.raises(AdapterMismatchError, match="cannot be served beside adapters without them"):
            engine.prepare(None, tmp_path / "tokens")
    finally:
        engine.close()


def test_ppo_from_an_adapter_with_added_tokens_trains_saves_and_evaluates_them(twin: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from agentrl_train.cli import main
    from agentrl_train.train import train

    start = build_policy(_cfg(tmp_path / "a", twin), log=lambda *a: None)
    _step(start, _seq(start))
    start.save(tmp_path / "sft")
    cfg = _cfg(
        tmp_path,
        twin,
        env="AgentRL/SQL-v0",
        init_adapter=str(tmp_path / "sft"),
        updates=1,
        num_envs=2,
        rollout_steps=2,
        max_new_tokens=8,
        max_prompt_tokens=4096,
        record=False,
        lr=1e-2,
    )
    assert train(cfg, log=lambda *a, **k: None)["finished"]
    final = tmp_path / "run" / "final" / "exec"
    assert read_tool_tokens(final) == start.tool_tokens

    def rows(f: Path) -> dict[str, torch.Tensor]:
        return {k: v for k, v in load_file(f).items() if "trainable_tokens" in k}

    before, after = rows(tmp_path / "sft" / "exec" / "adapter_model.safetensors"), rows(final / "adapter_model.safetensors")
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)
    for extra in ([], ["--checkpoint", "latest"]):
        assert main(["eval", "--run", str(tmp_path / "run"), "--episodes", "1", "--json", *extra]) == 0
