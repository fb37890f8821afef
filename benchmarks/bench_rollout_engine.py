"""Rollout engines compared: wall time per 1,000 env steps, local vs server vs server + async.

The same short PPO run (generate mode) three times on one machine:

- ``local``: the trainer samples with its own model (``--rollout-engine local``);
- ``server``: ``agentrl-train serve`` samples (a subprocess on 127.0.0.1, the run's adapter synced
  into it after every update), then the trainer updates (``--rollout-engine server``);
- ``server+async``: the same, the next rollout sampled while the trainer updates (``--async-rollouts 1``).

Printed per engine: seconds per update, per 1,000 env steps, and the share of an update's wall time
in which the trainer waited for its rollout (local and server: the whole rollout; async: the wait
after its update). The first update is left out (it pays for start-up)::

    python benchmarks/bench_rollout_engine.py                          # the tiny model, 4 updates each
    python benchmarks/bench_rollout_engine.py --model smollm2-135m --lora-preset small --updates 2 --num-envs 4 \
        --micro-batch 2 --activation-checkpointing
    python benchmarks/bench_rollout_engine.py --url http://127.0.0.1:8011 --device cuda ...   # a running vLLM

With ``--url`` the server runs already (vLLM with runtime LoRA: ``benchmarks/gpu/vllm_rollouts.sh``)
and must read the run folders this script writes under ``--out``.

Threads: the trainer gets ``--threads``; the server ``--server-threads`` (it runs while the trainer
waits in ``server`` mode, beside it in async mode). Printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENGINES = ("local", "server", "server+async")


def start_server(model: str, root: Path, threads: int, max_new_tokens: int) -> tuple[subprocess.Popen[bytes], str]:
    """``agentrl-train serve`` on a free loopback port, adapters loadable from under ``root``."""
    import httpx

    from agentrl_envs.testing import free_port

    port = free_port()
    argv = [sys.executable, "-m", "agentrl_train", "serve", "--model", model, "--port", str(port)]
    argv += ["--adapters-root", str(root), "--threads", str(threads), "--max-new-tokens", str(max_new_tokens)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):  # the model loads first; bounded by tries, not by a clock
        if proc.poll() is not None:
            raise RuntimeError(f"agentrl-train serve exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("agentrl-train serve did not answer /health")


def run(engine: str, args: argparse.Namespace, root: Path, url: str) -> dict[str, Any]:
    """One PPO run with ``engine``; its metrics rows summarised."""
    from agentrl_train.config_io import load_config
    from agentrl_train.train import train

    opts: dict[str, Any] = {
        "model": args.model,
        "lora_preset": args.lora_preset,
        "env": args.env,
        "mode": "generate",
        "num_envs": args.num_envs,
        "rollout_steps": args.rollout_steps,
        "updates": args.updates,
        "max_new_tokens": args.max_new_tokens,
        "micro_batch": args.micro_batch,
        "activation_checkpointing": args.activation_checkpointing,
        "threads": args.threads,
        "vectorization": "sync",
        "eval_every": 0,
        "final_eval_splits": [],
        "checkpoint_every": 0,
        "record": False,
        "progress": False,
        "tensorboard": False,
        "seed": args.seed,
        "device": args.device,
        "out": str(root / engine.replace("+", "-")),
    }
    if engine != "local":
        opts |= {"rollout_engine": "server", "rollout_url": [url], "async_rollouts": int(engine == "server+async")}
    t0 = time.perf_counter()
    train(load_config(None, opts), log=lambda _: None)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (Path(opts["out"]) / "metrics.jsonl").read_text().splitlines() if x.strip()][1:]
    steps = sum(args.num_envs * args.rollout_steps for _ in rows)
    total = sum(r["time/total_s"] for r in rows)
    if engine == "server+async":
        waited = sum(r.get("time/rollout_wait_s", 0.0) for r in rows)
    else:
        waited = sum(r["time/rollout_model_s"] + r["time/rollout_env_s"] for r in rows)
    return {
        "engine": engine,
        "updates": len(rows),
        "s_per_update": total / max(len(rows), 1),
        "s_per_1000_steps": 1000 * total / max(steps, 1),
        "wait_share": waited / total if total else float("nan"),
        "wall_s": wall,
        "gap_max": max((r.get("rollout/logprob_gap_max", 0.0) for r in rows), default=0.0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--lora-preset", default="seed", help="LoRA preset (small for smollm2-135m, as bench_real_model.py)")
    ap.add_argument("--env", default="AgentRL/SQL-v0")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    ap.add_argument("--updates", type=int, default=4, help="updates per run; the first is not counted (default 4)")
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--rollout-steps", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--micro-batch", type=int, default=16, help="transitions per forward/backward in the update")
    ap.add_argument("--activation-checkpointing", action="store_true", help="less memory in the update (SmolLM2)")
    ap.add_argument("--threads", type=int, default=1, help="the trainer's torch threads (default 1)")
    ap.add_argument("--server-threads", type=int, default=1, help="the server's torch threads (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", help="the trainer's device: auto, cpu or cuda")
    ap.add_argument("--url", default="", help="a running rollout server (vLLM) instead of agentrl-train serve")
    ap.add_argument(
        "--out", default="", help="folder for the runs (default: a temporary one; with --url the server must read it)"
    )
    args = ap.parse_args()
    if args.updates < 2:
        ap.error("--updates must be at least 2 (the first update is not counted)")
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        root = Path(args.out or tmp).resolve()
        root.mkdir(parents=True, exist_ok=True)
        local_only = args.engines == ["local"]
        proc, url = (None, args.url) if args.url or local_only else start_server(args.model, root, args.server_threads, 256)
        try:
            results = [run(e, args, root, url) for e in args.engines]
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=60)
    print(f"model {args.model}, {args.env}, {args.num_envs} envs x {args.rollout_steps} steps, {args.max_new_tokens} tokens")
    print(f"{'engine':<14}{'s/update':>10}{'s/1000 steps':>14}{'wait share':>12}{'max log-prob gap':>18}")
    for r in results:
        print(
            f"{r['engine']:<14}{r['s_per_update']:>10.1f}{r['s_per_1000_steps']:>14.1f}{r['wait_share']:>12.2f}{r['gap_max']:>18.2e}"
        )


if __name__ == "__main__":
    main()
