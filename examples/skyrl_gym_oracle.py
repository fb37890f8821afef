"""Play the oracle through SkyRL-Gym's own ``skyrl_gym.make`` / ``init`` / ``step`` on an agentrl env, faults on.

    python examples/skyrl_gym_oracle.py --env AgentRL/SQLPythonSMTP-v1 --episodes 3 --error-profile flaky

Needs ``pip install -e ".[skyrl]"``. SkyRL's generator makes one env per dataset row the same way:
``env_class`` is the agentrl id, ``env_extras`` holds the row's ``seed``, and the trainer config's
``environment.skyrl_gym["AgentRL/..."]`` section holds ``gym.make`` arguments such as ``error_profile``.
"""

from __future__ import annotations

import argparse

import skyrl_gym

import agentrl_envs.integrations.skyrl_gym_env  # noqa: F401  (registers the agentrl ids with skyrl_gym)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="AgentRL/SQL-v0")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--error-profile", default="flaky")
    args = parser.parse_args()

    successes = 0
    for seed in range(args.episodes):
        env = skyrl_gym.make(args.env, env_config={"error_profile": args.error_profile}, extras={"seed": seed})
        chat, _ = env.init([])  # [system prompt with the tools, instruction]: what the policy reads
        while True:
            action = env.env.unwrapped.oracle_action()  # the policy's reply to `chat` would go here
            out = env.step(action)
            chat += [{"role": "assistant", "content": action}, *out["observations"]]
            if out["done"]:
                break
        metrics = env.get_metrics()
        env.close()
        successes += bool(metrics["success"])
        print(f"seed {seed}: {metrics['steps']} steps, return {metrics['return']:+.2f}, success {bool(metrics['success'])}")
    print(f"success {successes}/{args.episodes}")


if __name__ == "__main__":
    main()
