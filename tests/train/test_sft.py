"""SFT: transcripts cut to --max-prompt-tokens without losing the system prompt, masks, progress, the final eval."""

from __future__ import annotations

import json
import re

import pytest

from agentrl_envs.errors import ConfigError
from agentrl_train.sft import encode_transcript, oracle_transcripts, sft

from .conftest import small_config

TOOLS = [{"type": "function", "function": {"name": "sql", "description": "run a query", "parameters": {"type": "object"}}}]


def _transcript(turns: int, reply: str = "row " * 40) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "You are an agent. Call the tools."}, {"role": "user", "content": "Count the rows."}]
    for j in range(turns):
        msgs += [{"role": "assistant", "content": f'<tool_call>{{"name": "sql", "arguments": {{"query": "q{j}"}}}}</tool_call>'}]
        msgs += [{"role": "tool", "content": f"{reply} {j}"}]
    return msgs


def _runs(ids: list[int], mask: list[bool]) -> list[list[int]]:
    """The contiguous masked stretches of ``ids`` (one per assistant turn)."""
    out: list[list[int]] = []
    for j, (tok, m) in enumerate(zip(ids, mask)):
        if m:
            if j == 0 or not mask[j - 1]:
                out.append([])
            out[-1].append(tok)
    return out


def test_a_long_transcript_keeps_the_system_prompt_and_every_assistant_token_once(small_policy) -> None:
    """SFT cut transcripts with ``ids[-max_prompt_tokens:]``: the system prompt and tools went first, and the early actions."""
    policy, _ = small_policy
    msgs = _transcript(6)
    whole_ids, whole_mask = policy.encode_episode(msgs, TOOLS)
    system_ids = policy.encode_episode(msgs[:1], TOOLS)[0]
    head_ids = policy.encode_episode(msgs[:2], TOOLS)[0]
    limit = len(head_ids) + 120  # room for about two turns of the six
    assert len(whole_ids) > 2 * limit
    seqs = encode_transcript(policy, msgs, TOOLS, limit)
    assert len(seqs) > 2
    for ids, mask in seqs:
        assert len(ids) == len(mask) <= limit
        assert ids[: len(system_ids)] == system_ids  # the system prompt's rendering (with the tools) comes first
        assert ids[: len(head_ids)] == head_ids  # then the instruction
        assert not any(mask[: len(head_ids)])
    # the masks cover exactly the assistant turns' tokens, each turn in one sequence, as in the uncut transcript
    assert [run for ids, mask in seqs for run in _runs(ids, mask)] == _runs(whole_ids, whole_mask)
    assert len(_runs(whole_ids, whole_mask)) == 6
    runs = [run for ids, mask in seqs for run in _runs(ids, mask)]
    for j, run in enumerate(runs):  # and nothing else: each masked stretch is an assistant turn and its end-of-turn token
        content = msgs[2 + 2 * j]["content"]
        assert policy.tokenizer.decode(run).strip().removesuffix("<|im_end|>") == content


def test_a_later_sequence_carries_the_turn_before_it_as_context_outside_the_loss(small_policy) -> None:
    policy, _ = small_policy
    msgs = _transcript(4, reply="ok")
    whole_ids, whole_mask = policy.encode_episode(msgs[:-1], TOOLS)  # a trailing tool reply is in no loss
    head = len(policy.encode_episode(msgs[:2], TOOLS)[0])
    one_turn = len(policy.encode_episode(msgs[:4], TOOLS)[0]) - head
    seqs = encode_transcript(policy, msgs, TOOLS, head + 3 * one_turn)
    assert len(seqs) == 2
    (first, first_mask), (second, second_mask) = seqs
    assert len(_runs(first, first_mask)) + len(_runs(second, second_mask)) == 4
    # the second sequence starts after the head with the last turn of the first, unmasked
    ctx = policy.encode_episode(
        msgs[:2] + msgs[2 + 2 * (len(_runs(first, first_mask)) - 1) : 2 + 2 * len(_runs(first, first_mask))], TOOLS
    )[0]
    assert second[: len(ctx)] == ctx and not any(second_mask[: len(ctx)])
    assert [r for ids, m in seqs for r in _runs(ids, m)] == _runs(whole_ids, whole_mask)


def test_a_transcript_that_fits_is_one_sequence_with_the_whole_mask(small_policy) -> None:
    policy, _ = small_policy
    msgs = _transcript(3)
    ids, mask = policy.encode_episode(msgs, TOOLS)
    ((seq_ids, seq_mask),) = encode_transcript(policy, msgs, TOOLS, 10_000)
    last_assistant = max(j for j, m in enumerate(mask) if m)
    assert seq_ids == ids[: last_assistant + 1] and seq_mask == mask[: last_assistant + 1]
    assert encode_transcript(policy, msgs[:2], TOOLS, 10_000) == []


def test_a_head_or_an_action_that_does_not_fit_names_max_prompt_tokens(small_policy) -> None:
    policy, _ = small_policy
    msgs = _transcript(2)
    head = len(policy.encode_episode(msgs[:2], TOOLS)[0])
    with pytest.raises(
        ConfigError,
        match=rf"--max-prompt-tokens={head - 1}: the system prompt, tools and instruction alone take {head} tokens.*raise --max-prompt-tokens",
    ):
        encode_transcript(policy, msgs, TOOLS, head - 1)
    with pytest.raises(
        ConfigError,
        match=r"--max-prompt-tokens=.*instruction and oracle action 1 take \d+ tokens.*raise --max-prompt-tokens to at least",
    ):
        encode_transcript(policy, msgs, TOOLS, head + 2)


def test_sft_logs_each_step_cuts_long_transcripts_and_ends_with_a_greedy_eval(tmp_path, small_policy) -> None:
    """A user's first run: a line per optimizer step (loss, tokens/s) without a bar, the cut, and greedy success per split."""
    policy, _ = small_policy
    transcripts = oracle_transcripts("AgentRL/SQL-v0", 4, "train", {"error_profile": "none"})  # the ones sft clones
    # room for every transcript's longest single action after its head, but not for every whole transcript
    limit = max(
        len(policy.encode_episode([*msgs[:2], msgs[j]], tools)[0]) for msgs, tools in transcripts for j in range(2, len(msgs), 2)
    )
    extra = sum(len(encode_transcript(policy, msgs, tools, limit)) - 1 for msgs, tools in transcripts)
    lines: list[str] = []
    cfg = small_config(
        tmp_path,
        env="AgentRL/SQL-v0",
        mode="generate",
        episodes=4,
        sft_epochs=1,
        sft_batch=2,
        max_new_tokens=16,
        max_prompt_tokens=limit,
        final_eval_splits=["train", "test"],
        eval_episodes=1,
    )
    result = sft(cfg, log=lines.append)
    assert result["steps"] == 2
    steps = [line for line in lines if line.startswith("sft step ")]
    assert [s.split()[2] for s in steps] == ["1/2", "2/2"] and all("loss" in s and "tokens/s" in s for s in steps)
    cut = [re.search(r"as (\d+) sequences .*\((\d+) extra from long transcripts\)", line) for line in lines]
    assert [(int(c[1]), int(c[2])) for c in cut if c] == [(4 + extra, extra)] and extra > 0
    assert any(line.startswith("final evaluation: greedy, 1 episodes per split") for line in lines)
    table = lines[-1]
    assert "| train |" in table and "| test |" in table and "success" in table
    assert set(result["eval"]) == {"train", "test"}
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["tokens_per_s"] > 0 and r["tokens"] > 0 for r in rows)


def test_sft_shows_a_progress_bar_unless_no_progress(tmp_path, capsys) -> None:
    cfg = small_config(
        tmp_path,
        env="AgentRL/SQL-v0",
        mode="generate",
        episodes=2,
        sft_epochs=1,
        sft_batch=1,
        progress=True,
        final_eval_splits=[],
    )
    lines: list[str] = []
    sft(cfg, log=lines.append)
    err = capsys.readouterr().err
    assert "sft" in err and "2/2" in err and "loss=" in err
    assert not [line for line in lines if line.startswith("sft step ")]
