"""Tool-call markers as tokens: the log-prob of oracle tool calls before training, split vs added tokens.

The same base model scores the same oracle steps twice, with fresh adapters (LoRA ``B`` = 0: the base
model itself): once with its own tokenizer (``<tool_call>`` and ``</tool_call>`` split into
sub-words on SmolLM2) and once with ``--add-tool-tokens`` (each marker one token, its rows the mean of
the sub-words' rows). Each oracle step of the first ``--episodes`` episodes of ``--env`` (train split)
is scored as SFT sees it: the assistant turn's tokens (the call and the end-of-turn token) after the
rendered conversation so far. Printed per step: the tokens of the turn and its log-prob (nats) under
each tokenization, and the part of it on the marker tokens; the rest of the turn (the JSON of the call)
sees another context after an added marker, so it moves too::

    python benchmarks/bench_tool_tokens.py                                   # SmolLM2-135M-Instruct, SQL-v0
    python benchmarks/bench_tool_tokens.py --model tiny                      # markers single already: no change

Printed, not asserted; it trains nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def steps(policy: Any, transcripts: list[tuple[list[dict[str, str]], Any]]) -> list[tuple[list[int], list[int]]]:
    """Per oracle step, (the conversation's tokens before the assistant turn, the turn's own tokens)."""
    out = []
    for messages, tools in transcripts:
        for n in range(1, len(messages) + 1):
            if messages[n - 1]["role"] != "assistant":
                continue
            ids, mask = policy.encode_episode(messages[:n], tools)
            end = max(i for i, m in enumerate(mask) if m) + 1
            start = end
            while start > 0 and mask[start - 1]:
                start -= 1
            out.append((ids[:start], ids[start:end]))
    return out


def score(policy: Any, items: list[tuple[list[int], list[int]]]) -> list[tuple[int, float, float]]:
    """Per item: the turn's token count, its log-prob and the log-prob on the tool-call marker tokens."""
    import torch

    split = {m: policy.tokenizer(m, add_special_tokens=False)["input_ids"] for m in ("<tool_call>", "</tool_call>")}
    rows = []
    with torch.no_grad():
        for prompt, action in items:
            lp, _, _ = policy.sequence_logprobs(prompt, action)
            on_marker = [False] * len(action)
            for pieces in split.values():  # the marker's tokens, one or several
                k = len(pieces)
                for j in range(len(action) - k + 1):
                    if action[j : j + k] == pieces:
                        on_marker[j : j + k] = [True] * k
            rows.append((len(action), float(lp.sum()), float(lp[torch.tensor(on_marker)].sum())))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--env", default="AgentRL/SQL-v0")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    from agentrl_train.config_io import load_config
    from agentrl_train.policy import build_policy
    from agentrl_train.sft import oracle_transcripts

    t0 = time.perf_counter()
    transcripts = oracle_transcripts(args.env, args.episodes, "train", {"error_profile": "none"})
    results = {}
    for added in (False, True):
        cfg = load_config(
            None,
            {"model": args.model, "add_tool_tokens": added, "lora_preset": "small", "threads": args.threads, "mode": "generate"},
        )
        policy = build_policy(cfg, log=lambda *a, **k: None)
        results[added] = score(policy, steps(policy, transcripts))
        del policy
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"model {args.model}, {args.env} train split, {args.episodes} oracle episodes, commit {commit}, fresh adapters")
    print("| step | tokens split | tokens added | log-prob split | log-prob added | markers split | markers added |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for k, (a, b) in enumerate(zip(results[False], results[True])):
        print(f"| {k} | {a[0]} | {b[0]} | {a[1]:.2f} | {b[1]:.2f} | {a[2]:.2f} | {b[2]:.2f} |")
    tot = [[sum(r[i] for r in results[x]) for i in range(3)] for x in (False, True)]
    n = len(results[False])
    print(
        f"| mean over {n} | {tot[0][0] / n:.1f} | {tot[1][0] / n:.1f} | {tot[0][1] / n:.2f} | {tot[1][1] / n:.2f} | "
        f"{tot[0][2] / n:.2f} | {tot[1][2] / n:.2f} |"
    )
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
