"""DDP pieces: the wrapper over the trainable set, its rebuild on a stage switch, the start check,
the all-reduce wait's timing, ranks that drop the group right after a backward, the sync-batch
arithmetic, a killed rank, and the resource map's CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl_envs.errors import ConfigError
from agentrl_train.accumulation import accumulate, micro_batches_per_step
from agentrl_train.cli import main
from agentrl_train.distributed import Dist, wrap_trainable

from . import _ddp_workers as workers
from .conftest import SMALL, small_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Every in-process scenario on one 2-rank gloo group (forked: no re-import of torch per rank)."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("ddp") / "result"
    mp.start_processes(workers.scenarios, args=(2, _free_port(), str(out)), nprocs=2, join=True, start_method="fork")
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in (0, 1)]


def test_switching_the_trainable_set_under_one_wrapper_desyncs_and_a_rebuild_does_not(two_ranks: list[dict]) -> None:
    k, r = two_ranks[0]["kept"], two_ranks[0]["rebuilt"]
    assert k["same"] and r["same"]  # no rebuild while the trainable set is unchanged
    assert k["diff_a"] == 0.0 and r["diff_a"] == 0.0  # the first adapter trains in sync
    assert k["diff_b"] > 1e-3  # the old wrapper never all-reduces the new adapter: the ranks drift apart
    assert r["rebuilt"] and r["diff_b"] == 0.0  # a new wrapper keeps them identical


def test_the_all_reduce_wait_is_timed_on_the_syncing_backward_only(two_ranks: list[dict]) -> None:
    # DDP's own timer (no Python hook): a local backward waits on nobody; the syncing one waits on the
    # all-reduce (rank 1 came late, so rank 0 waited; only > 0 is asserted, never how long)
    for rank in (0, 1):
        t = two_ranks[rank]["timing"]
        assert t["no_sync_s"] == 0.0 and t["synced_s"] > 0.0, t


def test_gather_returns_every_ranks_object_in_rank_order_on_every_rank(two_ranks: list[dict]) -> None:
    want = [
        [{"rank": 0, "text": "é" * 3000}, {"rank": 1, "text": "é" * 3000}],
        [[1.5, None], ""],
        [0, 1],
    ]
    assert two_ranks[0]["gathered"] == want and two_ranks[1]["gathered"] == want


def test_start_check_catches_weights_that_differ_with_the_same_sum(two_ranks: list[dict]) -> None:
    for rank in (0, 1):
        msg = two_ranks[rank]["mismatch"]
        assert "differ across ranks" in msg and "--seed" in msg, msg


@pytest.mark.timeout(900)  # a hang detector: 3 s alone, minutes on a loaded 2-core machine
def test_ddp_gradients_equal_one_process_gradients(small_policy: tuple, tmp_path: Path) -> None:
    # the real PPO loss under DDP: 2 ranks x 4 transitions in micro-batches of 1 (accumulation 4, no_sync on
    # 3 of them) give the gradient of 1 process x 8 transitions in one micro-batch (summation order aside)
    import torch
    import torch.multiprocessing as mp

    from .test_train import _fixed_batch

    policy, cfg = small_policy
    samples = _fixed_batch(policy, cfg)
    policy.zero_grad(set_to_none=True)
    stats: dict[str, list[float]] = {k: [] for k in ("pg", "vf", "entropy", "kl_ref", "approx_kl", "clipfrac")}
    accumulate(policy, samples, [list(range(len(samples)))], cfg, 0.01, 0.5, Dist(), stats)
    want = {n: p.grad.clone() for n, p in policy.trainable_parameters() if p.grad is not None}
    policy.zero_grad(set_to_none=True)
    out = tmp_path / "grads.pt"
    mp.start_processes(
        workers.ppo_grads, args=(2, _free_port(), policy, cfg, samples, str(out)), nprocs=2, join=True, start_method="fork"
    )
    got = torch.load(out)
    assert got["comm_s"] > 0  # the all-reduce ran (and was timed)
    assert got["grads"].keys() == want.keys() and want
    for k in want:  # summed across ranks, not averaged (an averaging DDP gives half of each gradient)
        assert torch.allclose(got["grads"][k], want[k], atol=1e-6, rtol=1e-5), k
    assert any(float(g.abs().max()) > 1e-4 for g in want.values())


def test_ranks_exit_when_the_group_is_dropped_right_after_a_ddp_backward(tmp_path: Path) -> None:
    # The trainer's path, without the test workers' barrier + os._exit: each of 2 gloo ranks (plain
    # subprocesses) runs rounds of "DDP backward through wrap_trainable, then destroy the group and drop the
    # wrapper at once", then exits normally. With the old Python comm hook (and torch's backward parking a
    # Python object in the works it launches) a rank hung in ~ProcessGroupGloo within 3 rounds in 7 of 7
    # tries on the loaded 2-core machine. The timeout is a hang detector, not a timing assert.
    import torch

    rounds = 8
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "tests.train._ddp_workers"]
    procs = [
        subprocess.Popen(
            [*cmd, str(r), "2", str(port), str(rounds)],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=600)[0])
    except subprocess.TimeoutExpired:
        pytest.fail("a rank hung after dropping its process group right after a DDP backward (~ProcessGroupGloo deadlock)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outs):
        assert p.returncode == 0 and out.rstrip().endswith("exited cleanly"), out[-3000:]
    # every round's gradient is the sum over both ranks (rank r's batch is r + 1 everywhere), not the average
    model = workers.TwoAdapters()
    for r in (0, 1):
        model(torch.full((3, 4), float(r + 1))).backward()
    want = f"grad {float(model.a.weight.grad.abs().sum()):.6g}"
    for out in outs:
        lines = [line for line in out.splitlines() if line.startswith("round ")]
        assert len(lines) == rounds and all(line.endswith(want) for line in lines), (want, out[-2000:])


def test_wrap_trainable_seam_on_one_process() -> None:
    model = workers.TwoAdapters()
    tr = wrap_trainable(model, Dist())
    assert tr.ddp is None and wrap_trainable(model, Dist(), tr) is tr
    model.b.requires_grad_(True)
    tr2 = wrap_trainable(model, Dist(), tr)
    assert tr2 is not tr and any(n.startswith("b.") for n in tr2.names)
    model.requires_grad_(False)
    with pytest.raises(ConfigError, match="nothing to train"):
        wrap_trainable(model, Dist(), tr2)


@pytest.mark.parametrize(
    ("sync", "acc", "mb", "world", "want"),
    [(0, 3, 4, 2, 3), (0, 0, 4, 2, 0), (12, 0, 1, 2, 6), (12, 0, 4, 1, 3), (12, 6, 1, 2, 6), (8, 0, 1, 8, 1)],
)
def test_sync_batch_sets_the_accumulation(sync: int, acc: int, mb: int, world: int, want: int, tmp_path: Path) -> None:
    cfg = small_config(tmp_path, sync_batch=sync, accumulation=acc, micro_batch=mb)
    assert micro_batches_per_step(cfg, world) == want


def test_sync_batch_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="multiple of ranks x --micro-batch"):
        micro_batches_per_step(small_config(tmp_path, sync_batch=10, micro_batch=4), 2)
    with pytest.raises(ConfigError, match="contradicts"):
        micro_batches_per_step(small_config(tmp_path, sync_batch=12, accumulation=2, micro_batch=1), 2)
    with pytest.raises(ConfigError, match="sync-batch"):
        small_config(tmp_path, sync_batch=-1)


def test_resources_cli_prints_the_table_and_refuses_garbage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    phase = {
        "calls": 2,
        "seconds": 4.0,
        "mean_s": 2.0,
        "peak_rss_mb_per_rank": [700.0, 710.0],
        "peak_gpu_mb": None,
        "comm_share": 0.25,
        "tokens_per_s": 1000.0,
        "env_steps_per_s": 3.0,
        "io_bytes_per_s": 2048.0,
    }
    (tmp_path / "resources.json").write_text(json.dumps({"stages": {"exec": {"world": 2, "phases": {"update": phase}}}}))
    assert main(["resources", "--run", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| exec | update | 2 | 2 | 2.000 | 700 / 710 | - | 1000 | 3.0 | 2.0 | 25.0% |" in out
    (tmp_path / "resources.json").write_text("{not json")
    assert main(["resources", "--run", str(tmp_path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["resources", "--run", str(tmp_path / "nowhere")]) == 2
    assert "no resources.json" in capsys.readouterr().err
    assert main(["resources", "--run", str(tmp_path / "resources.json")]) == 2  # a file: was a NotADirectoryError traceback
    assert "not a folder" in capsys.readouterr().err


def _opts(out: Path, updates: int, *extra: str) -> list[str]:
    opts = {
        **SMALL,
        "num_envs": 2,
        "rollout_steps": 2,
        "updates": updates,
        "epochs": 1,
        "vectorization": "sync",
        "eval_every": 0,
        "final_eval_splits": "[test]",
        "eval_episodes": 1,
        "checkpoint_every": 1,
        "out": str(out),
    }
    args = [x for k, v in opts.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    return [*args, "--no-record", "--no-tensorboard", "--no-progress", *extra]


@pytest.mark.slow
def test_a_killed_rank_ends_the_run_with_a_clear_error_and_resume_continues(tmp_path: Path) -> None:
    run = tmp_path / "run"
    port = _free_port()
    base = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTRL_DIST_TIMEOUT_S": "60", "MASTER_ADDR": "127.0.0.1"}
    procs = []
    for rank in (0, 1):
        env = {**base, "MASTER_PORT": str(port), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        cmd = [sys.executable, "-m", "agentrl_train", "ppo", *_opts(run, 50)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        first = run / "checkpoints" / "update-000001" / "complete"
        for _ in range(3000):  # hang detector, not a timing assert: poll until the first checkpoint is complete
            if first.exists() or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.1)
        assert first.exists(), procs[0].communicate(timeout=60)[1][-3000:]
        procs[1].send_signal(signal.SIGKILL)
        _, err = procs[0].communicate(timeout=240)  # the gloo timeout (60 s) bounds it; a closed socket ends it at once
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[0].returncode == 2, err[-3000:]
    assert "lost another rank" in err and "--resume" in err, err[-3000:]

    # the same world size continues from the last complete checkpoint ...
    torchrun = str(Path(sys.executable).parent / "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun is not installed")
    ck = run / "checkpoints"
    last = int((ck / "latest").read_text().strip().split("-")[1])
    resumed = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node=2",
            f"--log-dir={run.parent / 'torchrun'}",
            "-m",
            "agentrl_train",
            "ppo",
            *_opts(run, last + 1, "--resume"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**base, "AGENTRL_DIST_TIMEOUT_S": "240"},
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["finished"] and summary["updates"] == last + 1 and summary["rank_weight_max_abs_diff"] == 0.0
    # ... and another world size is refused with a message that says so
    one = subprocess.run(
        [sys.executable, "-m", "agentrl_train", "ppo", *_opts(run, last + 2, "--resume")],
        capture_output=True,
        text=True,
        timeout=600,
        env=base,
    )
    assert one.returncode == 2 and "written by 2 ranks, this run has 1" in one.stderr, one.stderr[-2000:]
