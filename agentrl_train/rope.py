"""Context scaling: a RoPE scaling setting applied to a model's config before its weights load.

``--rope-scaling '{type: linear, factor: 2}'`` stretches a rotary-position model's context past the
length it was trained at. The kinds:

- ``linear``: positions are divided by ``factor`` (position interpolation); context x factor.
- ``dynamic``: dynamic NTK: ``rope_theta`` grows with the sequence once it passes the original
  context, so shorter sequences see the model unchanged; up to context x factor.
- ``yarn``: YaRN (interpolation per frequency band plus an attention temperature); context x factor.
- ``ntk``: static NTK-aware scaling: ``rope_theta`` x ``factor ** exponent``, ``exponent`` an option
  (default ``d / (d - 2)`` for rotary dimension ``d``, the usual NTK-aware exponent); context x factor.

``original_context`` (default: the config's ``max_position_embeddings``) is the length the model was
trained at; a model trained on shorter sequences than its config allows (the ``tiny`` model: 512 of
4,096) names it here. Measured effect on held-out env transcripts: ``benchmarks/bench_rope_scaling.py``
and docs/results/rope-scaling.md.

Only this module decides what a setting means; :func:`parse_rope_scaling` imports nothing heavy (the
config validates with it) and :func:`apply_rope_scaling` changes a transformers config in place.
"""

from __future__ import annotations

import math
from typing import Any

from agentrl_envs.errors import ConfigError

__all__ = ["KINDS", "apply_rope_scaling", "check_rope_applied", "parse_rope_scaling"]

KINDS = ("linear", "dynamic", "yarn", "ntk")
MAX_FACTOR = 64.0  #: a 64x longer context is already far past what these methods recover
_KEYS = {"type", "factor", "exponent", "original_context"}
_EXAMPLE = "e.g. --rope-scaling '{type: linear, factor: 2}'"


def parse_rope_scaling(value: Any) -> dict[str, Any] | None:
    """The validated setting (``type``, ``factor``, ``exponent``, ``original_context``), or None for ``{}``.

    Raises:
        ConfigError: not a mapping, an unknown key or kind, a factor outside (1, 64], an exponent
            outside (0, 4], an original context that is not a whole number from 16 to 2**20.
    """
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"--rope-scaling {str(value)[:80]!r}: use a mapping, {_EXAMPLE}")
    unknown = sorted(str(k)[:40] for k in value if k not in _KEYS)
    if unknown:
        raise ConfigError(f"--rope-scaling: unknown key(s) {unknown}; use {sorted(_KEYS)}, {_EXAMPLE}")
    kind = value.get("type")
    if kind not in KINDS:
        raise ConfigError(f"--rope-scaling type {str(kind)[:40]!r}: use one of {', '.join(KINDS)}, {_EXAMPLE}")
    factor = _number(value.get("factor"), "factor")
    if not 1.0 < factor <= MAX_FACTOR:
        raise ConfigError(f"--rope-scaling factor {factor}: use a number above 1 and at most {MAX_FACTOR:g}")
    out: dict[str, Any] = {"type": kind, "factor": factor}
    if "exponent" in value:
        if kind != "ntk":
            raise ConfigError(f"--rope-scaling exponent: only type ntk reads it (type is {kind})")
        exponent = _number(value["exponent"], "exponent")
        if not 0.0 < exponent <= 4.0:
            raise ConfigError(f"--rope-scaling exponent {exponent}: use a number above 0 and at most 4")
        out["exponent"] = exponent
    if "original_context" in value:
        ctx = value["original_context"]
        if not isinstance(ctx, int) or isinstance(ctx, bool) or not 16 <= ctx <= 1 << 20:
            raise ConfigError(f"--rope-scaling original_context {str(ctx)[:40]!r}: use a whole number from 16 to {1 << 20}")
        out["original_context"] = ctx
    return out


def apply_rope_scaling(config: Any, scaling: dict[str, Any] | None, model: str = "the model") -> int:
    """Set ``scaling`` (from :func:`parse_rope_scaling`) on a transformers ``config``; return the context it gives.

    With ``scaling`` None the config is left as it is and its ``max_position_embeddings`` returned.

    Raises:
        ConfigError: the model has no rotary position embeddings, or transformers refuses the setting.
    """
    context = int(getattr(config, "max_position_embeddings", 0) or 0)
    if scaling is None:
        return context
    params = _rope_parameters(config)
    if params is None:
        raise ConfigError(
            f"--rope-scaling: {model} ({getattr(config, 'model_type', '?')}) has no rotary position embeddings; "
            "drop --rope-scaling for it"
        )
    if params.get("rope_type", params.get("type", "default")) != "default":
        raise ConfigError(
            f"--rope-scaling: {model} is already scaled ({params.get('rope_type', params.get('type'))}); "
            "drop --rope-scaling or start from an unscaled model"
        )
    original = scaling.get("original_context", context)
    if not original:
        raise ConfigError(f"--rope-scaling: {model} states no max_position_embeddings; set original_context")
    factor = scaling["factor"]
    theta = float(params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)
    kind = scaling["type"]
    new: dict[str, Any] = {"rope_theta": theta}
    if kind == "ntk":
        new["rope_type"] = "default"
        new["rope_theta"] = theta * factor ** scaling.get("exponent", ntk_exponent(config))
    elif kind == "yarn":
        new.update(rope_type="yarn", factor=factor, original_max_position_embeddings=original)
    else:
        new.update(rope_type=kind, factor=factor)
    for key in ("partial_rotary_factor",):
        if key in params:
            new[key] = params[key]
    scaled = int(original * factor)
    config.rope_parameters = new
    # dynamic NTK starts scaling past max_position_embeddings; the others read it as the new context
    config.max_position_embeddings = original if kind == "dynamic" else scaled
    validate = getattr(config, "validate_rope", None)
    try:
        if hasattr(config, "standardize_rope_params"):
            config.standardize_rope_params()
        if validate is not None:
            validate()
    except Exception as exc:
        raise ConfigError(f"--rope-scaling {kind}: transformers refuses it for {model} ({type(exc).__name__}: {exc})") from None
    return scaled


def check_rope_applied(lm: Any, scaling: dict[str, Any] | None, model: str = "the model") -> None:
    """Raise ConfigError when the loaded ``lm`` does not use the scaling (its rotary module ignores it)."""
    if scaling is None:
        return
    want = "default" if scaling["type"] == "ntk" else scaling["type"]
    kinds = {str(getattr(m, "rope_type", "")) for m in lm.modules() if hasattr(m, "rope_type") and hasattr(m, "inv_freq")}
    if want not in kinds:
        raise ConfigError(
            f"--rope-scaling {scaling['type']}: {model}'s rotary embedding does not use it (it uses {sorted(kinds) or 'none'}); "
            "drop --rope-scaling for this model"
        )


def ntk_exponent(config: Any) -> float:
    """``d / (d - 2)`` for the rotary dimension ``d``: NTK-aware scaling's exponent of the factor on theta."""
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    params = _rope_parameters(config) or {}
    d = int(head * float(params.get("partial_rotary_factor", 1.0)))
    return d / (d - 2) if d > 2 else 1.0


def _rope_parameters(config: Any) -> dict[str, Any] | None:
    """The config's RoPE settings (``rope_parameters`` in transformers 5, ``rope_scaling``/``rope_theta`` before)."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        return dict(params)
    if getattr(config, "rope_theta", None) is not None:
        return {"rope_type": "default", "rope_theta": config.rope_theta, **(getattr(config, "rope_scaling", None) or {})}
    return None


def _number(value: Any, name: str) -> float:
    if value is None:
        raise ConfigError(f"--rope-scaling: {name} is missing, {_EXAMPLE}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"--rope-scaling {name} {str(value)[:40]!r}: use a number, {_EXAMPLE}")
    return float(value)
