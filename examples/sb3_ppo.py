"""Stable-Baselines3 PPO on the candidates view of an agentrl env, on CPU.

:class:`~agentrl_envs.wrappers.candidates_discrete.CandidatesDiscrete` turns ``candidates=K`` into ``Discrete(K)``
actions and a fixed-size hashed n-gram observation; SB3's ``check_env`` passes on it and
``make_vec_env`` vectorizes it. The script checks the env, trains, then evaluates the policy
against the random-candidate and overlap baselines on the same seeds::

    python examples/sb3_ppo.py --env AgentRL/SQL-v0 --timesteps 4096
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np

import agentrl_envs  # noqa: F401 - registers the envs
from agentrl_envs.agents import OverlapAgent, RandomCandidateAgent
from agentrl_envs.wrappers.candidates_discrete import CandidatesDiscrete


def evaluate(env: CandidatesDiscrete, choose, episodes: int, seed: int) -> float:  # type: ignore[no-untyped-def]
    """Success rate of ``choose(features, text_observation, info) -> index`` over seeds seed..seed+episodes-1."""
    solved = 0
    for i in range(episodes):
        features, info = env.reset(seed=seed + i)
        done = False
        while not done:
            features, _, terminated, truncated, info = env.step(choose(features, info["observation_text"], info))
            done = terminated or truncated
        solved += bool(info["success"])
    return solved / episodes


def main() -> None:
    parser = argparse.ArgumentParser(description="SB3 PPO on the candidates view (CPU)")
    parser.add_argument("--env", default="AgentRL/SQL-v0")
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--difficulty", default="easy", choices=("easy", "hard"))
    parser.add_argument("--timesteps", type=int, default=4096)
    parser.add_argument("--n-envs", type=int, default=2)
    parser.add_argument("--eval-episodes", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from stable_baselines3 import PPO
    from stable_baselines3.common.env_checker import check_env
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger

    kwargs = {"candidates": args.candidates, "candidates_difficulty": args.difficulty, "render_mode": None}
    probe = CandidatesDiscrete(gym.make(args.env, **kwargs))
    check_env(probe, warn=True)
    print("sb3 check_env: ok", flush=True)

    vec = make_vec_env(args.env, n_envs=args.n_envs, seed=args.seed, wrapper_class=CandidatesDiscrete, env_kwargs=kwargs)
    model = PPO("MlpPolicy", vec, n_steps=256, batch_size=128, n_epochs=4, learning_rate=3e-4, seed=args.seed, verbose=0)
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default makes an empty /tmp/SB3-<time> per learn()
    model.learn(total_timesteps=args.timesteps)
    vec.close()

    eval_seed = 10_000  # unseen by training (make_vec_env seeds from args.seed)
    overlap, rand = OverlapAgent(seed=0), RandomCandidateAgent(seed=0)
    result = {
        "env": args.env,
        "difficulty": args.difficulty,
        "timesteps": args.timesteps,
        "ppo": evaluate(probe, lambda f, t, i: int(model.predict(f, deterministic=True)[0]), args.eval_episodes, eval_seed),
        "random": evaluate(probe, lambda f, t, i: rand.choose(t, i), args.eval_episodes, eval_seed),
        "overlap": evaluate(probe, lambda f, t, i: overlap.choose(t, i), args.eval_episodes, eval_seed),
    }
    probe.close()
    print("sb3 result:", json.dumps(result), flush=True)
    assert np.isfinite(result["ppo"])


if __name__ == "__main__":
    main()
