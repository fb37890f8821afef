"""Evaluate a model on an agentrl env with verifiers' own ``vf-eval``, faults on.

    python examples/verifiers_eval.py --env AgentRL/SQL-v0 --num-tasks 4 --error-profile flaky
    python examples/verifiers_eval.py --base-url http://127.0.0.1:8000/v1 --model my-model   # a real endpoint

Needs ``pip install -e ".[verifiers]"``. Without ``--base-url`` it serves the env's oracle as a scripted
OpenAI-compatible model on a loopback port (:class:`~agentrl_envs.integrations.oracle_chat.OracleChat`),
so the run needs no model. The taskset is the Environments Hub package in environments/agentrl_env
(``pip install -e environments/agentrl_env``; a checkout works without it, see below). Each rollout's
reward is the episode's return; the reward components are metrics.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

from verifiers.v1.cli.eval.main import main as vf_eval

from agentrl_envs.integrations.oracle_chat import OracleChat
from agentrl_envs.testing import free_port, serve_in_thread

HUB_PACKAGE = Path(__file__).resolve().parents[1] / "environments" / "agentrl_env"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="AgentRL/SQL-v0")
    parser.add_argument("--num-tasks", type=int, default=4)
    parser.add_argument("--error-profile", default="flaky")
    parser.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint (.../v1); default: the scripted oracle")
    parser.add_argument("--model", default="oracle")
    args = parser.parse_args()

    try:
        import agentrl_env  # noqa: F401
    except ImportError:  # a checkout without `pip install -e environments/agentrl_env`
        sys.path.insert(0, str(HUB_PACKAGE))

    with contextlib.ExitStack() as stack:
        base_url = args.base_url
        if base_url is None:
            oracle = OracleChat(args.env, range(args.num_tasks), error_profile=args.error_profile)
            base_url = stack.enter_context(serve_in_thread(oracle.app(), free_port())) + "/v1"
        out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vf-eval-")))
        vf_eval(
            [
                "agentrl-env",
                *("--env.taskset.env-id", args.env, "--env.taskset.num-tasks", str(args.num_tasks)),
                *("--env.taskset.make-kwargs", json.dumps({"error_profile": args.error_profile})),
                *("--env.agent.runtime.type", "subprocess"),
                *("--model", args.model, "--client.base-url", base_url, "--client.api-key-var", "AGENTRL_EXAMPLE_API_KEY"),
                *("--no-rich", "--no-push", "--output-dir", str(out)),
            ]
        )
        traces = [json.loads(line) for path in out.rglob("traces.jsonl") for line in path.read_text().splitlines() if line]
        rows = [trace for record in traces for trace in record.get("traces", [record])]
        for trace in rows:
            metrics = trace["metrics"]
            components = ", ".join(f"{k[7:]} {v:+.2f}" for k, v in metrics.items() if k.startswith("reward_"))
            reward = sum(r["score"] * r["weight"] for r in trace["rewards"].values() if r)
            print(f"seed {trace['task']['data']['seed']}: reward {reward:+.2f} ({components}), success {metrics['success']:.0f}")
        print(f"success {sum(int(t['metrics']['success']) for t in rows)}/{len(rows)}")


if __name__ == "__main__":
    main()
