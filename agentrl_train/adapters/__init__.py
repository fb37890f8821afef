"""LoRA adapter surgery: exact fusion of several adapters, and remapping between model layouts.

``fuse_adapters`` turns adapters trained one per stage into one adapter (or one merged model) whose
weight delta is exactly ``sum_i s_i B_i A_i``; ``remap_adapter`` moves an adapter between a fused layout
(Phi-3 ``qkv_proj``, ``gate_up_proj``) and a split one (Llama/Qwen ``q_proj``, ``k_proj``, ``v_proj``,
``gate_proj``, ``up_proj``). Both write the peft ``save_pretrained`` layout (``adapter_config.json`` +
``adapter_model.safetensors``), so ``PeftModel.from_pretrained`` loads the result.

Errors (all picklable, each message says what to do)::

    AgentRLError
    └── AdapterError               anything wrong with an adapter or what it is applied to
        ├── AdapterNotFoundError   a missing adapter or model folder (also a FileNotFoundError)
        ├── AdapterMismatchError   the adapter does not fit the model: unknown module names, other shapes
        ├── UnsupportedAdapterError  a peft feature this code cannot fuse exactly (DoRA, biases, embedding LoRA)
        ├── RemapError             a module whose shape or name has no counterpart in the target layout
        └── FusionCheckError       the self-check failed: the fused result does not match the stacked adapters

Importing this package does not import torch; the functions load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrl_envs.errors import AgentRLError

if TYPE_CHECKING:
    from agentrl_train.adapters.adapter import LoraAdapter, LoraModule, load_adapter
    from agentrl_train.adapters.fuse import FuseReport, fuse_adapters
    from agentrl_train.adapters.remap import RemapReport, remap_adapter

__all__ = [
    "AdapterError",
    "AdapterMismatchError",
    "AdapterNotFoundError",
    "FuseReport",
    "FusionCheckError",
    "LoraAdapter",
    "LoraModule",
    "RemapError",
    "RemapReport",
    "UnsupportedAdapterError",
    "fuse_adapters",
    "load_adapter",
    "remap_adapter",
]


class AdapterError(AgentRLError):
    """Something is wrong with an adapter or with the model it is applied to."""


class AdapterNotFoundError(AdapterError, FileNotFoundError):
    """An adapter or model folder is missing, or holds no adapter files."""


class AdapterMismatchError(AdapterError, ValueError):
    """The adapter does not fit the model: a module it targets is missing there, or has another shape."""


class UnsupportedAdapterError(AdapterError, ValueError):
    """The adapter uses a peft feature whose delta is not ``scaling * B @ A`` on a Linear weight."""


class RemapError(AdapterError, ValueError):
    """A module cannot be mapped to the target layout; the message names it."""


class FusionCheckError(AdapterError, RuntimeError):
    """The fused adapter or merged model does not reproduce the stacked adapters' logits."""


_LAZY = {
    "FuseReport": "fuse",
    "LoraAdapter": "adapter",
    "LoraModule": "adapter",
    "fuse_adapters": "fuse",
    "load_adapter": "adapter",
    "RemapReport": "remap",
    "remap_adapter": "remap",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agentrl_train.adapters' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"agentrl_train.adapters.{module}"), name)
