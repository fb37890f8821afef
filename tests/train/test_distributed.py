"""torchrun (gloo, CPU): 2 ranks x N envs give the same update as 1 rank x 2N envs, through DDP."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import SMALL

pytestmark = pytest.mark.slow


def _opts(out: Path, num_envs: int, micro_batch: int, **extra: object) -> list[str]:
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
        "micro_batch": micro_batch,
        "sync_batch": 12,  # the whole rollout (3 steps x 4 envs) per optimizer step, however it is split
        "out": str(out),
        **extra,
    }
    return [x for k, v in opts.items() if v is not None for x in (f"--{k.replace('_', '-')}", str(v))] + [
        "--no-record",
        "--no-tensorboard",
        "--no-progress",
    ]


def _params(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    ck = run / "checkpoints"
    return load_file(ck / (ck / "latest").read_text().strip() / "trainable.safetensors")


def _run_one_and_two(tmp_path: Path, one_opts: list[str], two_opts: list[str]) -> tuple[Path, Path]:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun is not installed")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTRL_DIST_TIMEOUT_S": "240"}
    one = subprocess.run(
        [sys.executable, "-m", "agentrl_train", "ppo", *one_opts], capture_output=True, text=True, timeout=600, env=env
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node=2",
            f"--log-dir={tmp_path / 'torchrun'}",
            "-m",
            "agentrl_train",
            "ppo",
            *two_opts,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    return tmp_path / "one", tmp_path / "two"


def test_grpo_on_two_ranks_equals_one_rank_with_twice_the_envs(tmp_path: Path) -> None:
    # 2 groups of 2: one per rank on 2 ranks, both on the one rank; each rank's groups are its own
    # envs, seeded by their global index, so both runs play the same episodes with the same actions.
    # The whole rollout is one optimizer step per epoch (a group rollout's length varies by rank).
    grpo = {"advantage": "grpo", "group_size": 2, "env_kwargs": "{max_steps: 3}", "sync_batch": None}
    one, two = _run_one_and_two(tmp_path, _opts(tmp_path / "one", 4, 3, **grpo), _opts(tmp_path / "two", 2, 3, **grpo))
    a, b = _params(one), _params(two)
    assert a.keys() == b.keys() and not [k for k in a if "value" in k]
    moved = max(float(a[k].abs().max()) for k in a if "lora_B" in k)
    assert moved > 0
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 5e-5, worst  # as for PPO below: float summation order, through Adam
    rows = [[json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()] for run in (one, two)]
    upd = [[r for r in rs if r["kind"] == "update"] for rs in rows]
    for key in ("env_steps", "groups", "zero_adv_groups", "cut_share"):  # counted over every rank
        assert [r[key] for r in upd[0]] == pytest.approx([r[key] for r in upd[1]]), key
    assert json.loads((two / "summary.json").read_text())["rank_weight_max_abs_diff"] == 0.0


def test_two_ranks_equal_one_rank_with_twice_the_envs(tmp_path: Path) -> None:
    # 1 rank x 4 envs (accumulation 4) vs 2 ranks x 2 envs (accumulation 2, no_sync on all but the
    # last): the same global batch, the same update. Micro-batches of 3 hold one env's 3 steps in both
    # runs, so each env's prompts are encoded the same way (as one chain) and only DDP's sum differs;
    # other splits are compared in test_train.py (micro-batch 1 x accumulation 8 vs 8).
    _run_one_and_two(tmp_path, _opts(tmp_path / "one", 4, 3), _opts(tmp_path / "two", 2, 3))
    a, b = _params(tmp_path / "one"), _params(tmp_path / "two")
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    moved = max(float(a[k].abs().max()) for k in a if "lora_B" in k)
    assert moved > 0  # the update did something
    # Same batch, same gradients up to summation order (tested to 1e-6 in test_ddp.py); Adam turns those
    # float-level differences in near-zero gradient entries into steps of up to lr, so parameters after
    # 2 updates x 2 epochs agree to 5e-5 (1.2e-5 measured), against moves of up to 2e-3.
    assert worst < 5e-5, worst
    # both ranks wrote their env state, the world size is recorded
    ck = tmp_path / "two" / "checkpoints"
    last = ck / (ck / "latest").read_text().strip()
    for rank in (0, 1):
        assert (last / f"envs-rank{rank}.json").exists() and (last / f"envs-rank{rank}.safetensors").exists()
    assert not list(last.glob("*.pt"))  # nothing pickled
    # every rank holds exactly the same weights after the updates, checked across ranks at the end
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["world"] == 2 and summary["rank_weight_max_abs_diff"] == 0.0
    # the resource map covers both ranks; the update phase waited on the all-reduce
    res = json.loads((tmp_path / "two" / "resources.json").read_text())["stages"]["exec"]
    assert res["world"] == 2 and [r["rank"] for r in res["ranks"]] == [0, 1]
    assert len(res["phases"]["update"]["peak_rss_mb_per_rank"]) == 2
    assert res["phases"]["update"]["comm_share"] > 0 and res["phases"]["rollout"]["env_steps_per_s"] > 0


def test_server_rollouts_on_two_ranks_equal_one_rank_with_twice_the_envs(tmp_path: Path) -> None:
    """--rollout-engine server under torchrun: rank 0 syncs the adapter, every rank samples its own envs
    through the server (seeded per env), and 2 ranks x 2 envs train what 1 rank x 4 envs trains."""
    from agentrl_envs.testing import free_port, serve_in_thread
    from agentrl_train.serve.run import build_app
    from agentrl_train.tiny import TinySpec

    spec = TinySpec(pretrain_steps=SMALL["tiny_pretrain_steps"], corpus_episodes=SMALL["tiny_corpus_episodes"])
    app = build_app("tiny", {}, adapters_root=str(tmp_path), max_new_tokens=256, tiny_spec=spec, log=lambda _: None)
    try:
        with serve_in_thread(app, free_port()) as url:
            server = {"mode": "generate", "env": "AgentRL/SQL-v0", "max_new_tokens": 16}
            server |= {"rollout_engine": "server", "rollout_url": url}
            one, two = _run_one_and_two(
                tmp_path, _opts(tmp_path / "one", 4, 3, **server), _opts(tmp_path / "two", 2, 3, **server)
            )
    finally:
        app.engine.close()
    a, b = _params(one), _params(two)
    assert a.keys() == b.keys() and max(float(a[k].abs().max()) for k in a if "lora_B" in k) > 0
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 5e-5
    for run in (one, two):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        upd = [r for r in rows if r["kind"] == "update"]
        assert [r["rollout/version_lag"] for r in upd] == [0.0, 0.0]
        assert all(r["rollout/logprob_gap_max"] < 1e-3 for r in upd)
