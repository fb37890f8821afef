"""What a reset of a task seen before does (issue #16): no Generator, no Progress, nothing shared with the caller.

The costs are counted (calls of a patched function), never timed; the speed itself is measured by
``benchmarks/bench_peers.py``.
"""

from __future__ import annotations

import copy
import gc
import pickle
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils import seeding as gym_seeding

import agentrl_envs.core.env
from agentrl_envs.core.actions import format_call
from agentrl_envs.core.seeding import DRAW_HIGH
from agentrl_envs.tasks.sampler import clear_task_cache
from tests.conftest import ENV_IDS

IMMUTABLE = (str, int, float, bool, type(None))


def counting(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    """Patch ``owner.name`` with a wrapper that counts its calls; return the counter."""
    calls = [0]
    real = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


def test_a_seeded_reset_builds_no_generator_and_no_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    env = gym.make("AgentRL/SQLPythonSMTP-v1")
    for seed in range(3):  # first resets: tasks generated, starts worked out
        env.reset(seed=seed)
    generators = counting(monkeypatch, gym_seeding, "np_random")
    progresses = counting(monkeypatch, agentrl_envs.core.env, "Progress")
    for i in range(12):
        env.reset(seed=i % 3)
    assert generators[0] == 0 and progresses[0] == 0
    env.np_random.random()  # a reader gets it built, once
    env.np_random.random()
    assert generators[0] == 1
    env.step(format_call("finish", {"answer": "x"}))  # the first step makes the episode's Progress
    assert progresses[0] == 1
    env.close()


def reference(seed: int, draws: int) -> tuple[list[int], np.random.Generator]:
    """What gymnasium's eager ``Env.reset(seed=seed)`` and ``draws`` draws would have given."""
    rng, _ = gym_seeding.np_random(seed)
    return [int(rng.integers(0, DRAW_HIGH)) for _ in range(draws)], rng


@pytest.mark.parametrize("seed", [0, 7, 2**31 + 5, 2**70])
def test_the_lazy_generator_is_the_same_stream(seed: int) -> None:
    env = gym.make("AgentRL/SQL-v0")
    core = env.unwrapped
    env.reset(seed=seed)  # the first reset of this seed fills the table
    env.reset(seed=seed)  # this one is served from it
    (task_seed, fault_seed), rng = reference(seed, 2)
    assert core.task.seed == task_seed and core._backend._lazy_pending[core._episode_id].seed == fault_seed
    assert env.np_random_seed == seed
    assert core._np_random.bit_generator.state == rng.bit_generator.state  # what check_env reads
    assert env.np_random.random() == rng.random()
    # Unbuilt again, then seed=None continues the stream: the third draw is the next task seed.
    env.reset(seed=seed)
    env.reset()
    (*_, next_task_seed, next_fault_seed), rng = reference(seed, 4)
    assert core.task.seed == next_task_seed and core._backend._lazy_pending[core._episode_id].seed == next_fault_seed
    assert env.np_random.bit_generator.state == rng.bit_generator.state
    # options["task_seed"] takes one draw only (the fault seed); the stream goes on from there.
    env.reset(seed=seed, options={"task_seed": 3})
    (fault_seed,), rng = reference(seed, 1)
    assert core._backend._lazy_pending[core._episode_id].seed == fault_seed
    assert env.np_random.integers(0, 1000, size=4).tolist() == rng.integers(0, 1000, size=4).tolist()
    env.close()


def test_a_generator_set_by_hand_wins_and_bad_seeds_are_still_refused() -> None:
    env = gym.make("AgentRL/SQL-v0")
    env.reset(seed=1)
    env.unwrapped.np_random = np.random.default_rng(99)
    expected = np.random.default_rng(99).integers(0, DRAW_HIGH)
    env.reset()
    assert env.unwrapped.task.seed == expected and env.np_random_seed == -1
    for bad in (-1, np.int64(3), "3", 1.5):
        with pytest.raises(gym.error.Error, match="Seed must be"):
            env.reset(seed=bad)
    env.close()


def deep_mutate(value: Any) -> None:
    """Change everything mutable inside ``value`` (as a careless caller might)."""
    if isinstance(value, dict):
        for key in list(value):
            if isinstance(value[key], (dict, list)):
                deep_mutate(value[key])
            else:
                value[key] = "tampered"
        value["added"] = 1
    elif isinstance(value, list):
        for item in value:
            deep_mutate(item)
        value.append("added")


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_mutating_a_reset_info_does_not_reach_the_next_reset(env_id: str) -> None:
    env = gym.make(env_id, candidates=3)
    obs0, info0 = env.reset(seed=4)
    expected = copy.deepcopy(info0)
    tools = info0["tools"]
    for schema in tools:  # the two levels every reset makes afresh (parameters: the env's copy, made once)
        schema["type"] = "tampered"
        schema["function"]["description"] = "tampered"
        schema["function"]["name"] = "tampered"
    tools.append("added")
    for key in ("reward_components", "tool_result", "fault", "candidates"):
        deep_mutate(info0[key])
    info0["task_id"] = "tampered"
    obs1, info1 = env.reset(seed=4)
    assert obs1 == obs0 and info1 == expected
    assert list(info1) == list(expected)  # the key order too
    # The fixed part an env keeps per task holds immutable values only: nothing to share by mistake.
    start, task = env.unwrapped._start_of(env.unwrapped.task.seed)
    assert task is env.unwrapped.task
    mutable = {key: type(value).__name__ for key, value in start.info.items() if not isinstance(value, IMMUTABLE)}
    assert mutable == {}
    env.close()


def test_a_pickled_env_leaves_its_per_task_starts_behind() -> None:
    env = gym.make("AgentRL/SMTP-v0")
    obs, info = env.reset(seed=2)
    clone = pickle.loads(pickle.dumps(env))
    assert clone.unwrapped._starts == {} and env.unwrapped._starts
    assert clone.reset(seed=2) == (obs, info)
    clone.close()
    env.close()


def test_per_task_starts_are_bounded_and_let_go_of_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """An env keeps at most _STARTS_PER_ENV starts, holds their tasks weakly, and resets the same either way."""
    monkeypatch.setattr(agentrl_envs.core.env, "_STARTS_PER_ENV", 2)
    env = gym.make("AgentRL/SQL-v0")
    core = env.unwrapped
    first = [env.reset(seed=s) for s in range(5)]
    assert len(core._starts) <= 2
    assert [env.reset(seed=s) for s in range(5)] == first
    clear_task_cache()  # the process-wide cache lets go of every task: the env's starts must not keep them
    env.reset(seed=0, options={"task_seed": 10**6})  # the current episode no longer holds a task of seeds 0-4
    gc.collect()
    assert all(start.task_ref() is None for seed, start in core._starts.items() if seed != 10**6)
    assert [env.reset(seed=s) for s in range(5)] == first  # made again, the same
    env.close()
