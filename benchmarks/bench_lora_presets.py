"""LoRA presets on a real small model: trainable parameters and one forward+backward (printed, not asserted).

For each preset of ``LORA_PRESETS`` (and ``--extra attn/mlp`` rank pairs): the trainable parameter
count of the policy (LoRA + value head) and the CPU time of one forward+backward of ``--tokens``
tokens through it (the median of ``--repeats`` after one warm-up), on ``--threads`` threads.

    python benchmarks/bench_lora_presets.py [--model smollm2-135m] [--tokens 400] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers.utils import logging as hf_logging

from agentrl_train.lora import LORA_PRESETS, lora_targets
from agentrl_train.models import load_base
from agentrl_train.policy import Policy


def measure(model: str, ranks: dict[str, int], tokens: int, repeats: int, threads: int) -> tuple[int, float]:
    lm, tok = load_base(model, torch.device("cpu"), log=lambda *a: None, threads=threads)
    policy = Policy(lm, tok, "bench", lora_targets(lm, "seed", ranks))
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tok), (1, tokens), generator=gen)
    times = []
    for n in range(repeats + 1):
        start = time.process_time()
        loss = policy.lm(input_ids=ids, labels=ids).loss
        loss.backward()
        policy.zero_grad(set_to_none=True)
        if n:  # the first is a warm-up
            times.append(time.process_time() - start)
    return trainable, statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--extra", nargs="*", default=["8/4"], help="more attn/mlp rank pairs to compare, e.g. 8/4")
    args = ap.parse_args()
    hf_logging.disable_progress_bar()
    rows = [(name, dict(r)) for name, r in LORA_PRESETS.items()]
    rows += [(f"attn {a} / mlp {m}", {"attn": int(a), "mlp": int(m)}) for a, m in (e.split("/") for e in args.extra)]
    print(
        f"{args.model}: one forward+backward of {args.tokens} tokens, {args.threads} thread(s), CPU seconds (median of {args.repeats})"
    )
    print(f"{'preset':<18} {'attn':>4} {'mlp':>4} {'trainable':>12} {'fwd+bwd s':>10}")
    base = None
    for name, ranks in rows:
        trainable, secs = measure(args.model, ranks, args.tokens, args.repeats, args.threads)
        base = base or secs
        print(f"{name:<18} {ranks['attn']:>4} {ranks['mlp']:>4} {trainable:>12,} {secs:>10.2f}  ({secs / base:.2f}x seed)")


if __name__ == "__main__":
    main()
