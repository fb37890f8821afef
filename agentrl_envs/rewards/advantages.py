"""Advantage estimators in plain numpy, for any trainer (no torch).

Layout: every array is ``[T]`` (one rollout of one env) or ``[T, N]`` (T steps of N envs), time first.
``values[t]`` is V(s_t), the value of the state in which action t was taken; ``rewards[t]``,
``terminated[t]`` and ``truncated[t]`` are what ``step`` returned for that action. Several episodes may
follow each other in one column: an episode end (terminated or truncated) cuts every trace, so
nothing leaks from one episode into the one before it.

Bootstrapping at the end of an episode or a rollout:

- terminated at t: the target is ``rewards[t]`` alone (the value after a true end is 0);
- truncated at t: the target is ``rewards[t] + gamma * V(final observation)``, where V(final
  observation) is ``truncation_values[t]`` when given, else ``values[t + 1]``, else (last row)
  ``last_values``. ``values[t + 1]`` is right for Gymnasium's default NEXT_STEP autoreset: the row after
  a done row is the reset step, and its observation (hence its value) is still the truncated episode's
  final one. For SAME_STEP autoreset, or episodes concatenated without reset rows, pass
  ``truncation_values`` (V of ``info["final_obs"]``);
- neither, at the last row: ``last_values`` (V of the observation after the rollout; 0 when omitted,
  which is only right when every column's rollout ends with its episode).

:func:`hierarchical_gae` runs GAE inside sub-tasks and passes discounted returns across sub-task
boundaries; :func:`credit_weights` shows what that does to the credit a terminal reward gives early steps.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agentrl_envs.errors import ConfigError

__all__ = ["credit_weights", "gae", "hierarchical_gae", "reset_step_mask", "subtask_boundaries"]

Array = np.ndarray[Any, Any]


def gae(
    rewards: Any,
    values: Any,
    terminated: Any,
    truncated: Any,
    gamma: float = 0.99,
    lam: float = 0.95,
    last_values: Any = None,
    truncation_values: Any = None,
) -> tuple[Array, Array]:
    """Generalized advantage estimation (Schulman et al. 2016) with truncation handled correctly.

    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}`` with
    ``delta_t = r_t + gamma * bootstrap_t - V(s_t)``; see the module docstring for ``bootstrap_t``.

    Args:
        rewards: ``[T]`` or ``[T, N]`` step rewards.
        values: V(s_t), same shape.
        terminated: episode ended for real at t (bootstrap 0), same shape.
        truncated: episode was cut at t (bootstrap from the final observation's value), same shape.
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1] (0: one-step TD errors; 1: Monte Carlo returns minus values).
        last_values: V of the observation after the last row, ``[]`` or ``[N]``; default 0.
        truncation_values: V(final observation) per row, same shape as ``rewards``; read only where
            ``truncated`` (default: ``values[t + 1]``, or ``last_values`` on the last row).

    Returns:
        ``(advantages, returns)``, float64 arrays of the input shape; ``returns = advantages + values``.
    """
    r, v, term, trunc, last, tv = _prepare(rewards, values, terminated, truncated, last_values, truncation_values)
    _check_rates(gamma=gamma, lam=lam)
    adv = _backward(r, v, term, trunc, last, tv, gamma, lam, None)
    return _shape_like(adv, rewards), _shape_like(adv + v, rewards)


def hierarchical_gae(
    rewards: Any,
    values: Any,
    terminated: Any,
    truncated: Any,
    boundaries: Any,
    gamma: float = 0.99,
    lam: float = 0.95,
    last_values: Any = None,
    truncation_values: Any = None,
) -> tuple[Array, Array]:
    """GAE inside sub-tasks, discounted returns across sub-task boundaries.

    ``boundaries[t]`` is True at the first step of a new sub-task (``info["subtask_boundary"]``; see
    :func:`subtask_boundaries`). Let ``G_t`` be the discounted return from t to the episode's end,
    ``G_t = r_t + gamma * G_{t+1}``, bootstrapped exactly as :func:`gae` bootstraps (0 after termination,
    V(final observation) after truncation, ``last_values`` after the last row). Then for a step t whose
    sub-task ends at step e (the last step before the next boundary or the episode end):

    - at e, when a boundary follows (no episode end at e), the lambda trace is cut and the step
      bootstraps from the discounted return of the following sub-tasks:
      ``A_e = r_e + gamma * G_{e+1} - V(s_e)``;
    - before e (and at an episode end), plain GAE: ``A_t = delta_t + gamma * lam * A_{t+1}``.

    A terminal reward therefore reaches step t with weight
    ``gamma ** (T - 1 - t) * lam ** (e - t)`` (steps left in t's own sub-task) instead of GAE's
    ``(gamma * lam) ** (T - 1 - t)``: it is discounted across sub-tasks but lambda-decayed only inside
    the step's own sub-task. The price is Monte Carlo variance from the following sub-tasks' rewards.
    With no boundaries this is :func:`gae`; with a boundary at every step it is ``G_t - V(s_t)``
    (GAE with ``lam=1``).

    Args:
        rewards, values, terminated, truncated, gamma, lam, last_values, truncation_values: as in :func:`gae`.
        boundaries: bool array of the rewards' shape, True at the first step of a new sub-task.

    Returns:
        ``(advantages, returns)`` as in :func:`gae`; ``returns = advantages + values``.
    """
    r, v, term, trunc, last, tv = _prepare(rewards, values, terminated, truncated, last_values, truncation_values)
    _check_rates(gamma=gamma, lam=lam)
    b = _as_2d(np.asarray(boundaries), "boundaries", r.shape).astype(bool)
    adv = _backward(r, v, term, trunc, last, tv, gamma, lam, b)
    return _shape_like(adv, rewards), _shape_like(adv + v, rewards)


def subtask_boundaries(infos: Sequence[Mapping[str, Any]], by: str = "tool") -> Array:
    """Sub-task boundaries of one episode from its step infos (not the reset info), as a bool ``[T]``.

    Args:
        infos: the ``info`` dicts returned by ``step``, in order.
        by: ``"tool"`` reads ``info["subtask_boundary"]`` (the tool type changed; in the pipeline env
            that is every step, since each sub-task is sql -> python -> smtp). ``"subtask"`` uses
            ``info["subtask_index"]``: the index after step t-1 names the sub-task step t works on, so a
            boundary is where that changes (the steps of one sql -> python -> smtp sub-task share a segment).

    Raises:
        ConfigError: unknown ``by``, or an info without the key.
    """
    if by not in ("tool", "subtask"):
        raise ConfigError(f"by={by!r}: use 'tool' (info['subtask_boundary']) or 'subtask' (info['subtask_index'])")
    key = "subtask_boundary" if by == "tool" else "subtask_index"
    try:
        column = [info[key] for info in infos]
    except (KeyError, TypeError):
        raise ConfigError(f"every step info needs {key!r}; pass the info dicts returned by an agentrl env's step()") from None
    if by == "tool":
        return np.asarray([bool(x) for x in column], dtype=bool)
    working = [0, *[int(x) for x in column[:-1]]]  # the sub-task each step works on
    out = np.zeros(len(column), dtype=bool)
    for t in range(1, len(column)):
        out[t] = working[t] != working[t - 1]
    return out


def credit_weights(T: int, gamma: float = 0.99, lam: float = 0.95, boundaries: Any = None) -> Array:
    """How much of a terminal reward at step ``T - 1`` reaches the advantage of each step k.

    ``weights[k] = dA_k / dr_{T-1}`` (values held fixed) for one episode that terminates at ``T - 1``:
    ``(gamma * lam) ** (T - 1 - k)`` under :func:`gae` (``boundaries=None``), and
    ``gamma ** (T - 1 - k) * lam ** (steps left in k's sub-task)`` under :func:`hierarchical_gae`.

    Raises:
        ConfigError: ``T`` is not a positive int or ``boundaries`` has the wrong length.
    """
    if not isinstance(T, (int, np.integer)) or isinstance(T, bool) or T < 1:
        raise ConfigError(f"T={T!r}: use the episode length, a positive int")
    rewards = np.zeros(T)
    rewards[-1] = 1.0
    done = np.zeros(T, dtype=bool)
    done[-1] = True
    zeros, never = np.zeros(T), np.zeros(T, dtype=bool)
    if boundaries is None:
        adv, _ = gae(rewards, zeros, done, never, gamma, lam)
    else:
        adv, _ = hierarchical_gae(rewards, zeros, done, never, boundaries, gamma, lam)
    return adv


def reset_step_mask(terminated: Any, truncated: Any) -> Array:
    """Rows that are NEXT_STEP autoreset steps (the row after a done row in the same column).

    Their action was ignored by the vector env; a trainer should drop them from the loss.
    """
    term = np.asarray(terminated, dtype=bool)
    trunc = np.asarray(truncated, dtype=bool)
    if term.shape != trunc.shape:
        raise ConfigError(f"terminated {term.shape} and truncated {trunc.shape} must have the same shape")
    mask = np.zeros(term.shape, dtype=bool)
    if term.shape and term.shape[0] > 1:
        mask[1:] = (term | trunc)[:-1]
    return mask


# -- internals -----------------------------------------------------------------------------------


def _backward(
    r: Array, v: Array, term: Array, trunc: Array, last: Array, tv: Array | None, gamma: float, lam: float, b: Array | None
) -> Array:
    """The backward pass of GAE; with boundaries ``b``, the hierarchical variant."""
    T = r.shape[0]
    adv = np.zeros_like(r)
    next_adv, next_mc = np.zeros(r.shape[1]), last.copy()  # A_{t+1} and the discounted return G_{t+1}
    for t in range(T - 1, -1, -1):
        next_value = last if t == T - 1 else v[t + 1]
        boot = next_value if tv is None else np.where(trunc[t], tv[t], next_value)
        alive = ~(term[t] | trunc[t])
        delta = r[t] + gamma * boot * (~term[t]) - v[t]
        a_t = delta + gamma * lam * alive * next_adv
        if b is not None:
            if t + 1 < T:  # the last step of a sub-task bootstraps from the discounted return after it
                a_t = np.where(alive & b[t + 1], r[t] + gamma * next_mc - v[t], a_t)
            next_mc = r[t] + gamma * np.where(alive, next_mc, boot * (~term[t]))
        adv[t] = next_adv = a_t
    return adv


def _prepare(
    rewards: Any, values: Any, terminated: Any, truncated: Any, last_values: Any, truncation_values: Any
) -> tuple[Array, Array, Array, Array, Array, Array | None]:
    r_in = np.asarray(rewards, dtype=np.float64)
    if r_in.ndim not in (1, 2) or r_in.shape[0] == 0:
        raise ConfigError(f"rewards has shape {r_in.shape}; use [T] or [T, N] with T >= 1")
    r = _as_2d(r_in, "rewards", None)
    v = _as_2d(np.asarray(values, dtype=np.float64), "values", r.shape)
    term = _as_2d(np.asarray(terminated), "terminated", r.shape).astype(bool)
    trunc = _as_2d(np.asarray(truncated), "truncated", r.shape).astype(bool)
    n = r.shape[1]
    if last_values is None:
        last = np.zeros(n)
    else:
        last = np.asarray(last_values, dtype=np.float64).reshape(-1)
        if last.shape != (n,):
            raise ConfigError(f"last_values has {last.size} entries; give one per env ({n})")
    tv = (
        None
        if truncation_values is None
        else _as_2d(np.asarray(truncation_values, dtype=np.float64), "truncation_values", r.shape)
    )
    for name, arr in (("rewards", r), ("values", v), ("last_values", last)):
        if not np.all(np.isfinite(arr)):
            raise ConfigError(f"{name} holds NaN or inf; check the reward wrapper or the value head")
    if tv is not None and not np.all(np.isfinite(tv[trunc])):
        raise ConfigError("truncation_values holds NaN or inf at a truncated step")
    return r, v, term, trunc, last, tv


def _as_2d(arr: Array, name: str, shape: tuple[int, ...] | None) -> Array:
    out = arr.reshape(arr.shape[0], 1) if arr.ndim == 1 else arr
    if out.ndim != 2 or (shape is not None and out.shape != shape):
        want = "[T] or [T, N]" if shape is None else f"the rewards' shape {shape}"
        raise ConfigError(f"{name} has shape {arr.shape}; it must have {want}")
    return out


def _shape_like(arr: Array, like: Any) -> Array:
    return arr.reshape(-1) if np.ndim(like) == 1 else arr


def _check_rates(**rates: float) -> None:
    for name, value in rates.items():
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0.0 <= float(value) <= 1.0:
            raise ConfigError(f"{name}={value!r}: use a number in [0, 1]")
