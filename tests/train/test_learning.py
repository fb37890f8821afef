"""The tiny model learns SQLPythonSMTP-v0 in candidates mode with the CLI's defaults (a bounded run).

The long version (the README's curve, 3 seeds, shuffled-reward control) is ``benchmarks/bench_learning.py``.
This one runs 10 updates of the default settings with a fixed seed and checks that greedy success
on 16 fixed train episodes rises clearly (0.25 -> 1.00 when measured; with rewards shuffled the same
run falls to 0.00, so the rise is the reward's doing). Bounded by counts, not time: the same result
on an idle and a busy machine.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentrl_train.config import load_config
from agentrl_train.train import train

pytestmark = pytest.mark.slow


def test_tiny_learns_sqlpythonsmtp_candidates(tmp_path) -> None:
    cfg = load_config(
        None,
        {
            "updates": 10,
            "eval_every": 10,
            "eval_splits": ["train"],
            "final_eval_splits": ["train"],
            "eval_episodes": 16,
            "record": False,
            "tensorboard": False,
            "progress": False,
            "checkpoint_every": 0,
            "out": str(tmp_path / "run"),
        },
    )
    train(cfg, log=lambda *a, **k: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = {r["update"]: r["success_rate"] for r in rows if r["kind"] == "eval"}
    assert sorted(evals) == [0, 10]
    assert evals[0] <= 0.4
    assert evals[10] >= evals[0] + 0.4, evals
    returns = [r["return"] for r in rows if r["kind"] == "update"]
    assert np.mean(returns[-3:]) > np.mean(returns[:3]), returns
