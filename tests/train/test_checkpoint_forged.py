"""Checkpoints a stranger wrote: nothing in them runs, and ``latest`` names only a checkpoint of the run."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl_train import checkpoint
from agentrl_train.cli import main
from agentrl_train.statefile import StateFileError, load_tree, save_tree
from agentrl_train.train import train

from .conftest import small_config


class _Payload:
    """A pickle that, when loaded, creates ``marker`` (what a forged checkpoint would do, harmlessly)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[override]
        return (subprocess.call, ([sys.executable, "-c", f"open({str(self.marker)!r}, 'w').write('ran')"],))


def _forge_pickles(folder: Path, marker: Path) -> None:
    """Every file a checkpoint had in the pickle format, holding the payload."""
    for name in ("state.pt", "envs-rank0.pt"):
        with open(folder / name, "wb") as f:
            pickle.dump({"payload": _Payload(marker)}, f)
        torch.save({"payload": _Payload(marker)}, folder / (name + ".torch"))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("ckpt")
    train(small_config(base, updates=1, record=False, final_eval_splits=[]), log=lambda *a, **k: None)
    return base


def _copy(finished_run: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished_run, tmp_path / "base")
    return tmp_path / "base"


def test_a_checkpoint_has_no_pickle(finished_run: Path) -> None:
    ck = finished_run / "run" / "checkpoints" / "update-000001"
    names = sorted(p.name for p in ck.iterdir())
    assert names == sorted(
        ["complete", "trainable.safetensors", "state.json", "state.safetensors", "envs-rank0.json", "envs-rank0.safetensors"]
    )
    from safetensors import safe_open

    for p in ck.glob("*.json"):
        json.loads(p.read_text())
    for p in ck.glob("*.safetensors"):
        with safe_open(str(p), framework="pt") as f:
            assert all(f.get_tensor(k) is not None for k in f.keys())


def test_forged_pickles_in_a_checkpoint_run_nothing(finished_run: Path, tmp_path: Path) -> None:
    base = _copy(finished_run, tmp_path)
    ck = base / "run" / "checkpoints" / "update-000001"
    marker = tmp_path / "pwned"
    for f in ("state.json", "state.safetensors"):
        (ck / f).unlink()
    _forge_pickles(ck, marker)
    for name in ("state.pt", "envs-rank0.pt"):  # the old format's names hold the torch.save pickles too
        os.replace(ck / (name + ".torch"), ck / name)
    with pytest.raises(checkpoint.CheckpointError, match="old pickle format"):
        train(small_config(base, updates=2, resume=True, record=False), log=lambda *a, **k: None)
    assert not marker.exists()


@pytest.mark.parametrize("where", ["state", "envs-rank0"])
def test_a_pickle_in_place_of_a_state_file_is_refused_as_corrupt(finished_run: Path, tmp_path: Path, where: str) -> None:
    base = _copy(finished_run, tmp_path)
    ck = base / "run" / "checkpoints" / "update-000001"
    marker = tmp_path / "pwned"
    for suffix in (".json", ".safetensors"):
        with open(ck / (where + suffix), "wb") as f:
            pickle.dump(_Payload(marker), f)
        with pytest.raises(checkpoint.CheckpointError, match="corrupt"):
            train(small_config(base, updates=2, resume=True, record=False), log=lambda *a, **k: None)
        assert not marker.exists()
        shutil.copy(finished_run / "run" / "checkpoints" / "update-000001" / (where + suffix), ck / (where + suffix))


@pytest.mark.parametrize(
    "latest",
    [
        "../../../evil",
        "ABSOLUTE",
        "update-000001/../../../../evil",
        "..",
        "",
        "update-1",
        "update-000001\x00",
        "x" * 5000,
        "update-000002",  # a well-formed name with no folder
    ],
)
def test_latest_names_only_a_checkpoint_folder_of_the_run(finished_run: Path, tmp_path: Path, latest: str) -> None:
    base = _copy(finished_run, tmp_path)
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "complete").write_text("ok\n")
    marker = tmp_path / "pwned"
    _forge_pickles(evil, marker)
    (base / "run" / "checkpoints" / "latest").write_text((str(evil) if latest == "ABSOLUTE" else latest) + "\n")
    with pytest.raises(checkpoint.CheckpointError, match=r"not a checkpoint|no checkpoint"):
        train(small_config(base, updates=2, resume=True, record=False), log=lambda *a, **k: None)
    assert not marker.exists()


def test_latest_refuses_a_symlinked_checkpoint_folder(finished_run: Path, tmp_path: Path) -> None:
    base = _copy(finished_run, tmp_path)
    root = base / "run" / "checkpoints"
    shutil.copytree(root / "update-000001", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", root / "update-000009")
    (root / "latest").write_text("update-000009\n")
    with pytest.raises(checkpoint.CheckpointError, match="not a checkpoint folder"):
        train(small_config(base, updates=2, resume=True, record=False), log=lambda *a, **k: None)
    capsys_args = ["eval", "--run", str(base / "run"), "--checkpoint", "update-000009", "--episodes", "1"]
    assert main(capsys_args) == 2


def test_resume_from_the_new_format_still_continues(finished_run: Path, tmp_path: Path) -> None:
    base = _copy(finished_run, tmp_path)
    summary = train(small_config(base, updates=2, resume=True, record=False, final_eval_splits=[]), log=lambda *a, **k: None)
    assert summary["finished"]


# -- the state file format itself ---------------------------------------------------------------------


def test_state_tree_round_trips_what_a_checkpoint_holds(tmp_path: Path) -> None:
    import random

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.randn(3, 2))], lr=1e-3)
    opt.zero_grad()
    opt.param_groups[0]["params"][0].grad = torch.ones(3, 2)
    opt.step()
    obj = {
        "optimizer": opt.state_dict(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
        "sgd_rng": np.random.default_rng(3).bit_generator.state,
        "torch_rng": torch.get_rng_state(),
        "history": [{"update": 1, "loss": float("nan"), "x": np.float32(0.5)}],
        "odd": {"__tensor__": "looks like a marker", 3: (1, "a")},
    }
    save_tree(tmp_path / "s", obj)
    back = load_tree(tmp_path / "s")
    opt2 = torch.optim.AdamW([torch.nn.Parameter(torch.randn(3, 2))], lr=1e-3)
    opt2.load_state_dict(back["optimizer"])
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    random.setstate(back["python_rng"])
    np.random.set_state(back["numpy_rng"])
    np.random.default_rng().bit_generator.state = back["sgd_rng"]
    torch.set_rng_state(back["torch_rng"])
    assert back["odd"] == {"__tensor__": "looks like a marker", 3: (1, "a")}
    assert math_isnan(back["history"][0]["loss"]) and back["history"][0]["x"] == 0.5


def math_isnan(x: float) -> bool:
    return x != x


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"\x80\x04K\x01.",  # a pickle
        b"not json",
        b"[" * 100_000 + b"]" * 100_000,  # deep
        json.dumps({"__tensor__": "t99"}).encode(),  # a tensor the file lacks
        json.dumps({"__tensor__": "t0", "x": 1}).encode(),
        json.dumps({"__tuple__": 5}).encode(),
        json.dumps({"__dict__": [[1]]}).encode(),
        json.dumps({"__dict__": [[[1, 2], 3]]}).encode(),  # an unhashable key
        json.dumps({"__ndarray__": ["t0"]}).encode(),
    ],
)
def test_state_tree_refuses_garbage_with_its_own_error(tmp_path: Path, text: bytes) -> None:
    save_tree(tmp_path / "s", {"a": torch.zeros(2)})
    (tmp_path / "s.json").write_bytes(text)
    with pytest.raises(StateFileError):
        load_tree(tmp_path / "s")


def test_state_tree_refuses_a_huge_structure_before_reading_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrl_train import statefile

    save_tree(tmp_path / "s", {"a": list(range(1000))})
    monkeypatch.setattr(statefile, "MAX_JSON_BYTES", 100)
    with pytest.raises(StateFileError, match="over the 100"):
        load_tree(tmp_path / "s")


def test_state_tree_refuses_to_write_what_it_cannot_read_back(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="cannot hold a object"):
        save_tree(tmp_path / "s", {"x": object()})
