"""Behaviour cloning: the LoRA policy trained on oracle transcripts (only the assistant's tokens in the loss).

The usual warm start before PPO in ``generate`` mode: ``agentrl-train sft --env AgentRL/SQL-v0`` then
``agentrl-train ppo --mode generate --init-adapter runs/sft/final``. The loss is the mean negative
log-likelihood over the assistant tokens of each optimizer step's episodes (a global token count, so
the batch split does not change the update).

A transcript longer than ``--max-prompt-tokens`` is cut as the policy's prompts are
(:meth:`~agentrl_train.chat_codec.ChatCodec.encode_prompt`): the system prompt, tools and instruction are
always kept and whole turns go, never part of one. Rather than lose the early turns, it becomes
several sequences (:func:`encode_transcript`), so every oracle action is trained on exactly once.
"""

from __future__ import annotations

import json
import math
import random
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import agentrl_envs  # noqa: F401  (registers the ids)
from agentrl_envs.agents import OracleAgent
from agentrl_envs.errors import ConfigError
from agentrl_train import evaluate
from agentrl_train.config import TrainConfig
from agentrl_train.config_io import dump_config, make_run_dir
from agentrl_train.episodes import episode_seed

__all__ = ["encode_transcript", "oracle_transcripts", "sft"]

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


def encode_transcript(
    policy: Any, messages: list[dict[str, str]], tools: Any, max_tokens: int
) -> list[tuple[list[int], list[bool]]]:
    """A transcript as token sequences of at most ``max_tokens``, each with its loss mask; usually one.

    Every sequence starts with the head (the messages before the first assistant turn: the system
    prompt with the tools, and the instruction) and holds whole turns after it, ending on an assistant
    turn (a trailing tool reply is in no loss). When the whole transcript does not fit, its assistant
    turns are cut into consecutive runs, each run one sequence: head, then the turn before the run
    (its action and tool reply, as context outside the loss) when it fits, then the run. The mask is
    True on the tokens of the run's assistant turns, so each assistant turn is in exactly one mask.

    Raises:
        ConfigError: naming ``--max-prompt-tokens`` when the head, or the head and one oracle action,
            do not fit.
    """
    asst = [j for j, msg in enumerate(messages) if msg["role"] == "assistant"]
    if not asst:
        return []
    head = messages[: asst[0]]

    def window(c: int, m: int, k: int) -> tuple[list[int], list[bool]]:
        """Context turns ``c..m-1`` (out of the loss), then assistant turns ``m..k`` in the loss."""
        ids, mask = policy.encode_episode(head + messages[asst[c] : asst[k] + 1], tools)
        runs = [j for j in range(len(mask)) if mask[j] and (j == 0 or not mask[j - 1])]  # where each turn's span starts
        if len(runs) != k - c + 1:  # two turns' spans ran together: which tokens are whose is unknown
            raise ConfigError("the chat template leaves no token between assistant turns; cannot mask them for SFT")
        if c < m:  # the context turns' spans leave the mask
            mask = [False] * runs[m - c] + mask[runs[m - c] :]
        return ids, mask

    last = len(asst) - 1
    whole = window(0, 0, last)
    if len(whole[0]) <= max_tokens:
        return [whole]
    out: list[tuple[list[int], list[bool]]] = []
    m = 0
    while m <= last:
        c, best = m, window(m, m, m)
        if m > 0:
            with_context = window(m - 1, m, m)
            if len(with_context[0]) <= max_tokens:
                c, best = m - 1, with_context
        if len(best[0]) > max_tokens:
            head_len = len(policy.encode_episode(head, tools)[0])
            what = (
                f"the system prompt, tools and instruction alone take {head_len} tokens"
                if head_len >= max_tokens
                else f"the system prompt, tools, instruction and oracle action {m + 1} take {len(best[0])} tokens"
            )
            raise ConfigError(
                f"--max-prompt-tokens={max_tokens}: {what}, and SFT never cuts them; raise --max-prompt-tokens "
                f"to at least {max(len(best[0]), head_len + 1)}"
            )
        k = m
        while k < last:
            longer = window(c, m, k + 1)
            if len(longer[0]) > max_tokens:
                break
            k, best = k + 1, longer
        out.append(best)
        m = k + 1
    return out


def sft(cfg: TrainConfig, log: Any = print) -> dict[str, Any]:
    """Train ``cfg.model.adapter`` on oracle transcripts of ``cfg.env.env``; writes ``final/`` and an eval table."""
    from agentrl_train.env_checks import check_env_config
    from agentrl_train.policy import build_policy

    check_env_config(cfg.env)  # before building a model or the run folder: a typo should fail in a second
    out = make_run_dir(cfg)
    dump_config(cfg, out / "config.yaml")
    random.seed(cfg.run.seed)
    np.random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    policy = build_policy(cfg, log=log)
    kwargs = {"error_profile": cfg.env.error_profile, **cfg.env.env_kwargs}
    data = [
        encode_transcript(policy, messages, tools, cfg.ppo.max_prompt_tokens)
        for messages, tools in oracle_transcripts(cfg.env.env, cfg.sft.episodes, cfg.env.split, kwargs)
    ]
    n_seqs = sum(len(seqs) for seqs in data)
    steps_total = cfg.sft.sft_epochs * math.ceil(len(data) / cfg.sft.sft_batch)
    log(
        f"sft: {len(data)} oracle transcripts of {cfg.env.env} ({cfg.env.split}) as {n_seqs} sequences of at most "
        f"--max-prompt-tokens={cfg.ppo.max_prompt_tokens} ({n_seqs - len(data)} extra from long transcripts), "
        f"{steps_total} optimizer steps"
    )
    params = [p for n, p in policy.trainable_parameters() if not n.startswith("value_head")]
    opt = torch.optim.AdamW(params, lr=cfg.sft.sft_lr, weight_decay=0.0)
    rng = np.random.default_rng(cfg.run.seed)
    rows: list[dict[str, Any]] = []
    bar = _Bar(steps_total) if cfg.run.progress else None
    policy.train()
    step = 0
    causal: Any = policy.causal  # the transformers model under the adapters (untyped attributes)
    try:
        for epoch in range(cfg.sft.sft_epochs):
            order = rng.permutation(len(data))
            for b in range(0, len(order), cfg.sft.sft_batch):
                t_step = time.perf_counter()
                batch = [seq for j in order[b : b + cfg.sft.sft_batch] for seq in data[j]]
                n_tokens = sum(sum(m) for _, m in batch)
                loss_total = 0.0
                for ids, mask in batch:
                    t = torch.tensor([ids], device=policy.device)
                    hidden = causal.model(input_ids=t, use_cache=False).last_hidden_state[0, :-1]
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
                tokens = sum(len(ids) for ids, _ in batch)
                tokens_per_s = tokens / max(time.perf_counter() - t_step, 1e-9)
                rows.append(
                    {"epoch": epoch, "step": step, "loss": loss_total, "tokens": tokens, "tokens_per_s": round(tokens_per_s, 1)}
                )
                if bar is not None:
                    bar.update(loss_total, tokens_per_s)
                else:
                    log(f"sft step {step}/{steps_total} epoch {epoch} loss {loss_total:.4f} {tokens_per_s:.0f} tokens/s")
    finally:
        if bar is not None:
            bar.close()
    if not all(bool(torch.isfinite(p).all()) for p in params):  # the last step can diverge with every loss finite
        _diverged(out, rows, cfg, f"after step {step} the adapter's weights are not finite")
    policy.eval()
    policy.save(out / "final")
    dump_config(cfg, out / "final" / "config.yaml")
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if cfg.run.final_eval_splits:
        log(f"final evaluation: greedy, {cfg.run.eval_episodes} episodes per split")
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


class _Bar:
    """A tqdm bar of optimizer steps showing the last step's loss and tokens/s (``--no-progress``: none)."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc="sft", unit="step", dynamic_ncols=True)

    def update(self, loss: float, tokens_per_s: float) -> None:
        self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:.0f}", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
