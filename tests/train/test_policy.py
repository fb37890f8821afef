"""Policy: LoRA targets and presets, candidate scoring, generation log-probs, the reference policy."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from agentrl_envs.errors import ConfigError
from agentrl_train.lora import LORA_PRESETS, lora_targets
from agentrl_train.models import load_base


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


def _perturbed(policy, seed: int = 0):
    """A copy of the shared policy whose adapter and value head are not zero (so scores depend on them)."""
    p2 = copy.deepcopy(policy)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in p2.trainable_parameters():
            if "lora_B" in n or n.startswith("value_head"):
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return p2


def _episode_prompts(policy) -> list[list[int]]:
    """An episode's successive prompts (each a prefix of the next), a second episode's, and a repeat."""
    msgs = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Email the median order."}]
    other = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Count the staff rows."}]
    p1 = policy.encode_prompt(msgs, None, 512)
    p2 = [*p1, *policy.encode_action("SELECT amount FROM orders"), 7, 8, 9]
    p3 = [*p2, *policy.encode_action("finish"), 10, 11]
    q1 = policy.encode_prompt(other, None, 512)
    return [p2, q1, p1, p3, list(p2), [*q1, 12]]


def test_prefix_chains_put_every_sequence_in_one_chain_under_a_head_it_prefixes() -> None:
    from agentrl_train.policy import prefix_chains

    seqs = [[1, 2, 3], [1, 2], [4], [1, 2, 3, 4], [], [1, 3], [1, 2], [4, 5]]
    chains = prefix_chains(seqs)
    members = sorted(i for _, ms in chains for i in ms)
    assert members == list(range(len(seqs)))
    for head, ms in chains:
        assert ms[0] == head and all(seqs[head][: len(seqs[m])] == seqs[m] for m in ms)
        assert [len(seqs[m]) for m in ms] == sorted((len(seqs[m]) for m in ms), reverse=True)
    by_head = {tuple(seqs[h]): sorted(ms) for h, ms in chains}
    assert by_head[(1, 2, 3, 4)] == [0, 1, 3, 6] and by_head[(4, 5)] == [2, 7] and by_head[(1, 3)] == [5]
    assert by_head[()] == [4]
    assert prefix_chains([]) == []


@pytest.mark.parametrize("scoring", ["mean", "sum"])
def test_candidates_of_many_prompts_equal_each_prompt_scored_alone_with_their_gradients(small_policy, scoring: str) -> None:
    policy = _perturbed(small_policy[0])
    prompts = _episode_prompts(policy)
    cands = [
        [policy.encode_action(t) for t in ("finish", "SELECT amount FROM orders", "x" * 30)],
        [policy.encode_action("a"), [5]],
        [policy.encode_action(t) for t in ("finish", "python: print(1)")],
        [policy.encode_action(t) for t in ("SELECT 1", "finish", "smtp", "y" * 12)],
        [policy.encode_action(t) for t in ("b", "finish")],
        [policy.encode_action(t) for t in ("c d e", "finish")],
    ]
    items = list(zip(prompts, cands))
    params = [p for _, p in policy.trainable_parameters()]

    def grads(outs) -> list[torch.Tensor]:
        policy.zero_grad(set_to_none=True)
        sum(o.scores_K.sum() + o.value for o in outs).backward()
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]

    alone = [policy.score_candidates(p, c, scoring) for p, c in items]
    g_alone = grads(alone)
    many = policy.score_candidates_many(items, scoring)
    g_many = grads(many)
    assert len(many) == len(items)
    for a, m, (_, c) in zip(alone, many, items):
        assert m.scores_K.shape == (len(c),)
        assert torch.allclose(a.scores_K, m.scores_K, atol=1e-5)
        assert float(a.value.detach()) == pytest.approx(float(m.value.detach()), abs=1e-5)
        for ta, tm in zip(a.token_logprobs, m.token_logprobs):
            assert torch.allclose(ta, tm, atol=1e-5)
    assert any(float(g.abs().max()) > 0 for g in g_alone)
    for ga, gm in zip(g_alone, g_many):
        assert torch.allclose(ga, gm, atol=1e-5, rtol=1e-4)


def test_sequence_logprobs_of_many_items_equal_each_alone(small_policy) -> None:
    policy = _perturbed(small_policy[0], seed=1)
    prompts = _episode_prompts(policy)
    p1 = prompts[2]
    new_1 = policy.encode_action("SELECT amount FROM orders")
    items = [(p1, new_1), ([*p1, *new_1, 7, 8, 9], [11, 12, 13]), (prompts[1], [14]), (p1, new_1[:3])]
    with torch.no_grad():
        alone = [policy.sequence_logprobs(p, n) for p, n in items]
        many = policy.sequence_logprobs_many(items)
    for (lp_a, ent_a, v_a), (lp_m, ent_m, v_m) in zip(alone, many):
        assert torch.allclose(lp_a, lp_m, atol=1e-5) and torch.allclose(ent_a, ent_m, atol=1e-5)
        assert float(v_a) == pytest.approx(float(v_m), abs=1e-5)


def test_a_prompt_extended_step_by_step_scores_as_one_encoded_whole(small_policy) -> None:
    policy = _perturbed(small_policy[0], seed=2)
    p2, q1, p1, p3 = _episode_prompts(policy)[:4]
    cands = [policy.encode_action(t) for t in ("finish", "SELECT amount FROM orders", "z" * 25)]
    with torch.no_grad():
        state = None
        for prompt in (p1, p2, p2, p3, q1):  # q1 is no extension of p3: encoded from scratch
            state = policy.extend_prompt(prompt, state)
            assert state is not None and state.ids == prompt and state.cache.get_seq_length() == len(prompt)
            on = policy.score_candidates_on(state, cands, "mean")
            assert state.cache.get_seq_length() == len(prompt)  # the candidates' keys/values were dropped again
            alone = policy.score_candidates(prompt, cands, "mean")
            assert torch.allclose(on.scores_K, alone.scores_K, atol=1e-5)
            assert float(on.value) == pytest.approx(float(alone.value), abs=1e-5)
            for a, b in zip(on.token_logprobs, alone.token_logprobs):
                assert torch.allclose(a, b, atol=1e-5)


def test_generation_and_its_reference_log_probs_over_kept_keys_values_equal_those_from_scratch(small_policy) -> None:
    policy = _perturbed(small_policy[0], seed=3)
    p2, _, p1, p3 = _episode_prompts(policy)[:4]
    with torch.no_grad():
        state = None
        for prompt in (p1, p2, p3):
            state = policy.extend_prompt(prompt, state)
            kept = policy.generate(prompt, 16, generator=torch.Generator().manual_seed(5), state=state)
            assert state.cache.get_seq_length() == len(prompt)  # the sampled tokens' keys/values were dropped again
            fresh = policy.generate(prompt, 16, generator=torch.Generator().manual_seed(5))
            assert kept[0] == fresh[0] and len(kept[0]) >= 1
            assert np.allclose(kept[1], fresh[1], atol=1e-5) and kept[2] == pytest.approx(fresh[2], abs=1e-5)
            on = policy.sequence_logprobs_on(state, kept[0])
            assert state.cache.get_seq_length() == len(prompt)
            alone = policy.sequence_logprobs(prompt, kept[0])
            for a, b in zip(on, alone):
                assert torch.allclose(a, b, atol=1e-5)
