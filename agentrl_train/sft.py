"""Behaviour cloning: the LoRA policy trained on oracle transcripts (only the assistant's tokens in the loss).

The usual warm start before PPO in ``generate`` mode: ``agentrl-train sft --env AgentRL/SQL-v0`` then
``agentrl-train ppo --mode generate --init-adapter runs/sft/final``. The loss is the mean negative
log-likelihood over the assistant tokens of each optimizer step's episodes (a global token count, so
the batch split does not change the update).
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import agentrl_envs  # noqa: F401  (registers the ids)
from agentrl_envs.agents import OracleAgent
from agentrl_envs.errors import ConfigError
from agentrl_train import evaluate
from agentrl_train.config import TrainConfig, dump_config, make_run_dir
from agentrl_train.rollout import episode_seed

__all__ = ["oracle_transcripts", "sft"]

SFT_SEED = 2_000_003  #: transcripts use seeds disjoint from PPO and evaluation episodes


def oracle_transcripts(
    env_id: str, episodes: int, split: str, make_kwargs: dict[str, Any]
) -> list[tuple[list[dict[str, str]], Any]]:
    """``episodes`` oracle-solved episodes as (chat messages, tools)."""
    if env_id not in gym.registry:
        raise ConfigError(f"--env {env_id!r}: no such env id; see `agentrl-envs list`")
    env = gym.make(env_id, split=split, **make_kwargs)
    out = []
    try:
        for j in range(episodes):
            obs, info = env.reset(seed=episode_seed(SFT_SEED, j, 0))
            agent = OracleAgent(env)
            messages = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": str(obs)}]
            tools = info["tools"]
            done = False
            while not done:
                action = agent.act(obs, info)
                obs, _, term, trunc, info = env.step(action)
                messages += [{"role": "assistant", "content": action}, {"role": "tool", "content": str(obs)}]
                done = term or trunc
            out.append((messages, tools))
    finally:
        env.close()
    return out


def sft(cfg: TrainConfig, log: Any = print) -> dict[str, Any]:
    """Train ``cfg.model.adapter`` on oracle transcripts of ``cfg.env.env``; writes ``final/`` and an eval table."""
    from agentrl_train.train import build_policy, check_env_id, check_env_kwargs, check_error_profile

    check_env_id(cfg.env.env)  # before building a model: a typo should fail in a second
    check_env_kwargs(cfg.env.env, cfg.env.env_kwargs)
    check_error_profile(cfg.env.error_profile)  # it failed after the model was built and the run folder made
    out = make_run_dir(cfg)
    dump_config(cfg, out / "config.yaml")
    random.seed(cfg.run.seed)
    np.random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    policy = build_policy(cfg, log=log)
    kwargs = {"error_profile": cfg.env.error_profile, **cfg.env.env_kwargs}
    data = []
    for messages, tools in oracle_transcripts(cfg.env.env, cfg.sft.episodes, cfg.env.split, kwargs):
        ids, mask = policy.encode_episode(messages, tools)
        data.append((ids[-cfg.ppo.max_prompt_tokens :], mask[-cfg.ppo.max_prompt_tokens :]))
    params = [p for n, p in policy.trainable_parameters() if not n.startswith("value_head")]
    opt = torch.optim.AdamW(params, lr=cfg.sft.sft_lr, weight_decay=0.0)
    rng = np.random.default_rng(cfg.run.seed)
    rows = []
    policy.train()
    step = 0
    for epoch in range(cfg.sft.sft_epochs):
        order = rng.permutation(len(data))
        for b in range(0, len(order), cfg.sft.sft_batch):
            batch = [data[j] for j in order[b : b + cfg.sft.sft_batch]]
            n_tokens = sum(sum(m) for _, m in batch)
            loss_total = 0.0
            for ids, mask in batch:
                t = torch.tensor([ids], device=policy.device)
                hidden = policy.causal.model(input_ids=t).last_hidden_state[0, :-1]
                m = torch.tensor(mask[1:], device=policy.device)
                lp, _ = policy._logprobs(hidden[m], t[0, 1:][m])
                loss = -lp.sum() / max(n_tokens, 1)
                loss.backward()
                loss_total += float(loss.detach())
            if not math.isfinite(loss_total):  # the weights diverged: saving them would hand PPO a NaN adapter
                _diverged(out, rows, cfg, f"at step {step + 1} (epoch {epoch}) the loss is {loss_total}")
            torch.nn.utils.clip_grad_norm_(params, cfg.ppo.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            rows.append({"epoch": epoch, "step": step, "loss": loss_total})
            if step % 10 == 0:
                log(f"sft epoch {epoch} step {step} loss {loss_total:.4f}")
    if not all(bool(torch.isfinite(p).all()) for p in params):  # the last step can diverge with every loss finite
        _diverged(out, rows, cfg, f"after step {step} the adapter's weights are not finite")
    policy.eval()
    policy.save(out / "final")
    dump_config(cfg, out / "final" / "config.yaml")
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = evaluate.final_eval(policy, cfg, out, log)
    return {"steps": step, "final_loss": rows[-1]["loss"] if rows else None, "eval": table}


def _diverged(out: Any, rows: list[dict[str, Any]], cfg: TrainConfig, what: str) -> None:
    """Stop a diverged run: its metrics so far are written, final/ is left as it was."""
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raise ConfigError(
        f"sft diverged: {what}; lower --sft-lr (now {cfg.sft.sft_lr:g}, default 0.001), --lora-alpha-ratio "
        f"(now {cfg.model.lora_alpha_ratio:g}, default 2) or --grad-clip (now {cfg.ppo.grad_clip:g}); final/ was not "
        f"written (the losses so far are in {out / 'metrics.jsonl'})"
    )
