"""What ``--activation-checkpointing`` costs and saves in the update: peak memory and time of one forward+backward.

Each setting runs in a fresh process (peak RSS is per process): the policy of ``--model`` in generate
mode is built, then ``--repeats`` forwards and backwards of one ``--tokens``-long sequence (half
prompt, half action, as the update scores them) run with the policy in training mode. Printed per
setting: resident memory after the build, the peak during the update steps, the bytes the forward
kept for the backward (autograd's saved tensors), and seconds per forward+backward. On CUDA
(``--device cuda``) the peak allocated GPU memory is printed too. Printed, not asserted::

    python benchmarks/bench_memory_options.py                                # smollm2-135m, 1024 tokens
    python benchmarks/bench_memory_options.py --model tiny --tokens 512
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS = {"plain": {}, "activation-checkpointing": {"activation_checkpointing": True}}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(args: argparse.Namespace, setting: str) -> dict[str, Any]:
    """One setting, in this process."""
    import torch

    from agentrl_train.config_io import load_config
    from agentrl_train.policy import build_policy

    with tempfile.TemporaryDirectory() as tmp:
        opts = {"model": args.model, "mode": "generate", "env": "AgentRL/SQL-v0", "threads": args.threads}
        opts |= {"device": args.device, "lora_preset": args.lora_preset, "out": tmp, **SETTINGS[setting]}
        policy = build_policy(load_config(None, opts), log=lambda _: None)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, len(policy.tokenizer), (args.tokens,), generator=g).tolist()
    half = args.tokens // 2
    policy.train()
    built = _rss_mb()
    cuda = policy.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    seconds = []
    for r in range(args.repeats):
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp, _, value = policy.sequence_logprobs(ids[:half], ids[half:])
        kept = saved[0]
        (lp.mean() + value).backward()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
        saved[0] = 0
        policy.causal.zero_grad(set_to_none=True)
        if r == 0:
            first_kept = kept
    return {
        "setting": setting,
        "rss_built_mb": built,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "saved_mb": first_kept / 2**20,
        "s_per_step": min(seconds),
        "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lora-preset", default="small")
    ap.add_argument("--tokens", type=int, default=1024, help="sequence length, prompt + action (default 1024)")
    ap.add_argument("--repeats", type=int, default=3, help="forward+backward passes per setting; the fastest is printed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args, args.worker)))
        return
    rows = []
    for setting in args.settings:
        argv = [sys.executable, __file__, "--worker", setting, "--model", args.model, "--tokens", str(args.tokens)]
        argv += ["--repeats", str(args.repeats), "--threads", str(args.threads), "--device", args.device]
        argv += ["--lora-preset", args.lora_preset]
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"model {args.model} ({args.lora_preset}), {args.tokens} tokens, {args.device}, {args.threads} thread(s)")
    print(f"{'setting':<26}{'RSS built MB':>14}{'peak RSS MB':>13}{'update +MB':>12}{'kept MB':>10}{'s/step':>9}{'GPU MB':>9}")
    for r in rows:
        gpu = "-" if r["peak_gpu_mb"] is None else f"{r['peak_gpu_mb']:.0f}"
        print(
            f"{r['setting']:<26}{r['rss_built_mb']:>14.0f}{r['peak_rss_mb']:>13.0f}{r['peak_rss_mb'] - r['rss_built_mb']:>12.0f}"
            f"{r['saved_mb']:>10.0f}{r['s_per_step']:>9.2f}{gpu:>9}"
        )


if __name__ == "__main__":
    main()
