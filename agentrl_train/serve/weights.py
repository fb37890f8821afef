"""An adapter's files and weights, read and checked before any slot of the model sees them.

Adapters are read in peft's layout (``adapter_config.json`` + ``adapter_model.safetensors``, or a
run's ``final/`` folder with one such subfolder) or from a trainer checkpoint
(``checkpoints/update-N/trainable.safetensors``). Every check here raises
:class:`AdapterMismatchError` (or :class:`~agentrl_envs.errors.ConfigError` for unreadable files) with
a message that says what to serve instead; nothing here changes a served adapter.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentrl_envs.errors import ConfigError
from agentrl_train.tool_tokens import ToolTokens, read_tool_tokens

__all__ = [
    "ROWS",
    "AdapterMismatchError",
    "Family",
    "Prepared",
    "check_fit",
    "check_model_fit",
    "config_key",
    "find_adapter_files",
    "lora_config",
    "lora_scaling",
    "read_adapter",
    "tokens_refusal",
]

_TRAINABLE = re.compile(r"^lm\.(.+)\.lora_([AB])\.[^.]+\.weight$")
_TRAINABLE_ROWS = re.compile(r"^lm\.(.+\.token_adapter\.trainable_tokens_delta)\.[^.]+$")
ROWS = ".token_adapter.trainable_tokens_delta"  #: peft's key of an adapter's added-token rows


class AdapterMismatchError(ConfigError):
    """An adapter folder does not fit the adapter it would replace (keys, shapes, scaling or base model)."""


@dataclass
class Prepared:
    """Checked weights of one adapter, ready to copy into a slot."""

    path: str  #: the folder they came from
    tensors: dict[str, torch.Tensor]  #: peft-saved keys (no adapter name) -> weights on the model's device
    config: dict[str, Any]  #: its adapter_config.json (empty for a trainer checkpoint)
    tool_tokens: ToolTokens | None = None  #: the tool-call tokens it was trained with (tool_tokens.json)


@dataclass
class Family:
    """The adapters served under one name: their shared LoRA config and the slots that hold them."""

    config: Any  #: peft LoraConfig shared by every slot of this name
    shapes: dict[str, tuple[int, ...]]  #: peft-saved key -> shape
    scaling: dict[str, float]  #: r / alpha facts checked on every load
    free: list[str] = field(default_factory=list)  #: slots kept for reuse


def find_adapter_files(folder: str | Path) -> tuple[Path, Path | None]:
    """The weights file of an adapter folder and its ``adapter_config.json`` (None for a checkpoint).

    Raises:
        ConfigError: no ``adapter_model.safetensors`` or ``trainable.safetensors`` there.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"adapter path {str(folder)[:200]!r} is not a folder; point at a run's final/ or an adapter folder")
    subs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    for sub in (folder, *subs):
        if (sub / "adapter_model.safetensors").is_file():
            cfg = sub / "adapter_config.json"
            return sub / "adapter_model.safetensors", cfg if cfg.is_file() else None
    if (folder / "trainable.safetensors").is_file():
        return folder / "trainable.safetensors", None
    raise ConfigError(
        f"adapter path {str(folder)[:200]!r} holds no adapter_model.safetensors (peft layout) or "
        "trainable.safetensors (a trainer checkpoint); point at a run's final/ or checkpoints/update-N/"
    )


def read_adapter(
    path: str | Path, served_tokens: ToolTokens | None, first: bool, base_path: str
) -> tuple[dict[str, torch.Tensor], dict[str, Any], ToolTokens | None]:
    """The LoRA weights (peft's saved names, on the CPU), ``adapter_config.json`` and tool-call tokens of the
    adapter at ``path``, checked on their own and against the served base.

    Args:
        served_tokens: the tool-call tokens added to the served base (None for none).
        first: no adapter is served yet (its tokens decide the base's).
        base_path: the served base model's name or folder.

    Raises:
        ConfigError: no adapter files there, or they cannot be read.
        AdapterMismatchError: not LoRA weights, or trained with other tool-call tokens or on another base.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights, cfg_file = find_adapter_files(path)
    config: dict[str, Any] = {}
    try:
        if cfg_file is not None:
            config = json.loads(cfg_file.read_text())
        raw = load_file(weights, device="cpu")
    except (OSError, ValueError, RecursionError, SafetensorError) as exc:
        raise ConfigError(f"adapter {str(path)[:200]!r}: cannot read it ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"adapter {str(path)[:200]!r}: adapter_config.json holds a {type(config).__name__}, not a JSON object; "
            "save the adapter again with peft (the old version keeps serving)"
        )
    lora_scaling(config, str(path))  # r / lora_alpha that are not numbers are refused here, before any slot exists
    tensors = peft_keys(raw, weights.name == "trainable.safetensors")
    tokens = read_tool_tokens(weights.parent) if cfg_file is not None else served_tokens
    if not first and tokens != served_tokens:
        raise AdapterMismatchError(tokens_refusal(str(path), tokens, served_tokens))
    if cfg_file is not None and tokens is not None and not any(k.endswith(ROWS) for k in tensors):
        raise AdapterMismatchError(
            f"adapter {str(path)[:200]!r}: tool_tokens.json says it trains added tool-call tokens, but its weights "
            "hold no rows for them; save the adapter again"
        )
    if not tensors:
        raise AdapterMismatchError(f"adapter {str(path)[:200]!r}: {weights.name} holds no LoRA weights")
    for key, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise AdapterMismatchError(
                f"adapter {str(path)[:200]!r}: {key} holds {tensor.dtype} values, LoRA weights are floating point; "
                "the file is not an adapter (the old version keeps serving)"
            )
    base = config.get("base_model_name_or_path")
    if base and Path(str(base)).name != Path(base_path).name:
        raise AdapterMismatchError(
            f"adapter {str(path)[:200]!r} was trained on base {base!r}, this server serves {base_path!r}; "
            "serve it with that --model (the old version keeps serving)"
        )
    return tensors, config, tokens


def check_model_fit(path: str, tensors: dict[str, torch.Tensor], modules: dict[str, Any]) -> None:
    """Before a first slot exists: every LoRA pair must sit on a layer of the base (``modules``, its
    ``named_modules()``) with its in/out sizes."""
    for key, tensor in tensors.items():
        if key.endswith(ROWS):  # added tokens' rows: the base is resized for them, and their shape checked in add_family
            continue
        m = re.match(r"^base_model\.model\.(.+)\.lora_([AB])\.weight$", key)
        layer = modules.get(m.group(1)) if m else None
        if tensor.ndim != 2:
            raise AdapterMismatchError(
                f"adapter {path[:200]!r}: {key} has shape {tuple(tensor.shape)}, a LoRA weight is a matrix; "
                "the file is damaged or not a LoRA adapter"
            )
        if layer is None or not hasattr(layer, "in_features"):
            raise AdapterMismatchError(
                f"adapter {path[:200]!r}: {key} is not a layer of this base; it was trained on another model"
            )
        size = tensor.shape[1] if m and m.group(2) == "A" else tensor.shape[0]
        want = layer.in_features if m and m.group(2) == "A" else layer.out_features
        if size != want:
            raise AdapterMismatchError(
                f"adapter {path[:200]!r}: {key} has shape {tuple(tensor.shape)}, this base's layer is "
                f"{layer.in_features}->{layer.out_features}; it was trained on another model"
            )


def lora_config(name: str, prepared: Prepared) -> Any:
    """The peft ``LoraConfig`` of an adapter's adapter_config.json (for inference)."""
    from peft import LoraConfig

    if not prepared.config:
        raise ConfigError(f"adapter {name}={prepared.path}: the first version needs adapter_config.json (peft layout)")
    try:
        config = LoraConfig(**{k: v for k, v in prepared.config.items() if k in LoraConfig.__dataclass_fields__})
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"adapter {name}={prepared.path}: adapter_config.json is not a LoRA config peft accepts "
            f"({type(exc).__name__}: {str(exc)[:200]}); save the adapter again with peft"
        ) from None
    config.inference_mode = True
    return config


def config_key(config: Any) -> str:
    """What a slot's layers depend on in a ``LoraConfig``: two adapters with equal keys can share a slot."""
    facts = {k: v for k, v in config.to_dict().items() if k not in ("base_model_name_or_path", "revision", "peft_version")}
    return json.dumps(facts, sort_keys=True, default=lambda v: sorted(map(str, v)) if isinstance(v, (set, frozenset)) else str(v))


def peft_keys(raw: dict[str, torch.Tensor], trainable: bool) -> dict[str, torch.Tensor]:
    """LoRA weights under peft's saved names (``...q_proj.lora_A.weight``), from either file layout."""
    if not trainable:
        return {k: v for k, v in raw.items() if ".lora_" in k or k.endswith(ROWS)}
    out = {}
    for k, v in raw.items():
        m = _TRAINABLE.match(k)
        if m:
            out[f"{m.group(1)}.lora_{m.group(2)}.weight"] = v
        elif rows := _TRAINABLE_ROWS.match(k):
            out[rows.group(1)] = v
    return out


def tokens_refusal(path: str, tokens: ToolTokens | None, served: ToolTokens | None) -> str:
    def what(t: ToolTokens | None) -> str:
        return f"added tool-call tokens {', '.join(t.tokens)} at ids {list(t.ids)}" if t else "no added tool-call tokens"

    return (
        f"adapter {path[:200]!r} was trained with {what(tokens)}, and this server's base has {what(served)}; "
        "an adapter with added tokens needs a base resized for them and cannot be served beside adapters without "
        "them (or with others): serve it from its own agentrl-train serve (the old version keeps serving)"
    )


def lora_scaling(config: dict[str, Any], path: str = "") -> dict[str, float]:
    """The r / alpha facts two versions of one name must share.

    Raises:
        AdapterMismatchError: one of them is not a number (or a pattern is not a JSON object).
    """
    facts: dict[str, float] = {}
    items: list[tuple[str, Any]] = [("r", config.get("r", 0)), ("lora_alpha", config.get("lora_alpha", 0))]
    for kind in ("rank_pattern", "alpha_pattern"):
        pattern = config.get(kind) or {}
        if not isinstance(pattern, dict):
            raise AdapterMismatchError(
                f"adapter {path[:200]!r}: adapter_config.json {kind} is {str(pattern)[:60]!r}, not a JSON object of numbers"
            )
        items += [(f"{kind}.{k}", v) for k, v in sorted(pattern.items())]
    for key, value in items:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise AdapterMismatchError(
                f"adapter {path[:200]!r}: adapter_config.json {key} is {str(value)[:60]!r}, not a number; "
                "save the adapter again with peft (the old version keeps serving)"
            )
        facts[key] = float(value)
    return facts


def check_fit(path: str, fam: Family, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    missing = sorted(set(fam.shapes) - set(tensors))
    extra = sorted(set(tensors) - set(fam.shapes))
    if missing or extra:
        what = f"missing {missing[0]}" if missing else f"unexpected {extra[0]}"
        raise AdapterMismatchError(
            f"adapter {path[:200]!r} does not fit: {what} ({len(missing)} missing, {len(extra)} unexpected); "
            "it targets other layers or another base model (the old version keeps serving)"
        )
    for key, shape in fam.shapes.items():
        if tuple(tensors[key].shape) != shape:
            raise AdapterMismatchError(
                f"adapter {path[:200]!r} does not fit: {key} has shape {tuple(tensors[key].shape)}, the served one {shape}; "
                "a different rank or base model needs its own --adapter name (the old version keeps serving)"
            )
    if config:
        got = lora_scaling(config, path)
        for key, want in fam.scaling.items():
            if got.get(key) != want:
                raise AdapterMismatchError(
                    f"adapter {path[:200]!r} does not fit: {key} is {got.get(key)}, the served one {want}; "
                    "serve it under its own --adapter name (the old version keeps serving)"
                )
