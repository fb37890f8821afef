"""Exact fusion of LoRA adapters: one adapter, or one merged model, whose delta is ``sum_i s_i B_i A_i``.

Fusing concatenates ranks. For every module, the fused ``A`` stacks the adapters' ``A_i`` (rows) and
the fused ``B`` puts their ``s_i B_i`` side by side (columns), with ``s_i = alpha_i / r_i`` (or
``alpha_i / sqrt(r_i)`` under rsLoRA) folded in, so ``B A = sum_i s_i B_i A_i`` to rounding. The fused
adapter has ``r = sum r_i`` per module and ``lora_alpha = r`` (scaling 1), written per module in
``rank_pattern`` / ``alpha_pattern``. A module that only some adapters target is carried over from those.

peft's ``add_weighted_adapter(combination_type="linear")`` is not a substitute: it adds the ``A`` and
``B`` matrices separately, and ``(A_1 + A_2)(B_1 + B_2) != B_1 A_1 + B_2 A_2``; it also drops
``rank_pattern``. ``tests/train/test_fuse.py`` shows the difference.

Every fusion checks itself before anything lands in ``out_dir``: the logits of what was written (loaded
back from disk) against the base model with all source adapters active at once
(``model.base_model.set_adapter([...])``), on a fixed random batch, in float32.

Embedding rows an adapter trains (``--add-tool-tokens``, peft ``trainable_token_indices``) are carried
unchanged (:mod:`agentrl_train.adapters.token_rows`): the base first gets the adapter's added tokens, the
fused adapter holds the rows, a merged model has them in its matrices and its grown tokenizer beside it,
and the self-check's batch includes every trained id.
"""

from __future__ import annotations

import copy
import difflib
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agentrl_envs.errors import ConfigError
from agentrl_train.adapters import AdapterMismatchError, AdapterNotFoundError, FusionCheckError, UnsupportedAdapterError
from agentrl_train.adapters.adapter import (
    AdapterSource,
    LoraAdapter,
    LoraModule,
    as_adapter,
    resolve_adapter_dir,
    staged_output,
)
from agentrl_train.adapters.token_rows import (
    TokenRows,
    check_rows_fit,
    merge_rows,
    prepare_base,
    probe_ids,
    union_rows,
)

__all__ = ["FuseReport", "check_fits", "fuse_adapters", "fuse_modules", "load_base_model"]

logger = logging.getLogger(__name__)

REPORT_NAME = "fuse_report.json"
DEFAULT_ATOL = 1e-5


# ----------------------------------------------------------------------------------------------------
# The base model
# ----------------------------------------------------------------------------------------------------


def load_base_model(model: str | os.PathLike[str] | nn.Module) -> tuple[nn.Module, str | None]:
    """A base model and its name: a local Hugging Face folder loaded in float32, or a model object as is."""
    if isinstance(model, nn.Module):
        if hasattr(model, "peft_config"):
            raise ConfigError(
                "the base model already carries peft adapters; pass the plain base model, and the adapters as "
                "(peft_model, adapter_name) pairs"
            )
        return model, getattr(getattr(model, "config", None), "_name_or_path", None) or None
    path = Path(model)
    if not (path / "config.json").is_file():
        raise AdapterNotFoundError(
            f"model folder {path} has no config.json; pass a local Hugging Face model folder (what save_pretrained "
            "writes; nothing is downloaded)"
        )
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True), str(path)


def check_fits(name: str, adapter: LoraAdapter, model: nn.Module, model_name: str | None) -> None:
    """Raise unless every module ``adapter`` targets is an ``nn.Linear`` of the same shape in ``model``."""
    layers = dict(model.named_modules())
    linear_names = [n for n, m in layers.items() if isinstance(m, nn.Linear)]
    recorded = adapter.base_model_name_or_path
    trained_on = f"its adapter_config.json names {recorded!r}" if recorded else "its adapter_config.json does not name it"
    for module_name, lora in adapter.modules.items():
        layer = layers.get(module_name)
        if layer is None:
            close = difflib.get_close_matches(module_name, linear_names, n=1)
            hint = f" (closest: {close[0]!r})" if close else ""
            raise AdapterMismatchError(
                f"adapter {name!r} ({adapter.source}) targets module {module_name!r}, which the base model "
                f"{model_name or ''} does not have{hint}; pass the base model it was trained on ({trained_on}), or "
                "convert it with `agentrl-train remap-adapter`"
            )
        if not isinstance(layer, nn.Linear):
            raise UnsupportedAdapterError(
                f"adapter {name!r} targets {module_name!r}, a {type(layer).__name__}; only nn.Linear layers can be fused"
            )
        if (lora.in_features, lora.out_features) != (layer.in_features, layer.out_features):
            raise AdapterMismatchError(
                f"adapter {name!r} ({adapter.source}) maps {lora.in_features} -> {lora.out_features} features on "
                f"{module_name!r}, but the base model's layer maps {layer.in_features} -> {layer.out_features}; the "
                f"adapter was trained on another base model ({trained_on}): pass that one with --model"
            )


# ----------------------------------------------------------------------------------------------------
# Fusion
# ----------------------------------------------------------------------------------------------------


def concat_ranks(parts: Sequence[LoraModule]) -> LoraModule:
    """One pair with ``B @ A = sum_i s_i B_i @ A_i``: A stacked, ``s_i B_i`` side by side, scaling 1."""
    lora_A = torch.cat([p.lora_A.to(torch.float64) for p in parts], dim=0)
    lora_B = torch.cat([p.scaling * p.lora_B.to(torch.float64) for p in parts], dim=1)
    return LoraModule(lora_A.to(torch.float32), lora_B.to(torch.float32), 1.0)


def fuse_modules(adapters: Mapping[str, LoraAdapter]) -> tuple[dict[str, LoraModule], dict[str, list[str]]]:
    """Fuse module by module; returns the fused pairs and, per module, the adapters that contributed."""
    sources: dict[str, list[str]] = {}
    for adapter_name, adapter in adapters.items():
        for module_name in adapter.modules:
            sources.setdefault(module_name, []).append(adapter_name)
    fused = {m: concat_ranks([adapters[a].modules[m] for a in names]) for m, names in sorted(sources.items())}
    return fused, dict(sorted(sources.items()))


@dataclass
class FuseReport:
    """What ``fuse_adapters`` wrote and how well it matches the stacked adapters.

    Attributes:
        out_dir: The adapter folder, or the merged model folder.
        merged: True when ``out_dir`` is a full model with the deltas in its weights.
        adapters: The fused adapters' names, in order.
        sources: Per module, the adapters that target it (one name: carried; several: fused).
        ranks: Per module, the fused rank (the sum of the contributing ranks).
        max_abs_diff: Max |logit difference| of the written result vs the stacked adapters (float32).
        atol: The bound ``max_abs_diff`` was checked against.
        probe_shape: (batch, tokens) of the random probe batch.
        token_rows: Per embedding module whose rows an adapter trains, ``{"ids": [...], "from": adapter}``.
        added_tokens: The added tool-call tokens those rows belong to (the base was grown by them first).
    """

    out_dir: Path
    merged: bool
    adapters: list[str]
    sources: dict[str, list[str]]
    ranks: dict[str, int]
    max_abs_diff: float
    atol: float
    probe_shape: tuple[int, int] = (2, 16)
    base_model: str | None = None
    token_rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    added_tokens: list[str] = field(default_factory=list)

    @property
    def fused_modules(self) -> list[str]:
        return [m for m, names in self.sources.items() if len(names) > 1]

    @property
    def carried_modules(self) -> list[str]:
        return [m for m, names in self.sources.items() if len(names) == 1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "merged": self.merged,
            "base_model": self.base_model,
            "adapters": self.adapters,
            "sources": self.sources,
            "ranks": self.ranks,
            "max_abs_diff": self.max_abs_diff,
            "atol": self.atol,
            "probe_shape": list(self.probe_shape),
            "token_rows": self.token_rows,
            "added_tokens": self.added_tokens,
        }

    def summary(self) -> str:
        what = "merged model" if self.merged else "fused adapter"
        lines = [
            f"{what}: {self.out_dir}",
            f"adapters: {', '.join(self.adapters)}; modules: {len(self.sources)} "
            f"({len(self.fused_modules)} fused, {len(self.carried_modules)} carried)",
        ]
        width = max((len(m) for m in self.sources), default=6)
        lines.append(f"  {'module':<{width}}  rank  from")
        for module, names in self.sources.items():
            lines.append(f"  {module:<{width}}  {self.ranks[module]:>4}  {'+'.join(names)}")
        added = f" (added tokens {', '.join(self.added_tokens)})" if self.added_tokens else ""
        for module, rows in self.token_rows.items():
            lines.append(f"  rows {rows['ids']} of {module}{added}, carried from {rows['from']}")
        lines.append(
            f"check: max |logit diff| vs stacked adapters = {self.max_abs_diff:.3g} (float32, batch "
            f"{self.probe_shape[0]}x{self.probe_shape[1]}, bound {self.atol:g}): ok"
        )
        return "\n".join(lines)


def probe_batch(model: nn.Module, seed: int = 0, shape: tuple[int, int] = (2, 16)) -> torch.Tensor:
    """The fixed random token batch the self-checks run on."""
    vocab = int(model.get_input_embeddings().num_embeddings)  # type: ignore[operator]
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def logits_of(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Float32 logits on the CPU, with the batch moved to wherever the model lives."""
    model.eval()
    device = next(model.parameters()).device
    return model(input_ids=input_ids.to(device)).logits.float().cpu()


def stacked_logits(
    base: nn.Module, adapter_dirs: Sequence[Path], input_ids: torch.Tensor, rows: TokenRows | None = None
) -> torch.Tensor:
    """Logits of a float32 copy of ``base`` with every adapter in ``adapter_dirs`` active at once.

    ``rows``: trained embedding rows written into the copy first. peft cannot stack a second adapter on a
    model whose first one trains rows (``load_adapter`` looks for the rows in the second), so with several
    adapters the rows are written into the base and ``adapter_dirs`` hold LoRA only.
    """
    from peft import PeftModel

    names = [f"stack{i}" for i in range(len(adapter_dirs))]
    start = copy.deepcopy(base).float()
    if rows is not None:
        merge_rows(start, rows)
    model: Any = PeftModel.from_pretrained(start, str(adapter_dirs[0]), adapter_name=names[0])
    for name, folder in zip(names[1:], adapter_dirs[1:]):
        model.load_adapter(str(folder), adapter_name=name)
    model.base_model.set_adapter(names)  # PeftModel.set_adapter refuses a list; the LoraModel takes one
    return logits_of(model, input_ids)


def _merge_into(model: Any, fused: Mapping[str, LoraModule]) -> None:
    embedding = model.get_input_embeddings()
    for name, lora in fused.items():
        layer = model.get_submodule(name)
        assert isinstance(layer, nn.Linear), name  # check_fits made sure
        if embedding is not None and layer.weight is getattr(embedding, "weight", None):
            raise UnsupportedAdapterError(
                f"{name!r} shares its weight with the input embeddings; merging would change both. Use the fused "
                "adapter (no --merge) instead"
            )
        with torch.no_grad():
            layer.weight += lora.delta(torch.float64).to(device=layer.weight.device, dtype=layer.weight.dtype)


def _copy_tokenizer_files(src: Path, dst: Path) -> None:
    prefixes = ("tokenizer", "special_tokens_map", "vocab", "merges", "chat_template", "added_tokens")
    for f in src.iterdir():
        if f.is_file() and f.name.startswith(prefixes):
            shutil.copy2(f, dst / f.name)


@dataclass
class _Fused:
    """What is written: the fused pairs, the carried rows, and the grown tokenizer that goes with them."""

    modules: dict[str, LoraModule]
    rows: TokenRows | None
    tokenizer: Any  # the base's tokenizer with the added tool-call tokens, or None


def _write_fused(
    tmp: Path, model: nn.Module, base: Any, name: str | None, fused: _Fused, merge: bool, ids: torch.Tensor
) -> torch.Tensor:
    """Write the fused adapter (``merge``: the merged model, with ``base``'s tokenizer files) to ``tmp``; its logits read back."""
    if merge:
        merged = copy.deepcopy(model).float()
        _merge_into(merged, fused.modules)
        if fused.rows is not None:
            merge_rows(merged, fused.rows)
        merged.save_pretrained(str(tmp))  # type: ignore[operator]
        del merged
        if fused.tokenizer is not None:  # the added tokens are in the tokenizer the merged model needs
            fused.tokenizer.save_pretrained(str(tmp))
        elif not isinstance(base, nn.Module):
            _copy_tokenizer_files(Path(base), tmp)
        from transformers import AutoModelForCausalLM

        return logits_of(AutoModelForCausalLM.from_pretrained(str(tmp), dtype=torch.float32), ids)
    from peft import PeftModel

    LoraAdapter(fused.modules, name, "<fused>", fused.rows).save(tmp)
    return logits_of(PeftModel.from_pretrained(copy.deepcopy(model).float(), str(tmp)), ids)


def _reference_dirs(
    adapters: Mapping[str, AdapterSource], loaded: Mapping[str, LoraAdapter], scratch: Path, lora_only: bool
) -> list[Path]:
    """The folders the self-check stacks with peft: the originals where given as folders, else saved to
    ``scratch`` (``lora_only``: without their trained rows, which stacked_logits writes into the base)."""
    dirs = []
    for i, (name, source) in enumerate(adapters.items()):
        if isinstance(source, (str, os.PathLike)) and not lora_only:
            dirs.append(resolve_adapter_dir(Path(source)))
        else:
            a = loaded[name]
            dirs.append(
                (LoraAdapter(a.modules, a.base_model_name_or_path, a.source) if lora_only else a).save(scratch / f"adapter{i}")
            )
    return dirs


def fuse_adapters(
    base_model: str | os.PathLike[str] | nn.Module,
    adapters: Mapping[str, AdapterSource],
    out_dir: str | os.PathLike[str],
    merge: bool = False,
    *,
    atol: float = DEFAULT_ATOL,
    seed: int = 0,
) -> FuseReport:
    """Fuse LoRA adapters exactly into one adapter, or (``merge=True``) into the weights of a full model.

    Args:
        base_model: A local Hugging Face model folder (loaded in float32) or a model object (left untouched).
        adapters: Name -> adapter: a folder in peft's ``save_pretrained`` layout, a ``LoraAdapter``, or a
            ``(peft_model, adapter_name)`` pair.
        out_dir: A new (or empty) folder; it appears only once the self-check has passed.
        merge: Write a full model (``save_pretrained``, float32) instead of an adapter.
        atol: Bound on the max absolute logit difference vs the stacked adapters, in float32.
        seed: Seed of the random probe batch.

    Returns:
        A ``FuseReport`` (also written to ``out_dir/fuse_report.json``).

    Raises:
        ConfigError: No adapters, or ``out_dir`` not empty.
        AdapterNotFoundError, AdapterMismatchError, UnsupportedAdapterError: an adapter that cannot be fused.
        FusionCheckError: The result does not reproduce the stacked adapters (nothing is written).
    """
    if not adapters:
        raise ConfigError("no adapters to fuse; pass at least one, e.g. --adapter tool=runs/x/final")
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or not math.isfinite(atol) or atol <= 0:
        # nan passed every check (diff > nan is False); a negative bound failed after the whole fusion
        raise ConfigError(f"atol={atol!r}: use a finite bound > 0, e.g. {DEFAULT_ATOL:g} (--atol)")
    for name in adapters:
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"adapter names must be non-empty strings, got {name!r}; use --adapter NAME=DIR")
    out = Path(out_dir)
    model, model_name = load_base_model(base_model)
    loaded = {name: as_adapter(source) for name, source in adapters.items()}
    named_rows = {name: adapter.token_rows for name, adapter in loaded.items()}
    rows, row_sources = union_rows(named_rows)
    tokenizer = prepare_base(model, None if isinstance(base_model, nn.Module) else Path(base_model), named_rows, model_name)
    for name, adapter in loaded.items():
        check_fits(name, adapter, model, model_name)
        if adapter.token_rows is not None:
            check_rows_fit(name, adapter.token_rows, model, model_name)
    modules, sources = fuse_modules(loaded)
    fused = _Fused(modules, rows, tokenizer)
    input_ids = probe_ids(rows, probe_batch(model, seed))

    with staged_output(out) as tmp, tempfile.TemporaryDirectory(prefix="agentrl-fuse-") as scratch:
        rows_apart = rows is not None and len(loaded) > 1  # see stacked_logits
        dirs = _reference_dirs(adapters, loaded, Path(scratch), rows_apart)
        reference = stacked_logits(model, dirs, input_ids, rows if rows_apart else None)
        candidate = _write_fused(tmp, model, base_model, model_name, fused, merge, input_ids)
        diff = float((candidate - reference).abs().max())
        if not math.isfinite(diff) or diff > atol:
            raise FusionCheckError(
                f"the {'merged model' if merge else 'fused adapter'} differs from the stacked adapters by {diff:.3g} "
                f"in the logits (bound {atol:g}, float32); nothing was written to {out}. If the base model is large or "
                "its logits are large, pass a looser atol; otherwise report this with the adapters' configs"
            )
        report = FuseReport(
            out_dir=out,
            merged=merge,
            adapters=list(adapters),
            sources=sources,
            ranks={m: f.rank for m, f in modules.items()},
            max_abs_diff=diff,
            atol=atol,
            probe_shape=(int(input_ids.shape[0]), int(input_ids.shape[1])),
            base_model=model_name,
            token_rows={m: {"ids": list(ids), "from": row_sources[m]} for m, ids in (rows.indices if rows else {}).items()},
            added_tokens=list(rows.tool_tokens.tokens) if rows is not None and rows.tool_tokens is not None else [],
        )
        (tmp / REPORT_NAME).write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    logger.info("%s", report.summary())
    return report
