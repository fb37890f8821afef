"""How sure a saved candidates-mode policy is of its greedy choices.

For each run folder, plays ``agentrl-train eval``'s fixed episodes greedily on train and test and
records, at every decision, the gap between the best and the second candidate's log-probability
under the policy (``margin``), the spread between the best and the worst, and how often the greedy
choice is the reference model's own favourite. A policy that learned nothing but was moved by noise
updates shows margins as large as a trained one's; a policy near its untrained start shows
near-zero margins (ties, which the greedy rule gives to the reference model).

Run: ``python benchmarks/greedy_margins.py RUN [RUN ...] [--episodes 16]``. Prints one JSON line
per run and split; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from agentrl_train import evaluate, rollout  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run folders (the --out of agentrl-train ppo)")
    ap.add_argument("--episodes", type=int, default=16, help="episodes per split (default 16, as the learning table)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    seen: list[tuple[float, float, bool]] = []
    greedy = rollout.greedy_candidate

    def recording(logp_k: torch.Tensor, base_k: torch.Tensor | None, tol: float = 1e-6) -> int:
        top = torch.sort(logp_k, descending=True).values
        choice = greedy(logp_k, base_k, tol)
        favourite = base_k is not None and choice == int(torch.argmax(base_k))
        seen.append((float(top[0] - top[1]), float(top[0] - top[-1]), favourite))
        return choice

    rollout.greedy_candidate = recording  # act() looks it up in the module at each call
    for run in args.runs:
        for split in ("train", "test"):
            seen.clear()
            result = evaluate.evaluate_run(run, split, args.episodes)
            margin = np.array([m for m, _, _ in seen])
            row = {
                "run": run,
                "split": split,
                "success": result["success_rate"],
                "decisions": len(seen),
                "margin_p10": round(float(np.percentile(margin, 10)), 3),
                "margin_p50": round(float(np.median(margin)), 3),
                "margin_p90": round(float(np.percentile(margin, 90)), 3),
                "spread_p50": round(float(np.median([s for _, s, _ in seen])), 3),
                "reference_favourite": round(float(np.mean([f for _, _, f in seen])), 3),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
