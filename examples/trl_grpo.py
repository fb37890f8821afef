"""TRL GRPO on an agentrl env, on CPU, with nothing downloaded.

The model is a tiny Qwen2 built from a config (random weights) and the tokenizer a byte-level BPE
trained here on env text, with TRL's Qwen 2.5 chat template (TRL parses tool calls for the
templates it knows). Such a model cannot solve tasks: the run shows the plumbing (the env's tools
in the prompt, its reward in TRL's logs as ``rewards/<Env>ForTRL/mean``). Swap in a real
instruction-tuned model (``--model Qwen/Qwen2.5-0.5B-Instruct``) to learn something::

    python examples/trl_grpo.py --env AgentRL/SQL-v0 --steps 2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import gymnasium as gym

import agentrl_envs  # noqa: F401 - registers the envs
from agentrl_envs.integrations.trl import environment_factory, train_dataset

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]


def tiny_tokenizer(env_id: str, vocab_size: int = 1024):  # type: ignore[no-untyped-def]
    """A byte-level BPE trained on the env's instructions, system prompt and tool schemas."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen2_5_chat_template

    env = gym.make(env_id)
    texts = []
    for seed in range(50):
        observation, info = env.reset(seed=seed)
        texts += [observation, info["system_prompt"], json.dumps(info["tools"])]
    env.close()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left"
    )
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


def tiny_model(tokenizer):  # type: ignore[no-untyped-def]
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2ForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(description="TRL GRPO on an agentrl env (tiny model, CPU)")
    parser.add_argument("--env", default="AgentRL/SQL-v0")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rows", type=int, default=8, help="prompt rows (seeds 0..rows-1)")
    parser.add_argument("--completion-tokens", type=int, default=24)
    parser.add_argument("--model", default=None, help="a local model path instead of the tiny random model")
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    import torch
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    if args.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(args.model)
    else:
        tokenizer = tiny_tokenizer(args.env)
        model = tiny_model(tokenizer)
    # TRL wants an output folder even with save_strategy="no": a temporary one, removed at the end
    scratch = None if args.output_dir else tempfile.TemporaryDirectory(prefix="trl-grpo-")
    config = GRPOConfig(
        output_dir=args.output_dir or scratch.name,
        max_steps=args.steps,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=args.completion_tokens,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=config,
        train_dataset=train_dataset(args.env, n=args.rows),
        environment_factory=environment_factory(args.env),
    )
    try:
        trainer.train()
    finally:
        if scratch is not None:
            scratch.cleanup()
    for entry in trainer.state.log_history:
        rewards = {k: v for k, v in entry.items() if k.startswith("rewards/") or k == "reward"}
        if rewards:
            print("env reward:", json.dumps({"step": entry.get("step"), **rewards}), flush=True)


if __name__ == "__main__":
    main()
