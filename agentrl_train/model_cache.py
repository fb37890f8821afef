"""Model folders the trainer builds once and caches: the ``tiny`` model and converted GGUF files.

:func:`cached_folder` is the one way a folder enters the cache (``$AGENTRL_CACHE``, default
``~/.cache/agentrl``):

- built into a temporary sibling ``.<name>-XXXXXXXX`` under a file lock ``.<name>.lock`` (parallel
  tests and DDP ranks wait; the first builds), then renamed into place, so a reader sees a whole
  folder or none;
- checked before it is committed: the config, the weights (no missing or unexpected keys) and the
  tokenizer load with ``from_pretrained``. Only then is ``done`` written: a JSON manifest of every
  file and its size;
- checked again, cheaply, on every later use (each file of the manifest present with its size); a
  folder that fails (a build killed between files, a file deleted or truncated, or an old ``done``
  over a folder that does not load) is rebuilt, and the log says why;
- temporary folders left by a killed build are swept when the next build runs: those of this name
  (this process holds the lock, so no one else is building it) and those of any other name whose
  lock no one holds.

:func:`save_model` writes a model on any rank: transformers 5's ``save_pretrained`` writes nothing on
a rank other than 0 once ``torch.distributed`` is initialised, even with ``is_main_process=True``,
so a cache built by rank 1 under ``torchrun`` would be committed without weights.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["cache_root", "cached_folder", "check_hf_folder", "save_model"]

DONE = "done"


def cache_root() -> Path:
    """``$AGENTRL_CACHE``, or ``~/.cache/agentrl``."""
    return Path(os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl")


def cached_folder(name: str, build: Callable[[Path], None], *, log: Any = print) -> Path:
    """``cache_root() / name``, built once by ``build(tmp)`` (which fills the empty folder ``tmp``).

    Raises:
        ConfigError: the folder ``build`` wrote does not load (see :func:`check_hf_folder`).
    """
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    if _intact(target) is None:
        return target
    with _locked(root / f".{name}.lock"):
        problem = _intact(target)
        if problem is None:
            return target
        if problem == "legacy":  # a `done` from before the manifest: load it once, then record the manifest
            try:
                check_hf_folder(target)
            except Exception as exc:  # whatever stops it loading, it is rebuilt
                problem = f"it does not load ({type(exc).__name__}: {str(exc)[:200]})"
            else:
                _write_manifest(target)
                return target
        if target.exists():
            log(f"cache: {target} is unusable: {problem}; rebuilding it")
        _sweep(root, name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        try:
            build(tmp)
            check_hf_folder(tmp)
            _write_manifest(tmp)
            if target.exists():
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def check_hf_folder(path: Path) -> None:
    """Load the folder's config, weights and tokenizer as the trainer will; raise if any is missing.

    Raises:
        ConfigError: a part does not load, or the weights miss or add keys.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from agentrl_envs.errors import ConfigError

    for part, load in (("config", AutoConfig.from_pretrained), ("tokenizer", AutoTokenizer.from_pretrained)):
        try:
            load(path)
        except Exception as exc:
            raise ConfigError(f"{path}: its {part} does not load ({type(exc).__name__}: {str(exc)[:200]})") from None
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
        info: dict[str, Any] = loaded[1]
    except Exception as exc:
        raise ConfigError(f"{path}: its weights do not load ({type(exc).__name__}: {str(exc)[:200]})") from None
    bad = {k: sorted(v)[:5] for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ConfigError(f"{path}: its weights do not match its config: {bad}")


def save_model(model: Any, out: Path) -> None:
    """``model.save_pretrained(out)`` on whatever rank this process is.

    ``save_pretrained`` asks ``should_save_on_this_rank``, which is False on a rank other than 0 of
    an initialised process group whatever ``is_main_process`` says. The cache is per machine, not
    per rank: the model built here is this process's own object, so its answer is set to yes.
    """
    model.should_save_on_this_rank = lambda is_main_process: True
    try:
        model.save_pretrained(out, is_main_process=True)
    finally:
        del model.should_save_on_this_rank


# -- internals -----------------------------------------------------------------------------------


def _intact(folder: Path) -> str | None:
    """None if the folder is committed and whole; else what is wrong (``"legacy"``: an old ``done``)."""
    try:
        text = (folder / DONE).read_text()
    except OSError:
        return "no `done` marker (a build that did not finish)"
    try:
        manifest = json.loads(text)
    except ValueError:
        return "legacy"
    if not isinstance(manifest, dict) or not manifest:
        return "legacy"
    for rel, size in manifest.items():
        try:
            have = (folder / rel).stat().st_size
        except OSError:
            return f"{rel} is missing"
        if have != size:
            return f"{rel} has {have} bytes, {size} were written"
    return None


def _write_manifest(folder: Path) -> None:
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file() and p.name != DONE}
    tmp = folder / f".{DONE}.tmp"
    tmp.write_text(json.dumps(files, indent=1) + "\n")
    os.replace(tmp, folder / DONE)


@contextlib.contextmanager
def _locked(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path``; with ``wait=False`` yield False at once when it is held."""
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sweep(root: Path, held: str) -> None:
    """Remove temporary folders of builds that died: ``held``'s (its lock is ours) and free-locked others'."""
    for tmp in root.glob(".*-*"):
        if not tmp.is_dir():
            continue
        name = tmp.name[1:].rsplit("-", 1)[0]  # mkdtemp's suffix has no '-'
        if name == held:
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        if not (root / f".{name}.lock").exists():
            continue  # not a folder of this module's
        with _locked(root / f".{name}.lock", wait=False) as free:
            if free:
                shutil.rmtree(tmp, ignore_errors=True)
