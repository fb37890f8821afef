"""The tiny model's build: the same bytes whatever the caller's thread count (the pretraining runs on
one thread: with two, CPU kernels split bias and embedding gradient sums and the weights differ), so
the background build of tests/train/conftest.py and a user's build on every core give one model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl_train.tiny import TinySpec, build_tiny

SPEC = TinySpec(pretrain_steps=12, corpus_episodes=4)


def _build(root: Path, threads: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    monkeypatch.setenv("AGENTRL_CACHE", str(root))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        folder = build_tiny(SPEC, log=lambda *a: None)
        assert torch.get_num_threads() == threads  # the build gives the caller's thread count back
    finally:
        torch.set_num_threads(before)
    return {name: (folder / name).read_bytes() for name in ("model.safetensors", "tokenizer.json", "config.json")}


def test_the_weights_do_not_depend_on_the_thread_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = _build(tmp_path / "one", 1, monkeypatch)
    two = _build(tmp_path / "two", 2, monkeypatch)
    for name in one:
        assert one[name] == two[name], f"{name} differs between a 1-thread and a 2-thread build"


def test_a_built_model_is_reused_not_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _build(tmp_path, 1, monkeypatch)
    folder = build_tiny(SPEC, log=lambda *a: pytest.fail(f"rebuilt: {a}"))
    assert (folder / "model.safetensors").read_bytes() == first["model.safetensors"]
