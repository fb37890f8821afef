"""Policy: LoRA targets and presets, candidate scoring, generation log-probs, the reference policy."""

from __future__ import annotations

import copy

import pytest
import torch

from agentrl_envs.errors import ConfigError
from agentrl_train.policy import LORA_PRESETS, load_base, lora_targets


def _tiny_lm(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    cls, cfg = {
        "llama": (LlamaForCausalLM, LlamaConfig),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config),
        "phi3": (Phi3ForCausalLM, Phi3Config),
    }[kind]
    return cls(cfg(**common))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "phi3"])
@pytest.mark.parametrize("preset", sorted(LORA_PRESETS))
def test_presets_resolve_per_architecture(kind: str, preset: str) -> None:
    lm = _tiny_lm(kind)
    t = lora_targets(lm, preset)
    expected = {"phi3": {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}}.get(
        kind, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    )
    assert set(t["target_modules"]) == expected
    for m, r in t["rank_pattern"].items():
        kind_of = "attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj") else "mlp"
        assert r == LORA_PRESETS[preset][kind_of]
        assert t["alpha_pattern"][m] == 2.0 * r
    assert not {"lm_head", "embed_tokens"} & set(t["target_modules"])


def test_lora_is_never_on_embeddings_or_head(small_policy) -> None:
    policy, _ = small_policy
    names = [n for n, _ in policy.trainable_parameters()]
    assert names and all("lora_" in n or n.startswith("value_head") for n in names)
    assert not any("embed" in n or "lm_head" in n for n in names)
    seen = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in names if "lora_A" in n}
    assert seen == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_user_ranks_override_and_bad_ranks_are_refused() -> None:
    lm = _tiny_lm("llama")
    t = lora_targets(lm, "seed", {"attn": 8, "down_proj": 2})
    assert t["rank_pattern"]["q_proj"] == 8 and t["rank_pattern"]["down_proj"] == 2 and t["rank_pattern"]["up_proj"] == 16
    with pytest.raises(ConfigError, match="unknown module 'qkv'"):
        lora_targets(lm, "seed", {"qkv": 4})
    with pytest.raises(ConfigError, match="positive int"):
        lora_targets(lm, "seed", {"attn": 0})
    with pytest.raises(ConfigError, match="use one of"):
        lora_targets(lm, "huge")


def test_candidate_logprobs_equal_one_at_a_time_reference(small_policy) -> None:
    policy, _ = small_policy
    tok = policy.tokenizer
    prompt = policy.encode_prompt(
        [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Find the median order amount."}],
        None,
        512,
    )
    cands = [
        policy.encode_action(t)
        for t in ('<tool_call>{"name": "sql"}</tool_call>', "finish", "x" * 40, "SELECT amount FROM orders")
    ]
    with torch.no_grad():
        out = policy.score_candidates(prompt, cands, "mean")
        out_sum = policy.score_candidates(prompt, cands, "sum")
        for k, c in enumerate(cands):
            ids = torch.tensor([prompt + c])
            logp = torch.log_softmax(policy.causal(input_ids=ids).logits[0].float(), -1)
            ref = torch.stack([logp[len(prompt) - 1 + j, c[j]] for j in range(len(c))])
            assert torch.allclose(out.token_logprobs[k], ref, atol=1e-5)
            assert float(out.scores_K[k]) == pytest.approx(float(ref.mean()), abs=1e-5)
            assert float(out_sum.scores_K[k]) == pytest.approx(float(ref.sum()), abs=1e-4)
    assert tok.eos_token_id == cands[0][-1]


def test_generated_logprobs_are_recomputed_exactly(small_policy) -> None:
    policy, _ = small_policy
    prompt = policy.encode_prompt(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "Email the total."}], None, 512
    )
    g = torch.Generator().manual_seed(3)
    new, lps, value = policy.generate(prompt, 24, generator=g)
    assert 1 <= len(new) <= 24 and len(lps) == len(new)
    with torch.no_grad():
        lp, ent, v = policy.sequence_logprobs(prompt, new)
    assert torch.allclose(lp, torch.tensor(lps), atol=1e-4)
    assert float(v) == pytest.approx(value, abs=1e-5)
    assert bool((ent >= 0).all())


def test_kl_to_reference_is_zero_before_the_first_update(small_policy) -> None:
    policy, _ = small_policy
    prompt = policy.encode_prompt([{"role": "system", "content": "s"}, {"role": "user", "content": "Count staff."}], None, 512)
    cands = [policy.encode_action(t) for t in ("a b c", "SELECT COUNT(*) FROM staff")]
    with torch.no_grad():
        a = policy.score_candidates(prompt, cands).scores_K
        with policy.reference():
            b = policy.score_candidates(prompt, cands).scores_K
    assert torch.equal(a, b)  # LoRA B starts at zero: the adapter changes nothing yet


def test_reference_ignores_trained_adapter(small_policy) -> None:
    policy, _ = small_policy
    p2 = copy.deepcopy(policy)
    with torch.no_grad():
        for n, p in p2.trainable_parameters():
            if "lora_B" in n:
                p.add_(0.05)
    prompt = [5, 6, 7, 8]
    cands = [[9, 10], [11, 12, 13]]
    with torch.no_grad():
        trained = p2.score_candidates(prompt, cands).scores_K
        with p2.reference():
            ref = p2.score_candidates(prompt, cands).scores_K
        base = policy.score_candidates(prompt, cands).scores_K
    assert not torch.allclose(trained, ref)
    assert torch.allclose(ref, base)


def test_bad_models_get_clear_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such folder"):
        load_base(str(tmp_path / "nope"), torch.device("cpu"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no config\.json"):
        load_base(str(tmp_path / "empty"), torch.device("cpu"))


def test_tokenizer_without_chat_template_is_refused(small_policy, tmp_path) -> None:
    policy, _ = small_policy
    folder = tmp_path / "m"
    policy.causal.config.save_pretrained(folder)
    tok = copy.deepcopy(policy.tokenizer)
    tok.chat_template = None
    tok.save_pretrained(folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ConfigError, match="no chat template"):
        load_base(str(folder), torch.device("cpu"))


def test_a_rank_above_the_layer_width_is_refused() -> None:
    """``{attn: 100000}`` was accepted: a LoRA of 100000 x 32 per projection, minutes of work before any use."""
    from transformers import LlamaConfig, LlamaForCausalLM

    lm = _tiny_lm("llama")  # hidden 32, intermediate 64: every projection is 32 wide
    with pytest.raises(ConfigError) as info:
        lora_targets(lm, "seed", {"attn": 100000})
    msg = str(info.value)
    assert msg.startswith("--lora-ranks: rank 100000 for attn modules (k_proj, o_proj, q_proj, v_proj)"), msg
    assert msg.endswith("the largest allowed attn rank is 32"), msg
    with pytest.raises(ConfigError, match=r"rank 33 for mlp modules .* largest allowed mlp rank is 32"):
        lora_targets(lm, "seed", {"mlp": 33})
    with pytest.raises(ConfigError, match=r"rank 40 for up_proj .* largest allowed up_proj rank is 32"):
        lora_targets(lm, "seed", {"up_proj": 40})
    assert lora_targets(lm, "seed", {"attn": 32, "mlp": 32})["rank_pattern"]["down_proj"] == 32  # the width itself is fine
    assert lora_targets(lm, "seed")["rank_pattern"]["q_proj"] == 64  # a preset is not checked (small models are narrow)
    # grouped-query attention: k/v_proj are narrower than q/o_proj, and the narrowest sets the kind's bound
    gqa = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=1,
        )
    )
    with pytest.raises(ConfigError, match=r"k_proj is 16 wide.*largest allowed attn rank is 16"):
        lora_targets(gqa, "seed", {"attn": 64})
    # a module named on its own is bounded by its own width, and the kind by the rest
    t = lora_targets(gqa, "seed", {"attn": 64, "k_proj": 8, "v_proj": 8})
    assert t["rank_pattern"] == {**t["rank_pattern"], "q_proj": 64, "o_proj": 64, "k_proj": 8, "v_proj": 8}
