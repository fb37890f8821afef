"""Training state as JSON plus safetensors: nothing in a state file can run code when it is read.

A checkpoint holds nested Python state: the optimizer's ``state_dict`` (tensors under integer keys),
RNG states (tuples, numpy arrays, byte tensors), episode state (lists of messages, token ids, tool
schemas). Pickle (``torch.save``) would carry all of it, and loading a pickle runs whatever code
its author put in it, so a checkpoint a user was sent could take over their machine. Here the
structure goes to ``NAME.json`` and every tensor or array to ``NAME.safetensors``; a JSON object
marks what plain JSON cannot say:

- ``{"__tensor__": key}`` / ``{"__ndarray__": key}``: a tensor / numpy array stored under ``key``;
- ``{"__tuple__": [...]}``: a tuple;
- ``{"__dict__": [[key, value], ...]}``: a dict whose keys are not all strings (or look like a marker).

Reading accepts exactly these forms and plain JSON; anything else is a :class:`StateFileError`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl_envs.errors import AgentRLError

__all__ = ["MAX_JSON_BYTES", "StateFileError", "load_tree", "save_tree"]

MAX_JSON_BYTES = 256 * 1024 * 1024  #: a state's structure; its tensors live in the safetensors file
_MARKERS = ("__tensor__", "__ndarray__", "__tuple__", "__dict__")


class StateFileError(AgentRLError):
    """A state file is missing, damaged, or holds something other than the documented forms."""


def save_tree(stem: Path, obj: Any) -> None:
    """Write ``obj`` as ``stem.json`` + ``stem.safetensors`` (both written whole, then renamed).

    Raises:
        TypeError: ``obj`` holds a value of a type the format does not carry (a bug in the caller).
    """
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(obj, tensors)
    stem = Path(stem)
    tmp_json, tmp_st = stem.with_name(stem.name + ".json.tmp"), stem.with_name(stem.name + ".safetensors.tmp")
    tmp_json.write_text(json.dumps(tree, separators=(",", ":")), encoding="utf-8")
    save_file(tensors, str(tmp_st))
    os.replace(tmp_json, stem.with_name(stem.name + ".json"))
    os.replace(tmp_st, stem.with_name(stem.name + ".safetensors"))


def load_tree(stem: Path) -> Any:
    """Read what :func:`save_tree` wrote at ``stem``.

    Raises:
        StateFileError: a file is missing, too large, not JSON / safetensors, or holds another form.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    stem = Path(stem)
    jf, sf = stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".safetensors")
    for f in (jf, sf):
        if not f.is_file():
            raise StateFileError(f"{f.name} is missing")
    if jf.stat().st_size > MAX_JSON_BYTES:
        raise StateFileError(f"{jf.name} is {jf.stat().st_size:,} bytes, over the {MAX_JSON_BYTES:,} a state file may have")
    try:
        tree = json.loads(jf.read_bytes())
    except (ValueError, RecursionError) as exc:
        raise StateFileError(f"{jf.name} is not readable JSON ({type(exc).__name__})") from None
    try:
        tensors = load_file(str(sf))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise StateFileError(f"{sf.name} is damaged ({type(exc).__name__}: {str(exc)[:200]})") from None
    try:
        return _decode(tree, tensors)
    except RecursionError:
        raise StateFileError(f"{jf.name} nests too deep") from None
    except TypeError as exc:  # e.g. a tuple key holding a list (unhashable)
        raise StateFileError(f"{jf.name} holds an invalid value ({exc})") from None


def _encode(x: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, float)):  # json writes NaN and Infinity as such and reads them back
        return x
    if isinstance(x, np.generic):
        return _encode(x.item(), tensors)
    if isinstance(x, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = x.detach().cpu().contiguous().clone()
        return {"__tensor__": key}
    if isinstance(x, np.ndarray):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(x).copy())
        return {"__ndarray__": key}
    if isinstance(x, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in x]}
    if isinstance(x, list):
        return [_encode(v, tensors) for v in x]
    if isinstance(x, dict):
        if all(isinstance(k, str) for k in x) and not any(k in _MARKERS for k in x):
            return {k: _encode(v, tensors) for k, v in x.items()}
        return {"__dict__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in x.items()]}
    raise TypeError(f"a state file cannot hold a {type(x).__name__}")


def _decode(x: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, list):
        return [_decode(v, tensors) for v in x]
    if not isinstance(x, dict):
        raise StateFileError(f"unexpected JSON value of type {type(x).__name__}")
    marker = next((m for m in _MARKERS if m in x), None)
    if marker is None:
        return {k: _decode(v, tensors) for k, v in x.items()}
    if len(x) != 1:
        raise StateFileError(f"a {marker!r} object has other keys")
    body = x[marker]
    if marker in ("__tensor__", "__ndarray__"):
        if not isinstance(body, str) or body not in tensors:
            raise StateFileError(f"{marker} names a tensor the safetensors file lacks: {str(body)[:40]!r}")
        return tensors[body] if marker == "__tensor__" else tensors[body].numpy()
    if not isinstance(body, list):
        raise StateFileError(f"a {marker!r} object does not hold a list")
    if marker == "__tuple__":
        return tuple(_decode(v, tensors) for v in body)
    out: dict[Any, Any] = {}
    for pair in body:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise StateFileError("a '__dict__' entry is not a [key, value] pair")
        key = _decode(pair[0], tensors)
        if not isinstance(key, (str, int, float, bool, tuple)) and key is not None:
            raise StateFileError(f"a '__dict__' key of type {type(key).__name__}")
        out[key] = _decode(pair[1], tensors)
    return out
