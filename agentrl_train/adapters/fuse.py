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
"""

from __future__ import annotations

import copy
import difflib
import json
import logging
import math
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import torch
from torch import nn

from agentrl_envs.errors import ConfigError
from agentrl_train.adapters import (
    AdapterError,
    AdapterMismatchError,
    AdapterNotFoundError,
    FusionCheckError,
    UnsupportedAdapterError,
)

__all__ = ["FuseReport", "LoraAdapter", "LoraModule", "fuse_adapters", "fuse_modules", "load_adapter", "load_base_model"]

logger = logging.getLogger(__name__)

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
LEGACY_WEIGHTS_NAME = "adapter_model.bin"
REPORT_NAME = "fuse_report.json"
DEFAULT_ATOL = 1e-5

# peft keys: base_model.model.<module>.lora_A.weight (saved), or ...lora_A.<adapter>.weight (a live state_dict).
_KEY_RE = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight$")


# ----------------------------------------------------------------------------------------------------
# What an adapter is, read from disk or from a live PeftModel
# ----------------------------------------------------------------------------------------------------


@dataclass
class LoraModule:
    """One LoRA pair on one Linear layer: ``delta_W = scaling * lora_B @ lora_A``.

    Attributes:
        lora_A: ``(r, in_features)``.
        lora_B: ``(out_features, r)``.
        scaling: ``alpha / r`` (``alpha / sqrt(r)`` under rsLoRA), as peft applies it.
    """

    lora_A: torch.Tensor
    lora_B: torch.Tensor
    scaling: float

    @property
    def rank(self) -> int:
        return int(self.lora_A.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.lora_A.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.lora_B.shape[0])

    def delta(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The weight delta ``(out_features, in_features)`` this pair adds."""
        return self.scaling * (self.lora_B.to(dtype) @ self.lora_A.to(dtype))


@dataclass
class LoraAdapter:
    """A LoRA adapter as plain tensors, keyed by module path in the base model (``model.layers.0.mlp.up_proj``).

    Attributes:
        modules: One ``LoraModule`` per adapted Linear layer.
        base_model_name_or_path: What ``adapter_config.json`` says the adapter was trained on, if anything.
        source: Where it came from, for error messages.
    """

    modules: dict[str, LoraModule]
    base_model_name_or_path: str | None = None
    source: str = "<memory>"

    @classmethod
    def from_peft_model(cls, model: nn.Module, adapter_name: str = "default") -> LoraAdapter:
        """Read adapter ``adapter_name`` out of a live ``PeftModel`` (weights are copied)."""
        from peft.tuners.lora import LoraLayer

        modules: dict[str, LoraModule] = {}
        for name, layer in model.named_modules():
            if not isinstance(layer, LoraLayer):
                continue
            if adapter_name in getattr(layer, "lora_embedding_A", {}):
                raise UnsupportedAdapterError(
                    f"adapter {adapter_name!r} adapts the embedding {name!r}; fusion handles Linear layers only: "
                    "retrain it without embeddings in target_modules"
                )
            if adapter_name not in layer.lora_A:
                continue
            if layer.use_dora.get(adapter_name, False):
                raise UnsupportedAdapterError(
                    f"adapter {adapter_name!r} uses DoRA on {name!r}, whose delta is not B @ A; retrain with use_dora=False"
                )
            if not isinstance(layer.get_base_layer(), nn.Linear):
                raise UnsupportedAdapterError(f"adapter {adapter_name!r} adapts {name!r}, which is not an nn.Linear")
            key = name.removeprefix("base_model.model.")
            lora_A: Any = layer.lora_A[adapter_name]
            lora_B: Any = layer.lora_B[adapter_name]
            modules[key] = LoraModule(
                lora_A.weight.detach().cpu().clone(), lora_B.weight.detach().cpu().clone(), float(layer.scaling[adapter_name])
            )
        if not modules:
            names = sorted(getattr(model, "peft_config", {}) or [])
            raise AdapterNotFoundError(f"the model has no LoRA adapter named {adapter_name!r}; it has {names}")
        config = getattr(model, "peft_config", {}).get(adapter_name)
        return cls(modules, getattr(config, "base_model_name_or_path", None), f"<PeftModel adapter {adapter_name!r}>")

    def save(self, out_dir: str | os.PathLike[str]) -> Path:
        """Write the peft ``save_pretrained`` layout (config + safetensors, float32) into ``out_dir``."""
        from peft import LoraConfig
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        ranks = {name: m.rank for name, m in sorted(self.modules.items())}
        alphas = {name: _alpha_of(m) for name, m in sorted(self.modules.items())}
        r0 = Counter(ranks.values()).most_common(1)[0][0]
        config = LoraConfig(
            r=r0,
            lora_alpha=r0,
            target_modules=sorted(self.modules),
            rank_pattern=ranks,
            alpha_pattern=alphas,
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
            base_model_name_or_path=self.base_model_name_or_path,
        )
        config.save_pretrained(str(out))
        tensors = {}
        for name, m in self.modules.items():
            tensors[f"base_model.model.{name}.lora_A.weight"] = m.lora_A.detach().to(torch.float32).contiguous()
            tensors[f"base_model.model.{name}.lora_B.weight"] = m.lora_B.detach().to(torch.float32).contiguous()
        save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
        return out


def _alpha_of(module: LoraModule) -> int | float:
    """The ``lora_alpha`` that gives ``module.scaling`` without rsLoRA: an int whenever it is one."""
    alpha = module.scaling * module.rank
    return round(alpha) if abs(alpha - round(alpha)) < 1e-9 else alpha


def _resolve_adapter_dir(path: Path) -> Path:
    if not path.exists():
        raise AdapterNotFoundError(
            f"adapter folder {path} does not exist; pass the folder PeftModel.save_pretrained wrote (it holds {CONFIG_NAME})"
        )
    if not path.is_dir():
        raise AdapterNotFoundError(f"{path} is a file; pass the adapter folder that holds {CONFIG_NAME}")
    if (path / CONFIG_NAME).is_file():
        return path
    subdirs = [d for d in sorted(path.iterdir()) if (d / CONFIG_NAME).is_file()]
    if len(subdirs) == 1:
        return subdirs[0]
    if subdirs:
        names = ", ".join(d.name for d in subdirs)
        raise AdapterNotFoundError(f"{path} holds several adapters ({names}); pass one of them, e.g. {subdirs[0]}")
    raise AdapterNotFoundError(f"{path} holds no {CONFIG_NAME}; pass the folder PeftModel.save_pretrained wrote")


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{path / CONFIG_NAME} cannot be read ({exc}); re-save the adapter with save_pretrained") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path / CONFIG_NAME} is not a JSON object; re-save the adapter with save_pretrained")
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise UnsupportedAdapterError(f"{path} is a {peft_type} adapter; only LoRA adapters can be fused or remapped")
    refusals = {
        "use_dora": "DoRA scales the weight, so its delta is not B @ A; retrain with use_dora=False",
        "lora_bias": "it trains a bias on lora_B; retrain with lora_bias=False",
        "fan_in_fan_out": "it targets transposed (Conv1D) weights; only nn.Linear layers are supported",
        "modules_to_save": "it trains full copies of some modules, which cannot be added up; retrain without modules_to_save",
        "trainable_token_indices": (
            "it trains embedding rows (the added tool-call tokens of --add-tool-tokens, or other trainable tokens), "
            "which fusion and remapping do not carry: use the adapter as it is, on its base with the same added tokens "
            "(agentrl-train eval and serve load it), or retrain without --add-tool-tokens"
        ),
        "target_parameters": "it adapts raw parameters, not Linear layers",
    }
    for key, why in refusals.items():
        if config.get(key):
            raise UnsupportedAdapterError(f"{path} sets {key}={config[key]!r}: {why}")
    if config.get("bias", "none") != "none":
        raise UnsupportedAdapterError(f"{path} trains biases (bias={config['bias']!r}); retrain with bias='none'")
    return config


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    try:
        if (path / WEIGHTS_NAME).is_file():
            from safetensors.torch import load_file

            return dict(load_file(str(path / WEIGHTS_NAME)))
        if (path / LEGACY_WEIGHTS_NAME).is_file():
            return dict(torch.load(path / LEGACY_WEIGHTS_NAME, map_location="cpu", weights_only=True))
    except Exception as exc:  # safetensors and torch raise several types for a damaged file
        raise AdapterError(f"the weights in {path} cannot be read ({type(exc).__name__}: {exc}); re-save the adapter") from None
    raise AdapterNotFoundError(f"{path} has {CONFIG_NAME} but no {WEIGHTS_NAME}; re-save the adapter with save_pretrained")


def load_adapter(path: str | os.PathLike[str]) -> LoraAdapter:
    """Read a LoRA adapter folder (peft ``save_pretrained`` layout).

    A folder that holds exactly one named adapter in a subfolder (what ``save_pretrained`` writes for an
    adapter not called ``default``) is accepted too.

    Raises:
        AdapterNotFoundError: No such folder, or no adapter files in it.
        UnsupportedAdapterError: DoRA, trained biases, embeddings, modules_to_save, non-LoRA adapters.
        AdapterError: Unreadable config or weights, or A and B that do not pair up.
    """
    from peft.utils.other import get_pattern_key

    folder = _resolve_adapter_dir(Path(path))
    config = _read_config(folder)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in _read_weights(folder).items():
        match = _KEY_RE.match(key)
        if match is None:
            raise UnsupportedAdapterError(
                f"{folder} holds {key!r}, which is not a LoRA A/B matrix (embedding LoRA, DoRA magnitude or a saved module); "
                "only plain LoRA on Linear layers can be fused or remapped"
            )
        pairs.setdefault(match["module"], {})[match["part"]] = tensor
    if not pairs:
        raise AdapterError(f"{folder} holds no LoRA weights; re-save the adapter with save_pretrained")
    r_default, alpha_default = int(config.get("r", 8)), float(config.get("lora_alpha", 8))
    rank_pattern, alpha_pattern = dict(config.get("rank_pattern") or {}), dict(config.get("alpha_pattern") or {})
    use_rslora = bool(config.get("use_rslora", False))
    modules: dict[str, LoraModule] = {}
    for name, pair in sorted(pairs.items()):
        lora_A, lora_B = pair.get("A"), pair.get("B")
        if lora_A is None or lora_B is None or lora_A.ndim != 2 or lora_B.ndim != 2 or lora_A.shape[0] != lora_B.shape[1]:
            shapes = {part: tuple(t.shape) for part, t in sorted(pair.items())}
            raise AdapterError(f"{folder}: module {name!r} has LoRA matrices {shapes} that do not pair up as B @ A; re-save it")
        rank = int(rank_pattern.get(get_pattern_key(list(rank_pattern), name), r_default))
        if rank != lora_A.shape[0]:
            raise AdapterError(
                f"{folder}: module {name!r} has rank {lora_A.shape[0]} but its config says r={rank}; the config and "
                "weights come from different adapters"
            )
        alpha = float(alpha_pattern.get(get_pattern_key(list(alpha_pattern), name), alpha_default))
        scaling = alpha / math.sqrt(rank) if use_rslora else alpha / rank
        modules[name] = LoraModule(lora_A, lora_B, scaling)
    return LoraAdapter(modules, config.get("base_model_name_or_path"), str(folder))


AdapterSource = Union[str, "os.PathLike[str]", LoraAdapter, tuple[nn.Module, str]]


def _as_adapter(source: AdapterSource) -> LoraAdapter:
    if isinstance(source, LoraAdapter):
        return source
    if isinstance(source, tuple):
        model, name = source
        return LoraAdapter.from_peft_model(model, name)
    return load_adapter(source)


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
        lines.append(
            f"check: max |logit diff| vs stacked adapters = {self.max_abs_diff:.3g} (float32, batch "
            f"{self.probe_shape[0]}x{self.probe_shape[1]}, bound {self.atol:g}): ok"
        )
        return "\n".join(lines)


@contextmanager
def staged_output(out_dir: Path) -> Iterator[Path]:
    """A fresh folder next to ``out_dir`` that becomes ``out_dir`` only if the block succeeds."""
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(f"output {out_dir} exists and is not empty; pass a new folder (nothing was written)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out_dir.exists():
        out_dir.rmdir()
    os.replace(tmp, out_dir)


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


def stacked_logits(base: nn.Module, adapter_dirs: Sequence[Path], input_ids: torch.Tensor) -> torch.Tensor:
    """Logits of a float32 copy of ``base`` with every adapter in ``adapter_dirs`` active at once."""
    from peft import PeftModel

    names = [f"stack{i}" for i in range(len(adapter_dirs))]
    model: Any = PeftModel.from_pretrained(copy.deepcopy(base).float(), str(adapter_dirs[0]), adapter_name=names[0])
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


def _write_fused(
    tmp: Path, model: nn.Module, base: Any, name: str | None, fused: dict[str, LoraModule], merge: bool, ids: torch.Tensor
) -> torch.Tensor:
    """Write the fused adapter (``merge``: the merged model, with ``base``'s tokenizer files) to ``tmp``; its logits read back."""
    if merge:
        merged = copy.deepcopy(model).float()
        _merge_into(merged, fused)
        merged.save_pretrained(str(tmp))  # type: ignore[operator]
        del merged
        if not isinstance(base, nn.Module):
            _copy_tokenizer_files(Path(base), tmp)
        from transformers import AutoModelForCausalLM

        return logits_of(AutoModelForCausalLM.from_pretrained(str(tmp), dtype=torch.float32), ids)
    from peft import PeftModel

    LoraAdapter(fused, name, "<fused>").save(tmp)
    return logits_of(PeftModel.from_pretrained(copy.deepcopy(model).float(), str(tmp)), ids)


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
    loaded = {name: _as_adapter(source) for name, source in adapters.items()}
    for name, adapter in loaded.items():
        check_fits(name, adapter, model, model_name)
    fused, sources = fuse_modules(loaded)
    input_ids = probe_batch(model, seed)

    with staged_output(out) as tmp, tempfile.TemporaryDirectory(prefix="agentrl-fuse-") as scratch:
        dirs = []
        for i, (name, source) in enumerate(adapters.items()):
            if isinstance(source, (str, os.PathLike)):
                dirs.append(_resolve_adapter_dir(Path(source)))  # the check loads the originals with peft
            else:
                dirs.append(loaded[name].save(Path(scratch) / f"adapter{i}"))
        reference = stacked_logits(model, dirs, input_ids)
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
            ranks={m: f.rank for m, f in fused.items()},
            max_abs_diff=diff,
            atol=atol,
            probe_shape=(int(input_ids.shape[0]), int(input_ids.shape[1])),
            base_model=model_name,
        )
        (tmp / REPORT_NAME).write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    logger.info("%s", report.summary())
    return report
