"""PPO pieces checked against hand computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from agentrl_train import ppo


def test_entropy_coefficient_decays_logarithmically() -> None:
    assert ppo.entropy_coef(0, 101) == pytest.approx(0.01)
    assert ppo.entropy_coef(100, 101) == pytest.approx(0.001)
    assert ppo.entropy_coef(50, 101) == pytest.approx(math.sqrt(0.01 * 0.001))  # geometric midpoint
    assert ppo.entropy_coef(0, 1) == 0.01
    values = [ppo.entropy_coef(u, 20) for u in range(20)]
    assert all(a > b for a, b in itertools.pairwise(values))


def test_critic_weight_rises_linearly_per_optimizer_step() -> None:
    assert [ppo.critic_weight(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert ppo.critic_weight(0, 1) == 1.0 and ppo.critic_weight(0, 0) == 1.0  # no warmup


def test_critic_warmup_is_real_at_every_budget() -> None:
    """It was ``max(1, updates // 10)`` updates: 1 update (full weight from the start) at the default 5 updates."""
    # the defaults: 5 updates x 2 epochs x 1 step (128 transitions, --accumulation 0)
    assert ppo.optimizer_steps_per_epoch(8 * 16, 16, 0) == 1
    total = 5 * 2 * ppo.optimizer_steps_per_epoch(8 * 16, 16, 0)
    warmup = ppo.critic_warmup_steps(0, total)
    assert warmup == 4  # two updates' worth, not a single step
    assert ppo.critic_weight(0, warmup) == 0.25 and ppo.critic_weight(warmup - 1, warmup) == 1.0
    assert ppo.critic_warmup_steps(0, 1000) == 200  # a fifth of a long run
    assert ppo.critic_warmup_steps(0, 10) == 4  # at least 4 steps ...
    assert ppo.critic_warmup_steps(0, 2) == 2  # ... but within the run, so the weight reaches 1
    assert ppo.critic_warmup_steps(7, 2) == 7  # as given (--critic-warmup, optimizer steps)
    assert ppo.optimizer_steps_per_epoch(128, 16, 2) == 4 and ppo.optimizer_steps_per_epoch(130, 16, 2) == 5


def test_target_kl_compares_the_current_epochs_mean() -> None:
    """It compared the mean over every epoch so far: a first epoch near 0 hid a second epoch far past the target."""
    first, second = [0.001] * 8, [0.03] * 8
    assert not ppo.should_stop_early(first, 0.02)
    assert ppo.should_stop_early(second, 0.02)  # the second epoch alone is past the target ...
    assert not ppo.should_stop_early(first + second, 0.02)  # ... the mean of both epochs (0.0155) was not
    assert not ppo.should_stop_early(second, 0.0)  # 0: off
    assert not ppo.should_stop_early([], 0.02)
    # the global moments (DDP: count, sum, sum of squares over every rank) decide, not this rank's values
    assert ppo.should_stop_early([0.0], 0.02, stats=(2, 0.1, 0.0))
    assert not ppo.should_stop_early([1.0], 0.02, stats=(2, 0.01, 0.0))


def test_policy_loss_matches_hand_computation() -> None:
    logp = torch.log(torch.tensor([0.5, 0.9, 0.1]))
    old = torch.log(torch.tensor([0.25, 0.9, 0.2]))
    adv = torch.tensor([1.0, -1.0, -2.0])
    loss, ratio, clipped = ppo.policy_loss(logp, old, adv, 0.2)
    assert ratio.tolist() == pytest.approx([2.0, 1.0, 0.5])
    # A>0, r=2 -> clipped at 1.2; A<0, r=1 -> -A; A<0, r=0.5 -> max(1.0, 1.6) = 1.6
    assert loss.tolist() == pytest.approx([-1.2, 1.0, 1.6])
    assert clipped.tolist() == [1.0, 0.0, 1.0]


def test_value_loss_takes_the_max_of_clipped_and_unclipped() -> None:
    v, old, ret = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([0.0, 1.0])
    out = ppo.value_loss(v, old, ret, 0.2)
    # sample 0: unclipped (1-0)^2=1, clipped (0.2-0)^2=.04 -> 0.5; sample 1: (0-1)^2=1 both -> 0.5
    assert out.tolist() == pytest.approx([0.5, 0.5])
    assert ppo.value_loss(torch.tensor([0.5]), torch.tensor([0.0]), torch.tensor([1.0]), 0.0).tolist() == pytest.approx([0.125])


def test_k3_is_zero_at_equal_policies_positive_otherwise_and_clamped() -> None:
    lp = torch.tensor([-1.0, -2.0, -50.0])
    assert ppo.k3_kl(lp, lp).tolist() == [0.0, 0.0, 0.0]
    k = ppo.k3_kl(torch.tensor([-1.0]), torch.tensor([-2.0]))
    assert float(k) == pytest.approx(math.exp(-1) - 1 + 1)
    big = ppo.k3_kl(torch.tensor([-100.0]), torch.tensor([0.0]), clamp=10.0)
    assert float(big) == pytest.approx(math.exp(10) - 1 - 10)


def test_reward_zscore_uses_min_sigma_and_global_stats() -> None:
    r = np.array([[1.0, 0.0], [0.0, 0.0]])
    valid = np.ones_like(r, dtype=bool)
    z = ppo.normalize_rewards(r, valid, "zscore", min_sigma=0.1)
    assert z.mean() == pytest.approx(0.0) and z.std() == pytest.approx(1.0)
    flat = ppo.normalize_rewards(np.zeros((2, 2)), valid, "zscore", min_sigma=0.1)
    assert np.all(flat == 0.0)
    const = ppo.normalize_rewards(np.full((2, 2), 0.01), valid, "zscore", min_sigma=0.5)
    assert np.allclose(const, 0.0)
    # statistics given from outside (DDP all-reduce) win over the local ones
    g = ppo.normalize_rewards(np.array([[2.0]]), np.array([[True]]), "zscore", 0.1, stats=(4, 4.0, 8.0))
    assert float(g[0, 0]) == pytest.approx((2.0 - 1.0) / 1.0)
    assert np.array_equal(ppo.normalize_rewards(r, valid, "none"), r)


def test_per_layer_clipping_clips_each_block_on_its_own() -> None:
    a = torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(3))
    v = torch.nn.Parameter(torch.zeros(2))
    a.grad, b.grad, v.grad = torch.tensor([3.0, 4.0, 0.0]), torch.tensor([0.3, 0.4, 0.0]), torch.tensor([6.0, 8.0])
    groups = ppo.clip_groups(
        [("base.model.layers.0.q_proj.lora_A", a), ("base.model.layers.1.q_proj.lora_A", b), ("value_head.weight", v)]
    )
    assert set(groups) == {"layer.0", "layer.1", "value_head"}
    norms = ppo.clip_gradients(groups, 1.0, "per-layer")
    assert norms == pytest.approx({"layer.0": 5.0, "layer.1": 0.5, "value_head": 10.0})
    assert float(a.grad.norm()) == pytest.approx(1.0)
    assert float(b.grad.norm()) == pytest.approx(0.5)  # under the limit: untouched
    assert float(v.grad.norm()) == pytest.approx(1.0)
    a.grad, b.grad, v.grad = torch.tensor([3.0, 4.0, 0.0]), torch.tensor([0.3, 0.4, 0.0]), torch.tensor([6.0, 8.0])
    g = ppo.clip_gradients(groups, 1.0, "global")
    assert g["global"] == pytest.approx(math.sqrt(25 + 0.25 + 100))
    assert float(b.grad.norm()) < 0.5  # global clipping scales every block


def test_whiten() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0])
    w = ppo.whiten(x)
    assert w.mean() == pytest.approx(0.0) and w.std() == pytest.approx(1.0, rel=1e-6)


def test_lr_factor_constant_and_linear_per_optimizer_step() -> None:
    """Linear fell per update to 1/updates at the end of the run; now 1 at the first step, 0 at the run's end."""
    assert [ppo.lr_factor(s, 4, "constant") for s in range(5)] == [1.0] * 5
    assert [ppo.lr_factor(s, 4, "linear") for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    total = 5 * 2 * 4  # 5 updates x 2 epochs x 4 steps
    assert ppo.lr_factor(0, total, "linear") == 1.0
    assert ppo.lr_factor(total - 1, total, "linear") == pytest.approx(1 / 40)  # the last step: small, not 1/updates
    assert ppo.lr_factor(total, total, "linear") == 0.0  # the end of the last update
    assert ppo.lr_factor(99, 4, "linear") == 0.0 and ppo.lr_factor(-1, 4, "linear") == 1.0  # clamped outside the run


def test_greedy_candidate_breaks_ties_by_the_reference_score() -> None:
    from agentrl_train.rollout import candidate_logprobs, greedy_candidate

    class P:
        score_baseline, temperature, reference_weight = "reference", 0.1, 1.0

    base = torch.tensor([-2.0, -0.5, -1.0, -3.0])
    # an untrained adapter scores like the reference: a uniform policy, every candidate tied
    logp = candidate_logprobs(base.clone(), base, P())
    assert torch.allclose(logp, torch.full((4,), -math.log(4)))
    assert int(torch.argmax(logp)) == 0  # plain argmax: the first of the env's shuffled candidates
    assert greedy_candidate(logp, base) == 1  # the reference model's own choice
    # a policy with a preference keeps it, whatever the reference prefers
    moved = candidate_logprobs(base + torch.tensor([0.0, 0.0, 0.3, 0.0]), base, P())
    assert greedy_candidate(moved, base) == 2
    # ties among a subset go to the reference's best of that subset
    two = candidate_logprobs(base + torch.tensor([0.0, 0.0, 0.3, 0.3]), base, P())
    assert greedy_candidate(two, base) == 2
    assert greedy_candidate(logp, None) == 0  # no reference scores: plain argmax


def test_reference_weight_keeps_a_share_of_the_base_preference_as_margins() -> None:
    from agentrl_train.rollout import candidate_logprobs, greedy_candidate

    class P:
        score_baseline, temperature, reference_weight = "reference", 0.1, 0.9

    base = torch.tensor([-2.0, -0.5, -1.0, -3.0])
    # untrained: the policy is softmax((1 - w) * base / T), the base model's ranking with margins
    start = candidate_logprobs(base.clone(), base, P())
    assert torch.allclose(start, torch.log_softmax(0.1 * base / 0.1, dim=-1))
    assert greedy_candidate(start, base) == 1
    # the KL's reference is that same start policy, so the KL is 0 before the first update
    assert torch.equal(candidate_logprobs(base, base, P()), start)
    # a shift smaller than the base margin (0.1 * 0.5 = 0.05 per token) does not change the greedy choice
    assert greedy_candidate(candidate_logprobs(base + torch.tensor([0.0, 0.0, 0.04, 0.0]), base, P()), base) == 1
    # ... a larger one does; with w = 1 even the small one would
    assert greedy_candidate(candidate_logprobs(base + torch.tensor([0.0, 0.0, 0.06, 0.0]), base, P()), base) == 2
    P.reference_weight = 1.0
    assert greedy_candidate(candidate_logprobs(base + torch.tensor([0.0, 0.0, 0.04, 0.0]), base, P()), base) == 2
    # no baseline: the weight is not used
    P.score_baseline = "none"
    assert torch.allclose(candidate_logprobs(base, base, P()), torch.log_softmax(base / 0.1, dim=-1))
