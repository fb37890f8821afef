"""vLLM's completions and runtime LoRA bodies for ``agentrl-train serve``: what is accepted, and the answer.

``POST /v1/completions`` takes one prompt (token ids, or a string) and answers as vLLM's OpenAI server
does, with ``logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``) and the
sampled ``token_ids``; ``return_tokens_as_token_ids`` spells tokens ``token_id:N``. A trainer's rollout
client (:class:`agentrl_train.rollout_engine.ServerEngine`) sends exactly these fields. vLLM's sampling
options that change the distribution (``top_p``, ``top_k``, penalties, ``min_p``, ``logit_bias``, ...)
are accepted at their neutral values only: any other value is a 400 naming the field, never silently a
different distribution. Fields this server does not know are ignored, as vLLM ignores them.

``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` take vLLM's bodies; their answers are
plain text (``Success: LoRA adapter 'NAME' added successfully.``) as vLLM's are.

Nothing here touches the model: the checks raise :class:`~agentrl_envs.errors.ConfigError` (a 400),
and :func:`completion_answer` builds the JSON from a :class:`~agentrl_train.serve.engine.Sampled`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from agentrl_envs.errors import ConfigError

__all__ = [
    "CompletionRequest",
    "LoraLoad",
    "LoraUnload",
    "check_ids",
    "completion_answer",
    "completion_budget",
    "prompt_of",
]

MAX_LOGPROBS = 20  #: vLLM's default --max-logprobs
DEFAULT_MAX_TOKENS = 16  #: vLLM's (and OpenAI's) max_tokens when a request leaves it out
MIN_LOGPROB = -9999.0  #: vLLM's floor for a log-prob in JSON (-inf is not JSON)
TOKEN_ID_PREFIX = "token_id:"


class CompletionRequest(BaseModel):
    """The fields of vLLM's completion request this server reads (unknown ones are ignored, as vLLM does)."""

    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, max_length=200)
    prompt: Any = None  #: token ids or a string; checked by :func:`prompt_of` (a batch gets its own message)
    max_tokens: int | None = Field(default=DEFAULT_MAX_TOKENS, ge=1, strict=True)  #: None: the server's --max-new-tokens
    temperature: float | None = Field(default=1.0, ge=0.0, strict=True, allow_inf_nan=False)
    top_p: float | None = Field(default=None, strict=True, allow_inf_nan=False)
    top_k: int | None = Field(default=None, strict=True)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS, strict=True)
    return_tokens_as_token_ids: bool | None = Field(default=None, strict=True)
    stop_token_ids: list[StrictInt] | None = Field(default=None, max_length=1024)
    skip_special_tokens: bool = Field(default=True, strict=True)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1, strict=True)  # torch's generator: 64 bits
    n: int = Field(default=1, strict=True)
    best_of: int | None = Field(default=None, strict=True)
    stream: bool = Field(default=False, strict=True)
    stop: str | list[str] | None = None
    echo: bool = Field(default=False, strict=True)
    suffix: str | None = None
    presence_penalty: float | None = Field(default=None, strict=True, allow_inf_nan=False)
    frequency_penalty: float | None = Field(default=None, strict=True, allow_inf_nan=False)
    repetition_penalty: float | None = Field(default=None, strict=True, allow_inf_nan=False)
    min_p: float | None = Field(default=None, strict=True, allow_inf_nan=False)
    min_tokens: int | None = Field(default=None, strict=True)
    logit_bias: dict[str, Any] | None = None
    ignore_eos: bool | None = Field(default=None, strict=True)
    include_stop_str_in_output: bool | None = Field(default=None, strict=True)
    prompt_logprobs: int | None = Field(default=None, strict=True)
    use_beam_search: bool | None = Field(default=None, strict=True)


#: vLLM options taken at their neutral values only: field -> (the values accepted, what to send)
_NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "top_p": ((None, 1.0), "1.0"),
    "top_k": ((None, -1, 0), "-1"),
    "n": ((1,), "1 (one request per sample)"),
    "best_of": ((None, 1), "1"),
    "stream": ((False,), "false"),
    "echo": ((False,), "false"),
    "suffix": ((None, ""), "null"),
    "presence_penalty": ((None, 0.0), "0"),
    "frequency_penalty": ((None, 0.0), "0"),
    "repetition_penalty": ((None, 1.0), "1"),
    "min_p": ((None, 0.0), "0"),
    "min_tokens": ((None, 0), "0"),
    "ignore_eos": ((None, False), "false"),
    "include_stop_str_in_output": ((None, False), "false"),
    "prompt_logprobs": ((None,), "null"),
    "use_beam_search": ((None, False), "false"),
}


def completion_budget(req: CompletionRequest, max_new_tokens: int) -> int:
    """The request's ``max_tokens`` after every unsupported option is refused.

    Raises:
        ConfigError: an option at a value this server cannot honour (the message names it and what to send).
    """
    for name, (accepted, instead) in _NEUTRAL.items():
        value = getattr(req, name)
        if value not in accepted:  # strict fields: no bool reaches a number's check, nor a number a bool's
            raise ConfigError(f"{name}={str(value)[:60]} is not supported by this server: send {instead}, or leave it out")
    if req.stop:
        raise ConfigError("stop (stop strings) is not supported by this server: send stop_token_ids, or leave stop out")
    if req.logit_bias:
        raise ConfigError("logit_bias is not supported by this server: leave it out")
    if req.max_tokens is not None and req.max_tokens > max_new_tokens:
        raise ConfigError(
            f"max_tokens={req.max_tokens} is over this server's limit of {max_new_tokens} new tokens (--max-new-tokens): "
            f"send at most {max_new_tokens}"
        )
    if "max_tokens" not in req.model_fields_set:
        return min(DEFAULT_MAX_TOKENS, max_new_tokens)
    return req.max_tokens if req.max_tokens is not None else max_new_tokens


def prompt_of(req: CompletionRequest) -> list[int] | str:
    """The request's one prompt: a list of token ids or a non-empty string.

    Raises:
        ConfigError: a batch (a list of prompts), an empty prompt, or items that are not token ids.
    """
    prompt = req.prompt
    if isinstance(prompt, str):
        if not prompt:
            raise ConfigError("prompt is empty: send a list of token ids or a non-empty string")
        return prompt
    if not isinstance(prompt, list):
        raise ConfigError(
            f"prompt is {type(prompt).__name__ if prompt is not None else 'missing'}: send a list of token ids or a string"
        )
    if not prompt:
        raise ConfigError("prompt is empty: send at least one token id")
    for i, item in enumerate(prompt):
        if isinstance(item, (list, str)):
            raise ConfigError(
                "prompt holds a batch of prompts (a list of lists or of strings): this server takes one prompt per "
                "request; send each as its own request"
            )
        if not isinstance(item, int) or isinstance(item, bool):
            raise ConfigError(f"prompt[{i}] is {str(item)[:40]!r}, not a token id: send integers")
    return prompt


def check_ids(prompt: list[int], stop_ids: list[int], vocab_size: int, context: int, max_tokens: int) -> None:
    """Token ids inside the vocabulary, and the prompt plus ``max_tokens`` inside the model's context.

    Raises:
        ConfigError: the message names the id (and its place) or the lengths.
    """
    if not prompt:
        raise ConfigError("prompt is empty (the string tokenizes to no tokens): send some text or token ids")
    for where, ids in (("prompt", prompt), ("stop_token_ids", stop_ids)):
        bad = next((i for i, t in enumerate(ids) if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ConfigError(
                f"{where}[{bad}] = {str(ids[bad])[:40]} is outside this model's vocabulary (0..{vocab_size - 1}); "
                "tokenize with the served model's tokenizer"
            )
    if len(prompt) + max_tokens > context:
        raise ConfigError(
            f"this model's maximum context length is {context} tokens; the prompt has {len(prompt)} and max_tokens "
            f"asks {max_tokens} ({len(prompt) + max_tokens} in all): send a shorter prompt or a lower max_tokens"
        )


def completion_answer(
    req: CompletionRequest, sampled: Any, prompt_tokens: int, tokenizer: Any, fingerprint: str
) -> dict[str, Any]:
    """vLLM's ``text_completion`` for a :class:`~agentrl_train.serve.engine.Sampled`.

    As vLLM: the text leaves out a final stop id's text; ``token_ids`` and the log-probs keep it.
    """
    ids = sampled.ids
    shown = ids[:-1] if sampled.finish == "stop" else ids
    text = tokenizer.decode(shown, skip_special_tokens=req.skip_special_tokens)
    logprobs = None
    if req.logprobs is not None:
        as_ids = bool(req.return_tokens_as_token_ids)

        def spell(t: int) -> str:
            return f"{TOKEN_ID_PREFIX}{t}" if as_ids else tokenizer.decode([t])

        tokens = [spell(t) for t in ids]
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        top = []
        for token, lp, best in zip(tokens, sampled.logprobs, sampled.top):
            step = {token: max(lp, MIN_LOGPROB)}  # the sampled token first, then the top req.logprobs
            for i, v in best[: req.logprobs]:
                step.setdefault(spell(i), max(v, MIN_LOGPROB))
            top.append(step)
        logprobs = {
            "tokens": tokens,
            "token_logprobs": [max(lp, MIN_LOGPROB) for lp in sampled.logprobs],
            "top_logprobs": top,
            "text_offset": offsets,
        }
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": req.model,
        "system_fingerprint": fingerprint,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": sampled.finish,
                "stop_reason": ids[-1] if sampled.finish == "stop" else None,
                "token_ids": ids,
            }
        ],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids), "total_tokens": prompt_tokens + len(ids)},
    }


class LoraLoad(BaseModel):
    """vLLM's ``POST /v1/load_lora_adapter`` body (other fields are ignored, as vLLM does)."""

    model_config = ConfigDict(extra="ignore")
    lora_name: StrictStr = Field(max_length=1000)  # the name rules are the server's (_check_name); this bounds the work
    lora_path: StrictStr = Field(min_length=1, max_length=4096)


class LoraUnload(BaseModel):
    """vLLM's ``POST /v1/unload_lora_adapter`` body."""

    model_config = ConfigDict(extra="ignore")
    lora_name: StrictStr = Field(min_length=1, max_length=1000)
