"""RoPE scaling: log-likelihood of held-out env transcripts at lengths past the context a model was trained at.

Each window is a run of whole oracle episodes of ``--env`` on the ``heldout`` split, rendered with the
model's chat template (system prompt, tools, calls, tool answers) and joined until it holds
``LENGTH`` tokens. For each ``--rope-scaling`` kind (and none) the model scores every window in one
forward pass; the table gives the mean negative log-likelihood per token (nats) of the window's
second half (positions ``LENGTH/2`` to ``LENGTH``: the positions a longer context adds). Lower is
better; a row that grows with the length is a model losing track of positions it never saw::

    python benchmarks/bench_rope_scaling.py                       # tiny: trained on 512-token windows
    python benchmarks/bench_rope_scaling.py --model smollm2-135m --original-context 8192 --lengths 4096 8192 12288

Printed, not asserted; ``--md PATH`` also writes the table with the command and commit.
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

KINDS = ("linear", "dynamic", "yarn", "ntk")


def transcripts(tokenizer: Any, env_id: str, need: int, count: int, seed: int = 10_000) -> list[list[int]]:
    """``count`` token windows of at least ``need`` tokens, each whole oracle episodes (heldout split) joined."""
    import gymnasium as gym

    import agentrl_envs  # noqa: F401  (registers the ids)

    env = gym.make(env_id, split="heldout")
    windows: list[list[int]] = []
    episode = seed
    try:
        while len(windows) < count:
            ids: list[int] = []
            while len(ids) < need:
                obs, info = env.reset(seed=episode)
                episode += 1
                messages = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": str(obs)}]
                done = False
                while not done:
                    action = env.unwrapped.oracle_action()  # type: ignore[attr-defined]
                    obs, _, terminated, truncated, _ = env.step(action)
                    messages += [{"role": "assistant", "content": action}, {"role": "tool", "content": str(obs)}]
                    done = terminated or truncated
                rendered = tokenizer.apply_chat_template(messages, tools=info["tools"], tokenize=False)
                ids += tokenizer(str(rendered), add_special_tokens=False, split_special_tokens=True)["input_ids"]
            windows.append(ids[:need])
    finally:
        env.close()
    return windows


def second_half_nll(lm: Any, window: list[int]) -> float:
    """Mean next-token NLL (nats) over the second half of ``window``, scored in one forward pass."""
    import torch

    ids = torch.tensor([window])
    with torch.no_grad():
        logits = lm(input_ids=ids).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
    return float(nll[len(window) // 2 - 1 :].mean())


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from agentrl_train.models import load_base

    torch.set_num_threads(args.threads)
    settings: list[tuple[str, dict[str, Any] | None]] = [("none", None)]
    for kind in args.kinds:
        setting: dict[str, Any] = {"type": kind, "factor": args.factor}
        if args.original_context:
            setting["original_context"] = args.original_context
        settings.append((f"{kind} x{args.factor:g}", setting))
    _, tokenizer = load_base(args.model, torch.device("cpu"), log=lambda *a: None, threads=args.threads)
    windows = transcripts(tokenizer, args.env, max(args.lengths), args.windows)
    rows = []
    for label, setting in settings:
        lm, _ = load_base(args.model, torch.device("cpu"), log=lambda *a: None, threads=args.threads, rope_scaling=setting)
        row: dict[str, Any] = {"scaling": label}
        t0 = time.perf_counter()
        for length in args.lengths:
            row[length] = sum(second_half_nll(lm, w[:length]) for w in windows) / len(windows)
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        print(f"{label:<14} " + "  ".join(f"{row[n]:.3f}" for n in args.lengths) + f"   ({row['seconds']:.0f} s)", flush=True)
    return rows


def table(rows: list[dict[str, Any]], lengths: list[int]) -> str:
    head = "| scaling | " + " | ".join(f"{n} tokens" for n in lengths) + " |"
    lines = [head, "|---|" + "---|" * len(lengths)]
    best = {n: min(r[n] for r in rows) for n in lengths}
    for r in rows:
        cells = [f"**{r[n]:.3f}**" if r[n] == best[n] else f"{r[n]:.3f}" for n in lengths]
        lines.append(f"| {r['scaling']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny (default), smollm2-135m, a .gguf file or a folder")
    ap.add_argument("--env", default="AgentRL/SQLPythonSMTP-v0", help="env whose heldout oracle transcripts are scored")
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048], help="window lengths in tokens")
    ap.add_argument("--windows", type=int, default=4, help="windows per length (default 4)")
    ap.add_argument("--factor", type=float, default=4.0, help="scaling factor of every kind (default 4)")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument(
        "--original-context",
        type=int,
        default=512,
        help="the length the model was trained at (default 512: the tiny model's pretraining windows; 0: the config's)",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--md", default="", help="also write the table, command and commit to this Markdown file")
    args = ap.parse_args(argv)
    if min(args.lengths) < 4 or args.windows < 1:
        ap.error("--lengths of at least 4 tokens and --windows >= 1")
    t0 = time.perf_counter()
    rows = run(args)
    md = table(rows, args.lengths)
    print(md)
    if args.md:
        cmd = "python benchmarks/bench_rope_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:])
        Path(args.md).write_text(
            f"{md}\n\nMean NLL per token (nats) of each window's second half, {args.windows} windows of heldout "
            f"`{args.env}` oracle transcripts, model `{args.model}`. Command: `{cmd}` at commit `{_commit()}`, "
            f"{time.perf_counter() - t0:.0f} s.\n"
        )
    return rows


if __name__ == "__main__":
    main()
