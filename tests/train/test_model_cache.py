"""The model cache (tiny, converted GGUF): committed only once it loads, rebuilt when broken, on any rank."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest
import torch

from agentrl_envs.errors import ConfigError
from agentrl_train import model_cache
from agentrl_train.model_cache import cached_folder, save_model
from agentrl_train.tiny import TinySpec, build_tiny

SPEC = TinySpec(pretrain_steps=4, corpus_episodes=2)


def _write_model(out: Path) -> None:
    """A small Llama and a word-level tokenizer: a folder ``from_pretrained`` loads."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(out)
    config = LlamaConfig(vocab_size=3, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    save_model(LlamaForCausalLM(config), out)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    return tmp_path


def test_a_folder_is_built_once_and_committed_with_a_manifest(cache: Path) -> None:
    builds: list[Path] = []
    folder = cached_folder("m", lambda out: (builds.append(out), _write_model(out)), log=print)
    assert folder == cache / "m" and len(builds) == 1 and not builds[0].exists()  # built aside, renamed in
    manifest = json.loads((folder / "done").read_text())
    assert manifest["config.json"] == (folder / "config.json").stat().st_size and "model.safetensors" in manifest
    assert cached_folder("m", lambda out: pytest.fail("rebuilt"), log=lambda *a: pytest.fail(f"logged {a}")) == folder


@pytest.mark.parametrize(
    ("damage", "reason"),
    [("delete", "model.safetensors is missing"), ("truncate", "model.safetensors has 10 bytes"), ("legacy", "does not load")],
)
def test_a_broken_folder_is_rebuilt_and_the_log_says_why(cache: Path, damage: str, reason: str) -> None:
    folder = cached_folder("m", _write_model, log=print)
    weights = folder / "model.safetensors"
    if damage == "delete":
        weights.unlink()
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:10])
    else:  # the old `done` (no manifest) over a folder without its config: what rank 1 used to commit
        (folder / "config.json").unlink()
        (folder / "done").write_text("ok\n")
    logs: list[str] = []
    assert cached_folder("m", _write_model, log=logs.append) == folder
    assert len(logs) == 1 and "unusable" in logs[0] and reason in logs[0] and "rebuilding" in logs[0]
    model_cache.check_hf_folder(folder)
    assert model_cache._intact(folder) is None


def test_an_old_done_over_a_good_folder_is_kept_and_given_a_manifest(cache: Path) -> None:
    folder = cached_folder("m", _write_model, log=print)
    (folder / "done").write_text("ok\n")
    assert cached_folder("m", lambda out: pytest.fail("rebuilt"), log=lambda *a: pytest.fail(f"logged {a}")) == folder
    assert "config.json" in json.loads((folder / "done").read_text())


def test_a_build_that_does_not_load_is_not_committed(cache: Path) -> None:
    def no_weights(out: Path) -> None:
        _write_model(out)
        (out / "model.safetensors").unlink()

    with pytest.raises(ConfigError, match="weights do not load"):
        cached_folder("m", no_weights, log=print)
    assert sorted(p.name for p in cache.iterdir()) == [".m.lock"]  # no folder, no temporary


def test_stale_temporary_folders_are_swept_but_not_a_live_builds(cache: Path) -> None:
    stale_same = cache / ".m-k1l2m3n4"  # a killed build of this very folder
    stale_other = cache / ".tiny-abc-q9w8e7r6"  # a killed build of another one, whose lock is free
    live_other = cache / ".busy-x1y2z3w4"  # another build in progress: its lock is held
    for d in (stale_same, stale_other, live_other):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x" * 100)
    (cache / ".tiny-abc.lock").touch()
    with open(cache / ".busy.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        cached_folder("m", _write_model, log=print)
    assert not stale_same.exists() and not stale_other.exists()
    assert live_other.exists()


def test_save_model_writes_on_a_rank_other_than_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5 writes nothing on rank 1 of an initialised group, even with ``is_main_process=True``."""
    import transformers.distributed.mixin as mixin
    from transformers import LlamaConfig, LlamaForCausalLM

    monkeypatch.setattr(mixin, "_is_torch_distributed_initialized", lambda: True)
    monkeypatch.setattr(mixin, "_get_torch_distributed_rank", lambda: 1)
    lm = LlamaForCausalLM(
        LlamaConfig(vocab_size=3, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    )
    lm.save_pretrained(tmp_path / "plain", is_main_process=True)
    assert not (tmp_path / "plain" / "config.json").exists()  # what the cache used to rely on
    save_model(lm, tmp_path / "ours")
    assert (tmp_path / "ours" / "config.json").exists() and (tmp_path / "ours" / "model.safetensors").exists()
    assert "should_save_on_this_rank" not in vars(lm)  # the model is left as it was


def test_tiny_built_by_rank_1_is_cached_with_its_weights(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#33 finding 15: under torchrun, rank 1 won the build lock and cached a tiny model without weights."""
    import transformers.distributed.mixin as mixin

    monkeypatch.setattr(mixin, "_is_torch_distributed_initialized", lambda: True)
    monkeypatch.setattr(mixin, "_get_torch_distributed_rank", lambda: 1)
    folder = build_tiny(SPEC, log=lambda *a: None)
    monkeypatch.undo()
    monkeypatch.setenv("AGENTRL_CACHE", str(cache))
    from agentrl_train.models import load_base

    lm, _ = load_base(str(folder), torch.device("cpu"), log=lambda *a: None)
    assert sum(p.numel() for p in lm.parameters()) > 0


def test_a_tiny_cache_without_its_config_is_rebuilt_with_a_message(cache: Path) -> None:
    """The state finding 15 left on machines: ``done`` (the old marker) and a tokenizer, no config.json."""
    folder = build_tiny(SPEC, log=lambda *a: None)
    (folder / "config.json").unlink()
    (folder / "model.safetensors").unlink()
    (folder / "done").write_text("ok\n")
    logs: list[str] = []
    assert build_tiny(SPEC, log=logs.append) == folder
    assert any("unusable" in line and "rebuilding" in line for line in logs)
    assert (folder / "config.json").exists() and (folder / "model.safetensors").exists()


_RANK = """
import sys
import torch
import torch.distributed as td
from agentrl_train.model_cache import check_hf_folder
from agentrl_train.tiny import TinySpec, build_tiny

rank, port = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(1)
td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
spec = TinySpec(pretrain_steps=4, corpus_episodes=2)
if rank == 1:  # rank 1 builds the cache, as when it wins the lock under torchrun
    build_tiny(spec, log=lambda *a: None)
td.barrier()
if rank == 0:
    folder = build_tiny(spec, log=lambda *a: print("rank 0:", *a))
    check_hf_folder(folder)
    print("rank 0: loaded", folder.name)
td.barrier()
td.destroy_process_group()
"""


def test_a_tiny_model_built_by_rank_1_of_a_gloo_group_loads_on_rank_0(cache: Path) -> None:
    """#33 finding 15 for real: two ranks under torch.distributed (gloo), the build on rank 1."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "AGENTRL_CACHE": str(cache), "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(rank), str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "rank 0: loaded tiny-" in outs[0] and "rebuilding" not in outs[0], outs[0]
