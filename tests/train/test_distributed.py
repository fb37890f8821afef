"""torchrun (gloo, CPU): 2 ranks x N envs give the same update as 1 rank x 2N envs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import SMALL

pytestmark = pytest.mark.slow


def _opts(out: Path, num_envs: int) -> list[str]:
    opts = {
        **SMALL,
        "num_envs": num_envs,
        "rollout_steps": 3,
        "updates": 2,
        "vectorization": "sync",
        "eval_every": 0,
        "final_eval_splits": "[test]",
        "eval_episodes": 1,
        "checkpoint_every": 1,
        "micro_batch": 2,
        "out": str(out),
    }
    return [x for k, v in opts.items() for x in (f"--{k.replace('_', '-')}", str(v))] + [
        "--no-record",
        "--no-tensorboard",
        "--no-progress",
    ]


def _params(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    ck = run / "checkpoints"
    return load_file(ck / (ck / "latest").read_text().strip() / "trainable.safetensors")


def test_two_ranks_equal_one_rank_with_twice_the_envs(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun is not installed")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTRL_DIST_TIMEOUT_S": "240"}
    one = subprocess.run(
        [sys.executable, "-m", "agentrl_train", "ppo", *_opts(tmp_path / "one", 4)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node=2", "-m", "agentrl_train", "ppo", *_opts(tmp_path / "two", 2)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = _params(tmp_path / "one"), _params(tmp_path / "two")
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    moved = max(float(a[k].abs().max()) for k in a if "lora_B" in k)
    assert moved > 0  # the update did something
    assert worst < 1e-5, worst  # same batch, same gradients (summation order aside)
    # both ranks wrote their env state, the world size is recorded
    ck = tmp_path / "two" / "checkpoints"
    last = ck / (ck / "latest").read_text().strip()
    assert (last / "envs-rank0.pt").exists() and (last / "envs-rank1.pt").exists()
