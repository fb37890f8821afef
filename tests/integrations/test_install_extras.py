"""The examples extra: what it pins, that `make setup` installs it, and that torch stays the CPU build."""

from __future__ import annotations

import importlib.metadata
import re

import pytest

from .conftest import ROOT


def test_examples_extra_and_setup_line() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert extras["examples"] == ["trl==1.16.*", "stable-baselines3>=2.9,<3", "datasets>=3"]
    assert "torch==2.13.0" in extras["train"]
    setup = re.search(r"pip install --quiet -e \"\.\[([a-z,]+)\]\"", (ROOT / "Makefile").read_text())
    assert setup is not None and {"train", "examples"} <= set(setup.group(1).split(","))


def test_installed_torch_is_the_pinned_cpu_build() -> None:
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torch is not installed (the train extra brings it)")
    assert version.startswith("2.13.0"), f"torch {version}: the train extra pins 2.13.0"
    assert "+cu" not in version, f"torch {version} is a CUDA build; install order must keep the CPU wheel"
