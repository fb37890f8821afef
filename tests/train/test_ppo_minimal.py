"""``examples/ppo_minimal.py``, the one-file teaching copy of the PPO loop, runs as written."""

from __future__ import annotations

import json
import math
import re

from tests.integrations.conftest import run_example
from tests.train.conftest import SMALL


def test_ppo_minimal_example_trains_and_reports_a_result() -> None:
    tiny = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]  # the tests' small tiny model, cached
    out = run_example("ppo_minimal.py", "--updates", "2", "--num-envs", "2", "--rollout-steps", "3", "--minibatch", "4", *tiny)
    lines = re.findall(r"^update (\d+)/2 .* success", out, flags=re.M)
    assert lines == ["1", "2"], out[-2000:]
    result = json.loads(re.search(r"^ppo_minimal result: (.*)$", out, flags=re.M).group(1))  # type: ignore[union-attr]
    assert result["updates"] == 2 and result["env_steps"] == 2 * 3 * 2
    assert result["success"] is None or 0.0 <= result["success"] <= 1.0
    assert math.isfinite(result["last_pg_loss"]) and result["last_v_loss"] >= 0.0
