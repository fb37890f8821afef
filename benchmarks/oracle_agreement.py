"""What a saved candidates-mode policy learned, measured against the oracle's actions.

For each run folder and split, on ``agentrl-train eval``'s fixed episodes:

- **oracle path**: the env is stepped with the oracle's action (``OracleAgent``), so every policy
  is asked about the same states; at each one, the policy's probability of the oracle's action
  (``p_oracle``), how often it is the policy's top choice (``oracle_top1``; a uniform policy's
  ``argmax`` is the oracle's action 1 time in K), the median gap between the policy's best and
  second candidate in log-probability (``gap_p50``), and the probability of a ``finish`` that is not
  the oracle's action (it ends the episode unsolved), per such candidate, relative to a uniform
  policy's (``early_finish_vs_uniform``: 1.0 = uniform, 0 = never);
- **own path**: the env is stepped with the policy's greedy choice (the rule of ``agentrl-train
  eval``); success, mean episode length, and how often the greedy choice is what the oracle would do
  from that state (``agree``).

A policy can reach a high greedy success with a low ``agree`` when the env lets wrong steps be
repaired (a failed query, a retry) and the policy avoids only the steps that end the episode badly.

Run: ``python benchmarks/oracle_agreement.py RUN [RUN ...] [--episodes 8] [--splits train test]``.
Prints one JSON line per run and split; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

import agentrl_envs  # noqa: E402,F401 - registers the env ids
from agentrl_envs.agents import OracleAgent  # noqa: E402
from agentrl_envs.core.actions import parse_action  # noqa: E402
from agentrl_envs.errors import ActionError, AgentRLError  # noqa: E402
from agentrl_train import evaluate  # noqa: E402
from agentrl_train.episodes import episode_seed  # noqa: E402
from agentrl_train.rollout import candidate_policy, greedy_candidate  # noqa: E402


def policy_logprobs(
    policy: Any, cfg: Any, messages: list[dict[str, str]], tools: Any, cands: list[str]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The candidates-mode policy's log-probs over ``cands`` and the reference model's scores, as ``act`` computes them."""
    prompt = policy.encode_prompt(messages, tools, cfg.ppo.max_prompt_tokens)
    with torch.no_grad():
        _, base, logp = candidate_policy(policy, prompt, [policy.encode_action(c) for c in cands], cfg.ppo)
    return logp, base


def _tool(action: str) -> str | None:
    """The tool a candidate calls, None when it does not parse."""
    try:
        return parse_action(action).name
    except ActionError:
        return None


def play(policy: Any, cfg: Any, split: str, episodes: int, follow_oracle: bool) -> dict[str, Any]:
    env = gym.make(cfg.env.env, split=split, candidates=cfg.env.candidates, **cfg.env.env_kwargs)
    p_oracle: list[float] = []
    top1: list[bool] = []
    gaps: list[float] = []
    p_early_finish: list[float] = []
    agree: list[bool] = []
    success: list[bool] = []
    lengths: list[int] = []
    try:
        for j in range(episodes):
            obs, info = env.reset(seed=episode_seed(evaluate.EVAL_SEED, j, 0))
            oracle = OracleAgent(env)
            messages = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": str(obs)}]
            tools, done, n = info["tools"], False, 0
            while not done:
                gold, cands = oracle.act(obs, info), list(info["candidates"])
                logp, base = policy_logprobs(policy, cfg, messages, tools, cands)
                choice = greedy_candidate(logp, base)
                top = torch.sort(logp, descending=True).values
                gaps.append(float(top[0] - top[1]))
                if gold in cands:
                    p_oracle.append(float(logp[cands.index(gold)].exp()))
                    top1.append(int(torch.argmax(logp)) == cands.index(gold))
                early = [k for k, c in enumerate(cands) if c != gold and _tool(c) == "finish"]
                if early:  # a finish that is not the oracle's ends the episode unsolved
                    p_early_finish.append(float(logp[early].exp().sum()) / len(early) * len(cands))
                agree.append(cands[choice] == gold)
                action = gold if follow_oracle else cands[choice]
                obs, _, terminated, truncated, info = env.step(action)
                messages += [{"role": "assistant", "content": action}, {"role": "tool", "content": str(obs)}]
                done, n = terminated or truncated, n + 1
            success.append(bool(info.get("success")))
            lengths.append(n)
    finally:
        env.close()
    row: dict[str, Any] = {"decisions": len(gaps), "success": statistics.mean(success), "mean_length": statistics.mean(lengths)}
    if follow_oracle:
        row.update(
            p_oracle=statistics.mean(p_oracle),
            oracle_top1=statistics.mean(top1),
            gap_p50=statistics.median(gaps),
            early_finish_vs_uniform=statistics.mean(p_early_finish) if p_early_finish else None,
            oracle_not_a_candidate=len(gaps) - len(p_oracle),
        )
    else:
        row.update(agree=statistics.mean(agree), p_oracle=statistics.mean(p_oracle) if p_oracle else None)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run folders (the --out of agentrl-train ppo, candidates mode)")
    ap.add_argument("--episodes", type=int, default=8, help="episodes per split (default 8)")
    ap.add_argument(
        "--splits", nargs="+", default=["train"], choices=("train", "test", "heldout"), help="splits (default: train)"
    )
    args = ap.parse_args()
    if args.episodes < 1:
        ap.error("--episodes: use a positive number")
    torch.set_num_threads(2)
    for run in args.runs:
        try:
            policy, cfg = evaluate.load_run(run)
        except AgentRLError as exc:
            ap.error(str(exc))
        if cfg.env.mode != "candidates":
            ap.error(f"{run}: a {cfg.env.mode}-mode run; this measures candidates-mode policies")
        policy.eval()
        for split in args.splits:
            oracle_path = play(policy, cfg, split, args.episodes, follow_oracle=True)
            own_path = play(policy, cfg, split, args.episodes, follow_oracle=False)
            print(json.dumps({"run": run, "split": split, "oracle_path": oracle_path, "own_path": own_path}), flush=True)


if __name__ == "__main__":
    main()
