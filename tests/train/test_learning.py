"""The tiny model learns SQLPythonSMTP-v0 in candidates mode with the CLI's defaults (a bounded run).

The long version (the README's curve, 3 seeds, shuffled-reward control) is ``benchmarks/bench_learning.py``.
This one runs 10 updates of the default settings with a fixed seed and checks that the sampled
policy's success and return rise clearly: bounded by counts, so it gives the same result on an idle
and a busy machine.
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
            "eval_every": 0,
            "final_eval_splits": ["train"],
            "eval_episodes": 8,
            "record": False,
            "tensorboard": False,
            "progress": False,
            "checkpoint_every": 0,
            "out": str(tmp_path / "run"),
        },
    )
    train(cfg, log=lambda *a, **k: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    upd = [r for r in rows if r["kind"] == "update"]
    assert len(upd) == 10
    first = np.mean([r["success"] for r in upd[:3]])
    last = np.mean([r["success"] for r in upd[-3:]])
    first_ret = np.mean([r["return"] for r in upd[:3]])
    last_ret = np.mean([r["return"] for r in upd[-3:]])
    assert first <= 0.4
    assert last >= first + 0.25, [round(r["success"], 2) for r in upd]
    assert last_ret >= first_ret + 0.3, [round(r["return"], 2) for r in upd]
