"""What a LoRA adapter is, as plain tensors: read from a peft folder or a live ``PeftModel``, and written back.

``load_adapter`` reads peft's ``save_pretrained`` layout (``adapter_config.json`` and
``adapter_model.safetensors``) into a :class:`LoraAdapter`: one :class:`LoraModule` (``A``, ``B`` and the
scaling) per adapted Linear layer, and the embedding rows the adapter trains, if any
(:class:`~agentrl_train.adapters.token_rows.TokenRows`: peft's ``trainable_token_indices``, which is how
``--add-tool-tokens`` trains the added tool-call tokens). ``LoraAdapter.save`` writes the same layout
back, so ``PeftModel.from_pretrained`` loads what fusion and remapping write. Features whose delta is
not ``B @ A`` plus replaced rows (DoRA, trained biases, embedding LoRA, ``modules_to_save``) are refused
by name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import torch
from torch import nn

from agentrl_envs.errors import ConfigError
from agentrl_train.adapters import AdapterError, AdapterNotFoundError, UnsupportedAdapterError
from agentrl_train.adapters.token_rows import TokenRows, read_token_rows

__all__ = ["AdapterSource", "LoraAdapter", "LoraModule", "as_adapter", "load_adapter", "resolve_adapter_dir", "staged_output"]

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
LEGACY_WEIGHTS_NAME = "adapter_model.bin"

# peft keys: base_model.model.<module>.lora_A.weight (saved), or ...lora_A.<adapter>.weight (a live state_dict).
_KEY_RE = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight$")


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
        token_rows: The embedding rows it trains (peft ``trainable_token_indices``), if any.
        base_model_name_or_path: What ``adapter_config.json`` says the adapter was trained on, if anything.
        source: Where it came from, for error messages.
    """

    modules: dict[str, LoraModule]
    base_model_name_or_path: str | None = None
    source: str = "<memory>"
    token_rows: TokenRows | None = None

    @classmethod
    def from_peft_model(cls, model: nn.Module, adapter_name: str = "default") -> LoraAdapter:
        """Read adapter ``adapter_name`` out of a live ``PeftModel`` (weights are copied).

        Raises:
            UnsupportedAdapterError: DoRA, embedding LoRA, or trained embedding rows (those are read from the
                adapter's saved folder, whose ``tool_tokens.json`` says how to grow the base for them).
        """
        from peft.tuners.lora import LoraLayer
        from peft.tuners.trainable_tokens.layer import TrainableTokensLayer

        modules: dict[str, LoraModule] = {}
        for name, layer in model.named_modules():
            if isinstance(layer, TrainableTokensLayer) and adapter_name in layer.trainable_tokens_delta:
                raise UnsupportedAdapterError(
                    f"adapter {adapter_name!r} trains embedding rows ({name}); save it (save_pretrained, or the "
                    "trainer's final/ folder) and pass the folder, which says how to grow the base for them"
                )
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
        rows = self.token_rows
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
            trainable_token_indices=rows.config_value() if rows is not None else None,
        )
        config.save_pretrained(str(out))
        tensors = {}
        for name, m in self.modules.items():
            tensors[f"base_model.model.{name}.lora_A.weight"] = m.lora_A.detach().to(torch.float32).contiguous()
            tensors[f"base_model.model.{name}.lora_B.weight"] = m.lora_B.detach().to(torch.float32).contiguous()
        if rows is not None:
            tensors.update(rows.tensors())
            rows.write_files(out)
        save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
        return out


def _alpha_of(module: LoraModule) -> int | float:
    """The ``lora_alpha`` that gives ``module.scaling`` without rsLoRA: an int whenever it is one."""
    alpha = module.scaling * module.rank
    return round(alpha) if abs(alpha - round(alpha)) < 1e-9 else alpha


def resolve_adapter_dir(path: Path) -> Path:
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
        UnsupportedAdapterError: DoRA, trained biases, embedding LoRA, modules_to_save, non-LoRA adapters.
        AdapterError: Unreadable config or weights, A and B that do not pair up, trained embedding rows
            (``trainable_token_indices``) whose ids and weights disagree.
        ConfigError: a damaged ``tool_tokens.json``.
    """
    from peft.utils.other import get_pattern_key

    from agentrl_train.lora import saved_scaling

    folder = resolve_adapter_dir(Path(path))
    config = _read_config(folder)
    tensors = _read_weights(folder)
    token_rows = read_token_rows(folder, config, tensors)  # takes the rows out of tensors
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY_RE.match(key)
        if match is None:
            raise UnsupportedAdapterError(
                f"{folder} holds {key!r}, which is not a LoRA A/B matrix (embedding LoRA, DoRA magnitude or a saved module); "
                "only plain LoRA on Linear layers can be fused or remapped"
            )
        pairs.setdefault(match["module"], {})[match["part"]] = tensor
    if not pairs:
        raise AdapterError(f"{folder} holds no LoRA weights; re-save the adapter with save_pretrained")
    r_default = int(config.get("r", 8))
    rank_pattern = dict(config.get("rank_pattern") or {})
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
        try:
            scaling = saved_scaling(config, name, rank)
        except ConfigError as exc:
            raise AdapterError(f"{folder}: {exc}") from None
        modules[name] = LoraModule(lora_A, lora_B, scaling)
    return LoraAdapter(modules, config.get("base_model_name_or_path"), str(folder), token_rows)


AdapterSource = Union[str, "os.PathLike[str]", LoraAdapter, tuple[nn.Module, str]]


def as_adapter(source: AdapterSource) -> LoraAdapter:
    if isinstance(source, LoraAdapter):
        return source
    if isinstance(source, tuple):
        model, name = source
        return LoraAdapter.from_peft_model(model, name)
    return load_adapter(source)


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
