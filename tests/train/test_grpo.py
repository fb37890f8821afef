"""The group-relative, critic-free advantages (GRPO, Dr. GRPO, RLOO): maths by hand, group rollouts, the loop."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from agentrl_envs.error_profiles import available

from agentrl_train import ppo
from agentrl_train.accumulation import accumulate
from agentrl_train.distributed import Dist
from agentrl_train.episodes import EnvPool
from agentrl_train.group_rollout import collect_groups
from agentrl_train.train import train

from .conftest import small_config

# -- the advantages, by hand ------------------------------------------------------------------------


def test_each_group_advantage_matches_hand_computation() -> None:
    returns = [1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 2.0, 2.0]  # two groups of 4
    # group 1: mean 0.5, centred +-0.5, sample std sqrt((4 x 0.25) / 3) = 0.57735
    # group 2: mean 1.5, centred [0.5, -1.5, 0.5, 0.5], sample std sqrt((3 x 0.25 + 2.25) / 3) = 1
    adv, flat = ppo.group_advantages(np.array(returns), 4, "grpo")
    s1 = math.sqrt(1 / 3) + 1e-4
    assert adv.tolist() == pytest.approx(
        [0.5 / s1, -0.5 / s1, -0.5 / s1, 0.5 / s1, 0.5 / 1.0001, -1.5 / 1.0001, 0.5 / 1.0001, 0.5 / 1.0001]
    )
    assert flat.tolist() == [False, False]
    adv, _ = ppo.group_advantages(np.array(returns), 4, "dr_grpo")
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.5, -1.5, 0.5, 0.5])
    adv, _ = ppo.group_advantages(np.array(returns), 4, "rloo")
    # R - mean of the other three: 1 - 1/3, 0 - 2/3, ...; 2 - 4/3, 0 - 2, ...
    assert adv.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 2 / 3, -2.0, 2 / 3, 2 / 3])
    # groups of 2: RLOO is the plain difference, GRPO +-1 / (sqrt(2) + eps)
    adv, _ = ppo.group_advantages(np.array([2.0, 0.0]), 2, "rloo")
    assert adv.tolist() == [2.0, -2.0]
    adv, _ = ppo.group_advantages(np.array([2.0, 0.0]), 2, "grpo")
    assert adv.tolist() == pytest.approx([1 / (math.sqrt(2) + 1e-4), -1 / (math.sqrt(2) + 1e-4)])


@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "rloo"])
def test_a_group_of_equal_returns_gets_exactly_zero_and_is_counted(kind: str) -> None:
    # the second group's returns are equal up to float rounding: 0.1 + 0.2 != 0.3 in binary
    returns = np.array([1.0, 0.0, 0.1 + 0.2, 0.3, 5.0, 5.0])
    adv, flat = ppo.group_advantages(returns, 2, kind)
    assert flat.tolist() == [False, True, True]
    assert adv[2:].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert adv[0] > 0 > adv[1]


@pytest.mark.parametrize("size", [0, 1, 3])
def test_a_group_of_one_or_one_that_does_not_divide_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match=f"group_size={size}: use at least 2, a divisor of the 4 episodes"):
        ppo.group_advantages(np.zeros(4), size, "grpo")
    with pytest.raises(ValueError, match="use grpo, dr_grpo or rloo"):
        ppo.group_advantages(np.zeros(4), 2, "gae")


def test_episode_advantages_broadcast_over_mixed_lengths_and_cut_episodes() -> None:
    # 4 envs, 2 groups, a window of 3 rows. env 0: 3 steps, ended (0.1 + 0 + 1); env 1: a 1-step episode
    # (-0.5); env 2: cut by the window after 3 steps, scored so far (0.2 x 3); env 3: 2 steps (0.3 + 0.3)
    rewards = np.array([[0.1, -0.5, 0.2, 0.3], [0.0, 9.0, 0.2, 0.3], [1.0, 9.0, 0.2, 9.0]])
    valid = np.array([[True, True, True, True], [True, False, True, True], [True, False, True, False]])
    adv, flat = ppo.episode_group_advantages(rewards, valid, 2, "dr_grpo")
    # returns 1.1 and -0.5 (the 9s are rows of a parked env: not counted): mean 0.3 -> +-0.8
    # returns 0.6 and 0.6: all equal, no signal
    want = np.array([[0.8, -0.8, 0.0, 0.0], [0.8, 0.0, 0.0, 0.0], [0.8, 0.0, 0.0, 0.0]])
    assert adv == pytest.approx(want)
    assert flat.tolist() == [False, True]


# 6 envs in 2 groups of 3, a window of 4 rows; 9 marks a row after the env's episode ended (not counted).
# group A: env 0 plays 3 steps, env 1 plays 2, env 2 plays 4 (the window cut it).
# group B: three episodes of return 1 (env 3: 0 then 1, env 4: 1 in one step, env 5: 1 then 0).
RTG_REWARDS = np.array(
    [
        [0.1, 0.1, 0.0, 0.0, 1.0, 1.0],
        [0.2, -1.0, 0.2, 1.0, 9.0, 0.0],
        [1.0, 9.0, 0.2, 9.0, 9.0, 9.0],
        [9.0, 9.0, 0.5, 9.0, 9.0, 9.0],
    ]
)
RTG_VALID = np.arange(4)[:, None] < np.array([3, 2, 4, 2, 1, 2])[None, :]


def test_return_to_go_advantages_match_hand_computation() -> None:
    # returns-to-go: env 0 [1.3, 1.2, 1.0], env 1 [-0.9, -1.0], env 2 [0.9, 0.9, 0.7, 0.5];
    # env 3 [1.0, 1.0], env 4 [1.0], env 5 [1.0, 0.0]
    # A, t=0: all three run, mean 1.3 / 3;  t=1: mean 1.1 / 3;  t=2: env 1 ended and is left out: envs 0 and 2,
    # mean 0.85;  t=3: env 2 alone, no baseline: 0.
    # B, t=0: all equal (1.0): 0;  t=1: env 4 ended: envs 3 and 5, mean 0.5.
    m0, m1 = 1.3 / 3, 1.1 / 3
    c = np.array(
        [
            [1.3 - m0, -0.9 - m0, 0.9 - m0, 0.0, 0.0, 0.0],
            [1.2 - m1, -1.0 - m1, 0.9 - m1, 0.5, 0.0, -0.5],
            [0.15, 0.0, -0.15, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ]
    )
    adv, flat = ppo.return_to_go_group_advantages(RTG_REWARDS, RTG_VALID, 3, "dr_grpo")
    assert adv == pytest.approx(c)
    assert flat.tolist() == [False, False]  # B's returns are all equal, its returns-to-go are not
    adv, _ = ppo.return_to_go_group_advantages(RTG_REWARDS, RTG_VALID, 3, "rloo")
    n = np.array([[3, 3, 3, 3, 3, 3], [3, 3, 3, 2, 2, 2], [2, 2, 2, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    assert adv == pytest.approx(np.where(n > 1, c * n / np.maximum(n - 1, 1), 0.0))
    adv, _ = ppo.return_to_go_group_advantages(RTG_REWARDS, RTG_VALID, 3, "grpo")
    s0 = math.sqrt(((c[0, :3] ** 2).sum()) / 2) + 1e-4
    s1 = math.sqrt(((c[1, :3] ** 2).sum()) / 2) + 1e-4
    s2 = math.sqrt(2 * 0.15**2) + 1e-4  # two running episodes: ddof 1 divides by 1
    sb = math.sqrt(2 * 0.5**2) + 1e-4
    want = np.array(
        [
            [*(c[0, :3] / s0), 0.0, 0.0, 0.0],
            [*(c[1, :3] / s1), 0.5 / sb, 0.0, -0.5 / sb],
            [0.15 / s2, 0.0, -0.15 / s2, 0.0, 0.0, 0.0],
            [0.0] * 6,
        ]
    )
    assert adv == pytest.approx(want)
    # every episode runs at t = 0: the first row is the episode-return advantage
    returns = np.where(RTG_VALID, RTG_REWARDS, 0.0).sum(axis=0)
    for kind in ("grpo", "dr_grpo", "rloo"):
        adv, _ = ppo.return_to_go_group_advantages(RTG_REWARDS, RTG_VALID, 3, kind)
        assert adv[0] == pytest.approx(ppo.group_advantages(returns, 3, kind)[0])


@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "rloo"])
def test_return_to_go_a_group_equal_at_every_step_gets_zero_and_is_counted(kind: str) -> None:
    # group 1: [0.5, 0.5], [1.0], [0.5, 0.5]: equal at t=0 (1.0 each) and among the two still running at t=1
    # (0.5 each; 0.1 + 0.4 is 0.5 up to float rounding). group 2: returns-to-go 2, 2, 2 at t=0, then env 5
    # runs on alone (no baseline). group 3: equal returns (1.0), unequal returns-to-go at t=1: a signal.
    rewards = np.array([[0.5, 1.0, 0.1 + 0.4, 2.0, 2.0, 0.0, 1.0, 0.0], [0.5, 9.0, 0.5, 9.0, 9.0, 2.0, 0.0, 1.0]])
    valid = np.array([[True] * 8, [True, False, True, False, False, True, True, True]])
    adv, flat = ppo.return_to_go_group_advantages(rewards[:, :6], valid[:, :6], 3, kind)
    assert flat.tolist() == [True, True]
    assert adv.tolist() == [[0.0] * 6, [0.0] * 6]
    adv, flat = ppo.return_to_go_group_advantages(rewards[:, 6:], valid[:, 6:], 2, kind)
    assert flat.tolist() == [False] and adv[0].tolist() == [0.0, 0.0] and adv[1, 0] < 0 < adv[1, 1]


@pytest.mark.parametrize("size", [0, 1, 4])
def test_return_to_go_refuses_a_bad_group_size_or_kind(size: int) -> None:
    with pytest.raises(ValueError, match=f"group_size={size}: use at least 2, a divisor of the 6 episodes"):
        ppo.return_to_go_group_advantages(RTG_REWARDS, RTG_VALID, size, "grpo")
    with pytest.raises(ValueError, match="use grpo, dr_grpo or rloo"):
        ppo.return_to_go_group_advantages(RTG_REWARDS, RTG_VALID, 3, "hierarchical")


def test_policy_loss_clips_asymmetrically() -> None:
    logp = torch.log(torch.tensor([2.0, 0.5, 1.25]))
    old = torch.zeros(3)
    adv = torch.tensor([1.0, -1.0, 1.0])
    loss, _, clipped = ppo.policy_loss(logp, old, adv, 0.2, 0.28)
    # r=2, A>0: clipped at 1 + 0.28; r=0.5, A<0: max(0.5, 0.8); r=1.25 < 1.28: not clipped
    assert loss.tolist() == pytest.approx([-1.28, 0.8, -1.25])
    assert clipped.tolist() == [1.0, 1.0, 0.0]
    sym, _, clipped = ppo.policy_loss(logp, old, adv, 0.2)
    assert sym.tolist() == pytest.approx([-1.2, 0.8, -1.2]) and clipped.tolist() == [1.0, 1.0, 1.0]
    assert ppo.clip_range(0.2, 0.0, 0.28) == (0.2, 0.28) and ppo.clip_range(0.3, 0.0, 0.0) == (0.3, 0.3)


def test_loss_aggregations_divide_as_the_papers_do() -> None:
    # generate mode: 3 samples of 3, 2 and 4 tokens; the first two from env "a", the third from env "b"
    units, seqs = [3, 2, 4], ["a", "a", "b"]
    assert ppo.unit_norms(units, seqs, "token-mean", 10) == [9.0] * 3
    # mean over the 2 sequences of each one's token mean: a has 5 tokens, b 4
    assert ppo.unit_norms(units, seqs, "seq-mean-token-mean", 10) == [10.0, 10.0, 8.0]
    # each sequence's token sum over the constant budget, then the mean over sequences
    assert ppo.unit_norms(units, seqs, "seq-mean-token-sum-norm", 10) == [20.0] * 3
    # the counts are global: a second rank with the same batch doubles every divisor
    assert ppo.unit_norms(units, seqs, "seq-mean-token-mean", 10, lambda x: 2 * x) == [20.0, 20.0, 16.0]
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        ppo.unit_norms(units, seqs, "sum", 10)
    assert ppo.resolve_loss_agg("auto", "dr_grpo") == "seq-mean-token-sum-norm"
    assert ppo.resolve_loss_agg("auto", "grpo") == ppo.resolve_loss_agg("auto", "gae") == "token-mean"
    assert ppo.resolve_loss_agg("seq-mean-token-mean", "dr_grpo") == "seq-mean-token-mean"


# -- group rollouts ---------------------------------------------------------------------------------


def _group_rollout(policy, cfg, *, num_envs: int = 4, group_size: int = 2, env: str | None = None, profile: str = "none"):
    pool = EnvPool(
        env or cfg.env.env,
        num_envs,
        run_seed=3,
        vectorization="sync",
        make_kwargs={"candidates": cfg.env.candidates, "error_profile": profile, **cfg.env.env_kwargs},
        group_size=group_size,
    )
    try:
        pool.reset()
        first = collect_groups(policy, pool, cfg)
        second = collect_groups(policy, pool, cfg)
    finally:
        pool.close()
    return first, second


def _lengths(roll) -> list[int]:
    return [int(n) for n in roll.valid_TN.sum(axis=0)]


def test_a_group_rollout_plays_one_episode_per_env_on_its_groups_task(small_policy, tmp_path: Path) -> None:
    policy, _ = small_policy
    # a window of 3 steps on episodes of at most 4: some end inside it, the rest are cut
    cfg = small_config(tmp_path, advantage="grpo", group_size=2, num_envs=4, rollout_steps=3, env_kwargs={"max_steps": 4})
    for roll in _group_rollout(policy, cfg):
        valid, lengths = roll.valid_TN, _lengths(roll)
        for i, n in enumerate(lengths):  # each env's rows: its episode's steps, then nothing
            assert n >= 1 and valid[:n, i].all() and not valid[n:, i].any()
            assert all(roll.transitions[t][i] is None for t in range(n, 3))
            ended = bool(roll.terminated_TN[n - 1, i] or roll.truncated_TN[n - 1, i])
            assert ended != bool(roll.cut_N[i])  # an episode ended inside the window, or was cut by it
            assert not (roll.terminated_TN[: n - 1, i] | roll.truncated_TN[: n - 1, i]).any()
        for g in (0, 2):  # the two envs of a group start on the same task, then sample their own actions
            a, b = roll.transitions[0][g], roll.transitions[0][g + 1]
            assert a.prompt_ids == b.prompt_ids and a.cand_ids == b.cand_ids
        assert roll.transitions[0][0].prompt_ids != roll.transitions[0][2].prompt_ids
        # one finished or cut episode per env, scored by its return so far
        assert sorted(e["env_index"] for e in roll.episodes) == [0, 1, 2, 3]
        by_env = {e["env_index"]: e for e in roll.episodes}
        returns = np.where(valid, roll.rewards_TN, 0.0).sum(axis=0)
        assert [by_env[i]["return"] for i in range(4)] == pytest.approx(returns.tolist())
        assert [by_env[i]["cut"] for i in range(4)] == roll.cut_N.tolist()
    first, second = _group_rollout(policy, cfg)
    assert first.transitions[0][0].prompt_ids != second.transitions[0][0].prompt_ids  # the next update: a new task
    # this seed's draw holds both kinds of episode and more than one length (the cases the maths above covers)
    both = [first, second]
    assert any(r.cut_N.any() for r in both) and any((~r.cut_N).any() for r in both)
    assert len({n for r in both for n in _lengths(r)}) > 1


ENVS = sorted(k for k in gym.registry if k.startswith("AgentRL/"))
PROFILES = [p for p in available() if p != "none"]


@pytest.mark.parametrize(("env", "profile"), [(e, "none") for e in ENVS] + [("AgentRL/SQLPythonSMTP-v1", p) for p in PROFILES])
def test_group_rollouts_run_on_every_env_and_error_profile(small_policy, tmp_path: Path, env: str, profile: str) -> None:
    policy, _ = small_policy
    cfg = small_config(tmp_path, advantage="rloo", group_size=2, num_envs=2, rollout_steps=2)
    roll, _ = _group_rollout(policy, cfg, num_envs=2, env=env, profile=profile)
    assert roll.transitions[0][0].prompt_ids == roll.transitions[0][1].prompt_ids
    adv, _ = ppo.episode_group_advantages(roll.rewards_TN, roll.valid_TN, 2, "rloo")
    assert np.isfinite(adv).all() and (adv[~roll.valid_TN] == 0).all()


# -- the update -------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_microbatch_1_x_accumulation_equals_one_microbatch_for_every_loss_aggregation(small_policy, tmp_path, loss_agg) -> None:
    policy, _ = small_policy
    cfg = small_config(
        tmp_path, advantage="grpo", group_size=2, num_envs=4, rollout_steps=3, env_kwargs={"max_steps": 4}, loss_agg=loss_agg
    )
    roll, _ = _group_rollout(policy, cfg)
    adv_TN, _ = ppo.episode_group_advantages(roll.rewards_TN, roll.valid_TN, 2, "grpo")
    adv_TN = adv_TN + 0.1 * np.arange(4)  # a flat group would leave only the KL and entropy terms
    samples = [(roll.transitions[t][i], float(adv_TN[t, i]), 0.0) for t, i in zip(*np.nonzero(roll.valid_TN))]
    n = len(samples)

    def grads(split):
        policy.zero_grad(set_to_none=True)
        stats = {k: [] for k in ("pg", "vf", "entropy", "kl_ref", "approx_kl", "clipfrac")}
        accumulate(policy, samples, split, cfg, 0.01, 0.5, Dist(), stats)
        out = {k: p.grad.clone() for k, p in policy.trainable_parameters() if p.grad is not None}
        policy.zero_grad(set_to_none=True)
        return out

    one, each, uneven = grads([list(range(n))]), grads([[j] for j in range(n)]), grads([[0, 1], list(range(2, n))])
    assert one and any(float(g.abs().max()) > 0 for g in one.values())
    for k in one:
        assert torch.allclose(one[k], each[k], atol=1e-6, rtol=1e-5), k
        assert torch.allclose(one[k], uneven[k], atol=1e-6, rtol=1e-5), k


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_grpo_run_has_no_value_head_logs_its_groups_and_records_only_real_steps(tmp_path: Path, capsys) -> None:
    from agentrl_envs.data import ReplayBuffer
    from agentrl_train.evaluate import load_run

    # async: the parked envs' resets and steps cross the workers' pipes
    opts = dict(
        advantage="grpo",
        group_size=2,
        num_envs=4,
        rollout_steps=5,
        env_kwargs={"max_steps": 5},
        record=True,
        vectorization="async",
    )
    summary = train(small_config(tmp_path, **opts, final_eval_splits=["test"]), log=lambda *a, **k: None)
    run = tmp_path / "run"
    assert summary["finished"]
    assert not (run / "final" / "value_head.safetensors").exists()
    assert (run / "final" / "exec" / "adapter_model.safetensors").exists()
    from safetensors.torch import load_file

    ck = run / "checkpoints" / "update-000002"
    assert not [k for k in load_file(ck / "trainable.safetensors") if "value" in k]
    rows = [r for r in _rows(run) if r["kind"] == "update"]
    for r in rows:
        assert r["groups"] == 2 and 0 <= r["zero_adv_groups"] <= 2 and r["zero_adv_share"] == r["zero_adv_groups"] / 2
        assert r["cut_share"] == 0.0  # the window is the step limit
        assert "vf" not in r and "critic_weight" not in r
    # the env steps counted are the steps taken: a parked env takes none
    steps = rows[-1]["env_steps"]
    assert steps == summary["env_steps"] and 2 * 4 <= steps <= 2 * 4 * 5
    with ReplayBuffer.open(run / "replay-rank0.ring", readonly=True) as buf:
        trajs = list(buf)
    assert sum(len(t.steps) for t in trajs) == steps  # nothing recorded while an env waited for its group
    assert all(s.action for t in trajs for s in t.steps)
    # the run folder evaluates like a PPO one (no value head expected)
    policy, cfg = load_run(run)
    assert policy.value_head is None and not [n for n, _ in policy.trainable_parameters() if "value" in n]
    assert cfg.ppo.advantage == "grpo"


def test_a_grpo_run_resumes_exactly(tmp_path: Path) -> None:
    opts = dict(advantage="rloo", group_size=2, num_envs=4, rollout_steps=3, env_kwargs={"max_steps": 4}, record=False, updates=3)
    train(small_config(tmp_path / "a", **opts, checkpoint_every=1), log=lambda *a, **k: None)
    train(small_config(tmp_path / "b", **opts, checkpoint_every=1, max_updates_this_call=1), log=lambda *a, **k: None)
    train(small_config(tmp_path / "b", **opts, checkpoint_every=1, resume=True), log=lambda *a, **k: None)
    from safetensors.torch import load_file

    a = load_file(tmp_path / "a" / "run" / "checkpoints" / "update-000003" / "trainable.safetensors")
    b = load_file(tmp_path / "b" / "run" / "checkpoints" / "update-000003" / "trainable.safetensors")
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [r["env_steps"] for r in _rows(tmp_path / "a" / "run") if r["kind"] == "update"] == [
        r["env_steps"] for r in _rows(tmp_path / "b" / "run") if r["kind"] == "update"
    ]


def test_a_return_to_go_run_scores_steps_by_their_return_to_go(tmp_path: Path) -> None:
    opts = dict(advantage="rloo", group_size=2, num_envs=4, rollout_steps=4, env_kwargs={"max_steps": 4}, record=False)
    summary = train(
        small_config(tmp_path, **opts, group_score="return-to-go", updates=1, final_eval_splits=[]), log=lambda *a, **k: None
    )
    assert summary["finished"]
    (row,) = [r for r in _rows(tmp_path / "run") if r["kind"] == "update"]
    assert row["groups"] == 2 and math.isfinite(row["pg"])
    from agentrl_train.evaluate import load_run

    assert load_run(tmp_path / "run")[1].ppo.group_score == "return-to-go"


def test_dr_grpo_in_generate_mode(tmp_path: Path) -> None:
    cfg = small_config(
        tmp_path,
        mode="generate",
        advantage="dr_grpo",
        group_size=2,
        num_envs=2,
        rollout_steps=2,
        updates=1,
        max_new_tokens=12,
        clip_high=0.28,
        final_eval_splits=[],
        record=False,
    )
    summary = train(cfg, log=lambda *a, **k: None)
    assert summary["finished"]
    (row,) = [r for r in _rows(tmp_path / "run") if r["kind"] == "update"]
    assert row["groups"] == 1 and math.isfinite(row["pg"]) and row["rollout_tokens"] > 0


def test_a_group_advantage_on_several_ranks_refuses_accumulation(tmp_path: Path) -> None:
    from agentrl_envs.errors import ConfigError
    from agentrl_train.accumulation import micro_batches_per_step

    cfg = small_config(tmp_path, advantage="grpo", group_size=2, num_envs=4, accumulation=2)
    assert micro_batches_per_step(cfg, 1) == 2  # one rank: any split of a rollout of any length
    with pytest.raises(
        ConfigError, match="on 2 ranks takes the whole rollout as one optimizer step per epoch: drop --sync-batch"
    ):
        micro_batches_per_step(cfg, 2)
    assert micro_batches_per_step(small_config(tmp_path, advantage="grpo", group_size=2, num_envs=4), 2) == 0
