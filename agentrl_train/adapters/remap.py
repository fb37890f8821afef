"""Move a LoRA adapter between fused and split layer layouts (Phi-3 vs Llama/Qwen), exactly where possible.

The two layouts hold the same weights in different Linear layers::

    fused (Phi-3)                 split (Llama, Qwen2, Mistral)
    self_attn.qkv_proj    rows =  self_attn.q_proj | k_proj | v_proj   (q, then k, then v)
    mlp.gate_up_proj      rows =  mlp.gate_proj | up_proj              (gate, then up)
    o_proj, down_proj, ...        same name, same shape

fused -> split is exact at the same rank: each part keeps the shared ``A`` and takes its rows of ``B``.
split -> fused is exact with ranks added: ``A`` stacks the parts' ``A_i`` and ``B`` is block-diagonal
(part ``i``'s ``s_i B_i`` in its rows and its rank columns; a part the adapter did not train is zero).
Row sizes come from the target model (its layers, and for a join its config: heads x head_dim,
key/value heads x head_dim, intermediate_size). With ``rank`` set, every target delta is cut to that rank
by a truncated SVD and the relative Frobenius error ``||D - D_k|| / ||D||`` is reported per module.

Embedding rows the adapter trains (``--add-tool-tokens``, peft ``trainable_token_indices``) are not
touched by the layout and are copied as they are, with ``tool_tokens.json``; the target must have the
same embedding modules, as wide as the rows.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agentrl_envs.errors import ConfigError
from agentrl_train.adapters import AdapterMismatchError, AdapterNotFoundError, RemapError
from agentrl_train.adapters.adapter import LoraAdapter, LoraModule, load_adapter, staged_output
from agentrl_train.adapters.fuse import check_fits
from agentrl_train.adapters.token_rows import check_rows_fit

__all__ = ["FUSED_PARTS", "MappingRow", "RemapReport", "model_skeleton", "remap_adapter", "target_layers", "truncate_rank"]

logger = logging.getLogger(__name__)

FUSED_PARTS: dict[str, tuple[str, ...]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
PART_OF = {part: fused for fused, parts in FUSED_PARTS.items() for part in parts}
REPORT_NAME = "remap_report.json"

ModelRef = str | os.PathLike[str] | nn.Module | Any  # a folder, a model, or a transformers PretrainedConfig


@dataclass(frozen=True)
class MappingRow:
    """One line of the mapping table: ``target`` rows ``rows`` come from ``source`` by ``op``."""

    source: str
    target: str
    op: str
    rows: tuple[int, int] | None = None


@dataclass
class _Step:
    kind: str  # "copy" | "split" | "join"
    target: str
    sources: list[tuple[str | None, int, int]]  # (source module or None for an untrained part, row start, row stop)


def _layout(names: list[str]) -> str:
    leaves = {n.rpartition(".")[2] for n in names}
    fused, split = leaves & set(FUSED_PARTS), leaves & set(PART_OF)
    if fused and split:
        return "mixed"
    return "fused" if fused else "split" if split else "plain"


def _load_config(ref: ModelRef) -> tuple[Any, str]:
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(ref, PretrainedConfig):
        return ref, getattr(ref, "_name_or_path", "") or type(ref).__name__
    if not isinstance(ref, (str, os.PathLike)):
        raise ConfigError(f"expected a model folder, a model or a config, got {type(ref).__name__}")
    path = Path(ref)
    if not (path / "config.json").is_file():
        raise AdapterNotFoundError(
            f"model folder {path} has no config.json; pass a local Hugging Face model folder (nothing is downloaded)"
        )
    return AutoConfig.from_pretrained(str(path), local_files_only=True), str(path)


def model_skeleton(ref: ModelRef) -> tuple[nn.Module, Any, str]:
    """A model to read layer names and shapes from: ``ref`` itself, or one built on the meta device (no weights)."""
    if isinstance(ref, nn.Module):
        config = getattr(ref, "config", None)
        return ref, config, getattr(config, "_name_or_path", "") or type(ref).__name__
    from transformers import AutoModelForCausalLM

    config, name = _load_config(ref)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return model, config, name


def target_layers(ref: ModelRef) -> tuple[dict[str, nn.Linear], Any, str]:
    """The Linear layers of a model by name, its config and its name."""
    model, config, name = model_skeleton(ref)
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}, config, name


def _part_sizes(fused_leaf: str, config: Any) -> list[int] | None:
    """Row sizes of the parts of a fused layer from the model config, or None if the config does not say."""
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    try:
        if fused_leaf == "qkv_proj":
            heads = int(text.num_attention_heads)
            kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
            head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
            return [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        if fused_leaf == "gate_up_proj":
            return [int(text.intermediate_size)] * 2
    except (AttributeError, TypeError, ValueError):
        return None
    return None


def _check_in(name: str, lora: LoraModule, layer: nn.Linear, target: str, target_name: str) -> None:
    if lora.in_features != layer.in_features:
        raise RemapError(
            f"module {name!r} reads {lora.in_features} features but {target!r} in {target_name} reads "
            f"{layer.in_features}; the models differ in width, so the adapter cannot be mapped"
        )


def _plan(modules: Mapping[str, LoraModule], layers: Mapping[str, nn.Linear], config: Any, target_name: str) -> list[_Step]:
    steps: list[_Step] = []
    joins: dict[str, dict[str, str]] = {}
    for name, lora in sorted(modules.items()):
        parent, _, leaf = name.rpartition(".")
        if name in layers:
            layer = layers[name]
            _check_in(name, lora, layer, name, target_name)
            if lora.out_features != layer.out_features:
                raise RemapError(
                    f"module {name!r} writes {lora.out_features} rows but the same module in {target_name} writes "
                    f"{layer.out_features}; the models differ in shape, so the adapter cannot be mapped"
                )
            steps.append(_Step("copy", name, [(name, 0, lora.out_features)]))
        elif leaf in FUSED_PARTS and all(f"{parent}.{p}" in layers for p in FUSED_PARTS[leaf]):
            targets = [f"{parent}.{p}" for p in FUSED_PARTS[leaf]]
            for target in targets:
                _check_in(name, lora, layers[target], target, target_name)
            rows = [layers[t].out_features for t in targets]
            if sum(rows) != lora.out_features:
                raise RemapError(
                    f"module {name!r} writes {lora.out_features} rows but {', '.join(targets)} in {target_name} write "
                    f"{'+'.join(map(str, rows))} = {sum(rows)}; the head counts differ, so it cannot be split"
                )
            start = 0
            for target, size in zip(targets, rows):
                steps.append(_Step("split", target, [(name, start, start + size)]))
                start += size
        elif leaf in PART_OF and f"{parent}.{PART_OF[leaf]}" in layers:
            joins.setdefault(f"{parent}.{PART_OF[leaf]}", {})[leaf] = name
        else:
            siblings = sorted(n.rpartition(".")[2] for n in layers if n.rpartition(".")[0] == parent)
            where = f"its parent {parent!r} there has {siblings}" if siblings else f"{target_name} has no {parent!r}"
            raise RemapError(
                f"module {name!r} has no counterpart in {target_name} ({where}); pass the model whose layout the "
                "adapter should move to, with the same number of layers"
            )
    for target, parts in sorted(joins.items()):
        leaf = target.rpartition(".")[2]
        part_names = FUSED_PARTS[leaf]
        sizes: list[int] | None = _part_sizes(leaf, config)
        if sizes is None and len(parts) == len(part_names):
            sizes = [modules[parts[p]].out_features for p in part_names]
        if sizes is None:
            raise RemapError(
                f"cannot build {target!r}: the adapter trains only {sorted(parts)} and the target config does not give "
                "the row sizes of the others; pass a model folder whose config.json has the head counts"
            )
        if sum(sizes) != layers[target].out_features:
            raise RemapError(
                f"{target!r} in {target_name} writes {layers[target].out_features} rows, but its config gives parts "
                f"{'+'.join(map(str, sizes))}; the layer and the config disagree, so it cannot be joined"
            )
        sources: list[tuple[str | None, int, int]] = []
        start = 0
        for part, size in zip(part_names, sizes):
            source = parts.get(part)
            if source is not None:
                lora = modules[source]
                _check_in(source, lora, layers[target], target, target_name)
                if lora.out_features != size:
                    raise RemapError(
                        f"module {source!r} writes {lora.out_features} rows but its slot in {target!r} in {target_name} "
                        f"has {size}; the head counts differ, so it cannot be joined"
                    )
            sources.append((source, start, start + size))
            start += size
        steps.append(_Step("join", target, sources))
    return sorted(steps, key=lambda s: s.target)


def _apply(step: _Step, modules: Mapping[str, LoraModule], out_features: int) -> LoraModule:
    if step.kind == "copy":
        m = modules[step.sources[0][0]]  # type: ignore[index]
        return LoraModule(m.lora_A.clone(), m.lora_B.clone(), m.scaling)
    if step.kind == "split":
        name, start, stop = step.sources[0]
        m = modules[name]  # type: ignore[index]
        return LoraModule(m.lora_A.clone(), m.lora_B[start:stop].clone(), m.scaling)
    present = [(modules[name], start, stop) for name, start, stop in step.sources if name is not None]
    lora_A = torch.cat([m.lora_A.to(torch.float64) for m, _, _ in present], dim=0)
    lora_B = torch.zeros(out_features, lora_A.shape[0], dtype=torch.float64)
    col = 0
    for m, start, stop in present:
        lora_B[start:stop, col : col + m.rank] = m.scaling * m.lora_B.to(torch.float64)
        col += m.rank
    return LoraModule(lora_A.to(torch.float32), lora_B.to(torch.float32), 1.0)


def _exact_diff(step: _Step, modules: Mapping[str, LoraModule], result: LoraModule) -> float:
    """Max |entry| of (target delta - the source delta rows it should equal): the algebra, checked on weights."""
    delta = result.delta()
    worst = 0.0
    for name, start, stop in step.sources:
        if step.kind == "join":  # the part's rows of the fused delta are the part's whole delta
            rows = delta[start:stop]
            expected = torch.zeros_like(rows) if name is None else modules[name].delta()
        else:  # a split part (or a copy) is its rows of the source delta
            rows, expected = delta, modules[name].delta()[start:stop]  # type: ignore[index]
        worst = max(worst, float((rows - expected).abs().max()))
    return worst


def truncate_rank(lora: LoraModule, rank: int) -> tuple[LoraModule, float]:
    """The best rank-``rank`` pair for ``lora``'s delta (truncated SVD) and its relative Frobenius error.

    The SVD runs on the small ``r x r`` core of ``QR(B) @ QR(A^T)^T``, so it never forms the full delta.
    """
    lora_B = lora.scaling * lora.lora_B.to(torch.float64)
    q_b, r_b = torch.linalg.qr(lora_B)
    q_a, r_a = torch.linalg.qr(lora.lora_A.to(torch.float64).T)
    u, s, vh = torch.linalg.svd(r_b @ r_a.T)
    k = max(1, min(rank, int(s.numel())))
    new_B = (q_b @ u[:, :k]) * s[:k]
    new_A = vh[:k] @ q_a.T
    total = float(s.square().sum())
    error = math.sqrt(float(s[k:].square().sum()) / total) if total > 0 else 0.0
    return LoraModule(new_A.to(torch.float32), new_B.to(torch.float32), 1.0), error


@dataclass
class RemapReport:
    """What ``remap_adapter`` wrote.

    Attributes:
        out_dir: The new adapter folder (peft layout).
        source_layout / target_layout: ``fused``, ``split``, ``mixed`` or ``plain`` (names only).
        mapping: One row per target module and source part.
        ranks: Rank per written module.
        exact_max_abs_diff: Max |difference| between the exact remap's deltas and the source deltas.
        rank: The imposed rank, or None for the exact remap.
        rel_errors: With ``rank``, per module ``||D - D_rank||_F / ||D||_F``.
    """

    out_dir: Path
    source: str
    target: str
    source_layout: str
    target_layout: str
    mapping: list[MappingRow]
    ranks: dict[str, int]
    exact_max_abs_diff: float
    rank: int | None = None
    rel_errors: dict[str, float] = field(default_factory=dict)

    @property
    def max_rel_error(self) -> float:
        return max(self.rel_errors.values(), default=0.0)

    def table(self) -> str:
        """The mapping table with layer numbers folded into ``{N}`` (one line per pattern)."""
        counts: dict[tuple[str, str, str], int] = {}
        for row in self.mapping:
            rows = f"rows {row.rows[0]}:{row.rows[1]}" if row.rows else ""
            key = (re.sub(r"\.\d+\.", ".{N}.", row.source), re.sub(r"\.\d+\.", ".{N}.", row.target), f"{row.op} {rows}".strip())
            counts[key] = counts.get(key, 0) + 1
        width_s = max((len(k[0]) for k in counts), default=6)
        width_t = max((len(k[1]) for k in counts), default=6)
        lines = [f"  {'source':<{width_s}}  {'target':<{width_t}}  how (x modules)"]
        for (src, dst, how), n in counts.items():
            lines.append(f"  {src:<{width_s}}  {dst:<{width_t}}  {how} (x{n})")
        return "\n".join(lines)

    def summary(self) -> str:
        lines = [
            f"remapped adapter: {self.out_dir}",
            f"from {self.source} ({self.source_layout}) to {self.target} ({self.target_layout})",
            self.table(),
            f"exact remap: max |delta difference| = {self.exact_max_abs_diff:.3g}",
        ]
        if self.rank is not None:
            lines.append(f"rank {self.rank} (truncated SVD): relative Frobenius error per module")
            width = max((len(n) for n in self.rel_errors), default=6)
            for name, err in self.rel_errors.items():
                lines.append(f"  {name:<{width}}  r={self.ranks[name]:<3}  {err:.4g}")
            lines.append(f"max relative error: {self.max_rel_error:.4g}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "source": self.source,
            "target": self.target,
            "source_layout": self.source_layout,
            "target_layout": self.target_layout,
            "mapping": [{"source": r.source, "target": r.target, "op": r.op, "rows": r.rows} for r in self.mapping],
            "ranks": self.ranks,
            "exact_max_abs_diff": self.exact_max_abs_diff,
            "rank": self.rank,
            "rel_errors": self.rel_errors,
        }


_OPS = {"copy": "copy A and B", "split": "share A, slice B", "join": "stack A, block-diagonal B"}


def remap_adapter(
    src_dir: str | os.PathLike[str] | LoraAdapter,
    to_model: ModelRef,
    out_dir: str | os.PathLike[str],
    rank: int | None = None,
    *,
    from_model: ModelRef | None = None,
) -> RemapReport:
    """Convert a LoRA adapter to ``to_model``'s layer layout (fused <-> split), exactly unless ``rank`` is set.

    Args:
        src_dir: The adapter folder (peft ``save_pretrained`` layout) or a ``LoraAdapter``.
        to_model: The target model: a local folder (only config.json is read), a model, or a config.
        out_dir: A new (or empty) folder for the remapped adapter.
        rank: Cut every written module to this rank by truncated SVD (errors reported); None keeps it exact.
        from_model: The source base model, to check the adapter against it first (optional).

    Raises:
        RemapError: A module whose name or shape has no counterpart in the target (the message names it).
        AdapterNotFoundError, AdapterMismatchError: missing folders; an adapter that does not fit ``from_model``.
        ConfigError: ``rank`` < 1, or ``out_dir`` not empty.
    """
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise ConfigError(f"rank must be a positive integer or None (exact), got {rank!r}")
    adapter = src_dir if isinstance(src_dir, LoraAdapter) else load_adapter(src_dir)
    if from_model is not None:
        source_model, _, source_name = model_skeleton(from_model)
        try:
            check_fits("source", adapter, source_model, source_name)
        except AdapterMismatchError as exc:
            raise AdapterMismatchError(f"{exc} (checked against --from-model)") from None
    skeleton, config, target_name = model_skeleton(to_model)
    layers = {n: m for n, m in skeleton.named_modules() if isinstance(m, nn.Linear)}
    steps = _plan(adapter.modules, layers, config, target_name)
    if adapter.token_rows is not None:  # embeddings are the same in both layouts: the rows are copied
        check_rows_fit("source", adapter.token_rows, skeleton, target_name, grown=False)

    written: dict[str, LoraModule] = {}
    mapping: list[MappingRow] = []
    exact = 0.0
    errors: dict[str, float] = {}
    for step in steps:
        result = _apply(step, adapter.modules, layers[step.target].out_features)
        exact = max(exact, _exact_diff(step, adapter.modules, result))
        for source, start, stop in step.sources:
            rows = (start, stop) if step.kind != "copy" else None
            op = _OPS[step.kind] if source is not None else "zero rows (part not trained)"
            mapping.append(MappingRow(source or "-", step.target, op, rows))
        if rank is not None:
            result, errors[step.target] = truncate_rank(result, rank)
        written[step.target] = result
    for module, ids in sorted((adapter.token_rows.indices if adapter.token_rows else {}).items()):
        mapping.append(MappingRow(module, module, f"copy trained rows of tokens {list(ids)}"))

    out = Path(out_dir)
    report = RemapReport(
        out_dir=out,
        source=adapter.base_model_name_or_path or adapter.source,
        target=target_name,
        source_layout=_layout(list(adapter.modules)),
        target_layout=_layout(list(layers)),
        mapping=mapping,
        ranks={name: m.rank for name, m in written.items()},
        exact_max_abs_diff=exact,
        rank=rank,
        rel_errors=errors,
    )
    with staged_output(out) as tmp:
        base_name = str(to_model) if isinstance(to_model, (str, os.PathLike)) else target_name
        LoraAdapter(written, base_name, "<remapped>", adapter.token_rows).save(tmp)
        (tmp / REPORT_NAME).write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    logger.info("%s", report.summary())
    return report
