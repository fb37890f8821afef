"""``--rollout-engine server`` against ``agentrl-train serve`` itself (vLLM's completions and LoRA routes).

The project's own server runs on 127.0.0.1 in a thread with the small tiny model the trainer uses:
the server path gives the trainer's own transitions (greedy) and log-probs, adapter versions swap
between updates, ``--async-rollouts 1`` resumes exactly.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from agentrl_envs.testing import free_port, serve_in_thread
from tests.train.conftest import SMALL, small_config

MAX_NEW = 24


def _cfg(tmp_path: Path, url: str = "", **kw: Any) -> Any:
    opts: dict[str, Any] = {"mode": "generate", "env": "AgentRL/SQL-v0", "max_new_tokens": MAX_NEW, "record": False}
    if url:
        opts |= {"rollout_engine": "server", "rollout_url": [url]}
    return small_config(tmp_path, **(opts | kw))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[str]:
    """``agentrl-train serve`` on the small tiny model, loading adapters from under ``root``."""
    from agentrl_train.serve.run import build_app
    from agentrl_train.tiny import TinySpec

    spec = TinySpec(pretrain_steps=SMALL["tiny_pretrain_steps"], corpus_episodes=SMALL["tiny_corpus_episodes"])
    app = build_app("tiny", {}, adapters_root=str(root), max_new_tokens=256, tiny_spec=spec, log=lambda _: None)
    with serve_in_thread(app, free_port()) as url:
        yield url
    app.engine.close()


def _policy(cfg: Any, seed: int = 0) -> Any:
    """The config's policy with a non-zero adapter (a fresh LoRA adapter is the base model exactly)."""
    from agentrl_train.policy import build_policy

    policy = build_policy(cfg, log=lambda _: None)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.trainable_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return policy


def _engine(policy: Any, url: str, **kw: Any) -> Any:
    from agentrl_train.rollout_engine import ServerEngine

    return ServerEngine(
        [url], prefix="t", stop_ids=sorted(policy.stop_ids), stops=policy.stops, vocab_size=len(policy.tokenizer), **kw
    )


def _pool(cfg: Any) -> Any:
    from agentrl_train.episodes import EnvPool

    pool = EnvPool(cfg.env.env, cfg.env.num_envs, run_seed=cfg.run.seed, vectorization="sync", make_kwargs={"split": "train"})
    pool.reset()
    return pool


def _play(policy: Any, cfg: Any, steps: int, engine: Any = None) -> list[Any]:
    """``steps`` greedy steps of the config's envs; every transition."""
    from agentrl_train.episodes import sub_info
    from agentrl_train.rollout import act_many

    pool, out = _pool(cfg), []
    try:
        for _ in range(steps):
            row = act_many(policy, pool, range(pool.num_envs), cfg, greedy=True, engine=engine)
            obs, rew, te, tu, info = pool.envs.step([tr.action_text for tr in row])
            for i, tr in enumerate(row):
                pool.took(policy, i, tr, obs[i], sub_info(info, i), rew[i], cfg)
            if np.any(te | tu):
                pool.reset(te | tu)
            out += row
    finally:
        pool.close()
    return out


def test_greedy_server_transitions_equal_the_trainers_own(server: str, root: Path) -> None:
    """Token in, token out: the same prompts, the same sampled ids, the same log-probs as in-process sampling."""
    cfg = _cfg(root / "greedy", server)
    policy = _policy(cfg)
    engine = _engine(policy, server)
    try:
        engine.sync(policy, root / "greedy" / "adapters", 0)
        remote = _play(policy, cfg, 3, engine)
    finally:
        engine.close()
    local = _play(policy, cfg, 3)
    assert [tr.prompt_ids for tr in remote] == [tr.prompt_ids for tr in local]
    assert [tr.new_ids for tr in remote] == [tr.new_ids for tr in local]
    assert [tr.action_text for tr in remote] == [tr.action_text for tr in local]
    for r, loc in zip(remote, local):
        assert r.version == 0 and loc.version == -1
        np.testing.assert_allclose(r.token_logprobs, loc.token_logprobs, atol=1e-4)


def test_the_server_answers_with_the_synced_adapter_not_the_base(server: str, root: Path) -> None:
    cfg = _cfg(root / "sync", server)
    policy = _policy(cfg, seed=1)
    engine = _engine(policy, server)
    prompt = _pool_prompt(policy, cfg)
    try:
        engine.sync(policy, root / "sync" / "adapters", 0)
        ((ids0, lps0),) = engine.sample([prompt], MAX_NEW, [None])
        with torch.no_grad():  # a different adapter: other log-probs for the same ids
            for name, p in policy.trainable_parameters():
                if "lora_B" in name:
                    p.mul_(-3.0)
        engine.sync(policy, root / "sync" / "adapters", 1)
        assert not (root / "sync" / "adapters" / "v0").exists()  # the old version is unloaded and removed
        ((ids1, lps1),) = engine.sample([prompt], MAX_NEW, [None])
    finally:
        engine.close()
    lp_local, _, _ = policy.sequence_logprobs(prompt, ids1)
    np.testing.assert_allclose(lps1, lp_local.tolist(), atol=1e-4)
    assert (ids0, lps0) != (ids1, lps1)


def _pool_prompt(policy: Any, cfg: Any) -> list[int]:
    pool = _pool(cfg)
    try:
        return pool.prompt(policy, 0, cfg)
    finally:
        pool.close()


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(next((out / "final").rglob("adapter_model.safetensors"))))


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_training_through_the_server_logs_the_gap_and_versions(server: str, root: Path) -> None:
    """Two updates through the server: sampled log-probs match the trainer's, each rollout's adapter is the latest."""
    from agentrl_train.train import train

    cfg = _cfg(root / "train", server, out=str(root / "train" / "run"), epochs=1)  # one step: stats before it
    summary = train(cfg, log=lambda _: None)
    rows = _rows(Path(cfg.run.out))
    assert summary["finished"] and len(rows) == 2
    for row in rows:
        assert row["rollout/version_lag"] == 0.0
        assert row["rollout/logprob_gap_max"] < 1e-3
        assert abs(row["approx_kl"]) < 1e-4  # measured before the update's only step: the ratio to the server is 1


def test_async_rollouts_are_one_version_stale_and_resume_exactly(server: str, root: Path) -> None:
    """--async-rollouts 1: the next rollout is sampled during the update; a run stopped and resumed ends the same."""
    from agentrl_train.train import train

    common = {"updates": 3, "async_rollouts": 1, "checkpoint_every": 1}
    whole = _cfg(root / "async", server, out=str(root / "async" / "whole"), **common)
    train(whole, log=lambda _: None)
    rows = _rows(Path(whole.run.out))
    assert [row["rollout/version_lag"] for row in rows] == [0.0, 1.0, 1.0]
    assert all(row["rollout/logprob_gap_max"] < 1e-3 for row in rows)  # numerics: same-version transitions only
    assert "rollout/stale_logprob_shift_mean" not in rows[0]
    assert all(row["rollout/stale_logprob_shift_mean"] > 0 for row in rows[1:])  # the update since they were sampled
    parts = _cfg(root / "async", server, out=str(root / "async" / "parts"), max_updates_this_call=1, **common)
    train(parts, log=lambda _: None)
    for _ in range(2):
        train(_cfg(root / "async", server, out=parts.run.out, max_updates_this_call=1, resume=True, **common), log=lambda _: None)
    a, b = _weights(Path(whole.run.out)), _weights(Path(parts.run.out))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def test_a_server_that_dies_mid_rollout_stops_the_run_clearly_and_resume_finishes(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stops in the middle of update 2's rollout: the requests are retried, then the run stops with
    a clear error and no update 2 (never an update on part of a batch); ``--resume`` against a new server
    finishes the run from update 1's checkpoint."""
    from agentrl_train.rollout_engine import RolloutServerError, ServerEngine
    from agentrl_train.serve.run import build_app
    from agentrl_train.tiny import TinySpec
    from agentrl_train.train import train

    spec = TinySpec(pretrain_steps=SMALL["tiny_pretrain_steps"], corpus_episodes=SMALL["tiny_corpus_episodes"])
    out = root / "dies" / "run"

    def app() -> Any:
        return build_app("tiny", {}, adapters_root=str(root), max_new_tokens=256, tiny_spec=spec, log=lambda _: None)

    first = app()
    stack = contextlib.ExitStack()
    url = stack.enter_context(serve_in_thread(first, free_port()))
    sample, calls = ServerEngine.sample, [0]

    def stop_the_server_at_step_2_of_update_2(self: Any, *args: Any, **kw: Any) -> Any:
        calls[0] += 1
        if calls[0] == 4 + 2:  # rollout_steps 4 per update: update 2's second step
            stack.close()  # uvicorn stops: connections refused from here on
        return sample(self, *args, **kw)

    monkeypatch.setattr(ServerEngine, "sample", stop_the_server_at_step_2_of_update_2)
    common = {"updates": 3, "checkpoint_every": 1, "rollout_retries": 1}
    try:
        with pytest.raises(RolloutServerError, match=r"could not be reached to sample an action.*2 tries.*abandoned whole"):
            train(_cfg(root / "dies", url, out=str(out), **common), log=lambda _: None)
    finally:
        stack.close()
        first.engine.close()
    assert calls[0] == 6 and [row["update"] for row in _rows(out)] == [1]
    second = app()
    try:
        with serve_in_thread(second, free_port()) as url2:
            summary = train(_cfg(root / "dies", url2, out=str(out), resume=True, **common), log=lambda _: None)
    finally:
        second.engine.close()
    assert summary["finished"]
    assert [row["update"] for row in _rows(out)] == [1, 2, 3]
