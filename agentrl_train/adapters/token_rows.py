"""Embedding rows an adapter trains (peft ``trainable_token_indices``), carried through fusion and remapping.

``--add-tool-tokens`` trains the rows of the added tool-call tokens this way
(:mod:`agentrl_train.tool_tokens`), and peft's ``trainable_token_indices`` does it for any token. An
adapter folder then holds, per embedding module, the rows' *values* (``...token_adapter.
trainable_tokens_delta``: despite the name, peft replaces the base's rows with them, it never adds),
the token ids in ``adapter_config.json`` (a list means the input embedding, with a tied output layer
following it; a dict names each module) and, for added tool-call tokens, ``tool_tokens.json``: how to
grow the base's tokenizer and embeddings before the rows fit.

Fusion carries one adapter's rows unchanged (two adapters training the same row cannot be summed: each
replaces it, and peft refuses to stack them), and a merged model gets them written into its embedding
and output matrices, with the grown tokenizer saved beside it. Remapping between fused and split layer
layouts does not touch embeddings, so it copies the rows as they are.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agentrl_envs.errors import ConfigError
from agentrl_train.adapters import AdapterError, AdapterMismatchError, UnsupportedAdapterError
from agentrl_train.tool_tokens import ToolTokens, add_tool_tokens, check_same, read_tool_tokens, write_tool_tokens

__all__ = ["ROWS_KEY", "TokenRows", "check_rows_fit", "merge_rows", "prepare_base", "probe_ids", "read_token_rows", "union_rows"]

logger = logging.getLogger(__name__)

ROWS_KEY = "token_adapter.trainable_tokens_delta"  #: peft's key suffix of an embedding module's trained rows
_ROWS_RE = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.token_adapter\.trainable_tokens_delta(?:\.[^.]+)?$")


@dataclass
class TokenRows:
    """The embedding rows one adapter trains.

    Attributes:
        rows: Module path (``model.embed_tokens``, ``lm_head``) -> the rows' values, ``(len(ids), dim)``.
        indices: Module path -> the token ids of those rows, in order.
        listed: True when ``adapter_config.json`` gives the ids as a list (the input embedding only; a tied
            output layer follows it), False for a dict by module name.
        tool_tokens: The added tool-call tokens the rows belong to (``tool_tokens.json``), or None for rows
            of tokens the base already has.
    """

    rows: dict[str, torch.Tensor]
    indices: dict[str, tuple[int, ...]]
    listed: bool
    tool_tokens: ToolTokens | None = None

    @property
    def ids(self) -> list[int]:
        return sorted({i for ids in self.indices.values() for i in ids})

    def config_value(self) -> list[int] | dict[str, list[int]]:
        """``trainable_token_indices`` as ``adapter_config.json`` holds it."""
        if self.listed:
            return list(next(iter(self.indices.values())))
        return {module: list(ids) for module, ids in sorted(self.indices.items())}

    def tensors(self) -> dict[str, torch.Tensor]:
        """The safetensors entries peft's ``save_pretrained`` writes for these rows (float32)."""
        return {f"base_model.model.{m}.{ROWS_KEY}": r.detach().to(torch.float32).contiguous() for m, r in self.rows.items()}

    def write_files(self, folder: Path) -> None:
        """``tool_tokens.json`` beside the weights, when the rows are added tool-call tokens'."""
        if self.tool_tokens is not None:
            write_tool_tokens(folder, self.tool_tokens)


def read_token_rows(folder: Path, config: Mapping[str, Any], tensors: dict[str, torch.Tensor]) -> TokenRows | None:
    """Take the trained rows out of ``tensors`` (what is left is LoRA) and pair them with the config's ids.

    Raises:
        AdapterError: rows without ids in the config, ids without rows, or shapes that disagree.
        ConfigError: a damaged ``tool_tokens.json``.
    """
    found = {}
    for key in [k for k in tensors if _ROWS_RE.match(k)]:
        found[_ROWS_RE.match(key)["module"]] = tensors.pop(key)  # type: ignore[index]
    value = config.get("trainable_token_indices")
    hint = "the config and weights come from different adapters; save the adapter again"
    if not value and not found:
        return None
    if not value or not found:
        have = "trained embedding rows" if found else "trainable_token_indices"
        lacks = "no trainable_token_indices in its config" if found else "no trained rows in its weights"
        raise AdapterError(f"{folder} has {have} but {lacks}; {hint}")

    def ids_of(x: Any) -> tuple[int, ...] | None:
        ok = isinstance(x, list) and x and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1 << 31 for i in x)
        return tuple(x) if ok and len(set(x)) == len(x) else None

    if isinstance(value, list):
        ids = ids_of(value)
        if ids is None or len(found) != 1:
            raise AdapterError(
                f"{folder}: trainable_token_indices={str(value)[:80]} with rows for {sorted(found)}: expected a list of "
                f"distinct token ids and the rows of one embedding; {hint}"
            )
        indices = {next(iter(found)): ids}
    elif isinstance(value, dict) and all(isinstance(k, str) for k in value):
        parsed = {m: ids_of(v) for m, v in value.items()}
        if any(v is None for v in parsed.values()) or set(parsed) != set(found):
            raise AdapterError(
                f"{folder}: trainable_token_indices names {sorted(parsed)}, the weights hold rows for {sorted(found)}; {hint}"
            )
        indices = {m: v for m, v in parsed.items() if v is not None}
    else:
        raise AdapterError(f"{folder}: trainable_token_indices={str(value)[:80]} is neither a list of ids nor a dict; {hint}")
    for module, rows in found.items():
        if rows.ndim != 2 or rows.shape[0] != len(indices[module]):
            raise AdapterError(
                f"{folder}: {module} has rows of shape {tuple(rows.shape)} for {len(indices[module])} token ids; {hint}"
            )
    tool = read_tool_tokens(folder)
    if tool is not None and any(not set(tool.ids) <= set(ids) for ids in indices.values()):
        raise AdapterError(f"{folder}: tool_tokens.json names ids {list(tool.ids)} that the adapter does not train; {hint}")
    return TokenRows(found, indices, isinstance(value, list), tool)


def union_rows(named: Mapping[str, TokenRows | None]) -> tuple[TokenRows | None, dict[str, str]]:
    """The rows a fusion of these adapters carries, and per module which adapter they come from.

    Raises:
        UnsupportedAdapterError: two adapters train the same row of one module (each would replace it).
        AdapterMismatchError: two adapters were trained with different added tool-call tokens.
    """
    present = {name: rows for name, rows in named.items() if rows is not None}
    if not present:
        return None, {}
    tools = {name: r.tool_tokens for name, r in present.items() if r.tool_tokens is not None}
    if len(set(tools.values())) > 1:
        a, b = list(tools)[:2]
        raise AdapterMismatchError(
            f"adapters {a!r} and {b!r} were trained with different added tool-call tokens (ids {list(tools[a].ids)} and "
            f"{list(tools[b].ids)}): they were trained on different bases, so they cannot be fused"
        )
    owner: dict[tuple[str, int], str] = {}
    rows: dict[str, torch.Tensor] = {}
    indices: dict[str, tuple[int, ...]] = {}
    sources: dict[str, str] = {}
    for name, r in present.items():
        for module, ids in r.indices.items():
            for i in ids:
                if (module, i) in owner:
                    raise UnsupportedAdapterError(
                        f"adapters {owner[module, i]!r} and {name!r} both train the row of token {i} in {module}; peft "
                        "replaces a trained row rather than adding to it, so one fused adapter cannot hold both: fuse "
                        "the adapters without one of them, or use them stacked as they are"
                    )
                owner[module, i] = name
            rows[module] = torch.cat([rows[module], r.rows[module]]) if module in rows else r.rows[module].clone()
            indices[module] = indices.get(module, ()) + ids
            sources[module] = f"{sources[module]}+{name}" if module in sources else name
    listed = all(r.listed for r in present.values()) and len(indices) == 1
    return TokenRows(rows, indices, listed, next(iter(tools.values()), None)), sources


def prepare_base(
    model: nn.Module, tokenizer_dir: Path | None, named: Mapping[str, TokenRows | None], model_name: str | None
) -> Any:
    """Grow ``model`` (in place) by the added tool-call tokens the adapters were trained with; returns the grown
    tokenizer, or None when no adapter has added tokens.

    Raises:
        ConfigError: added tokens but no tokenizer to add them with (``tokenizer_dir`` None: a model object).
        AdapterMismatchError: the tokens this base adds are not those an adapter was trained with.
    """
    with_tools = {name: r.tool_tokens for name, r in named.items() if r is not None and r.tool_tokens is not None}
    if not with_tools:
        return None
    name, saved = next(iter(with_tools.items()))
    if tokenizer_dir is None:
        raise ConfigError(
            f"adapter {name!r} was trained with added tool-call tokens ({', '.join(saved.tokens)}); pass the base model "
            "as its folder, whose tokenizer the tokens are added to, not as a model object"
        )
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    except Exception as exc:
        raise ConfigError(
            f"adapter {name!r} was trained with added tool-call tokens, which are added to the base's tokenizer, but "
            f"{tokenizer_dir} has no tokenizer that loads ({type(exc).__name__}: {str(exc)[:160]}); pass the model "
            "folder with its tokenizer files"
        ) from None
    own = add_tool_tokens(model, tokenizer, model_name or str(tokenizer_dir), log=logger.info)
    try:
        check_same(saved, own, f"adapter {name!r}")
    except ConfigError as exc:
        raise AdapterMismatchError(str(exc)) from None
    return tokenizer


def check_rows_fit(name: str, rows: TokenRows, model: nn.Module, model_name: str | None, grown: bool = True) -> None:
    """Raise unless every module ``rows`` names is in ``model``, as wide as the rows and with room for their ids
    (``grown=False``: the model has not been grown by the added tool-call tokens yet, so their ids are not checked)."""
    modules = dict(model.named_modules())
    added = set(rows.tool_tokens.ids) if rows.tool_tokens is not None and not grown else set()
    for module, values in rows.rows.items():
        layer = modules.get(module)
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.ndim != 2:
            raise AdapterMismatchError(
                f"adapter {name!r} trains rows of {module!r}, which the base model {model_name or ''} does not have as "
                "an embedding or output layer; pass the base model it was trained on"
            )
        if weight.shape[1] != values.shape[1] or max(set(rows.indices[module]) - added, default=-1) >= weight.shape[0]:
            raise AdapterMismatchError(
                f"adapter {name!r} trains rows {list(rows.indices[module])[:8]} of width {values.shape[1]} in {module!r}, "
                f"but the base model's has {weight.shape[0]} rows of width {weight.shape[1]}; it was trained on another "
                "base (or one with added tokens: the adapter folder's tool_tokens.json says which)"
            )


def merge_rows(model: nn.Module, rows: TokenRows) -> None:
    """Write the trained rows into ``model``'s matrices (a tied output layer follows its input embedding)."""
    modules = dict(model.named_modules())
    with torch.no_grad():
        for module, values in rows.rows.items():
            weight = modules[module].weight  # type: ignore[union-attr]
            index = torch.tensor(rows.indices[module], device=weight.device)
            weight.index_copy_(0, index, values.to(device=weight.device, dtype=weight.dtype))


def probe_ids(rows: TokenRows | None, batch: torch.Tensor) -> torch.Tensor:
    """``batch`` with its first row's leading positions set to the trained ids, so the self-check reads them."""
    if rows is None:
        return batch
    ids = rows.ids[: batch.shape[1]]
    out = batch.clone()
    out[0, : len(ids)] = torch.tensor(ids, dtype=out.dtype)
    return out
