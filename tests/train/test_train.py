"""The loop end to end on the small tiny model: run folder, exact resume, checkpoints, invariance, eval."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl_train import checkpoint
from agentrl_train.accumulation import accumulate
from agentrl_train.cli import main
from agentrl_train.distributed import Dist
from agentrl_train.episodes import EnvPool
from agentrl_train.rollout import collect
from agentrl_train.train import train

from .conftest import small_config


def _params(run) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    ck = run / "checkpoints"
    return load_file(ck / (ck / "latest").read_text().strip() / "trainable.safetensors")


def test_run_folder_has_everything(tmp_path, capsys) -> None:
    cfg = small_config(tmp_path, updates=2, eval_every=1, tensorboard=True)
    summary = train(cfg, log=lambda *a, **k: None)
    run = tmp_path / "run"
    # --no-progress (small_config's): a line per update, so make demo is not silent for minutes
    out = capsys.readouterr().out
    assert out.count("ppo update 1/2  return ") == 1 and out.count("ppo update 2/2  return ") == 1, out
    assert summary["finished"] and summary["env_steps"] == 2 * 4 * 2
    for f in ("config.yaml", "metrics.jsonl", "eval.json", "eval.md", "learning_curve.png", "summary.json", "replay-rank0.ring"):
        assert (run / f).exists(), f
    assert (run / "final" / "exec" / "adapter_model.safetensors").exists()
    assert (run / "final" / "value_head.safetensors").exists() and (run / "final" / "config.yaml").exists()
    assert list((run / "tensorboard").iterdir())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    upd = [r for r in rows if r["kind"] == "update"]
    assert [r["update"] for r in upd] == [1, 2]
    for key in ("pg", "vf", "entropy", "kl_ref", "approx_kl", "clipfrac", "ent_coef", "critic_weight", "time/rollout_model_s"):
        assert key in upd[0]
    assert {r["split"] for r in rows if r["kind"] == "eval"} == {"train", "test"}
    # every transition went through the recorder into the replay buffer
    from agentrl_envs.data import ReplayBuffer

    with ReplayBuffer.open(run / "replay-rank0.ring", readonly=True) as buf:
        steps = sum(len(t.steps) for t in buf)
    assert 0 < steps <= 16
    # the resource map: every phase measured, the rollout's replay records counted as IO
    res = json.loads((run / "resources.json").read_text())["stages"]["exec"]
    assert list(res["phases"]) == ["rollout", "update", "checkpoint"] and res["world"] == 1
    roll = res["phases"]["rollout"]
    assert roll["calls"] == 2 and roll["env_steps_per_s"] > 0 and roll["tokens_per_s"] > 0 and roll["io_bytes_per_s"] > 0
    assert res["phases"]["update"]["comm_share"] == 0.0 and res["ranks"][0]["phases"]["rollout"]["env_steps"] == 16
    assert "| exec | rollout | 1 | 2 |" in summary["resources_table"]


def test_exact_resume(tmp_path) -> None:
    straight = small_config(tmp_path / "a", updates=4, checkpoint_every=2, record=False)
    train(straight, log=lambda *a, **k: None)
    stopped = small_config(tmp_path / "b", updates=4, checkpoint_every=2, record=False, max_updates_this_call=2)
    s1 = train(stopped, log=lambda *a, **k: None)
    assert not s1["finished"]
    resumed = small_config(tmp_path / "b", updates=4, checkpoint_every=2, record=False, resume=True)
    s2 = train(resumed, log=lambda *a, **k: None)
    assert s2["finished"]
    a, b = _params(tmp_path / "a" / "run"), _params(tmp_path / "b" / "run")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_resume_errors(tmp_path) -> None:
    with pytest.raises(checkpoint.CheckpointError, match="no checkpoint"):
        train(small_config(tmp_path, resume=True, record=False), log=lambda *a, **k: None)
    train(small_config(tmp_path, updates=1, record=False), log=lambda *a, **k: None)
    ck = tmp_path / "run" / "checkpoints" / "update-000001"
    (ck / "trainable.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(checkpoint.CheckpointError, match="corrupt"):
        train(small_config(tmp_path, updates=2, resume=True, record=False), log=lambda *a, **k: None)
    (ck / "complete").unlink()
    with pytest.raises(checkpoint.CheckpointError, match="incomplete"):
        train(small_config(tmp_path, updates=2, resume=True, record=False), log=lambda *a, **k: None)


def _fixed_batch(policy, cfg):
    pool = EnvPool(cfg.env.env, 2, run_seed=5, vectorization="sync", make_kwargs={"candidates": cfg.env.candidates})
    try:
        pool.reset()
        roll = collect(policy, pool, cfg)
    finally:
        pool.close()
    rng = np.random.default_rng(0)
    return [(roll.transitions[t][i], float(rng.normal()), float(rng.normal())) for t in range(4) for i in range(2)]


def test_microbatch_1_x_accumulation_8_equals_microbatch_8(small_policy) -> None:
    policy, cfg = small_policy
    samples = _fixed_batch(policy, cfg)
    assert len(samples) == 8

    def grads(split):
        policy.zero_grad(set_to_none=True)
        accumulate(
            policy,
            samples,
            split,
            cfg,
            0.01,
            0.5,
            Dist(),
            {k: [] for k in ("pg", "vf", "entropy", "kl_ref", "approx_kl", "clipfrac")},
        )
        out = {n: p.grad.clone() for n, p in policy.trainable_parameters() if p.grad is not None}
        policy.zero_grad(set_to_none=True)
        return out

    one = grads([list(range(8))])
    eight = grads([[j] for j in range(8)])
    uneven = grads([[0, 1, 2], [3], [4, 5, 6, 7]])
    assert one.keys() == eight.keys() and one
    for k in one:
        assert torch.allclose(one[k], eight[k], atol=1e-6, rtol=1e-5), k
        assert torch.allclose(one[k], uneven[k], atol=1e-6, rtol=1e-5), k
    assert any(float(g.abs().max()) > 0 for g in one.values())


def test_a_steps_micro_batches_keep_each_envs_transitions_together(small_policy) -> None:
    from agentrl_train.accumulation import episode_micro_batches

    policy, cfg = small_policy
    samples = _fixed_batch(policy, cfg)  # rows of 2 envs: env 0, env 1, env 0, ...
    step = [7, 0, 3, 2, 5, 6]
    mbs = episode_micro_batches(step, samples, 4)
    assert sorted(j for mb in mbs for j in mb) == sorted(step) and all(0 < len(mb) <= 4 for mb in mbs)
    envs = [samples[j][0].env_index for mb in mbs for j in mb]
    assert envs == sorted(envs)
    flat = [j for mb in mbs for j in mb]
    for k in set(envs):  # each env's transitions in their rollout order
        mine = [j for j in flat if samples[j][0].env_index == k]
        assert mine == sorted(mine)
    assert episode_micro_batches([], samples, 4) == []


def test_micro_batches_cut_by_tokens_stay_under_the_budget(small_policy) -> None:
    """--micro-batch-tokens: each micro-batch holds at most that many tokens (one longer transition alone)."""
    from agentrl_train.accumulation import episode_micro_batches

    policy, cfg = small_policy
    samples = _fixed_batch(policy, cfg)
    size = [len(t.prompt_ids) + sum(len(c) for c in t.cand_ids) + len(t.new_ids) for t, _, _ in samples]
    step = list(range(len(samples)))
    budget = 2 * max(size) + 1
    mbs = episode_micro_batches(step, samples, 99, budget)
    assert [j for mb in mbs for j in mb] == [j for mb in episode_micro_batches(step, samples, 99) for j in mb]
    assert all(sum(size[j] for j in mb) <= budget for mb in mbs) and 1 < len(mbs) < len(samples)
    alone = episode_micro_batches(step, samples, 99, 1)  # every transition over the budget: one per micro-batch
    assert all(len(mb) == 1 for mb in alone) and len(alone) == len(samples)
    assert all(len(mb) <= 2 for mb in episode_micro_batches(step, samples, 2, 10**9))  # --micro-batch still caps


def test_cutting_micro_batches_by_tokens_trains_the_same_weights(tmp_path) -> None:
    from safetensors.torch import load_file

    def weights(name: str, **kw) -> dict:
        cfg = small_config(tmp_path / name, updates=1, checkpoint_every=0, final_eval_splits=[], **kw)
        train(cfg, log=lambda _: None)
        return load_file(str(next((Path(cfg.run.out) / "final").rglob("adapter_model.safetensors"))))

    a, b = weights("samples"), weights("tokens", micro_batch_tokens=300)
    assert a.keys() == b.keys()
    for k in a:  # float rounding only (Adam divides by the gradient's size, so the smallest entries move ~1e-6)
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_garbage_from_the_policy_gets_the_format_penalty(tmp_path) -> None:
    # generate mode with a barely trained model emits garbage; the env answers with penalties, never a crash
    cfg = small_config(tmp_path, mode="generate", max_new_tokens=12, updates=1, record=False)
    summary = train(cfg, log=lambda *a, **k: None)
    assert summary["finished"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["kind"] == "update"


def test_eval_cli_prints_json(tmp_path, capsys) -> None:
    train(small_config(tmp_path, updates=1, record=False), log=lambda *a, **k: None)
    capsys.readouterr()
    assert main(["eval", "--run", str(tmp_path / "run"), "--split", "heldout", "--episodes", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["split"] == "heldout" and 0.0 <= out["success_rate"] <= 1.0 and "mean_return" in out
    assert main(["eval", "--run", str(tmp_path / "run"), "--episodes", "1", "--error-profile", "realistic", "--json"]) == 0


def test_oracle_agreement_benchmark_follows_the_eval_episodes(tmp_path, capsys) -> None:
    import subprocess
    import sys
    from pathlib import Path

    train(small_config(tmp_path, updates=1, record=False), log=lambda *a, **k: None)
    capsys.readouterr()
    assert main(["eval", "--run", str(tmp_path / "run"), "--split", "train", "--episodes", "2", "--json"]) == 0
    greedy = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "oracle_agreement.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run"), "--episodes", "2"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    oracle, own = row["oracle_path"], row["own_path"]
    assert row["split"] == "train" and oracle["success"] == 1.0 and oracle["oracle_not_a_candidate"] == 0
    assert 0.0 <= oracle["p_oracle"] <= 1.0 and 0.0 <= oracle["oracle_top1"] <= 1.0 and oracle["gap_p50"] >= 0.0
    assert oracle["early_finish_vs_uniform"] is None or oracle["early_finish_vs_uniform"] >= 0.0
    # its own path is eval's greedy path: the same episodes, the same choices
    assert own["success"] == greedy["success_rate"] and own["mean_length"] == greedy["mean_length"]
    assert 0.0 <= own["agree"] <= 1.0
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "nothing")], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "not a run folder" in bad.stderr


def test_eval_sample_draws_from_the_policy_with_seeds_fixed_per_episode(tmp_path, capsys, monkeypatch) -> None:
    import agentrl_train.evaluate as evaluate_module

    train(small_config(tmp_path, updates=1, record=False), log=lambda *a, **k: None)
    chosen: list[str] = []
    real_act = evaluate_module.act_many

    def recording_act(*args, **kwargs):  # type: ignore[no-untyped-def]
        trs = real_act(*args, **kwargs)
        chosen.extend(tr.action_text for tr in trs)
        return trs

    monkeypatch.setattr(evaluate_module, "act_many", recording_act)
    runs = {}
    for name, flags in (("greedy", []), ("sampled", ["--sample"]), ("sampled again", ["--sample"])):
        chosen.clear()
        capsys.readouterr()
        assert main(["eval", "--run", str(tmp_path / "run"), "--split", "train", "--episodes", "3", "--json", *flags]) == 0
        runs[name] = (json.loads(capsys.readouterr().out.strip().splitlines()[-1]), list(chosen))
    assert runs["greedy"][0]["policy"] == "greedy" and runs["sampled"][0]["policy"] == "sampled"
    assert runs["sampled"] == runs["sampled again"]  # the same draws: seeded per episode
    # after one small update the policy is near uniform over 4 candidates: ~24 draws cannot all be the greedy ones
    assert runs["sampled"][1] != runs["greedy"][1]


def test_sft_then_ppo_from_its_adapter(tmp_path) -> None:
    from agentrl_train.sft import sft

    cfg = small_config(tmp_path / "s", env="AgentRL/SQL-v0", mode="generate", episodes=4, sft_epochs=1, sft_batch=2)
    result = sft(cfg, log=lambda *a, **k: None)
    assert result["steps"] == 2 and result["final_loss"] > 0
    final = tmp_path / "s" / "run" / "final"
    ppo_cfg = small_config(
        tmp_path / "p", env="AgentRL/SQL-v0", mode="generate", max_new_tokens=8, updates=1, record=False, init_adapter=str(final)
    )
    assert train(ppo_cfg, log=lambda *a, **k: None)["finished"]


@pytest.mark.parametrize(("progress", "rank0"), [(True, True), (False, True), (False, False), (True, False)])
def test_progress_is_a_bar_or_a_line_per_update_on_rank_0_only(progress, rank0, capsys) -> None:
    from types import SimpleNamespace

    from agentrl_train import runlog

    cfg = SimpleNamespace(ppo=SimpleNamespace(updates=3), run=SimpleNamespace(progress=progress))
    bar = runlog.progress(cfg, 0, enabled=rank0)
    row = {"update": 1, "return": 0.5, "success": 0.25, "kl_ref": 0.0123, "time/total_s": 12.34}
    bar.update(row)
    bar.close()
    out, err = capsys.readouterr()
    line = "ppo update 1/3  return 0.50  success 0.25  kl 0.012  12.3 s\n"
    assert out == (line if rank0 and not progress else "")
    assert ("1/3" in err) == (rank0 and progress)


def test_critic_grad_head_keeps_the_value_loss_out_of_the_adapter(small_policy) -> None:
    policy, cfg = small_policy
    prompt = _fixed_batch(policy, cfg)[0][0].prompt_ids

    def grads(detach: bool) -> tuple[float, float]:
        policy.zero_grad(set_to_none=True)
        policy.critic_detach = detach
        try:
            (policy.value(prompt) - 1.0).pow(2).backward()
        finally:
            policy.critic_detach = False
        named = policy.trainable_parameters()
        lora = sum(float(p.grad.abs().sum()) for n, p in named if p.grad is not None and not n.startswith("value_head"))
        head = sum(float(p.grad.abs().sum()) for n, p in named if p.grad is not None and n.startswith("value_head"))
        policy.zero_grad(set_to_none=True)
        return lora, head

    with torch.no_grad():  # a non-zero head, so that the value depends on the backbone at all
        policy.value_head.weight.normal_(generator=torch.Generator().manual_seed(0))
    try:
        shared, shared_head = grads(False)
        head_only, head_head = grads(True)
    finally:
        with torch.no_grad():
            policy.value_head.weight.zero_()
    assert shared > 0 and shared_head > 0
    assert head_only == 0 and head_head == pytest.approx(shared_head)


def test_anchor_drift_is_zero_at_the_start_and_penalises_a_moved_adapter(small_policy) -> None:
    from agentrl_train.ppo import unit_terms

    policy, cfg = small_policy
    tr = _fixed_batch(policy, cfg)[0][0]
    assert tr.baseline_scores, "candidates mode with score_baseline=reference stores the reference scores"
    assert float(unit_terms(policy, tr, cfg)[4]) == pytest.approx(0.0, abs=1e-10)
    saved = {n: p.detach().clone() for n, p in policy.lm.named_parameters() if "lora_B" in n}
    gen = torch.Generator().manual_seed(3)
    try:
        with torch.no_grad():
            for n, p in policy.lm.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        drift = unit_terms(policy, tr, cfg)[4]
        assert float(drift) > 1e-6
        drift.backward()  # the anchor's gradient reaches the adapter
        assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for n, p in policy.lm.named_parameters() if "lora_" in n)
    finally:
        policy.zero_grad(set_to_none=True)
        with torch.no_grad():
            for n, p in policy.lm.named_parameters():
                if n in saved:
                    p.copy_(saved[n])


def test_shards_option_writes_every_recorded_trajectory(tmp_path) -> None:
    """``--shards``: the run's trajectories as Arrow shards, the same ones the replay buffer holds, across a resume."""
    from agentrl_envs.data import ReplayBuffer, read_shards

    run = tmp_path / "run"
    (run / "shards").mkdir(parents=True)
    (run / "shards" / "rank0-00007.arrow").write_bytes(b"an earlier run's shard")  # a fresh run starts over
    train(small_config(tmp_path, updates=2, shards=True, max_updates_this_call=1), log=lambda *a, **k: None)
    assert [p.name for p in sorted((run / "shards").iterdir())] == ["rank0-00000.arrow"]
    train(small_config(tmp_path, updates=2, shards=True, resume=True), log=lambda *a, **k: None)
    assert [p.name for p in sorted((run / "shards").iterdir())] == ["rank0-00000.arrow", "rank0-00001.arrow"]
    sharded = list(read_shards(run / "shards"))
    with ReplayBuffer.open(run / "replay-rank0.ring", readonly=True) as buf:
        recorded = list(buf)
    assert sharded and sharded == recorded
    assert all(t.policy_id == "exec" and t.steps for t in sharded)
    # shards without the replay buffer
    train(small_config(tmp_path / "b", updates=1, shards=True, record=False), log=lambda *a, **k: None)
    assert not (tmp_path / "b" / "run" / "replay-rank0.ring").exists()
    assert sum(len(t.steps) for t in read_shards(tmp_path / "b" / "run" / "shards")) > 0


def _rows(run, kind="update") -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


def _same_numbers(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("time/") and k != "wall_s"}


def test_a_resumed_run_logs_each_update_once(tmp_path) -> None:
    """A run killed after logging update 3 but before checkpointing it: the resume logs update 3 again, once."""
    run = tmp_path / "run"
    train(small_config(tmp_path, updates=3, checkpoint_every=2, record=False), log=lambda *a, **k: None)
    straight = _rows(run)
    assert [r["update"] for r in straight] == [1, 2, 3]
    ck = run / "checkpoints"
    import shutil

    shutil.rmtree(ck / "update-000003")
    shutil.rmtree(run / "final")
    (ck / "latest").write_text("update-000002\n")
    train(small_config(tmp_path, updates=3, checkpoint_every=2, record=False, resume=True), log=lambda *a, **k: None)
    resumed = _rows(run)
    assert [r["update"] for r in resumed] == [1, 2, 3]
    assert [_same_numbers(r) for r in resumed] == [_same_numbers(r) for r in straight]


def test_empty_final_eval_splits_skip_the_final_eval_and_a_fresh_run_starts_its_own_metrics(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval.json").write_text('{"test": "an earlier run\'s table"}')
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "update", "update": 7, "env_steps": 1}) + "\n")
    logs: list[str] = []
    summary = train(
        small_config(tmp_path, updates=1, record=False, final_eval_splits=[]), log=lambda *a, **k: logs.append(str(a[0]))
    )
    assert summary["finished"] and "eval" not in summary
    assert (run / "final" / "value_head.safetensors").exists() and (run / "learning_curve.png").exists()
    assert not (run / "eval.json").exists() and not (run / "eval.md").exists()
    assert "final evaluation skipped (--final-eval-splits is empty)" in logs and not any("| split |" in x for x in logs)
    assert [r["update"] for r in _rows(run)] == [1]


def test_failed_resume_leaves_config_and_metrics_alone(tmp_path) -> None:
    run = tmp_path / "run"
    train(small_config(tmp_path, updates=1, record=False), log=lambda *a, **k: None)
    before = {f: (run / f).read_bytes() for f in ("config.yaml", "metrics.jsonl")}
    ck = run / "checkpoints" / "update-000001"
    for damaged in ("trainable.safetensors", "state.json", "state.safetensors", "envs-rank0.json"):
        good = (ck / damaged).read_bytes()
        (ck / damaged).write_bytes(b"not a checkpoint file")
        with pytest.raises(checkpoint.CheckpointError, match="corrupt"):
            train(small_config(tmp_path, updates=3, lr=1e-3, resume=True, record=False), log=lambda *a, **k: None)
        assert {f: (run / f).read_bytes() for f in before} == before
        (ck / damaged).write_bytes(good)


def test_prune_goes_by_update_number_and_leaves_later_runs_alone(tmp_path) -> None:
    root = tmp_path / "checkpoints"
    for n in (8, 999_999, 1_000_000, 1_000_001, 2_000_000):
        (root / f"update-{n:06d}").mkdir(parents=True)
        (root / f"update-{n:06d}" / "complete").write_text("ok\n")
    (root / "update-notes").mkdir()  # not a checkpoint name: never touched
    checkpoint._prune(root, keep=2, current=1_000_001)
    # the newest before 1000001 is 1000000 (a name sort would keep 999999); 2000000 is an earlier run's
    assert sorted(p.name for p in root.iterdir()) == ["update-1000000", "update-1000001", "update-2000000", "update-notes"]


def test_eval_on_damaged_run_folders_names_the_file(tmp_path, capsys) -> None:
    import shutil

    train(small_config(tmp_path, updates=1, record=False, final_eval_splits=[]), log=lambda *a, **k: None)
    good = tmp_path / "run"
    cases = {
        "no-final": (lambda r: shutil.rmtree(r / "final"), "no final/ folder"),
        "garbage-config": (lambda r: (r / "config.yaml").write_text("{{{ not yaml"), "config.yaml is damaged (not readable YAML"),
        "list-config": (lambda r: (r / "config.yaml").write_text("- a\n- b\n"), "config.yaml is damaged (not a mapping"),
        "bad-option-config": (
            lambda r: (r / "config.yaml").write_text("ppo: {lr: fast}\n"),
            "config.yaml is damaged (--lr='fast'",
        ),
        "binary-config": (lambda r: (r / "config.yaml").write_bytes(b"\xff\xfe\x00\x01"), "config.yaml is damaged"),
        "truncated-adapter": (
            lambda r: (r / "final" / "exec" / "adapter_model.safetensors").write_bytes(b"\x10\x00"),
            "adapter_model.safetensors is damaged",
        ),
        "no-value-head": (lambda r: (r / "final" / "value_head.safetensors").unlink(), "value_head.safetensors is missing"),
        "truncated-value-head": (
            lambda r: (r / "final" / "value_head.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}"),
            "value_head.safetensors",
        ),
    }
    for name, (damage, message) in cases.items():
        run = tmp_path / name
        shutil.copytree(good, run)
        damage(run)
        capsys.readouterr()
        assert main(["eval", "--run", str(run), "--episodes", "1"]) == 2, name
        err = capsys.readouterr().err  # model loading may print progress bars before it
        assert "Traceback" not in err and message in err.splitlines()[-1].partition("agentrl-train eval: error: ")[2], (name, err)
    # checkpoints: a hostile name, a missing one, a damaged one
    run = tmp_path / "ckpt"
    shutil.copytree(good, run)
    (run / "checkpoints" / "update-000001" / "trainable.safetensors").write_bytes(b"garbage")
    for flag, message in (
        ("../../etc", "is not a checkpoint name"),
        ("update-000009", "this run has update-000001"),
        ("latest", "trainable.safetensors is damaged"),
    ):
        capsys.readouterr()
        assert main(["eval", "--run", str(run), "--checkpoint", flag, "--episodes", "1"]) == 2, flag
        err = capsys.readouterr().err
        assert "Traceback" not in err and message in err.splitlines()[-1].partition("agentrl-train eval: error: ")[2], (flag, err)


def test_sft_that_diverges_saves_no_nan_adapter(tmp_path) -> None:
    """``--sft-lr 1e30`` saved an adapter of NaNs as final/ and reported success; now it stops, final/ untouched."""
    from agentrl_envs.errors import ConfigError
    from agentrl_train.sft import sft

    opts = dict(env="AgentRL/SQL-v0", mode="generate", episodes=2, sft_epochs=2, sft_batch=1, final_eval_splits=[])
    with pytest.raises(ConfigError, match=r"sft diverged: at step 2 \(epoch 0\) the loss is nan; lower --sft-lr \(now 1e\+30"):
        sft(small_config(tmp_path, sft_lr=1e30, **opts), log=lambda *a, **k: None)
    run = tmp_path / "run"
    assert not (run / "final").exists()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and math.isfinite(rows[0]["loss"])
    assert sft(small_config(tmp_path, **opts), log=lambda *a, **k: None)["steps"] == 4  # a sane rate still trains
    assert (run / "final").is_dir()


def test_eval_refuses_empty_options_by_name(tmp_path, capsys) -> None:
    """``--checkpoint ''`` evaluated final/ and ``--error-profile ''`` the run's profile, silently; ``--run ''`` said ``--run .``."""
    from agentrl_train.config import TrainConfig
    from agentrl_train.config_io import dump_config

    run = tmp_path / "run"
    run.mkdir()
    dump_config(TrainConfig(), run / "config.yaml")  # the checks come before any model is built
    for argv, message in (
        (["--run", str(run), "--checkpoint", ""], "--checkpoint '': '' is not a checkpoint name"),
        (["--run", str(run), "--error-profile", ""], "--error-profile '': name a fault profile"),
        (["--run", str(run), "--error-profile", "  "], "--error-profile '  ': name a fault profile"),
        (["--run", ""], "--run '': name a run folder"),
    ):
        capsys.readouterr()
        assert main(["eval", *argv, "--episodes", "1"]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)


def test_sft_refuses_resume(tmp_path, capsys) -> None:
    """sft keeps no checkpoints: ``--resume`` started over silently (and wrote over final/)."""
    out = tmp_path / "sft"
    argv = ["sft", "--resume", "--out", str(out), "--env", "AgentRL/SQL-v0", "--episodes", "1", "--sft-epochs", "1"]
    assert main([*argv, "--final-eval-splits", "[]", "--tiny-pretrain-steps", "30", "--tiny-corpus-episodes", "8"]) == 2
    err = capsys.readouterr().err
    assert "--resume: sft keeps no checkpoints" in err and "drop --resume" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ("nosuch", "--error-profile='nosuch': not a shipped profile"),
        ("", "--error-profile='': use a shipped profile name"),
        ("/nonexistent/p.yaml", "--error-profile='/nonexistent/p.yaml': /nonexistent/p.yaml does not exist"),
    ],
)
def test_sft_checks_the_error_profile_before_building_anything(tmp_path, profile, message) -> None:
    """A bad --error-profile failed after the model was built and the run folder made, as ``error_profile=...``."""
    from agentrl_envs.errors import ConfigError
    from agentrl_train.sft import sft

    cfg = small_config(tmp_path, env="AgentRL/SQL-v0", mode="generate", episodes=1, error_profile=profile)
    with pytest.raises(ConfigError) as info:
        sft(cfg, log=lambda *a, **k: None)
    assert str(info.value).startswith(message), str(info.value)
    assert not (tmp_path / "run").exists()


def test_ppo_names_a_bad_error_profile_by_its_flag_before_building_a_model(tmp_path, monkeypatch) -> None:
    import agentrl_train.train as train_module
    from agentrl_envs.errors import ConfigError

    def no_model(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("a model was built before --error-profile was checked")

    monkeypatch.setattr(train_module, "build_policy", no_model)
    with pytest.raises(ConfigError, match=r"^--error-profile='nosuch': not a shipped profile"):
        train(small_config(tmp_path, error_profile="nosuch"), log=lambda *a, **k: None)


def test_ppo_that_diverges_stops_naming_lr_and_saves_no_nan_weights(tmp_path) -> None:
    """``--lr 1e30``: the next rollout was torch's ``probability tensor contains inf, nan`` traceback."""
    from agentrl_envs.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^ppo diverged at update 1: .* lower --lr \(now 1e\+30\)"):
        train(small_config(tmp_path, lr=1e30, updates=2, record=False, final_eval_splits=[]), log=lambda *a, **k: None)
    run = tmp_path / "run"
    assert not (run / "final").exists() and not list((run / "checkpoints").glob("update-*"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows if r["kind"] == "update"] == [1]  # the diverged update is still logged


@pytest.mark.parametrize("mode", ["candidates", "generate"])
def test_rollouts_with_kept_prompt_keys_values_equal_rollouts_that_encode_every_prompt(small_policy, monkeypatch, mode) -> None:
    import dataclasses

    from agentrl_train.policy import Policy

    policy, cfg = small_policy
    cfg = dataclasses.replace(
        cfg, env=dataclasses.replace(cfg.env, mode=mode), ppo=dataclasses.replace(cfg.ppo, max_new_tokens=12)
    )
    with torch.no_grad():  # a moved adapter, so that policy and reference scores differ
        moved = {n: p.clone() for n, p in policy.trainable_parameters()}
        g = torch.Generator().manual_seed(4)
        for n, p in policy.trainable_parameters():
            if "lora_B" in n:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)

    def rollout():
        make_kwargs = {"candidates": cfg.env.candidates} if mode == "candidates" else {}
        pool = EnvPool(cfg.env.env, 2, run_seed=9, vectorization="sync", make_kwargs=make_kwargs)
        try:
            pool.reset()
            return collect(policy, pool, cfg), pool
        finally:
            pool.close()

    try:
        kept, pool = rollout()
        assert any("policy" in s for s in pool.prompt_states)  # the keys/values were kept
        monkeypatch.setattr(Policy, "extend_prompt", lambda self, ids, state=None: None)
        fresh, _ = rollout()
    finally:
        with torch.no_grad():
            for n, p in policy.trainable_parameters():
                p.copy_(moved[n])
    for row_k, row_f in zip(kept.transitions, fresh.transitions):
        for a, b in zip(row_k, row_f):
            assert a.action == b.action and a.prompt_ids == b.prompt_ids and a.new_ids == b.new_ids
            # log-probs are scores / temperature (0.1): float rounding of 1e-6 in a score is 1e-5 there
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4) and a.value == pytest.approx(b.value, abs=1e-5)
            assert np.allclose(a.baseline_scores, b.baseline_scores, atol=1e-5)
            assert np.allclose(a.token_logprobs, b.token_logprobs, atol=1e-5)
            assert np.allclose(a.ref_logprobs, b.ref_logprobs, atol=1e-4)


def test_critic_warmup_and_linear_lr_run_per_optimizer_step_and_resume_exactly(tmp_path, monkeypatch) -> None:
    """The warmup was 1 update at the defaults (the value loss at full weight from the first step) and the linear
    LR stepped per update to 1/updates; both now follow the optimizer step, the same after a resume."""
    import agentrl_train.train as train_module

    seen: list[tuple[str, float]] = []
    real_accumulate, real_step = train_module.accumulate, torch.optim.AdamW.step

    def accumulate_spy(policy, samples, group, cfg, ent_coef, critic_w, *a, **k):  # type: ignore[no-untyped-def]
        seen.append(("critic_w", critic_w))
        return real_accumulate(policy, samples, group, cfg, ent_coef, critic_w, *a, **k)

    def step_spy(self, *a, **k):  # type: ignore[no-untyped-def]
        seen.append(("lr", self.param_groups[0]["lr"] / 5e-4))
        seen.append(("value_lr", self.param_groups[1]["lr"] / 3e-3))
        return real_step(self, *a, **k)

    monkeypatch.setattr(train_module, "accumulate", accumulate_spy)
    monkeypatch.setattr(torch.optim.AdamW, "step", step_spy)
    opts = dict(updates=4, checkpoint_every=2, record=False, lr_schedule="linear", lr=5e-4, value_lr=3e-3, final_eval_splits=[])
    train(small_config(tmp_path / "a", **opts), log=lambda *a, **k: None)  # 4 updates x 2 epochs x 1 step: 8 steps
    straight, seen[:] = list(seen), []
    train(small_config(tmp_path / "b", max_updates_this_call=2, **opts), log=lambda *a, **k: None)
    train(small_config(tmp_path / "b", resume=True, **opts), log=lambda *a, **k: None)
    assert seen == straight
    weights = [v for k, v in straight if k == "critic_w"]
    assert weights == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0]  # over 4 of the 8 steps (at least 4)
    for key in ("lr", "value_lr"):
        assert [v for k, v in straight if k == key] == pytest.approx([1 - s / 8 for s in range(8)])  # 1 ... 1/8, then 0
    rows = [json.loads(line) for line in (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()]
    upd = [r for r in rows if r["kind"] == "update"]
    assert [r["critic_weight"] for r in upd] == [0.375, 0.875, 1.0, 1.0]  # the mean over each update's steps
    assert [r["lr_factor"] for r in upd] == pytest.approx([0.875, 0.625, 0.375, 0.125])  # at each update's last step


def test_target_kl_looks_at_the_current_epoch_only(tmp_path, monkeypatch) -> None:
    """The early stop compared the mean approx-KL over every epoch so far with --target-kl, not the epoch's."""
    from agentrl_train import ppo

    counts: list[int] = []
    real = ppo.should_stop_early

    def spy(epoch_kls, target, stats=None):  # type: ignore[no-untyped-def]
        counts.append(len(epoch_kls))
        return real(epoch_kls, target, stats)

    monkeypatch.setattr(ppo, "should_stop_early", spy)
    cfg = small_config(tmp_path, updates=1, epochs=3, target_kl=1e9, record=False, final_eval_splits=[])
    train(cfg, log=lambda *a, **k: None)
    assert counts == [8, 8, 8]  # 4 steps x 2 envs per epoch, not 8, 16, 24
