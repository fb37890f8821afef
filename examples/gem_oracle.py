"""Play the oracle through GEM's own ``gem.make`` on an agentrl env, faults on.

    python examples/gem_oracle.py --env AgentRL/SQLPythonSMTP-v1 --episodes 3 --error-profile flaky

Needs ``pip install -e ".[gem]"``. A trainer on GEM would put its policy where ``oracle_action()`` is.
"""

from __future__ import annotations

import argparse

import gem

import agentrl_envs.integrations.gem_env  # noqa: F401  (registers the agentrl ids with gem)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="AgentRL/SQL-v0")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--error-profile", default="flaky")
    args = parser.parse_args()

    env = gem.make(args.env, error_profile=args.error_profile)
    successes = 0
    for seed in range(args.episodes):
        observation, info = env.reset(seed=seed)
        episode_return, steps = 0.0, 0
        while True:
            action = env.env.unwrapped.oracle_action()  # the policy's reply would go here
            observation, reward, terminated, truncated, info = env.step(action)
            episode_return += reward
            steps += 1
            if terminated or truncated:
                break
        successes += bool(info.get("success"))
        last = observation.splitlines()[0][:60] if observation else ""
        print(f"seed {seed}: {steps} steps, return {episode_return:+.2f}, success {info.get('success')}, last: {last!r}")
    env.close()
    print(f"success {successes}/{args.episodes}")


if __name__ == "__main__":
    main()
