"""PPO on an agentrl env in one file: the teaching copy of ``agentrl-train ppo`` (CleanRL style).

It reads top to bottom: make the envs, build the policy (the project's tiny model with a LoRA
adapter and a value head), collect a rollout in candidates mode (each step the policy picks one
of the env's K candidate actions), compute GAE advantages, then run epochs of the clipped PPO
objective on minibatches, and print the training episodes' success rate::

    python examples/ppo_minimal.py --updates 10 --num-envs 8

The last line is ``ppo_minimal result: {...}`` (JSON). The full trainer, ``agentrl_train.train``,
adds what this copy leaves out: vector envs in processes, DDP, exact resume, checkpoints,
evaluation, a KL penalty to the reference policy, schedules, generate mode and group advantages.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import agentrl_envs  # noqa: F401  (registers the AgentRL/* ids)
from agentrl_train.config_io import load_config
from agentrl_train.policy import Policy, build_policy


@dataclass
class Args:
    env_id: str = "AgentRL/SQLPythonSMTP-v1"
    """the env to train on (``agentrl-envs list``)"""
    num_envs: int = 8
    """envs stepped side by side (in this process)"""
    updates: int = 5
    """PPO updates: each is one rollout, then ``epochs`` passes over it"""
    rollout_steps: int = 8
    """steps per env per rollout"""
    candidates: int = 4
    """K candidate actions the env offers per step"""
    epochs: int = 2
    """passes over each rollout"""
    minibatch: int = 16
    """transitions per optimizer step"""
    lr: float = 5e-4
    """AdamW learning rate of the LoRA weights"""
    value_lr: float = 3e-3
    """AdamW learning rate of the value head"""
    gamma: float = 0.99
    """discount"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    clip: float = 0.2
    """PPO ratio clip"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    max_grad_norm: float = 1.0
    """gradient clipping"""
    temperature: float = 0.1
    """policy = softmax((score - reference_weight x reference score) / temperature) over the candidates"""
    reference_weight: float = 0.9
    """share of the base model's own score taken off each candidate's (0: the plain scores)"""
    seed: int = 0
    """seed of the model, the sampling and the env episodes"""
    tiny_pretrain_steps: int = 600
    """pretraining steps of the tiny model (built once, then cached)"""
    tiny_corpus_episodes: int = 240
    """random-policy episodes of the tiny model's pretraining corpus"""


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in dataclasses.fields(Args):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    return Args(**vars(parser.parse_args()))


class Chat:
    """One env's episode as the policy reads it: the chat so far, the tools, the candidates offered."""

    def __init__(self, obs: Any, info: dict[str, Any]) -> None:
        self.messages = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": str(obs)}]
        self.tools, self.candidates = info["tools"], list(info["candidates"])

    def prompt(self, policy: Policy) -> list[int]:
        return policy.encode_prompt(self.messages, self.tools, max_tokens=1536)

    def took(self, action: str, obs: Any, info: dict[str, Any]) -> None:
        self.messages += [{"role": "assistant", "content": action}, {"role": "tool", "content": str(obs)}]
        self.candidates = list(info.get("candidates") or [])


def reference_scores(policy: Policy, prompt: list[int], cand_ids: list[list[int]], args: Args) -> torch.Tensor:
    """The base model's own score of each candidate (the adapter switched off); zeros when unused."""
    if not args.reference_weight:
        return torch.zeros(len(cand_ids), device=policy.device)
    with torch.no_grad(), policy.reference():
        return policy.score_candidates(prompt, cand_ids).scores_K


def policy_logprobs(
    policy: Policy, prompt: list[int], cand_ids: list[list[int]], ref_K: torch.Tensor, args: Args
) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy over the K candidates (log-probs) and the value of the state; with grad unless under no_grad.

    A candidate's score is the mean log-prob of its tokens after the prompt. Taking off a share of
    the base model's score cancels its own preferences (for short candidates, say), so what the
    adapter learns decides.
    """
    out = policy.score_candidates(prompt, cand_ids)
    return torch.log_softmax((out.scores_K - args.reference_weight * ref_K) / args.temperature, dim=-1), out.value


def main() -> dict[str, Any]:
    args = parse_args()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    # -- envs: plain Gymnasium envs in candidates mode, episode e of env k on its own seed --------
    envs = [gym.make(args.env_id, candidates=args.candidates) for _ in range(args.num_envs)]
    episodes_started = [0] * args.num_envs

    def reset(k: int) -> Chat:
        obs, info = envs[k].reset(seed=args.seed * 1_000_003 + k * 10_007 + episodes_started[k])
        episodes_started[k] += 1
        return Chat(obs, info)

    # -- policy: the tiny base model + a fresh LoRA adapter + a value head ------------------------
    model = {"tiny_pretrain_steps": args.tiny_pretrain_steps, "tiny_corpus_episodes": args.tiny_corpus_episodes}
    cfg = load_config(None, {"seed": args.seed, **model})
    policy = build_policy(cfg)
    lora = [p for n, p in policy.trainable_parameters() if not n.startswith("value_head")]
    assert policy.value_head is not None
    optimizer = torch.optim.AdamW(
        [{"params": lora, "lr": args.lr}, {"params": list(policy.value_head.parameters()), "lr": args.value_lr}],
        weight_decay=0.0,
    )

    chats = [reset(k) for k in range(args.num_envs)]
    returns_N = [0.0] * args.num_envs  # each env's return so far in its episode
    T, N = args.rollout_steps, args.num_envs
    history: list[dict[str, float]] = []
    all_finished: list[dict[str, float]] = []  # every episode that ended, for the result
    for update in range(1, args.updates + 1):
        t0 = time.perf_counter()
        # -- rollout: T steps of every env with the sampling policy (no grad) -------------------
        policy.eval()
        prompts: list[list[int]] = []  # flat index t * N + k
        cand_ids: list[list[list[int]]] = []
        refs: list[torch.Tensor] = []
        actions_TN, logprobs_TN = np.zeros((T, N), dtype=int), np.zeros((T, N))
        values_TN, rewards_TN, ended_TN = np.zeros((T, N)), np.zeros((T, N)), np.zeros((T, N))
        finished: list[dict[str, float]] = []
        for t in range(T):
            for k, chat in enumerate(chats):
                prompt = chat.prompt(policy)
                cands = [policy.encode_action(c) for c in chat.candidates]
                ref_K = reference_scores(policy, prompt, cands, args)
                with torch.no_grad():
                    logp_K, value = policy_logprobs(policy, prompt, cands, ref_K, args)
                a = int(torch.multinomial(logp_K.exp().cpu(), 1))
                obs, reward, terminated, truncated, info = envs[k].step(chat.candidates[a])
                prompts.append(prompt)
                cand_ids.append(cands)
                refs.append(ref_K)
                returns_N[k] += float(reward)
                actions_TN[t, k], logprobs_TN[t, k], values_TN[t, k] = a, float(logp_K[a]), float(value)
                rewards_TN[t, k] = float(reward)
                # this copy treats a truncated episode as ended (the trainer bootstraps it from V)
                ended_TN[t, k] = float(terminated or truncated)
                if terminated or truncated:
                    finished.append({"return": returns_N[k], "success": float(info.get("success", False))})
                    chats[k], returns_N[k] = reset(k), 0.0
                else:
                    chat.took(chat.candidates[a], obs, info)
        with torch.no_grad():  # V of the state each env is in after the rollout
            next_values_N = np.array([float(policy.value(chat.prompt(policy))) for chat in chats])

        # -- advantages: GAE, backwards through the rollout -------------------------------------
        advantages_TN = np.zeros((T, N))
        last_gae_N = np.zeros(N)
        for t in reversed(range(T)):
            next_v = next_values_N if t == T - 1 else values_TN[t + 1]
            not_ended = 1.0 - ended_TN[t]
            delta = rewards_TN[t] + args.gamma * next_v * not_ended - values_TN[t]
            last_gae_N = delta + args.gamma * args.gae_lambda * not_ended * last_gae_N
            advantages_TN[t] = last_gae_N
        returns_TN = advantages_TN + values_TN
        b_adv = advantages_TN.reshape(-1)
        b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)  # whitened over the whole batch
        b_ret, b_logp, b_act = returns_TN.reshape(-1), logprobs_TN.reshape(-1), actions_TN.reshape(-1)

        # -- update: epochs of the clipped PPO objective on minibatches -------------------------
        policy.train()
        clipfracs, pg_losses, v_losses = [], [], []
        for _epoch in range(args.epochs):
            order = rng.permutation(T * N)
            for start in range(0, T * N, args.minibatch):
                mb = order[start : start + args.minibatch]
                loss = torch.zeros((), device=policy.device)
                for j in mb:
                    logp_K, value = policy_logprobs(policy, prompts[j], cand_ids[j], refs[j], args)
                    ratio = (logp_K[int(b_act[j])] - float(b_logp[j])).exp()
                    adv = float(b_adv[j])
                    pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - args.clip, 1 + args.clip))
                    v_loss = 0.5 * (value - float(b_ret[j])) ** 2
                    entropy = -(logp_K.exp() * logp_K).sum()
                    loss = loss + (pg_loss + args.vf_coef * v_loss - args.ent_coef * entropy) / len(mb)
                    clipfracs.append(float((ratio - 1).abs() > args.clip))
                    pg_losses.append(float(pg_loss.detach()))
                    v_losses.append(float(v_loss.detach()))
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_([p for _, p in policy.trainable_parameters()], args.max_grad_norm)
                optimizer.step()

        row = {
            "update": update,
            "episodes": len(finished),
            "return": float(np.mean([e["return"] for e in finished])) if finished else float("nan"),
            "success": float(np.mean([e["success"] for e in finished])) if finished else float("nan"),
            "reward_per_step": float(rewards_TN.mean()),
            "pg_loss": float(np.mean(pg_losses)),
            "v_loss": float(np.mean(v_losses)),
            "clipfrac": float(np.mean(clipfracs)),
            "seconds": time.perf_counter() - t0,
        }
        history.append(row)
        all_finished += finished
        print(
            f"update {update}/{args.updates}  episodes {row['episodes']:3d}  success {row['success']:.2f}  "
            f"reward/step {row['reward_per_step']:+.3f}  pg {row['pg_loss']:+.3f}  vf {row['v_loss']:.3f}  "
            f"clipfrac {row['clipfrac']:.2f}  {row['seconds']:.1f} s",
            flush=True,
        )
    for env in envs:
        env.close()
    success = float(np.mean([e["success"] for e in all_finished])) if all_finished else None
    result = {
        "updates": args.updates,
        "env_steps": args.updates * T * N,
        "episodes": len(all_finished),
        "success": success,  # over every episode that ended (None: none did)
        "last_pg_loss": history[-1]["pg_loss"] if history else None,
        "last_v_loss": history[-1]["v_loss"] if history else None,
    }
    print("ppo_minimal result: " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
