"""TRL's GRPOTrainer on agentrl's models: shared by ``leaderboard.py`` and ``bench_train.py``.

The model and tokenizer are ``agentrl-train --model``'s: ``tiny`` (built once and cached by
:func:`agentrl_train.tiny.build_tiny`), ``smollm2-135m`` or a local folder (resolved by
:func:`agentrl_train.models.resolve_model`); nothing is downloaded. Only the chat template changes, to
TRL's Qwen 2.5 template: TRL parses tool calls only for templates it knows, and it renders the Hermes
``<tool_call>`` convention of agentrl's own tools template (both ChatML). ``tiny`` is trained in full,
as before; any other model through LoRA with agentrl's preset (``--lora-preset``), or from a saved
adapter (``adapter``: e.g. an SFT run's ``final/exec``), trainable. The env plugs in through
:func:`agentrl_envs.integrations.trl.environment_factory`, subclassed here only to count env steps
(tool calls that reached the env) and episodes.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["model_for_trl", "tiny_for_trl", "train_grpo"]


def tiny_for_trl() -> tuple[Any, Any]:
    """The cached tiny model (``agentrl-train --model tiny``) and its tokenizer with TRL's Qwen 2.5 template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from agentrl_train.tiny import build_tiny

    path = build_tiny()
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    tokenizer.chat_template = qwen2_5_chat_template
    return AutoModelForCausalLM.from_pretrained(path), tokenizer


def model_for_trl(model: str = "tiny", adapter: str | None = None, lora_preset: str = "small") -> tuple[Any, Any, Any]:
    """``(model, tokenizer, peft_config)`` for GRPOTrainer: ``tiny`` in full (no peft config); another model
    with a fresh LoRA adapter of ``lora_preset`` (its peft config), or with ``adapter`` loaded trainable."""
    if model == "tiny" and adapter is None:
        lm, tokenizer = tiny_for_trl()
        return lm, tokenizer, None
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from agentrl_train.lora import lora_config, lora_targets
    from agentrl_train.models import resolve_model

    path = resolve_model(model, log=lambda *a: None)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    tokenizer.chat_template = qwen2_5_chat_template
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if adapter is not None:
        return PeftModel.from_pretrained(lm, adapter, is_trainable=True), tokenizer, None
    return lm, tokenizer, lora_config(lora_targets(lm, lora_preset))


def counted_factory(env_id: str, counts: dict[str, int], **make_kwargs: Any) -> type:
    """:func:`environment_factory` whose instances add their env steps and episodes to ``counts``."""
    from agentrl_envs.integrations.trl import environment_factory

    base = environment_factory(env_id, **make_kwargs)

    def reset(self: Any, **row: Any) -> str:
        counts["episodes"] += 1
        return str(base.reset(self, **row))

    def step(self: Any, name: str, arguments: dict[str, Any]) -> str:
        counts["env_steps"] += 0 if self.done else 1
        return str(base._step(self, name, arguments))

    return type(base.__name__, (base,), {"reset": reset, "_step": step, "__doc__": base.__doc__})


def train_grpo(
    env_id: str,
    *,
    steps: int,
    max_new_tokens: int,
    prompts: int = 4,
    generations: int = 2,
    seed: int = 0,
    save_to: Path | None = None,
    threads: int = 1,
    model: str = "tiny",
    adapter: str | None = None,
    lora_preset: str = "small",
) -> dict[str, Any]:
    """Train ``model`` (:func:`model_for_trl`) with GRPO for ``steps`` optimizer steps of ``prompts x generations`` episodes.

    Each episode's completion may hold up to the env's step limit of tool calls, ``max_new_tokens``
    tokens per call on average (TRL's budget is per episode, tool results included).

    Returns:
        ``wall_s`` (of ``trainer.train()``), ``env_steps``, ``episodes``, ``mean_reward`` (the env's
        return, TRL's log) and ``log`` (TRL's log history).
    """
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import gymnasium as gym
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from agentrl_envs.integrations.trl import train_dataset

    torch.set_num_threads(threads)  # as agentrl's trainer on CPU: one intra-op thread
    torch.manual_seed(seed)
    probe = gym.make(env_id)
    max_steps = max(int(probe.reset(seed=seed + i)[1]["max_steps"]) for i in range(steps * prompts))
    probe.close()
    lm, tokenizer, peft_config = model_for_trl(model, adapter, lora_preset)
    counts = {"env_steps": 0, "episodes": 0}
    out = save_to or Path(tempfile.mkdtemp(prefix="trl-grpo-"))
    config = GRPOConfig(
        output_dir=str(out.parent / (out.name + "-trainer")),
        max_steps=steps,
        per_device_train_batch_size=prompts * generations,
        num_generations=generations,
        max_completion_length=max_new_tokens * max_steps,
        max_tool_calling_iterations=max_steps,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=lm,
        processing_class=tokenizer,
        peft_config=peft_config,
        args=config,
        train_dataset=train_dataset(env_id, n=steps * prompts, seed=seed),
        environment_factory=counted_factory(env_id, counts),
    )
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    rewards = [v for e in trainer.state.log_history for k, v in e.items() if k.startswith("rewards/") and k.endswith("/mean")]
    if save_to is not None:
        save_to.mkdir(parents=True, exist_ok=True)
        trainer.model.save_pretrained(save_to)
        tokenizer.save_pretrained(save_to)
    return {
        "wall_s": wall,
        "env_steps": counts["env_steps"],
        "episodes": counts["episodes"],
        "mean_reward": sum(rewards) / len(rewards) if rewards else float("nan"),
        "log": trainer.state.log_history,
    }
