"""Tool-call markers as tokens (``--add-tool-tokens``): one token each for ``<tool_call>`` and ``</tool_call>``.

Many tokenizers split the markers into sub-words (SmolLM2's makes five tokens of ``<tool_call>``); the
``tiny`` model has them as single tokens already. :func:`add_tool_tokens` adds each split marker to
the tokenizer as a special token (a no-op, said in one log line, where none is split), grows the
embedding matrix when the new ids do not fit in it, and sets each new input-embedding row, and each
new output (``lm_head``) row of an untied model, to the mean of the rows of the sub-word tokens it
replaces. A tied model's output row is its input row.

The new rows are trained as peft's ``trainable_token_indices`` (:func:`peft_token_indices`): peft
keeps a copy of those rows only, trains and saves them with the adapter (a few KB), and ties the
output rows to the input rows where the model ties its embeddings. (``modules_to_save`` would train,
and save, a full copy of both matrices: 28M parameters and 113 MB on SmolLM2, and every other row
would drift.)

An adapter saved with added tokens carries :data:`TOKENS_FILE` beside its weights: which markers, at
which ids, on a tokenizer of which size. Whatever loads the adapter applies the same additions to
its base first (:func:`add_tool_tokens`, then :func:`check_same`), and refuses an adapter whose
additions differ from its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl_envs.errors import ConfigError

__all__ = [
    "TOKENS_FILE",
    "TOOL_MARKERS",
    "ToolTokens",
    "add_tool_tokens",
    "check_same",
    "peft_token_indices",
    "read_tool_tokens",
    "split_markers",
    "write_tool_tokens",
]

TOOL_MARKERS = ("<tool_call>", "</tool_call>")  #: the markers of agentrl_train.chat_template.TOOLS_CHATML
TOKENS_FILE = "tool_tokens.json"  #: written beside adapter_model.safetensors when the adapter trains added tokens
_MAX_FILE = 1 << 16


@dataclass(frozen=True)
class ToolTokens:
    """The markers added to a tokenizer and where their rows sit."""

    tokens: tuple[str, ...]  #: the markers added, in TOOL_MARKERS order
    ids: tuple[int, ...]  #: their token ids
    pieces: tuple[tuple[int, ...], ...]  #: per marker, the sub-word ids it was split into (its rows' mean is the start)
    base_vocab: int  #: ``len(tokenizer)`` before the additions

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": list(self.tokens),
            "ids": list(self.ids),
            "pieces": [list(p) for p in self.pieces],
            "base_vocab": self.base_vocab,
        }


def split_markers(tokenizer: Any) -> dict[str, list[int]]:
    """The tool-call markers the tokenizer splits into several tokens, with their sub-word ids."""
    out = {}
    for marker in TOOL_MARKERS:
        ids = list(tokenizer(marker, add_special_tokens=False)["input_ids"])
        if len(ids) > 1:
            out[marker] = ids
    return out


def add_tool_tokens(lm: Any, tokenizer: Any, model: str = "the model", log: Any = print) -> ToolTokens | None:
    """Add the split tool-call markers as special tokens and start their rows at the sub-word mean.

    Returns None (and logs why) when every marker is one token already.

    Raises:
        ConfigError: the tokenizer cannot add tokens, or the model has no input embeddings to grow.
    """
    split = split_markers(tokenizer)
    if not split:
        log(f"--add-tool-tokens: {model} has {' and '.join(TOOL_MARKERS)} as single tokens already; nothing added")
        return None
    emb = lm.get_input_embeddings() if hasattr(lm, "get_input_embeddings") else None
    if not isinstance(emb, torch.nn.Embedding):
        raise ConfigError(f"--add-tool-tokens: {model} has no input embedding layer (nn.Embedding) to add tokens to")
    out_layer = lm.get_output_embeddings()
    if out_layer is None or not hasattr(out_layer, "weight") or out_layer.weight.shape[0] != emb.weight.shape[0]:
        raise ConfigError(f"--add-tool-tokens: {model} has no output layer with one row per token (lm_head); cannot add tokens")
    base_vocab = len(tokenizer)
    try:
        tokenizer.add_special_tokens({"extra_special_tokens": list(split)}, replace_extra_special_tokens=False)
    except Exception as exc:
        raise ConfigError(
            f"--add-tool-tokens: {model}'s tokenizer cannot add tokens ({type(exc).__name__}: {str(exc)[:200]}); "
            "use a Hugging Face tokenizer (tokenizer.json) or train without --add-tool-tokens"
        ) from None
    ids = [tokenizer.convert_tokens_to_ids(m) for m in split]
    if any(not isinstance(i, int) or i < 0 for i in ids) or any(
        len(tokenizer(m, add_special_tokens=False)["input_ids"]) != 1 for m in split
    ):
        raise ConfigError(f"--add-tool-tokens: {model}'s tokenizer did not make {', '.join(split)} single tokens")
    if max(ids) >= emb.weight.shape[0]:
        lm.resize_token_embeddings(max(ids) + 1, mean_resizing=False)
    tied = lm.get_output_embeddings().weight is lm.get_input_embeddings().weight
    with torch.no_grad():
        for layer in (lm.get_input_embeddings(), *(() if tied else (lm.get_output_embeddings(),))):
            w = layer.weight
            for i, pieces in zip(ids, split.values()):
                w[i] = w[torch.tensor(pieces, device=w.device)].double().mean(0).to(w.dtype)
    log(
        f"--add-tool-tokens: added {', '.join(f'{m} (was {len(p)} tokens)' for m, p in split.items())} to {model} as "
        f"ids {ids}; their {'embedding' if tied else 'input and output'} rows start at the mean of the sub-words' rows"
    )
    return ToolTokens(tuple(split), tuple(ids), tuple(tuple(p) for p in split.values()), base_vocab)


def peft_token_indices(lm: Any, added: ToolTokens) -> list[int] | dict[str, list[int]]:
    """peft's ``trainable_token_indices`` for the added rows: the input embedding's (a tied output layer
    follows it), or the input embedding's and the output layer's by module name for an untied model."""
    ids = list(added.ids)
    emb, out = lm.get_input_embeddings(), lm.get_output_embeddings()
    if out.weight is emb.weight:
        return ids
    names = {module: name for name, module in lm.named_modules()}
    return {names[emb]: ids, names[out]: ids}


def write_tool_tokens(folder: str | Path, added: ToolTokens) -> None:
    """Write :data:`TOKENS_FILE` into an adapter folder."""
    (Path(folder) / TOKENS_FILE).write_text(json.dumps(added.to_json(), indent=1) + "\n", encoding="utf-8")


def read_tool_tokens(folder: str | Path) -> ToolTokens | None:
    """The additions an adapter folder was trained with, or None when it has no :data:`TOKENS_FILE`.

    Raises:
        ConfigError: the file is there but is not what :func:`write_tool_tokens` writes.
    """
    f = Path(folder) / TOKENS_FILE
    if not f.is_file():
        return None
    hint = "the adapter folder is damaged; save the adapter again"
    try:
        raw = f.read_bytes()[: _MAX_FILE + 1]
        data = json.loads(raw) if len(raw) <= _MAX_FILE else None
    except (OSError, ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise ConfigError(f"{f} is not a JSON object of at most {_MAX_FILE} bytes; {hint}")
    tokens: Any = data.get("tokens")
    ids: Any = data.get("ids")
    pieces: Any = data.get("pieces")
    base: Any = data.get("base_vocab")

    def ints(x: Any) -> bool:
        return isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 31 for i in x)

    ok = (
        isinstance(tokens, list)
        and tokens
        and all(t in TOOL_MARKERS for t in tokens)
        and len(set(tokens)) == len(tokens)
        and ints(ids)
        and isinstance(pieces, list)
        and all(ints(p) and p for p in pieces)
        and len(ids) == len(tokens) == len(pieces)
        and isinstance(base, int)
        and not isinstance(base, bool)
        and 0 < base <= min(ids)
    )
    if not ok:
        raise ConfigError(f"{f} does not describe added tool-call tokens (tokens, ids, pieces, base_vocab); {hint}")
    return ToolTokens(tuple(tokens), tuple(ids), tuple(tuple(p) for p in pieces), base)


def check_same(saved: ToolTokens | None, own: ToolTokens | None, what: str) -> None:
    """ConfigError unless an adapter's additions (``saved``) are this model's (``own``); ``what`` names the adapter."""
    if saved == own:
        return
    if own is None and saved is not None:
        raise ConfigError(
            f"{what} was trained with added tool-call tokens ({', '.join(saved.tokens)} at ids {list(saved.ids)}); "
            "load it on a base with the same tokens: pass --add-tool-tokens"
        )
    if saved is None and own is not None:
        raise ConfigError(
            f"{what} has no added tool-call tokens, but this model adds {', '.join(own.tokens)}: its prompts would "
            "hold tokens it never saw. Load it without --add-tool-tokens, or train it with the flag"
        )
    assert saved is not None and own is not None
    raise ConfigError(
        f"{what} was trained with {', '.join(saved.tokens)} at ids {list(saved.ids)} on a {saved.base_vocab}-token "
        f"vocabulary; this base adds {', '.join(own.tokens)} at ids {list(own.ids)} to {own.base_vocab}: it was "
        "trained on another base model"
    )
