"""GAE and the hierarchical estimator: hand computations, properties, garbage input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl_envs import ConfigError
from agentrl_envs.rewards.advantages import credit_weights, gae, hierarchical_gae, reset_step_mask, subtask_boundaries

F, T_ = False, True
finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False)
rate = st.floats(0, 1)


# -- hand computations (gamma = lam = 0.5 keeps every number exact) --------------------------------


def test_gae_by_hand_terminated() -> None:
    # delta2 = 3 - 1.5 = 1.5                       A2 = 1.5
    # delta1 = 2 + 0.5 * 1.5 - 1 = 1.75            A1 = 1.75 + 0.25 * 1.5 = 2.125
    # delta0 = 1 + 0.5 * 1 - 0.5 = 1.0             A0 = 1.0 + 0.25 * 2.125 = 1.53125
    adv, ret = gae([1, 2, 3], [0.5, 1, 1.5], [F, F, T_], [F, F, F], gamma=0.5, lam=0.5)
    np.testing.assert_allclose(adv, [1.53125, 2.125, 1.5])
    np.testing.assert_allclose(ret, [2.03125, 3.125, 3.0])


def test_gae_by_hand_truncated_bootstraps_from_the_final_observation() -> None:
    # delta2 = 3 + 0.5 * V(final obs) 2.0 - 1.5 = 2.5; A1 = 1.75 + 0.25 * 2.5; A0 = 1 + 0.25 * A1
    adv, _ = gae([1, 2, 3], [0.5, 1, 1.5], [F, F, F], [F, F, T_], 0.5, 0.5, truncation_values=[0, 0, 2.0])
    np.testing.assert_allclose(adv, [1.59375, 2.375, 2.5])
    # Without truncation_values the last row bootstraps from last_values.
    adv2, _ = gae([1, 2, 3], [0.5, 1, 1.5], [F, F, F], [F, F, T_], 0.5, 0.5, last_values=2.0)
    np.testing.assert_allclose(adv2, adv)


def test_gae_next_step_autoreset_layout_reads_the_final_value_from_the_reset_row() -> None:
    # Row 1 is truncated; row 2 is the NEXT_STEP reset row, whose value is V(final obs of episode 1) = 4.
    # A1 = 2 + 0.5 * 4 - 0 = 4; A0 = 1 + 0.5 * 0 - 0 + 0.5 * 1 * A1 = 3 (lam = 1).
    adv, _ = gae([1, 2, 0], [0, 0, 4], [F, F, F], [F, T_, F], gamma=0.5, lam=1.0)
    np.testing.assert_allclose(adv[:2], [3.0, 4.0])
    np.testing.assert_array_equal(reset_step_mask([F, F, F], [F, T_, F]), [F, F, T_])


def test_gae_batch_episodes_do_not_leak() -> None:
    # Column 0: two 2-step episodes back to back; column 1: one 4-step episode. lam = 1, V = 0.
    rewards = np.array([[1, 1], [1, 1], [1, 1], [1, 1]], dtype=float)
    term = np.array([[F, F], [T_, F], [F, F], [T_, T_]])
    adv, _ = gae(rewards, np.zeros((4, 2)), term, np.zeros((4, 2), bool), gamma=0.5, lam=1.0)
    np.testing.assert_allclose(adv[:, 0], [1.5, 1.0, 1.5, 1.0])
    np.testing.assert_allclose(adv[:, 1], [1.875, 1.75, 1.5, 1.0])


def test_hierarchical_by_hand() -> None:
    # Sub-task A = steps 0-1, B = steps 2-3 (boundary at 2); reward 8 at the end; V = 1; gamma = lam = 0.5.
    # G = [1, 2, 4, 8]. A3 = 8 - 1 = 7; A2 = (0.5 - 1) + 0.25 * 7 = 1.25;
    # A1 (last of A) = 0 + 0.5 * G2 - 1 = 1; A0 = (0.5 - 1) + 0.25 * 1 = -0.25.
    adv, ret = hierarchical_gae([0, 0, 0, 8], [1, 1, 1, 1], [F, F, F, T_], [F] * 4, [F, F, T_, F], 0.5, 0.5)
    np.testing.assert_allclose(adv, [-0.25, 1.0, 1.25, 7.0])
    np.testing.assert_allclose(ret, [0.75, 2.0, 2.25, 8.0])
    plain, _ = gae([0, 0, 0, 8], [1, 1, 1, 1], [F, F, F, T_], [F] * 4, 0.5, 0.5)
    np.testing.assert_allclose(plain, [-0.546875, -0.1875, 1.25, 7.0])


def test_credit_weights_by_hand() -> None:
    np.testing.assert_allclose(credit_weights(4, 0.5, 0.5), [1 / 64, 1 / 16, 1 / 4, 1])
    # gamma^d * lam^(steps left in the sub-task): step 1 ends sub-task A, step 0 has one step left.
    np.testing.assert_allclose(credit_weights(4, 0.5, 0.5, [F, F, T_, F]), [1 / 16, 1 / 4, 1 / 4, 1])


def test_credit_weights_long_horizon_numbers() -> None:
    # 16-step oracle episode: sub-tasks of 3 steps (sql, python, smtp) and the finish step.
    by_subtask = np.zeros(16, bool)
    by_subtask[[3, 6, 9, 12, 15]] = True
    g = credit_weights(16, 0.99, 0.95)[::-1]
    h = credit_weights(16, 0.99, 0.95, by_subtask)[::-1]
    assert g[10] == pytest.approx((0.99 * 0.95) ** 10) and round(g[10], 3) == 0.541
    assert round(h[10], 3) == 0.904 and round(h[15], 3) == 0.776
    assert round(credit_weights(16, 1.0, 0.95)[::-1][10], 3) == 0.599


def test_subtask_boundaries_from_infos() -> None:
    infos = [{"subtask_boundary": b, "subtask_index": i} for b, i in [(F, 0), (T_, 0), (T_, 1), (T_, 1), (T_, 1), (T_, 2)]]
    np.testing.assert_array_equal(subtask_boundaries(infos), [F, T_, T_, T_, T_, T_])
    # Step t works on the sub-task named by the index after step t-1, which changes at step 3.
    np.testing.assert_array_equal(subtask_boundaries(infos, by="subtask"), [F, F, F, T_, F, F])
    assert subtask_boundaries([]).shape == (0,)


@pytest.mark.parametrize(
    "call",
    [
        lambda: gae([], [], [], []),
        lambda: gae([[[1.0]]], [[[1.0]]], [[[F]]], [[[F]]]),
        lambda: gae([1, 2], [1], [F, F], [F, F]),
        lambda: gae([1, float("nan")], [0, 0], [F, T_], [F, F]),
        lambda: gae([1, 2], [0, float("inf")], [F, T_], [F, F]),
        lambda: gae([1, 2], [0, 0], [F, T_], [F, F], gamma=1.5),
        lambda: gae([1, 2], [0, 0], [F, T_], [F, F], lam=-0.1),
        lambda: gae([1, 2], [0, 0], [F, T_], [F, F], gamma=True),
        lambda: gae([1, 2], [0, 0], [F, T_], [F, F], gamma="0.9"),  # type: ignore[arg-type]
        lambda: gae([[1, 2]], [[0, 0]], [[F, T_]], [[F, F]], last_values=[1, 2, 3]),
        lambda: gae([1, 2], [0, 0], [F, F], [F, T_], truncation_values=[0, float("nan")]),
        lambda: hierarchical_gae([1, 2], [0, 0], [F, T_], [F, F], [T_]),
        lambda: credit_weights(0),
        lambda: credit_weights(True),
        lambda: credit_weights(3, boundaries=[T_]),
        lambda: subtask_boundaries([{"step": 1}]),
        lambda: subtask_boundaries(["garbage"]),  # type: ignore[list-item]
        lambda: subtask_boundaries([], by="tools"),
    ],
)
def test_garbage_input_gives_config_errors(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError):
        call()


# -- properties ----------------------------------------------------------------------------------


@st.composite
def episode(draw: st.DrawFn, max_len: int = 12) -> tuple[np.ndarray, np.ndarray, float]:
    n = draw(st.integers(1, max_len))
    rewards = np.array(draw(st.lists(finite, min_size=n, max_size=n)))
    values = np.array(draw(st.lists(finite, min_size=n, max_size=n)))
    return rewards, values, draw(finite)


def discounted(rewards: np.ndarray, gamma: float, tail: float = 0.0) -> np.ndarray:
    out, g = np.zeros(len(rewards)), tail
    for t in range(len(rewards) - 1, -1, -1):
        g = rewards[t] + gamma * g
        out[t] = g
    return out


@settings(max_examples=60, deadline=None)
@given(episode(), rate, rate)
def test_lam_one_is_discounted_returns_minus_values(ep, gamma, lam) -> None:  # type: ignore[no-untyped-def]
    r, v, _ = ep
    done = np.zeros(len(r), bool)
    done[-1] = True
    adv, ret = gae(r, v, done, np.zeros(len(r), bool), gamma, 1.0)
    np.testing.assert_allclose(adv, discounted(r, gamma) - v, atol=1e-6)
    np.testing.assert_allclose(ret, discounted(r, gamma), atol=1e-6)
    # Boundaries at every step make the hierarchical estimator Monte Carlo whatever lam is.
    hier, _ = hierarchical_gae(r, v, done, np.zeros(len(r), bool), np.ones(len(r), bool), gamma, lam)
    np.testing.assert_allclose(hier, discounted(r, gamma) - v, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(episode(), rate)
def test_lam_zero_is_one_step_td_errors(ep, gamma) -> None:  # type: ignore[no-untyped-def]
    r, v, last = ep
    never = np.zeros(len(r), bool)
    adv, _ = gae(r, v, never, never, gamma, 0.0, last_values=last)
    next_v = np.append(v[1:], last)
    np.testing.assert_allclose(adv, r + gamma * next_v - v, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(episode(6), st.booleans()), min_size=1, max_size=5), rate, rate)
def test_concatenated_batch_equals_per_episode(episodes, gamma, lam) -> None:  # type: ignore[no-untyped-def]
    parts = []
    rows: dict[str, list[np.ndarray]] = {"r": [], "v": [], "term": [], "trunc": [], "tv": [], "b": []}
    for (r, v, final_value), truncated in episodes:
        n = len(r)
        end = np.zeros(n, bool)
        end[-1] = True
        term, trunc = (np.zeros(n, bool), end) if truncated else (end, np.zeros(n, bool))
        bounds = np.arange(n) % 2 == 1
        expect = gae(r, v, term, trunc, gamma, lam, last_values=final_value)[0]
        expect_h = hierarchical_gae(r, v, term, trunc, bounds, gamma, lam, last_values=final_value)[0]
        parts.append((expect, expect_h))
        tv = np.zeros(n)
        tv[-1] = final_value
        for key, arr in zip(rows, (r, v, term, trunc, tv, bounds)):
            rows[key].append(arr)
    cat = {k: np.concatenate(v) for k, v in rows.items()}
    got = gae(cat["r"], cat["v"], cat["term"], cat["trunc"], gamma, lam, truncation_values=cat["tv"])[0]
    got_h = hierarchical_gae(cat["r"], cat["v"], cat["term"], cat["trunc"], cat["b"], gamma, lam, truncation_values=cat["tv"])[0]
    np.testing.assert_allclose(got, np.concatenate([p[0] for p in parts]), atol=1e-6)
    np.testing.assert_allclose(got_h, np.concatenate([p[1] for p in parts]), atol=1e-6)
    # [T, N] columns are computed independently.
    width = np.stack([cat["r"], cat["r"][::-1]], axis=1)
    values = np.stack([cat["v"], cat["v"][::-1]], axis=1)
    never = np.zeros(width.shape, bool)
    both = gae(width, values, never, never, gamma, lam, last_values=[1.0, -1.0])[0]
    np.testing.assert_allclose(both[:, 1], gae(cat["r"][::-1], cat["v"][::-1], never[:, 1], never[:, 1], gamma, lam, -1.0)[0])


@settings(max_examples=60, deadline=None)
@given(episode(), st.floats(0.05, 1), rate, finite.filter(lambda x: abs(x) > 1e-3))
def test_truncation_bootstrap_differs_from_termination(ep, gamma, lam, final_value) -> None:  # type: ignore[no-untyped-def]
    r, v, _ = ep
    end = np.zeros(len(r), bool)
    end[-1] = True
    never = np.zeros(len(r), bool)
    by_term = gae(r, v, end, never, gamma, lam, last_values=final_value)[0]
    by_trunc = gae(r, v, never, end, gamma, lam, last_values=final_value)[0]
    assert by_trunc[-1] - by_term[-1] == pytest.approx(gamma * final_value, abs=1e-6)
    # The difference reaches earlier steps through the trace, scaled by (gamma * lam)^k.
    weights = credit_weights(len(r), gamma, lam)
    np.testing.assert_allclose(by_trunc - by_term, gamma * final_value * weights, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(episode(), rate, rate, st.data())
def test_hierarchical_limits_and_closed_form(ep, gamma, lam, data) -> None:  # type: ignore[no-untyped-def]
    r, v, _ = ep
    n = len(r)
    end = np.zeros(n, bool)
    end[-1] = True
    never = np.zeros(n, bool)
    np.testing.assert_allclose(hierarchical_gae(r, v, end, never, never, gamma, lam)[0], gae(r, v, end, never, gamma, lam)[0])
    bounds = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    weights = credit_weights(n, gamma, lam, bounds)
    for k in range(n):
        left = next((j for j in range(k + 1, n) if bounds[j]), n) - 1 - k  # steps left in k's sub-task
        assert weights[k] == pytest.approx(gamma ** (n - 1 - k) * lam**left, abs=1e-9)
