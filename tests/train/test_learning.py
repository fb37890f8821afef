"""The tiny model learns SQLPythonSMTP-v0 in candidates mode with the CLI's defaults (a bounded run).

The long version (the README's table: 3 seeds x 10 updates and the shuffled-reward control) is
``benchmarks/bench_learning.py``. This one runs 5 updates of the default settings with a fixed seed
and checks that greedy success on 16 fixed train episodes starts at most 0.4 and rises by at least
0.2 (the 3-seed runs reach 0.81-1.00 at update 5 on seeds 0 and 2). Bounded by counts, not time: the
same result on an idle and a busy machine (the runs are deterministic).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentrl_train.config import load_config
from agentrl_train.train import train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # a hang detector: the first run builds the tiny model


def test_tiny_learns_sqlpythonsmtp_candidates(tmp_path) -> None:
    cfg = load_config(
        None,
        {
            "updates": 5,
            "eval_every": 5,
            "eval_splits": ["train"],
            "final_eval_splits": [],
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
    assert sorted(evals) == [0, 5]
    assert evals[0] <= 0.4
    assert evals[5] >= evals[0] + 0.2, evals
    returns = [r["return"] for r in rows if r["kind"] == "update"]
    assert np.mean(returns[-3:]) > np.mean(returns[:3]), returns
