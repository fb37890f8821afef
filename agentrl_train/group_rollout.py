"""Group rollouts for the critic-free advantages (GRPO, Dr. GRPO, RLOO): G episodes of one task per group.

With ``--group-size G`` the ``num_envs`` sub-envs of a rank form ``num_envs / G`` groups of consecutive
global env indices; the envs of a group reset on the same episode seed (the same task, the same
faults) and sample with their own generators. One update plays one episode per env:

- every env starts its group's next episode together (the previous rollout's last act, or the run's
  first reset);
- the policy acts in every env whose episode is still running; an env whose episode ended (it
  terminated, or the env truncated it at its step limit) is parked (:meth:`EnvPool.hold`) and costs
  no forward pass until the window closes;
- the window closes when every episode has ended or after ``rollout_steps`` steps; an episode still
  running then is *cut* and scored by its return so far (``cut_N``; the share is logged as
  ``cut_share``). Set ``--rollout-steps`` to the env's step limit (or lower the limit with
  ``--env-kwargs '{max_steps: 8}'``) and no episode is cut.

Rows of a parked env are not transitions (``valid_TN`` is False there). Nothing here needs a value:
no V(s) is computed for bootstrapping. The advantages themselves are :func:`agentrl_train.ppo.group_advantages`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from agentrl_train.episodes import EnvPool, Transition, sub_info
from agentrl_train.rollout import Rollout, act_many

__all__ = ["collect_groups"]


def collect_groups(policy: Any, pool: EnvPool, cfg: Any, recorder: Any = None, engine: Any = None) -> Rollout:
    """One episode per sub-env, at most ``cfg.ppo.rollout_steps`` steps each, then every env starts its next one.

    The pool must stand at the start of its groups' episodes (``pool.reset()`` once before the first
    call; each call ends with that reset for the next), so a checkpoint taken between updates holds
    no episode in progress. With a rollout ``engine`` the actions come from its servers and the
    trainer's model is not used here (:func:`agentrl_train.rollout.collect`).
    """
    T, N = cfg.ppo.rollout_steps, pool.num_envs
    shape = (T, N)
    rewards, term, trunc = np.zeros(shape), np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)
    valid = np.zeros(shape, dtype=bool)
    transitions: list[list[Transition | None]] = []
    episodes: list[dict[str, Any]] = []
    running = np.ones(N, dtype=bool)
    env_s = model_s = 0.0
    tokens = 0
    if engine is None:
        policy.eval()
    pool.prompt_states = [{} for _ in range(N)]  # keys/values of the weights before the last update are stale
    for t in range(T):
        envs = [int(i) for i in np.flatnonzero(running)]
        row: list[Transition | None] = [None] * N
        if envs:
            t0 = time.perf_counter()
            for i, tr in zip(envs, act_many(policy, pool, envs, cfg, engine=engine)):
                row[i] = tr
            model_s += time.perf_counter() - t0
        transitions.append(row)
        if not envs:
            continue  # every episode has ended: the rest of the window is empty
        valid[t] = running
        tokens += sum(len(tr.prompt_ids) + sum(len(c) for c in tr.cand_ids) + len(tr.new_ids) for tr in row if tr)
        if recorder is not None:
            lp = np.array([tr.logprob if tr else 0.0 for tr in row], dtype=np.float32)
            recorder.annotate(log_prob=lp, value=np.zeros(N, dtype=np.float32))
        t0 = time.perf_counter()
        obs, rew, te, tu, info = pool.envs.step([tr.action_text if tr else "" for tr in row])
        env_s += time.perf_counter() - t0
        ended = np.zeros(N, dtype=bool)
        for i in envs:
            taken, sub = row[i], sub_info(info, i)
            assert taken is not None
            rewards[t, i], term[t, i], trunc[t, i] = rew[i], te[i], tu[i]
            pool.took(policy, i, taken, obs[i], sub, rew[i], cfg)
            if te[i] or tu[i]:
                ended[i] = True
                episodes.append(_episode(pool, i, sub, truncated=bool(tu[i]), cut=False))
        if ended.any():
            running &= ~ended
            t0 = time.perf_counter()
            pool.hold(ended)
            env_s += time.perf_counter() - t0
    cut = running.copy()
    for j in map(int, np.flatnonzero(cut)):  # the window closed on these episodes: scored by their return so far
        episodes.append(_episode(pool, j, pool.infos[j], truncated=True, cut=True))
    t0 = time.perf_counter()
    pool.reset()  # every env starts its group's next episode; a cut episode ends here (the recorder keeps it as partial)
    env_s += time.perf_counter() - t0
    return Rollout(
        transitions,
        rewards,
        term,
        trunc,
        np.zeros(shape),
        np.zeros(shape),
        np.zeros(shape, dtype=bool),
        np.zeros(N),
        episodes,
        env_s,
        model_s,
        tokens,
        valid_TN=valid,
        cut_N=cut,
    )


def _episode(pool: EnvPool, i: int, sub: dict[str, Any], *, truncated: bool, cut: bool) -> dict[str, Any]:
    return {**pool.summary(i, sub, truncated=truncated), "cut": cut}
