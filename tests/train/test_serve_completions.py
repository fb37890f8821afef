"""``agentrl-train serve``'s vLLM routes: ``/v1/completions`` and the runtime LoRA routes, on the small tiny model.

One server (uvicorn on a free loopback port, in a thread) with a chat token and an admin token is shared
by the module; requests carry the admin token (accepted on every route), as the trainer's rollout client
does. Adapter ``a`` (random LoRA weights, saved by ``policy.save``) is loaded over HTTP by the fixture;
each test that loads more uses names of its own.

- greedy completions equal the trainer's own in-process sampling, ids and log-probs;
- seeded sampling repeats; tokens are spelled ``token_id:N`` or as text, as vLLM spells them;
- load, reload refused, unload, unload refused, model gone; a freed slot serves the next name correctly;
- garbage, empty, huge and hostile bodies on the three routes: a 4xx naming what is wrong, and the
  server answers as before afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx
import numpy as np
import pytest
import torch

import agentrl_envs  # noqa: F401
from agentrl_envs.testing import free_port, serve_in_thread

from .conftest import SMALL, small_config

pytestmark = pytest.mark.timeout(900)  # a hang detector, not a speed check

MAX_NEW = 24  #: tokens asked per completion
LIMIT = 64  #: the server's --max-new-tokens
CHAT, ADMIN = "chat-token-0123456789abcdef", "admin-token-0123456789abcdef"


def _randomize(policy: Any, seed: int) -> None:
    """Small random lora_B weights: a fresh adapter is the base exactly, these are not."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.trainable_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("adapters")


@pytest.fixture(scope="module")
def policy(root: Path) -> Any:
    """The trainer's policy on the small tiny model with adapter ``a``'s weights, saved under ``root/a``."""
    from agentrl_train.policy import build_policy

    p = build_policy(small_config(root / "run", mode="generate", env="AgentRL/SQL-v0"), log=lambda *a, **k: None)
    _randomize(p, 1)
    p.save(root / "a")
    _randomize(p, 2)
    p.save(root / "b")
    _randomize(p, 1)  # back to a's weights: the reference of every comparison
    p.eval()
    _broken(root, root / "a" / p.adapter)
    return p


def _broken(root: Path, good: Path) -> None:
    """Adapter folders damaged the ways a crashed copy, a hand edit or another base leave them."""
    import shutil

    from safetensors.torch import load_file, save_file

    def copy(name: str) -> Path:
        shutil.copytree(good, root / name)
        return root / name

    w = copy("truncated") / "adapter_model.safetensors"
    w.write_bytes(w.read_bytes()[:-100])
    (copy("garbage") / "adapter_model.safetensors").write_bytes(b"\x00not safetensors" * 64)
    w = copy("nan") / "adapter_model.safetensors"
    tensors = load_file(w)
    key = sorted(k for k in tensors if "lora_B" in k)[0]
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[0] = float("nan")
    save_file(tensors, w)
    cfg = copy("rank") / "adapter_config.json"  # ranks the weights do not have: peft's slot will not fit them
    config = json.loads(cfg.read_text())
    config["r"] *= 2
    config["rank_pattern"] = {k: 2 * v for k, v in (config.get("rank_pattern") or {}).items()}
    cfg.write_text(json.dumps(config))
    (copy("config_text") / "adapter_config.json").write_text("{not json")
    (root / "empty").mkdir()
    (root / "file.txt").write_text("not an adapter")


@pytest.fixture(scope="module")
def server(root: Path, policy: Any) -> Iterator[tuple[httpx.Client, Any]]:
    """The server on the small tiny model, adapters under ``root``, ``a`` loaded over HTTP."""
    from agentrl_train.serve.run import build_app
    from agentrl_train.tiny import TinySpec

    spec = TinySpec(pretrain_steps=SMALL["tiny_pretrain_steps"], corpus_episodes=SMALL["tiny_corpus_episodes"])
    app = build_app(
        "tiny",
        {},
        adapters_root=str(root),
        max_new_tokens=LIMIT,
        token=CHAT,
        admin_token=ADMIN,
        tiny_spec=spec,
        log=lambda _: None,
    )
    with serve_in_thread(app, free_port()) as url:
        with httpx.Client(base_url=url, timeout=300, headers={"authorization": f"Bearer {ADMIN}"}) as c:
            r = c.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(root / "a" / policy.adapter)})
            assert r.status_code == 200, r.text
            yield c, app
    app.engine.close()


@pytest.fixture(scope="module")
def prompts(policy: Any) -> list[list[int]]:
    """Two env prompts as the trainer encodes them (system + the task, with the env's tools)."""
    env = gym.make("AgentRL/SQL-v0", split="train")
    out = []
    for seed in (0, 1):
        obs, info = env.reset(seed=seed)
        messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": obs}]
        out.append(policy.encode_prompt(messages, info["tools"], 1024))
    env.close()
    return out


def _complete(c: httpx.Client, model: str, prompt: Any, **kw: Any) -> httpx.Response:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": MAX_NEW,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        **kw,
    }
    return c.post("/v1/completions", json=body)


def _ids_lps(r: httpx.Response) -> tuple[list[int], list[float]]:
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _cut(policy: Any, ids: list[int], lps: list[float]) -> tuple[list[int], list[float]]:
    """Where the trainer's sampler stops (an end-of-turn id, or text completing ``</tool_call>``), as the client cuts."""
    for j in range(len(ids)):
        if policy.stops(ids[: j + 1]):
            return ids[: j + 1], lps[: j + 1]
    return ids, lps


# -- completions -------------------------------------------------------------------------------------


def test_greedy_completions_equal_the_trainers_own_sampling(server: Any, policy: Any, prompts: list[list[int]]) -> None:
    c, _ = server
    for prompt in prompts:
        local_ids, local_lps, _ = policy.generate(prompt, MAX_NEW, greedy=True)
        r = _complete(c, "a", prompt, stop_token_ids=sorted(policy.stop_ids))
        ids, lps = _cut(policy, *_ids_lps(r))
        assert ids == local_ids
        np.testing.assert_allclose(lps, local_lps, rtol=0, atol=1e-5)
        body = r.json()
        choice = body["choices"][0]
        assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == "a"
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
        assert choice["finish_reason"] in ("stop", "length")
        assert (choice["finish_reason"] == "stop") == (choice["token_ids"][-1] in policy.stop_ids)
        usage = body["usage"]
        assert usage == {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(choice["token_ids"]),
            "total_tokens": len(prompt) + len(choice["token_ids"]),
        }
    # the adapter is not the base: the same prompt under the base model has other log-probs
    _, base_lps = _ids_lps(_complete(c, "base", prompts[0]))
    _, a_lps = _ids_lps(_complete(c, "a", prompts[0]))
    assert abs(base_lps[0] - a_lps[0]) > 1e-4


def test_stop_token_ids_end_a_completion(server: Any, prompts: list[list[int]]) -> None:
    c, _ = server
    ids, _ = _ids_lps(_complete(c, "a", prompts[0], max_tokens=8))
    r = _complete(c, "a", prompts[0], max_tokens=8, stop_token_ids=[ids[2]])
    got, lps = _ids_lps(r)
    first = ids.index(ids[2])
    assert got == ids[: first + 1] and len(lps) == len(got)
    assert r.json()["choices"][0]["finish_reason"] == "stop" and r.json()["choices"][0]["stop_reason"] == ids[2]


def test_seeded_sampling_repeats_and_seeds_differ(server: Any, prompts: list[list[int]]) -> None:
    c, _ = server
    runs = [_ids_lps(_complete(c, "a", prompts[0], temperature=1.0, seed=s)) for s in (7, 7, 8, 9, 10)]
    assert runs[0] == runs[1]
    assert len({tuple(ids) for ids, _ in runs}) > 1
    # the log-probs of a sampled id are the untempered distribution's, whatever the temperature
    greedy_ids, greedy_lps = _ids_lps(_complete(c, "a", prompts[0], max_tokens=1))
    hot_ids, hot_lps = _ids_lps(_complete(c, "a", prompts[0], max_tokens=1, temperature=1e-6, seed=3))
    assert hot_ids == greedy_ids and hot_lps == pytest.approx(greedy_lps, abs=1e-6)


def test_tokens_are_spelled_as_text_or_token_ids(server: Any, policy: Any, prompts: list[list[int]]) -> None:
    c, _ = server
    tok = policy.tokenizer
    r = _complete(c, "a", prompts[0], max_tokens=6, logprobs=1, return_tokens_as_token_ids=False)
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert lp["tokens"] == [tok.decode([t]) for t in choice["token_ids"]]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    for spelled, step, value in zip(lp["tokens"], lp["top_logprobs"], lp["token_logprobs"]):
        assert 1 <= len(step) <= 2 and step[spelled] == value  # the sampled token, then the most likely one
        assert max(step.values()) == value  # greedy: the sampled token is the most likely
    shown = choice["token_ids"][:-1] if choice["finish_reason"] == "stop" else choice["token_ids"]
    assert choice["text"] == tok.decode(shown, skip_special_tokens=False)
    r = _complete(c, "a", prompts[0], max_tokens=3, logprobs=None)
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None


def test_a_string_prompt_is_tokenized_without_added_special_tokens(server: Any, policy: Any, prompts: list[list[int]]) -> None:
    c, _ = server
    text = policy.tokenizer.decode(prompts[0])
    ids = list(policy.tokenizer(text, add_special_tokens=False)["input_ids"])
    by_text = _complete(c, "a", text)
    assert by_text.json()["usage"]["prompt_tokens"] == len(ids)
    assert _ids_lps(by_text) == _ids_lps(_complete(c, "a", ids))


def test_unknown_fields_are_ignored_as_vllm_does(server: Any, prompts: list[list[int]]) -> None:
    c, _ = server
    plain = _ids_lps(_complete(c, "a", prompts[0], max_tokens=4))
    extra = _complete(c, "a", prompts[0], max_tokens=4, user="u1", some_future_option={"x": 1}, top_k=0, presence_penalty=0.0)
    assert _ids_lps(extra) == plain


# -- runtime LoRA ------------------------------------------------------------------------------------


def test_load_reload_unload_and_a_freed_slot_serves_the_next_name(
    server: Any, policy: Any, root: Path, prompts: list[list[int]]
) -> None:
    c, app = server
    b_path = str(root / "b" / policy.adapter)
    r = c.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": b_path})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'b' added successfully."
    models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert models["b"]["parent"] == "tiny" and {"a", "base", "tiny"} <= set(models)
    r = c.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": b_path})
    assert r.status_code == 400 and "has already been loaded" in r.text
    a_ref, b_ref = _ids_lps(_complete(c, "a", prompts[0])), _ids_lps(_complete(c, "b", prompts[0]))
    assert a_ref[1] != b_ref[1]  # two adapters at once, each its own weights
    chat = c.post("/v1/chat/completions", json={"model": "b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert chat.status_code == 200 and chat.json()["system_fingerprint"] == "b@1"
    r = c.post("/v1/unload_lora_adapter", json={"lora_name": "b"})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'b' removed successfully."
    r = c.post("/v1/unload_lora_adapter", json={"lora_name": "b"})
    assert r.status_code == 404 and "cannot be found" in r.text
    r = _complete(c, "b", prompts[0])
    assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]
    assert "b" not in {m["id"] for m in c.get("/v1/models").json()["data"]}
    # the next name takes b's freed slot: it must serve its own weights (a's), and a must be unchanged
    slots = len(app.engine.peft.peft_config)
    assert (
        c.post("/v1/load_lora_adapter", json={"lora_name": "a-again", "lora_path": str(root / "a" / policy.adapter)}).status_code
        == 200
    )
    assert len(app.engine.peft.peft_config) == slots
    assert _ids_lps(_complete(c, "a-again", prompts[0])) == a_ref
    assert _ids_lps(_complete(c, "a", prompts[0])) == a_ref
    # a trainer's sequence (load v(k+1), unload v(k)) many times over: the model's slots stay bounded
    for k in range(8):
        path = str(root / ("a" if k % 2 else "b") / policy.adapter)
        assert c.post("/v1/load_lora_adapter", json={"lora_name": f"t-v{k}", "lora_path": path}).status_code == 200
        assert _ids_lps(_complete(c, f"t-v{k}", prompts[0])) == (a_ref if k % 2 else b_ref)
        if k:
            assert c.post("/v1/unload_lora_adapter", json={"lora_name": f"t-v{k - 1}"}).status_code == 200
    assert len(app.engine.peft.peft_config) <= slots + 2  # two names live at once at the peak
    for name in ("a-again", "t-v7"):
        assert c.post("/v1/unload_lora_adapter", json={"lora_name": name}).status_code == 200


def test_adapter_routes_need_the_admin_token_and_completions_the_token(
    server: Any, policy: Any, root: Path, prompts: list[list[int]]
) -> None:
    c, _ = server
    url = str(c.base_url).rstrip("/")
    body = {"model": "a", "prompt": prompts[0][:8], "max_tokens": 2}
    load = {"lora_name": "auth", "lora_path": str(root / "a" / policy.adapter)}
    assert httpx.post(f"{url}/v1/completions", json=body).status_code == 401
    wrong = {"authorization": "Bearer wrong-token-0123456789abcdef"}
    assert httpx.post(f"{url}/v1/completions", json=body, headers=wrong).status_code == 401
    chat = {"authorization": f"Bearer {CHAT}"}
    assert httpx.post(f"{url}/v1/completions", json=body, headers=chat).status_code == 200
    for route, payload in (("/v1/load_lora_adapter", load), ("/v1/unload_lora_adapter", {"lora_name": "a"})):
        for headers in ({}, chat, wrong):
            r = httpx.post(f"{url}{route}", json=payload, headers=headers)
            assert r.status_code == 401, (route, headers, r.text)
    assert "auth" not in {m["id"] for m in c.get("/v1/models").json()["data"]}
    assert _complete(c, "a", prompts[0], max_tokens=2).status_code == 200  # a was not unloaded


# -- bad input ---------------------------------------------------------------------------------------

_OK = {"model": "a", "prompt": [1, 2, 3], "max_tokens": 2}

#: (body, the status, a fragment of the message) for /v1/completions
BAD_COMPLETIONS: dict[str, tuple[Any, int, str]] = {
    "not-json": (b"{not json", 400, "not JSON"),
    "array": ([1, 2], 400, "JSON object"),
    "empty-body": (b"", 400, "JSON object"),
    "no-model": ({"prompt": [1]}, 400, "model"),
    "model-number": ({**_OK, "model": 5}, 400, "model"),
    "unknown-model": ({**_OK, "model": "nope"}, 404, "does not exist"),
    "no-prompt": ({"model": "a"}, 400, "prompt is missing"),
    "prompt-number": ({**_OK, "prompt": 5}, 400, "prompt is int"),
    "empty-prompt": ({**_OK, "prompt": []}, 400, "prompt is empty"),
    "empty-string": ({**_OK, "prompt": ""}, 400, "prompt is empty"),
    "batch": ({**_OK, "prompt": [[1, 2], [3]]}, 400, "batch"),
    "batch-of-strings": ({**_OK, "prompt": ["a", "b"]}, 400, "batch"),
    "id-negative": ({**_OK, "prompt": [1, -1]}, 400, "prompt[1] = -1 is outside"),
    "id-huge": ({**_OK, "prompt": [10**12]}, 400, "outside this model's vocabulary"),
    "id-bool": ({**_OK, "prompt": [True]}, 400, "not a token id"),
    "id-float": ({**_OK, "prompt": [1.5]}, 400, "not a token id"),
    "surrogate": (b'{"model": "a", "prompt": "\\ud800", "max_tokens": 2}', 400, "surrogate"),
    "ids-1MB": ({**_OK, "prompt": [1] * 350_000}, 413, "--max-prompt-tokens"),
    "text-1MB": ({**_OK, "prompt": "x" * 1_000_000}, 413, "--max-prompt-chars"),
    "max-negative": ({**_OK, "max_tokens": -1}, 400, "max_tokens"),
    "max-zero": ({**_OK, "max_tokens": 0}, 400, "max_tokens"),
    "max-enormous": ({**_OK, "max_tokens": 10**30}, 400, f"limit of {LIMIT}"),
    "max-string": ({**_OK, "max_tokens": "5"}, 400, "max_tokens"),
    "temperature-negative": ({**_OK, "temperature": -1}, 400, "temperature"),
    "temperature-text": ({**_OK, "temperature": "hot"}, 400, "temperature"),
    "top-p": ({**_OK, "top_p": 0.9}, 400, "top_p"),
    "top-k": ({**_OK, "top_k": 40}, 400, "top_k"),
    "n": ({**_OK, "n": 2}, 400, "n=2"),
    "stream": ({**_OK, "stream": True}, 400, "stream"),
    "stop": ({**_OK, "stop": ["\n"]}, 400, "stop"),
    "echo": ({**_OK, "echo": True}, 400, "echo"),
    "penalty": ({**_OK, "presence_penalty": 1.0}, 400, "presence_penalty"),
    "logprobs-many": ({**_OK, "logprobs": 100}, 400, "logprobs"),
    "logprobs-negative": ({**_OK, "logprobs": -1}, 400, "logprobs"),
    "stop-id-outside": ({**_OK, "stop_token_ids": [-5]}, 400, "stop_token_ids[0]"),
    "stop-ids-text": ({**_OK, "stop_token_ids": "1"}, 400, "stop_token_ids"),
    "seed-text": ({**_OK, "seed": "x"}, 400, "seed"),
    "seed-huge": ({**_OK, "seed": 2**70}, 400, "seed"),
    "context": ({**_OK, "prompt": [1] * 4090, "max_tokens": LIMIT}, 400, "maximum context length"),
}

#: (body, the status, a fragment of the message) for /v1/load_lora_adapter; paths are relative to the adapters root
BAD_LOADS: dict[str, tuple[Any, int, str]] = {
    "not-json": (b"\x00\xff", 400, "not JSON"),
    "array": ([], 400, "JSON object"),
    "missing": ({}, 400, "lora_name"),
    "no-path": ({"lora_name": "x"}, 400, "lora_path"),
    "name-number": ({"lora_name": 5, "lora_path": "a"}, 400, "lora_name"),
    "path-number": ({"lora_name": "x", "lora_path": 5}, 400, "lora_path"),
    "escape": ({"lora_name": "x", "lora_path": "../../etc"}, 403, "outside the adapters root"),
    "absolute": ({"lora_name": "x", "lora_path": "/etc"}, 403, "outside the adapters root"),
    "missing-folder": ({"lora_name": "x", "lora_path": "nowhere"}, 400, "not a folder"),
    "file": ({"lora_name": "x", "lora_path": "file.txt"}, 400, "not a folder"),
    "empty-folder": ({"lora_name": "x", "lora_path": "empty"}, 400, "holds no adapter_model.safetensors"),
    "truncated": ({"lora_name": "x", "lora_path": "truncated"}, 400, "cannot read it"),
    "garbage": ({"lora_name": "x", "lora_path": "garbage"}, 400, "cannot read it"),
    "nan": ({"lora_name": "x", "lora_path": "nan"}, 400, "NaN"),
    "rank": ({"lora_name": "x", "lora_path": "rank"}, 400, "does not fit"),
    "config-text": ({"lora_name": "x", "lora_path": "config_text"}, 400, "cannot read it"),
    "name-slash": ({"lora_name": "a/b", "lora_path": "a/policy"}, 400, "lora_name"),
    "name-newline": ({"lora_name": "a\nb", "lora_path": "a/policy"}, 400, "lora_name"),
    "name-10k": ({"lora_name": "x" * 10_000, "lora_path": "a/policy"}, 400, "lora_name"),
    "name-empty": ({"lora_name": "", "lora_path": "a/policy"}, 400, "lora_name"),
    "name-base": ({"lora_name": "base", "lora_path": "a/policy"}, 400, "base"),
    "name-model": ({"lora_name": "tiny", "lora_path": "a/policy"}, 400, "base model's name"),
    "name-loaded": ({"lora_name": "a", "lora_path": "a/policy"}, 400, "has already been loaded"),
}

BAD_UNLOADS: dict[str, tuple[Any, int, str]] = {
    "not-json": (b"]", 400, "not JSON"),
    "array": (["a"], 400, "JSON object"),
    "missing": ({}, 400, "lora_name"),
    "name-number": ({"lora_name": 5}, 400, "lora_name"),
    "name-10k": ({"lora_name": "x" * 10_000}, 400, "lora_name"),
    "unknown": ({"lora_name": "nope"}, 404, "cannot be found"),
    "newline": ({"lora_name": "a\nb"}, 404, "cannot be found"),
    "base": ({"lora_name": "base"}, 404, "cannot be found"),
}


def _post(c: httpx.Client, route: str, body: Any) -> httpx.Response:
    return c.post(route, content=body) if isinstance(body, bytes) else c.post(route, json=body)


def _still_serving(c: httpx.Client, prompt: list[int], expected: tuple[list[int], list[float]]) -> None:
    assert _ids_lps(_complete(c, "a", prompt)) == expected


@pytest.mark.parametrize(
    ("route", "case"),
    [("/v1/completions", k) for k in BAD_COMPLETIONS]
    + [("/v1/load_lora_adapter", k) for k in BAD_LOADS]
    + [("/v1/unload_lora_adapter", k) for k in BAD_UNLOADS],
)
def test_bad_bodies_get_a_clear_4xx_and_the_server_keeps_serving(
    server: Any, root: Path, prompts: list[list[int]], route: str, case: str
) -> None:
    c, app = server
    table = {"/v1/completions": BAD_COMPLETIONS, "/v1/load_lora_adapter": BAD_LOADS, "/v1/unload_lora_adapter": BAD_UNLOADS}
    body, status, fragment = table[route][case]
    if route == "/v1/load_lora_adapter" and isinstance(body, dict) and isinstance(body.get("lora_path"), str):
        if not body["lora_path"].startswith(("/", "..")):
            body = {**body, "lora_path": str(root / body["lora_path"])}  # absolute, as the trainer sends it
    expected = _ids_lps(_complete(c, "a", prompts[0]))
    names, slots = set(app.router.deployments), len(app.engine.peft.peft_config)
    r = _post(c, route, body)
    assert r.status_code == status, r.text[:500]
    message = r.json()["error"]["message"]
    assert fragment in message, message
    assert str(root) not in message  # the server's own paths are never shown
    assert set(app.router.deployments) == names and len(app.engine.peft.peft_config) == slots  # nothing half-loaded
    _still_serving(c, prompts[0], expected)


def test_without_an_adapters_root_loads_are_refused_by_name(policy: Any, root: Path) -> None:
    from agentrl_train.serve.run import build_app
    from agentrl_train.tiny import TinySpec

    spec = TinySpec(pretrain_steps=SMALL["tiny_pretrain_steps"], corpus_episodes=SMALL["tiny_corpus_episodes"])
    app = build_app("tiny", {}, tiny_spec=spec, log=lambda _: None)
    try:
        with serve_in_thread(app, free_port()) as url:
            r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(root / "a" / policy.adapter)})
            assert r.status_code == 403 and "--adapters-root" in r.json()["error"]["message"]
            r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2})
            assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) <= 2
    finally:
        app.engine.close()


def test_a_refused_first_adapter_leaves_the_base_serving_and_the_next_load_works(
    policy: Any, root: Path, prompts: list[list[int]]
) -> None:
    """On a server that never held an adapter, peft's first slot is made for the refused one and must go again."""
    from agentrl_train.serve.run import build_app
    from agentrl_train.tiny import TinySpec

    spec = TinySpec(pretrain_steps=SMALL["tiny_pretrain_steps"], corpus_episodes=SMALL["tiny_corpus_episodes"])
    app = build_app("tiny", {}, adapters_root=str(root), max_new_tokens=LIMIT, tiny_spec=spec, log=lambda _: None)
    try:
        with serve_in_thread(app, free_port()) as url, httpx.Client(base_url=url, timeout=300) as c:
            base = _ids_lps(_complete(c, "base", prompts[0]))
            r = c.post("/v1/load_lora_adapter", json={"lora_name": "r", "lora_path": str(root / "rank")})
            assert r.status_code == 400 and "does not fit" in r.text
            assert _ids_lps(_complete(c, "base", prompts[0])) == base
            r = c.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(root / "a" / policy.adapter)})
            assert r.status_code == 200, r.text
            local_ids, local_lps, _ = policy.generate(prompts[0], MAX_NEW, greedy=True)
            ids, lps = _cut(policy, *_ids_lps(_complete(c, "a", prompts[0], stop_token_ids=sorted(policy.stop_ids))))
            assert ids == local_ids
            np.testing.assert_allclose(lps, local_lps, rtol=0, atol=1e-5)
            assert _ids_lps(_complete(c, "base", prompts[0])) == base
    finally:
        app.engine.close()
