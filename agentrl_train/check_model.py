"""``agentrl-train check-model MODEL``: what a user should know about a base model before training on it.

Porting a recipe to another base model fails in a few known places, and each one is checked here
without loading the weights (the modules are built on the ``meta`` device from the config):

- the chat template: does it render ``tools`` itself, or will the trainer use its own ChatML
  template (:mod:`agentrl_train.chat_template`), or can neither work (an error naming the fix);
- the markers: how the tool-call markers (``<tool_call>``, ``</tool_call>``) and the template's own
  markup (``<|im_start|>``, ...) tokenize: one token each, or split into sub-words, which the policy
  then has to spell out token by token;
- the context: ``max_position_embeddings``, ``rope_theta`` and ``rope_scaling``, and the longest
  prompt each env produces with this tokenizer, measured by playing the oracle for a number of
  episodes and rendering each prompt the way generate mode does (system, instruction, then the
  agent's calls and the tools' answers); a prompt longer than the context is flagged;
- the action budget: the longest oracle call of each env in this tokenizer's tokens (with the
  end-of-turn token), flagged when it exceeds ``--max-new-tokens`` (generate mode would cut the
  right call, and no training can repair that);
- the size: parameters, and the trainable LoRA parameters of each preset (``--lora-preset``);
- memory: a rough estimate, per phase, of what the tensors take (weights, adapter with its gradients
  and AdamW state, the KV cache of a rollout, the activations of an update micro-batch). It counts
  tensors only, with a per-layer activation factor that is an upper bound, not a fit to measured
  runs; a process adds the Python and torch runtime on top. Read it to compare presets and settings.

The report is a dict (``--json`` prints it) and a table.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl_envs.errors import ConfigError

__all__ = ["DEFAULT_ENVS", "check_model", "format_report", "longest_prompts", "lora_trainable", "markers"]

DEFAULT_ENVS = (
    "AgentRL/SQL-v0",
    "AgentRL/Python-v0",
    "AgentRL/SMTP-v0",
    "AgentRL/SQLPythonSMTP-v1",
    "AgentRL/HTTP-v0",
    "AgentRL/Workplace-v1",
)
#: Tool-call markup the envs parse; the template's own markers are found in its rendering.
TOOL_MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
_MARKUP = re.compile(r"<\|[A-Za-z0-9_]+\|>|\[/?INST\]|<start_of_turn>|<end_of_turn>")


def markers(tokenizer: Any, rendering: str) -> list[dict[str, Any]]:
    """How each tool-call marker, and each template marker found in ``rendering``, tokenizes."""
    found = list(TOOL_MARKERS) + sorted(set(_MARKUP.findall(rendering)) - set(TOOL_MARKERS))
    out = []
    for text in found:
        ids = tokenizer.encode(text, add_special_tokens=False)
        pieces = tokenizer.convert_ids_to_tokens(ids)
        out.append({"marker": text, "tokens": len(ids), "ids": ids, "pieces": pieces, "single_token": len(ids) == 1})
    return out


def _render_len(tokenizer: Any, messages: list[dict[str, str]], tools: Any) -> int:
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return len(tokenizer.encode(text, add_special_tokens=False))


def _action_len(tokenizer: Any, action: str) -> int:
    """Tokens the policy samples for ``action``: its text and the end-of-turn token that ends it."""
    ids = tokenizer(action, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return len(ids) + 1


def longest_prompts(
    tokenizer: Any, env_ids: tuple[str, ...] | list[str], episodes: int, *, long_horizon: bool = True, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Per env: the longest prompt and the longest oracle action (tokens) over ``episodes`` oracle episodes.

    Prompts are rendered as in generate mode; an action counts its end-of-turn token, as the policy
    samples it (``--max-new-tokens`` below it cuts the right call).

    Each step's prompt is the system prompt and the instruction, then every earlier call and tool
    answer; the longest is usually the last step's. ``long_horizon`` adds the
    ``AgentRL/SQLPythonSMTP-v1`` long-horizon variant (``long_horizon=True``) as its own row.
    """
    import gymnasium as gym

    import agentrl_envs  # noqa: F401  (registers the ids)

    runs: list[tuple[str, str, dict[str, Any]]] = [(env_id, env_id, {}) for env_id in env_ids]
    if long_horizon:
        runs.append(("AgentRL/SQLPythonSMTP-v1 long_horizon", "AgentRL/SQLPythonSMTP-v1", {"long_horizon": True}))
    out: dict[str, dict[str, Any]] = {}
    for label, env_id, kwargs in runs:
        env = gym.make(env_id, **kwargs)
        longest, steps, longest_action = 0, 0, 0
        try:
            for ep in range(episodes):
                obs, info = env.reset(seed=seed + ep)
                messages = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": str(obs)}]
                tools, done = info["tools"], False  # the reset's info carries the schemas
                while not done:
                    longest = max(longest, _render_len(tokenizer, messages, tools))
                    action = env.unwrapped.oracle_action()  # type: ignore[attr-defined]
                    longest_action = max(longest_action, _action_len(tokenizer, action))
                    obs, _, terminated, truncated, _ = env.step(action)
                    steps += 1
                    messages += [{"role": "assistant", "content": action}, {"role": "tool", "content": str(obs)}]
                    done = terminated or truncated
        finally:
            env.close()
        out[label] = {
            "episodes": episodes,
            "steps": steps,
            "longest_prompt_tokens": longest,
            "longest_action_tokens": longest_action,
        }
    return out


def lora_trainable(lm: Any) -> dict[str, dict[str, Any]]:
    """Per ``--lora-preset``: the LoRA parameters it trains on ``lm`` (exact: rank x (in + out) per layer)."""
    from agentrl_train.lora import LORA_PRESETS, lora_layers, lora_targets

    total = sum(p.numel() for p in lm.parameters())
    out = {}
    for preset in LORA_PRESETS:
        targets = lora_targets(lm, preset)
        ranks = targets["rank_pattern"]
        n = sum(ranks[leaf] * (layer.in_features + layer.out_features) for leaf, layer in lora_layers(lm))
        out[preset] = {"ranks": ranks, "trainable": n, "share_of_base": n / total}
    return out


def memory_estimate(
    config: Any,
    total: int,
    trainable: int,
    prompt_tokens: int,
    *,
    num_envs: int,
    micro_batch: int,
    new_tokens: int = 160,
    bytes_per: int = 4,
) -> dict[str, int]:
    """Bytes the tensors of each phase take (a rough upper bound: activations use a factor per layer).

    - weights: every parameter at ``bytes_per`` (float32 on CPU);
    - adapter: LoRA weights, their gradients and AdamW's two moments (4 x trainable);
    - value head: the critic, one linear layer (hidden size -> 1) on the backbone's last hidden
      state, with its gradient and moments: all that a critic head on another device would move
      (the backbone's forward and backward serve the policy and the critic alike);
    - rollout KV cache: keys and values of every layer for ``num_envs`` sequences of ``prompt_tokens``
      plus ``new_tokens``;
    - update activations: ``micro_batch`` such sequences, 8 hidden-size and 3 intermediate-size floats
      per token per layer kept for backward, plus logits and log-probs over the vocabulary for the
      ``new_tokens`` of each action (the trainer projects only those onto the vocabulary);
    - the same with ``--activation-checkpointing`` (``*_checkpointed``): one hidden-size float per token
      per layer (each layer's input) plus one layer's activations, rebuilt in the backward.
    """
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(config, "num_key_value_heads", heads) or heads)
    head_dim = int(getattr(config, "head_dim", 0) or (hidden // heads if heads else 0))
    inter = int(getattr(config, "intermediate_size", 4 * hidden) or 4 * hidden)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    weights = total * bytes_per
    adapter = 4 * trainable * bytes_per
    value_head = 4 * (hidden + 1) * bytes_per
    seq = prompt_tokens + new_tokens
    kv = 2 * layers * kv_heads * head_dim * seq * num_envs * bytes_per
    logits = 2 * new_tokens * vocab
    activations = micro_batch * (seq * layers * (8 * hidden + 3 * inter) + logits) * bytes_per
    # --activation-checkpointing: each layer's input is kept, one layer's activations at a time are rebuilt
    checkpointed = micro_batch * (seq * (layers * hidden + 8 * hidden + 3 * inter) + logits) * bytes_per
    return {
        "weights": weights,
        "adapter_and_optimizer": adapter,
        "value_head": value_head,
        "rollout_kv_cache": kv,
        "update_activations": activations,
        "update_activations_checkpointed": checkpointed,
        "rollout_total": weights + adapter + kv,
        "update_total": weights + adapter + value_head + activations,
        "update_total_checkpointed": weights + adapter + value_head + checkpointed,
    }


def check_model(
    model: str,
    *,
    envs: tuple[str, ...] | list[str] = DEFAULT_ENVS,
    episodes: int = 4,
    long_horizon: bool = True,
    num_envs: int = 8,
    micro_batch: int = 16,
    max_prompt_tokens: int = 1536,
    max_new_tokens: int = 160,
    rope_scaling: dict[str, Any] | None = None,
    tiny_spec: Any = None,
    log: Any = print,
) -> dict[str, Any]:
    """The porting report of ``model`` (any ``--model``: ``tiny``, ``smollm2-135m``, a ``.gguf`` file, a folder).

    Raises:
        ConfigError: the model cannot be found, has no tokenizer or chat template, or its template
            cannot show tools and the tokenizer has no ChatML markers for the trainer's own, or the
            model refuses ``rope_scaling`` (checked on the config and the model's rotary module).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl_train.models import resolve_model
    from agentrl_train.rope import apply_rope_scaling, check_rope_applied, parse_rope_scaling

    if not isinstance(episodes, int) or isinstance(episodes, bool) or not 1 <= episodes <= 1000:
        raise ConfigError(f"--episodes {episodes!r}: use a whole number from 1 to 1000")
    scaling = parse_rope_scaling(rope_scaling)
    path = resolve_model(model, tiny_spec=tiny_spec, log=log)
    tokenizer, config = _tokenizer_and_config(model, path)
    template, rendering = _chat_template(tokenizer, model)
    original_context = int(getattr(config, "max_position_embeddings", 0) or 0)
    context = apply_rope_scaling(config, scaling, model)
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config)
    check_rope_applied(lm, scaling, model)
    total = sum(p.numel() for p in lm.parameters())
    prompts = longest_prompts(tokenizer, list(envs), episodes, long_horizon=long_horizon)
    for row in prompts.values():
        row["fits"] = not context or row["longest_prompt_tokens"] <= context
        row["action_fits"] = row["longest_action_tokens"] <= max_new_tokens
    lora = lora_trainable(lm)
    longest = max((r["longest_prompt_tokens"] for r in prompts.values()), default=0)
    kept = min(longest, max_prompt_tokens)  # the trainer drops the oldest turns past --max-prompt-tokens
    memory = {
        preset: memory_estimate(
            config, total, row["trainable"], kept, num_envs=num_envs, micro_batch=micro_batch, new_tokens=max_new_tokens
        )
        for preset, row in lora.items()
    }
    return {
        "model": model,
        "path": str(path),
        "model_type": getattr(config, "model_type", None),
        "architectures": list(getattr(config, "architectures", None) or []),
        "parameters": total,
        "chat_template": template,
        "markers": markers(tokenizer, rendering),
        "context": {
            "max_position_embeddings": original_context or None,
            "rope_theta": _rope_theta(config),
            "rope_scaling": getattr(config, "rope_scaling", None),
            "scaling": scaling,
            "context": context or None,
        },
        "prompts": prompts,
        "lora": lora,
        "memory_estimate": {
            "num_envs": num_envs,
            "micro_batch": micro_batch,
            "prompt_tokens": kept,
            "new_tokens": max_new_tokens,
            "bytes": memory,
        },
    }


def _tokenizer_and_config(model: str, path: Any) -> tuple[Any, Any]:
    """The model's tokenizer and config from its folder, or ConfigError; a tokenizer without a chat template is refused."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ConfigError(
            f"--model {model}: cannot load its tokenizer or config ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"--model {model}: its tokenizer has no chat template; set tokenizer.chat_template (e.g. to Qwen2.5's, "
            "which renders tools) and save it with the model"
        )
    return tokenizer, config


def _chat_template(tokenizer: Any, model: str) -> tuple[dict[str, Any], str]:
    """The report's ``chat_template`` row (which template the trainer uses) and the rendering of a probe chat.

    The probe (system, user, a tool call, a tool answer) shows the template's own markers to :func:`markers`.
    """
    from agentrl_train.chat_template import ensure_tools_template, tools_problem

    problem = tools_problem(tokenizer)
    ensure_tools_template(tokenizer, model, log=lambda *_: None)  # raises when neither template can show tools
    template = {
        "renders_tools": problem is None,
        "problem": problem,
        "used": "the model's own" if problem is None else "the trainer's ChatML template (agentrl_train.chat_template)",
    }
    probe = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": '<tool_call>{"name": "sql", "arguments": {}}</tool_call>'},
        {"role": "tool", "content": "t"},
    ]
    rendering = str(tokenizer.apply_chat_template(probe, tools=[], tokenize=False, add_generation_prompt=True))
    return template, rendering


def _rope_theta(config: Any) -> float | None:
    """``rope_theta``: a config attribute in older transformers, inside ``rope_scaling`` / ``rope_parameters`` in newer."""
    for holder in (config, getattr(config, "rope_parameters", None), getattr(config, "rope_scaling", None)):
        value = holder.get("rope_theta") if isinstance(holder, dict) else getattr(holder, "rope_theta", None)
        if value is not None:
            return float(value)
    return None


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def format_report(report: dict[str, Any]) -> str:
    """The report as text tables."""
    lines = [
        f"model {report['model']} ({report['model_type']}, {report['parameters'] / 1e6:.1f}M parameters)",
        f"  folder {report['path']}",
        "",
        "chat template: "
        + (
            "renders tools itself"
            if report["chat_template"]["renders_tools"]
            else f"{report['chat_template']['problem']}; the trainer uses {report['chat_template']['used']}"
        ),
        "",
        "markers (a marker split into sub-words is spelled token by token by the policy):",
    ]
    for m in report["markers"]:
        how = "one token" if m["single_token"] else f"{m['tokens']} tokens: {' '.join(map(str, m['pieces']))}"
        lines.append(f"  {m['marker']:<22} {how}")
    if any(not m["single_token"] for m in report["markers"] if m["marker"] in ("<tool_call>", "</tool_call>")):
        lines.append("  (--add-tool-tokens makes <tool_call> and </tool_call> one token each; see the training guide)")
    c = report["context"]
    lines += [
        "",
        f"context: {c['max_position_embeddings']} positions, rope_theta {c['rope_theta']}, rope_scaling {c['rope_scaling']}",
    ]
    if c.get("scaling"):
        lines.append(f"with --rope-scaling {c['scaling']}: {c['context']} positions")
    lines.append("longest prompt per env (oracle episodes, rendered as in generate mode):")
    for env_id, row in report["prompts"].items():
        flag = "" if row["fits"] else "   EXCEEDS THE CONTEXT: raise it (--rope-scaling) or cut prompts (--max-prompt-tokens)"
        lines.append(f"  {env_id:<40} {row['longest_prompt_tokens']:>6} tokens over {row['episodes']} episodes{flag}")
    budget = report["memory_estimate"]["new_tokens"]
    lines.append(f"longest oracle action per env (tokens, with the end of turn) against --max-new-tokens {budget}:")
    for env_id, row in report["prompts"].items():
        flag = "" if row["action_fits"] else f"   LONGER THAN --max-new-tokens {budget}: generate mode cuts the right call"
        lines.append(f"  {env_id:<40} {row['longest_action_tokens']:>6} tokens{flag}")
    lines += ["", "LoRA presets (--lora-preset): trainable parameters"]
    for preset, row in report["lora"].items():
        lines.append(f"  {preset:<10} {row['trainable']:>12,}  ({100 * row['share_of_base']:.2f}% of the base)")
    est = report["memory_estimate"]
    lines += [
        "",
        f"memory, a rough upper bound (tensors only, float32; {est['num_envs']} envs, micro-batch "
        f"{est['micro_batch']}, {est['prompt_tokens']}-token prompts, {est['new_tokens']}-token actions):",
    ]
    for preset, b in est["bytes"].items():
        lines.append(
            f"  {preset:<10} rollout {_mb(b['rollout_total']):>10}   update {_mb(b['update_total']):>10}   "
            f"update, --activation-checkpointing {_mb(b['update_total_checkpointed']):>10}"
        )
    head = next(iter(est["bytes"].values()))["value_head"]
    lines.append(
        f"  value head (the critic: one linear layer on the shared backbone, with its gradient and AdamW moments): "
        f"{head:,} bytes, all that a critic head on another device would free"
    )
    return "\n".join(lines)
