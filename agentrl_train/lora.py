"""Where LoRA goes on a model and how saved adapters are found: presets of ranks by layer kind,
the layers a preset targets, and the folder checks that fail before a model is built.

- :func:`lora_targets`: peft ``target_modules`` / ``rank_pattern`` / ``alpha_pattern`` for a model,
  from a preset (:data:`LORA_PRESETS`) and per-kind or per-module overrides (``--lora-ranks``);
  attention and MLP projections inside the transformer blocks, split or fused, never embeddings or
  ``lm_head``.
- :func:`find_adapter_weights` / :func:`check_adapter_folder`: the ``adapter_model.safetensors`` a
  folder holds, checked from file headers only (a wrong ``--init-adapter`` fails in a second).
- :func:`rescale_saved_lora`: a saved adapter's own per-module scaling folded into its ``B`` where it is
  not the live adapter's (a fused or remapped adapter has ``alpha = r``), so loading it is exact.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agentrl_envs.errors import ConfigError

__all__ = [
    "ATTN",
    "LORA_PRESETS",
    "MLP",
    "check_adapter_folder",
    "find_adapter_weights",
    "lora_config",
    "lora_layers",
    "lora_targets",
    "rescale_saved_lora",
    "saved_scaling",
]

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj")
MLP = ("gate_proj", "up_proj", "down_proj", "gate_up_proj")
LORA_PRESETS: dict[str, dict[str, int]] = {
    "seed": {"attn": 64, "mlp": 16},
    "mlp-heavy": {"attn": 16, "mlp": 64},
    "uniform": {"attn": 32, "mlp": 32},
    "small": {"attn": 16, "mlp": 8},  # ~600-wide models (SmolLM2-135M): benchmarks/bench_lora_presets.py
}


def lora_layers(lm: nn.Module) -> Iterator[tuple[str, nn.Linear]]:
    """``(module name's last part, layer)`` of every linear layer LoRA may target: the attention and MLP
    projections inside the transformer blocks (``.layers.N.``), never embeddings or ``lm_head``."""
    for name, module in lm.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, nn.Linear) and leaf in ATTN + MLP and re.search(r"\.layers\.\d+\.", name):
            yield leaf, module


def lora_targets(
    lm: nn.Module, preset: str = "seed", ranks: dict[str, int] | None = None, alpha_ratio: float = 2.0
) -> dict[str, Any]:
    """LoRA target modules with ranks by layer kind, as peft ``rank_pattern`` / ``alpha_pattern``.

    Attention projections (``q/k/v/o_proj``, fused ``qkv_proj``) and MLP projections (``gate/up/down_proj``,
    fused ``gate_up_proj``) inside the transformer blocks; never embeddings, positions or ``lm_head``.
    ``ranks`` overrides the preset by kind (``attn``, ``mlp``) or by module name (``q_proj``).
    """
    if preset not in LORA_PRESETS:
        raise ConfigError(f"--lora-preset={preset!r}: use one of {', '.join(LORA_PRESETS)}")
    by_kind = dict(LORA_PRESETS[preset])
    ranks = dict(ranks or {})
    width: dict[str, int] = {}  # module name -> the smallest min(in, out) of its layers: a rank above it is no use
    for leaf, module in lora_layers(lm):
        width[leaf] = min(width.get(leaf, module.in_features), module.in_features, module.out_features)
    present = set(width)
    if not present:
        raise ConfigError("this model has no q/k/v/o_proj, qkv_proj or gate/up/down_proj layers to put LoRA on")
    for key, value in ranks.items():
        if key not in ("attn", "mlp") and key not in present:
            raise ConfigError(
                f"--lora-ranks: unknown module {key!r}; this model has {', '.join(sorted(present))} (or use attn / mlp)"
            )
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"--lora-ranks: rank of {key!r} is {value!r}; use a positive int")
    by_kind.update({k: v for k, v in ranks.items() if k in ("attn", "mlp")})
    rank_pattern = {m: ranks.get(m, by_kind["attn" if m in ATTN else "mlp"]) for m in sorted(present)}
    for key, value in ranks.items():  # the preset's ranks are not checked: a small model may be narrower than 64
        applies = [m for m in present if m == key or (m not in ranks and key == ("attn" if m in ATTN else "mlp"))]
        if applies and value > min(width[m] for m in applies):
            narrowest = min(applies, key=lambda m: (width[m], m))
            kind = f"{key} modules ({', '.join(sorted(applies))})" if key in ("attn", "mlp") else key
            raise ConfigError(
                f"--lora-ranks: rank {value} for {kind} is above this model's width there ({narrowest} is "
                f"{width[narrowest]} wide: min(in, out) features); the largest allowed {key} rank is {width[narrowest]}"
            )
    alpha_pattern = {m: alpha_ratio * r for m, r in rank_pattern.items()}
    return {"target_modules": sorted(present), "rank_pattern": rank_pattern, "alpha_pattern": alpha_pattern}


def find_adapter_weights(folder: Path, adapter: str) -> Path | None:
    """The ``adapter_model.safetensors`` that :meth:`Policy.load_adapter_weights` reads from ``folder``, or None.

    Looked for in ``folder/<adapter>/`` (what :meth:`Policy.save` writes), ``folder`` itself, then its subfolders.
    """
    if not folder.is_dir():
        return None
    for sub in (folder / adapter, folder, *sorted(p for p in folder.iterdir() if p.is_dir())):
        if (sub / "adapter_model.safetensors").is_file():
            return sub / "adapter_model.safetensors"
    return None


def check_adapter_folder(folder: str, adapter: str, option: str = "--init-adapter") -> None:
    """ConfigError unless ``folder`` looks like a saved peft adapter; reads file headers only, no model needed.

    So a wrong ``--init-adapter`` fails in a second, before the base model is built or loaded
    (minutes for the tiny model's first build), instead of after it.

    Raises:
        ConfigError: naming ``option``: no such folder, no ``adapter_model.safetensors`` with its
            ``adapter_config.json`` in it, or files that are not what their names say.
    """
    from safetensors import SafetensorError, safe_open

    shown = f"{option} {folder[:200]!r}"
    hint = "point at the final/ folder of an sft or ppo run (or a peft save_pretrained folder)"
    path = Path(folder)
    try:
        if "\x00" in folder or not path.exists():
            raise ConfigError(f"{shown}: no such folder; {hint}")
        if not path.is_dir():
            raise ConfigError(f"{shown}: is a file, not a folder; {hint}")
        weights = find_adapter_weights(path, adapter)
        if weights is None:
            raise ConfigError(f"{shown}: not an adapter folder (no adapter_model.safetensors in it or its subfolders); {hint}")
        config = weights.parent / "adapter_config.json"
        if not config.is_file():
            raise ConfigError(f"{shown}: {weights} has no adapter_config.json beside it, so it is not a peft adapter; {hint}")
        try:
            data = json.loads(config.read_bytes()[: 1 << 20])
        except (ValueError, UnicodeDecodeError):
            data = None
        if not isinstance(data, dict):
            raise ConfigError(f"{shown}: {config} is not a JSON object (damaged or not peft's); save the adapter again")
        with safe_open(str(weights), framework="pt") as f:  # the header only, not the tensors
            if not list(f.keys()):
                raise ConfigError(f"{shown}: {weights} holds no weights; save the adapter again")
    except SafetensorError as exc:
        raise ConfigError(f"{shown}: {weights} is not a safetensors file ({str(exc)[:200]}); save the adapter again") from None
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot be read ({exc.strerror or type(exc).__name__}); {hint}") from None


def lora_config(lora: dict[str, Any], dropout: float = 0.0, trainable_token_indices: Any = None) -> Any:
    """peft's ``LoraConfig`` for :func:`lora_targets`' targets, ranks and alphas (no biases, causal LM)."""
    from peft import LoraConfig

    return LoraConfig(
        r=max(lora["rank_pattern"].values()),
        lora_alpha=max(lora["alpha_pattern"].values()),
        target_modules=lora["target_modules"],
        rank_pattern=lora["rank_pattern"],
        alpha_pattern=lora["alpha_pattern"],
        lora_dropout=dropout,
        bias="none",
        task_type="CAUSAL_LM",
        trainable_token_indices=trainable_token_indices,
    )


def saved_scaling(config: dict[str, Any], module: str, rank: int) -> float:
    """The scaling peft gives ``module`` of a saved adapter: its ``alpha_pattern`` entry (else ``lora_alpha``)
    over ``rank``, or over its square root under rsLoRA.

    Raises:
        ConfigError: an alpha that is not a number, or a rank below 1.
    """
    from peft.utils.other import get_pattern_key

    pattern = config.get("alpha_pattern") or {}
    if not isinstance(pattern, dict):
        raise ConfigError(f"alpha_pattern={str(pattern)[:80]} is not a mapping; save the adapter again")
    alpha = pattern.get(get_pattern_key(list(pattern), module), config.get("lora_alpha", 8))
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or rank < 1:
        raise ConfigError(f"module {module} has alpha {str(alpha)[:40]} and rank {rank}; save the adapter again")
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def rescale_saved_lora(weights: dict[str, torch.Tensor], config_file: Path, lm: nn.Module, adapter: str) -> int:
    """Fold each saved module's scaling (``config_file``'s ``lora_alpha``/``alpha_pattern`` over its rank,
    or its square root under rsLoRA) into its ``lora_B`` where it differs from the live adapter's, so
    ``s_live * B' A = s_saved * B A``. Returns how many modules were rescaled (0 without a config file).

    Without this, an adapter whose ``alpha`` is not the preset's (what fusion and remapping write, with
    ``alpha = r``) would load with the preset's scaling and silently compute another model.

    Raises:
        ConfigError: ``config_file`` exists but is not a JSON object.
    """
    if not config_file.is_file():
        return 0
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        config = None
    if not isinstance(config, dict):
        raise ConfigError(f"{config_file} is not a JSON object; the adapter folder is damaged: save the adapter again")
    from peft.tuners.lora import LoraLayer

    rescaled = 0
    for name, layer in lm.named_modules():
        key = f"{name}.lora_B.weight"
        if not isinstance(layer, LoraLayer) or adapter not in layer.scaling or key not in weights:
            continue
        try:
            saved = saved_scaling(config, name.removeprefix("base_model.model."), int(weights[key].shape[1]))
        except ConfigError as exc:
            raise ConfigError(f"{config_file}: {exc}") from None
        live = float(layer.scaling[adapter])
        if live and not math.isclose(saved, live, rel_tol=1e-12):
            weights[key] = weights[key] * (saved / live)
            rescaled += 1
    return rescaled
