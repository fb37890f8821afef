"""Adapter hot swap vs a full model reload, and serving throughput with and without swaps (printed, never asserted).

    python benchmarks/bench_serve.py [--swaps 50] [--requests 200] [--clients 8] [--no-qwen-shapes]

1. Swap time (p50/p99): read + check of the adapter folder (caller's thread) and the in-place copy
   between two requests (the part requests wait for), on the tiny model and on a base with
   Qwen2.5-0.5B's shapes (hidden 896, MLP 4864, 24 layers, 14/2 heads; built from a config with random
   weights, a small vocabulary: nothing is downloaded) with the ``seed`` ranks (attention r=64, MLP r=16).
   Against the same run's full reload: loading the base from disk and attaching the adapter.
2. Requests/s and latency p50/p99 of ``--clients`` concurrent clients over HTTP on the tiny model,
   without swaps and while the adapter is swapped back and forth (every response checked against
   its version's greedy output).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _write_adapter(engine: Any, folder: Path, seed: int) -> Path:
    """A random-weight peft adapter folder (seed ranks) for ``engine``'s base, written without a second model copy."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    from agentrl_train.lora import lora_targets

    lora = lora_targets(engine.lm, "seed")
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, module in engine.lm.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in lora["target_modules"] and isinstance(module, torch.nn.Linear) and ".layers." in name:
            r = lora["rank_pattern"][leaf]
            tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(r, module.in_features, generator=gen) * 0.01
            tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(module.out_features, r, generator=gen) * 0.01
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "adapter_model.safetensors")
    cfg = LoraConfig(
        r=max(lora["rank_pattern"].values()),
        lora_alpha=max(lora["alpha_pattern"].values()),
        target_modules=lora["target_modules"],
        rank_pattern=lora["rank_pattern"],
        alpha_pattern=lora["alpha_pattern"],
        task_type="CAUSAL_LM",
        base_model_name_or_path=engine.base_path,
    )
    (folder / "adapter_config.json").write_text(json.dumps(cfg.to_dict(), default=list))
    return folder


def bench_swaps(model: str, swaps: int, work: Path, label: str) -> dict[str, float]:
    from agentrl_train.serve.engine import Engine

    t0 = time.perf_counter()
    engine = Engine(model, log=lambda *a: None)
    load_s = time.perf_counter() - t0
    a, b = _write_adapter(engine, work / f"{label}-a", 1), _write_adapter(engine, work / f"{label}-b", 2)
    t0 = time.perf_counter()
    slot = engine.add_family("p", engine.prepare(None, a))
    attach_s = time.perf_counter() - t0
    mb = (a / "adapter_model.safetensors").stat().st_size / 2**20
    read, copy = [], []
    for n in range(swaps):
        t0 = time.perf_counter()
        prepared = engine.prepare("p", b if n % 2 == 0 else a)
        read.append(time.perf_counter() - t0)
        copy.append(engine.install(slot, prepared).result())
        del prepared
    engine.close()
    full = load_s + attach_s
    row = {
        "adapter_mb": mb,
        "copy_p50_ms": _pct(copy, 0.5) * 1e3,
        "copy_p99_ms": _pct(copy, 0.99) * 1e3,
        "read_p50_ms": _pct(read, 0.5) * 1e3,
        "read_p99_ms": _pct(read, 0.99) * 1e3,
        "full_reload_s": full,
    }
    row["reload_over_swap"] = full / (statistics.median(copy) + statistics.median(read))
    print(
        f"{label:<22} {mb:7.1f} MB  swap copy p50 {row['copy_p50_ms']:7.2f} ms p99 {row['copy_p99_ms']:7.2f} ms  "
        f"read+check p50 {row['read_p50_ms']:7.1f} ms p99 {row['read_p99_ms']:7.1f} ms  "
        f"full reload {full:6.2f} s  ({row['reload_over_swap']:.0f}x read+swap)",
        flush=True,
    )
    return row


def _qwen_shaped(work: Path) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl_train.tiny import build_tiny

    tiny = build_tiny(log=lambda *a: None)
    config = Qwen2Config(
        vocab_size=4096,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    out = work / "qwen2.5-0.5b-shaped"
    Qwen2ForCausalLM(config).save_pretrained(out)
    for f in tiny.iterdir():  # the tiny tokenizer (ids < 4096) and its chat template
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            (out / f.name).write_bytes(f.read_bytes())
    return str(out)


def bench_requests(
    clients: int, requests: int, swaps: bool, url: str, ref: dict[str, str], dirs: dict[str, str], versions: dict[str, str]
) -> None:
    import httpx

    body = {
        "model": "p",
        "messages": [{"role": "user", "content": "Count rows."}],
        "temperature": 0,
        "max_tokens": 8,
    }
    lat: list[float] = []
    bad: list[str] = []
    stop = threading.Event()
    per = requests // clients

    def client() -> None:
        with httpx.Client(base_url=url, timeout=300) as c:
            for _ in range(per):
                t0 = time.perf_counter()
                r = c.post("/v1/chat/completions", json=body)
                lat.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    bad.append(r.text)
                    continue
                v = r.headers["x-adapter-version"]
                text = r.json()["choices"][0]["message"]["content"]
                if v not in versions or text != ref[versions[v]]:
                    bad.append(f"{v} is not a loaded version or answered like the other adapter")

    def swapper() -> int:
        n = 0
        with httpx.Client(base_url=url, timeout=300) as c:
            while not stop.is_set():
                key = "ab"[n % 2]
                # The version is known once the POST returns; a request can be answered by it a moment
                # before that, so the mapping is written first, under the version the swap will get.
                versions[f"p@{int(c.get('/v1/adapters/p').json()['stable'].split('@')[1]) + 1}"] = key
                c.post("/v1/adapters/p", json={"path": dirs[key]})
                n += 1
        return n

    swap_count = [0]
    sw = threading.Thread(target=lambda: swap_count.__setitem__(0, swapper())) if swaps else None
    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    if sw:
        sw.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    stop.set()
    if sw:
        sw.join()
    print(
        f"{'with swaps' if swaps else 'no swaps':<12} {len(lat) / wall:7.1f} req/s  latency p50 {_pct(lat, 0.5) * 1e3:7.1f} ms "
        f"p99 {_pct(lat, 0.99) * 1e3:7.1f} ms  swaps {swap_count[0]:4d}  failed {len(bad)}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--swaps", type=int, default=50, help="swaps per model (default 50)")
    ap.add_argument("--requests", type=int, default=200, help="requests per throughput run (default 200)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    ap.add_argument(
        "--qwen-shapes", action=argparse.BooleanOptionalAction, default=True, help="also time a 0.5B-shaped base (~1.4 GB RAM)"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    print(f"threads 1; {args.swaps} swaps per model; work dir {work}")
    from agentrl_train.serve.engine import Engine

    Engine("tiny", log=lambda *a: None).close()  # warm imports and caches: the reloads below are timed warm
    bench_swaps("tiny", args.swaps, work, "tiny (seed ranks)")
    if args.qwen_shapes:
        bench_swaps(_qwen_shaped(work), args.swaps, work, "Qwen2.5-0.5B shapes")

    from agentrl_envs.testing import free_port, serve_in_thread
    from agentrl_train.serve.app import ServeApp
    from agentrl_train.serve.engine import Engine

    engine = Engine("tiny", log=lambda *a: None)
    dirs = {k: str(_write_adapter(engine, work / f"http-{k}", s)) for k, s in (("a", 3), ("b", 4))}
    app = ServeApp(engine, adapters={"p": dirs["a"]}, log=lambda *a: None)
    with serve_in_thread(app, free_port()) as url:
        import httpx

        ref: dict[str, str] = {}
        versions: dict[str, str] = {}
        body = {"model": "p", "messages": [{"role": "user", "content": "Count rows."}], "temperature": 0, "max_tokens": 8}
        with httpx.Client(base_url=url, timeout=300) as c:
            for key in ("a", "b"):
                versions[c.post("/v1/adapters/p", json={"path": dirs[key]}).json()["version"]] = key
                ref[key] = c.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        print(f"HTTP, tiny model, {args.clients} clients x {args.requests // args.clients} requests of 8 greedy tokens:")
        bench_requests(args.clients, args.requests, False, url, ref, dirs, versions)
        bench_requests(args.clients, args.requests, True, url, ref, dirs, versions)
    engine.close()


if __name__ == "__main__":
    main()
