"""``--model tiny``: a small Qwen2-style causal LM built from a config and pretrained locally on env text.

Nothing is downloaded. :func:`build_tiny` (cached by its settings, under ``$AGENTRL_CACHE`` or
``~/.cache/agentrl``) does three things:

1. **Corpus.** Episodes of the train split of the four envs (``candidates=4``). Each step the text
   shows a uniformly random *wrong* candidate as the assistant's call; half the steps the env is
   moved on by the oracle instead (so later stages of a task, their observations and their wrong
   candidates appear), but the oracle's action is never written. The corpus holds instructions,
   observations and plausible-but-wrong calls, never an oracle action. Rendered with the chat
   template below.
2. **Tokenizer.** A byte-level BPE trained on that corpus (``tokenizers``), with the special tokens
   ``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``, ``<tool_call>`` and ``</tool_call>`` (one token
   each, so generation can stop on ``</tool_call>``), and a chat template that renders ``tools`` (names
   and arguments; Hermes/Qwen ``<tool_call>`` convention) and marks assistant tokens with
   ``{% generation %}`` (``return_assistant_tokens_mask``).
3. **Model.** ``Qwen2ForCausalLM`` from a config (hidden 128, 2 layers), trained as a plain causal LM
   for ``pretrain_steps`` steps on random windows of the corpus. Whatever it learns about *which*
   call is right comes from RL, not from this step.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl_train.model_cache import cache_root, cached_folder, save_model

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "TinySpec", "build_tiny", "cache_root", "corpus_texts"]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]

CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' %}{%- set sys = messages[0]['content'] %}"
    "{%- set rest = messages[1:] %}{%- else %}{%- set sys = '' %}{%- set rest = messages %}{%- endif %}"
    "<|im_start|>system\n{{ sys }}"
    "{%- if tools %}\nTools:"
    "{%- for t in tools %}\n- {{ t['function']['name'] }}({{ t['function']['parameters']['properties'] | list | join(', ') }})"
    "{%- endfor %}{%- endif %}<|im_end|>\n"
    "{%- for m in rest %}"
    "{%- if m['role'] == 'assistant' %}<|im_start|>assistant\n{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}\n"
    "{%- else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


@dataclass(frozen=True)
class TinySpec:
    """Settings of the tiny model; the cache key is their hash."""

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 2
    num_heads: int = 4
    max_positions: int = 4096
    corpus_episodes: int = 240
    pretrain_steps: int = 600
    seq_len: int = 512
    batch_size: int = 8
    lr: float = 3e-3
    seed: int = 0
    version: int = 1

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def build_tiny(spec: TinySpec | None = None, *, log: Any = print) -> Path:
    """Build (once) and return the folder of the tiny model: ``config.json``, weights, tokenizer.

    Concurrent callers (parallel tests, DDP ranks) wait on a file lock; the folder appears atomically,
    only once it loads, and a cached folder that does not load is rebuilt (:mod:`agentrl_train.model_cache`).
    The pretraining runs on one torch thread whatever the caller's setting (which is given back): with
    more, CPU kernels split some sums (bias and embedding gradients) across threads and the weights
    would depend on the machine's core count. So every machine builds the same bytes.
    """
    spec = spec or TinySpec()
    return cached_folder(f"tiny-{spec.key()}", lambda tmp: _build(spec, tmp, log), log=log)


def corpus_texts(episodes: int, seed: int = 0) -> list[str]:
    """Chat-rendered episodes of a random wrong-candidate policy on the train split of every env."""
    import gymnasium as gym

    import agentrl_envs  # noqa: F401  (registers the ids)

    ids = ["AgentRL/SQLPythonSMTP-v0", "AgentRL/SQL-v0", "AgentRL/Python-v0", "AgentRL/SMTP-v0"]
    rng = random.Random(seed)
    texts: list[str] = []
    envs = {i: gym.make(i, candidates=4, split="train") for i in ids}
    try:
        for n in range(episodes):
            env_id = ids[n % len(ids)] if n % 2 else ids[0]  # half the corpus on the pipeline env
            env = envs[env_id]
            obs, info = env.reset(seed=10_000 + n)
            messages = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": obs}]
            tools = info["tools"]
            done = False
            while not done:
                oracle = env.unwrapped.oracle_action()  # type: ignore[attr-defined]
                wrong = [c for c in info["candidates"] if c != oracle] or ["<tool_call>{}</tool_call>"]
                written = rng.choice(wrong)
                # Half the steps the oracle moves the env on (so later stages of the task appear in the
                # corpus), but the text always shows a wrong candidate: no oracle action is ever written.
                action = oracle if rng.random() < 0.5 else written
                obs, _, term, trunc, info = env.step(action)
                messages += [{"role": "assistant", "content": written}, {"role": "tool", "content": obs}]
                done = term or trunc
            texts.append(_render(messages, tools))
    finally:
        for env in envs.values():
            env.close()
    return texts


# -- internals -----------------------------------------------------------------------------------


def _render(messages: list[dict[str, str]], tools: list[dict[str, Any]]) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    # {% generation %} is a transformers extension; outside transformers render it as nothing.
    template = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    return env.from_string(template).render(messages=messages, tools=tools, add_generation_prompt=False)


def _build(spec: TinySpec, out: Path, log: Any) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    log(f"tiny: building corpus ({spec.corpus_episodes} random wrong-candidate episodes, no oracle actions)")
    texts = corpus_texts(spec.corpus_episodes, seed=spec.seed)
    (out / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")

    log(f"tiny: training a byte-level BPE tokenizer (vocab {spec.vocab_size})")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    hf_tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out)

    torch.manual_seed(spec.seed)
    config = Qwen2Config(
        vocab_size=len(hf_tok),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        pad_token_id=hf_tok.pad_token_id,
        eos_token_id=hf_tok.eos_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    ids = [i for t in texts for i in hf_tok(t, add_special_tokens=False)["input_ids"] + [hf_tok.pad_token_id]]
    data = torch.tensor(ids, dtype=torch.long)
    log(
        f"tiny: pretraining {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params on {len(ids):,} tokens, {spec.pretrain_steps} steps"
    )
    gen = torch.Generator().manual_seed(spec.seed)
    model.train()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _pretrain(model, data, spec, gen, log)
    finally:
        torch.set_num_threads(before)
    model.eval()
    save_model(model, out)
    (out / "tiny_spec.json").write_text(json.dumps(asdict(spec), indent=2))


def _pretrain(model: Any, data: torch.Tensor, spec: TinySpec, gen: torch.Generator, log: Any) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=spec.lr, total_steps=max(spec.pretrain_steps, 1), pct_start=0.1)
    for step in range(spec.pretrain_steps):
        starts = torch.randint(0, max(len(data) - spec.seq_len - 1, 1), (spec.batch_size,), generator=gen)
        batch = torch.stack([data[s : s + spec.seq_len] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == spec.pretrain_steps - 1:
            log(f"tiny: step {step} loss {loss.item():.3f}")
