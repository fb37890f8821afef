"""Rollout engines: where generate-mode actions are sampled (docs/design.md, "Rollout engines").

``--rollout-engine local`` (the default) samples with the trainer's own model in the training
process (:meth:`Policy.generate_many`). ``--rollout-engine server --rollout-url URL[,URL...]``
samples through OpenAI-compatible completion servers: vLLM (``vllm serve MODEL --enable-lora``
with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) or ``agentrl-train serve --adapters-root DIR``.

- **Token in, token out.** Each action is one ``POST /v1/completions`` whose ``prompt`` is the
  env's token stream (ids, never text), asking for ``logprobs`` and ``return_tokens_as_token_ids``:
  the sampled ids and their log-probs come back as the server sampled them. The trainer
  recomputes the log-probs in the update; the importance ratio's denominator is the server's
  (the behaviour policy's). :func:`score_rollout` also recomputes them once per rollout and logs
  the gap (``rollout/logprob_gap_mean`` and ``_max``), warning past ``--logprob-tolerance``.
- **Adapter-only sync.** After each update the adapter is saved (safetensors) to
  ``<run>/rollout_adapters/vN`` and loaded into every server under a new name
  (``/v1/load_lora_adapter``), the one before unloaded (``/v1/unload_lora_adapter``). Every
  transition records the version that sampled it (:attr:`Transition.version`).
- **Values and the reference** stay in the trainer: the server returns actions, the trainer
  computes V(s) and the reference's log-probs of them afterwards, one forward per env's chain of
  steps (:func:`score_rollout`).
- **Candidates mode** is refused with the server engine: it scores given candidates, which the
  completions API of vLLM and ``agentrl-train serve`` does not answer alike; it runs locally.
- **Failures.** A request that fails is retried (``--rollout-retries``, on the next URL when there
  are several); one that still fails stops the run with the server's answer and the option to
  change, never a short batch.

With ``--async-rollouts 1`` (:class:`Prefetch`) the servers sample the batch of update k+1 while
the trainer computes update k, with the adapter of update k-1: one version stale, recorded per
transition, bounded by the option and logged (``rollout/version_lag``). The pending batch is part
of the checkpoint, so a resumed run continues exactly.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl_envs.errors import AgentRLError, ConfigError

__all__ = ["Prefetch", "RolloutServerError", "ServerEngine", "rollout_from_state", "rollout_state", "score_rollout"]

#: vLLM spells a token as ``token_id:N`` when asked ``return_tokens_as_token_ids``
_TOKEN_ID_PREFIX = "token_id:"
#: what to run so that a server loads adapters at run time (named in errors)
_LORA_HELP = (
    "start vLLM with --enable-lora (and --max-lora-rank >= the adapter's rank) and the environment variable "
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, or agentrl-train serve with --adapters-root set to a folder holding the run folder"
)


class RolloutServerError(AgentRLError):
    """A rollout server could not be reached, refused a request, or answered without what the trainer needs."""


class ServerEngine:
    """Completion servers that sample the policy's actions, holding the trainer's adapter by version.

    Args:
        urls: the servers' base URLs (``http://host:port``; a ``/v1`` suffix is accepted).
        prefix: adapter names are ``{prefix}-v{version}``.
        stop_ids: token ids that end an action (the policy's end-of-turn tokens).
        stops: the policy's rule for the end of an action (:meth:`Policy.stops`); ids past it are cut.
        timeout: seconds one request may take.
        retries: further tries of a failed request.
        api_key: bearer token of the servers (``--rollout-api-key``; vLLM's ``--api-key``).
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        prefix: str,
        stop_ids: Sequence[int],
        stops: Callable[[Sequence[int]], bool],
        vocab_size: int,
        timeout: float = 300.0,
        retries: int = 2,
        api_key: str = "",
    ) -> None:
        import httpx

        if not urls:
            raise ConfigError("--rollout-engine server needs --rollout-url URL[,URL...] (e.g. http://127.0.0.1:8000)")
        self.urls = [_base_url(u) for u in urls]
        self.prefix = prefix
        self.stop_ids = sorted(int(t) for t in stop_ids)
        self.stops = stops
        self.vocab_size = vocab_size
        self.retries = retries
        self.version = -1  #: the adapter version the servers hold (-1: none yet)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=timeout, headers=headers)
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="agentrl-rollout")

    # -- set-up ------------------------------------------------------------------------------------

    def check(self) -> None:
        """Every server answers ``GET /v1/models``; else a :class:`RolloutServerError` saying how to start one."""
        for url in self.urls:
            self._call("GET", url, "/v1/models", None, what="list models")

    def sync(self, policy: Any, folder: Path, version: int) -> None:
        """Save the policy's adapter to ``folder/v{version}`` and load it into every server as version ``version``.

        The previous version is unloaded once every server holds the new one; a name left loaded by an
        earlier try of this run (a resumed run) is replaced.
        """
        where = folder / f"v{version}"
        if where.exists():
            shutil.rmtree(where)
        policy.save(where)
        name = self.name(version)
        for url in self.urls:
            # the peft folder itself (adapter_config.json + adapter_model.safetensors), as vLLM reads it
            body = {"lora_name": name, "lora_path": str((where / policy.adapter).resolve())}
            status, answer = self._call("POST", url, "/v1/load_lora_adapter", body, what="load the adapter", ok=(200, 400))
            if status == 400:  # already loaded under this name (a resumed run): replace it
                if "already" not in answer.lower():
                    raise RolloutServerError(f"rollout server {url} refused to load adapter {name}: {answer[:300]}")
                self._call("POST", url, "/v1/unload_lora_adapter", {"lora_name": name}, what="unload the adapter")
                self._call("POST", url, "/v1/load_lora_adapter", body, what="load the adapter")
        old, self.version = self.version, version
        if old >= 0 and old != version:
            for url in self.urls:
                self._call("POST", url, "/v1/unload_lora_adapter", {"lora_name": self.name(old)}, what="unload", ok=(200, 404))
            shutil.rmtree(folder / f"v{old}", ignore_errors=True)

    def name(self, version: int) -> str:
        return f"{self.prefix}-v{version}"

    # -- sampling ----------------------------------------------------------------------------------

    def sample(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, seeds: Sequence[int | None]
    ) -> list[tuple[list[int], list[float]]]:
        """One action per prompt (seed None: greedy), all requests in flight together; ``(ids, log-probs)`` each."""
        if self.version < 0:
            raise AgentRLError("ServerEngine.sample before sync: the servers hold no adapter of this run")
        jobs = [self._pool.submit(self._complete, k, list(p), max_new_tokens, s) for k, (p, s) in enumerate(zip(prompts, seeds))]
        return [j.result() for j in jobs]

    def _complete(self, k: int, prompt: list[int], max_new_tokens: int, seed: int | None) -> tuple[list[int], list[float]]:
        body: dict[str, Any] = {
            "model": self.name(self.version),
            "prompt": prompt,
            "max_tokens": max_new_tokens,
            "temperature": 0.0 if seed is None else 1.0,
            "top_p": 1.0,
            "top_k": -1,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "stop_token_ids": self.stop_ids,
            "skip_special_tokens": False,
        }
        if seed is not None:
            body["seed"] = seed
        url = self.urls[k % len(self.urls)]
        _, answer = self._call("POST", url, "/v1/completions", body, what="sample an action", first=k)
        return self._parse(url, answer, max_new_tokens)

    def _parse(self, url: str, text: str, max_new_tokens: int) -> tuple[list[int], list[float]]:
        try:
            choice = json.loads(text)["choices"][0]
            lp = choice.get("logprobs") or {}
            spelled, lps = lp.get("tokens"), lp.get("token_logprobs")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise RolloutServerError(f"rollout server {url} answered /v1/completions with no choices: {text[:200]!r}") from None
        ids = choice.get("token_ids") if isinstance(choice, dict) else None
        if not isinstance(ids, list):
            if not isinstance(spelled, list) or not all(isinstance(t, str) and t.startswith(_TOKEN_ID_PREFIX) for t in spelled):
                raise RolloutServerError(
                    f"rollout server {url} returned no token ids (logprobs.tokens should read 'token_id:N'): "
                    "vLLM needs return_tokens_as_token_ids (vLLM >= 0.6; or start it with --return-tokens-as-token-ids)"
                )
            try:
                ids = [int(t[len(_TOKEN_ID_PREFIX) :]) for t in spelled]
            except ValueError:
                raise RolloutServerError(f"rollout server {url} spelled a token id that is not a number") from None
        if not isinstance(lps, list) or len(lps) != len(ids):
            raise RolloutServerError(
                f"rollout server {url} returned no per-token log-probs for its {len(ids)} tokens: the request asks "
                "'logprobs': 0; a vLLM started with --max-logprobs 0 or a server without log-probs cannot be a rollout engine"
            )
        if not ids or len(ids) > max_new_tokens:
            raise RolloutServerError(f"rollout server {url} returned {len(ids)} tokens for a budget of {max_new_tokens}")
        if not all(isinstance(i, int) and 0 <= i < self.vocab_size for i in ids):
            raise RolloutServerError(
                f"rollout server {url} returned a token id outside this model's vocabulary ({self.vocab_size}): "
                "it serves another base model than --model"
            )
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in lps):
            raise RolloutServerError(f"rollout server {url} returned a log-prob that is not a finite number")
        for j in range(len(ids)):  # the action ends where the trainer's own sampler would have stopped
            if self.stops(ids[: j + 1]):
                return ids[: j + 1], [float(x) for x in lps[: j + 1]]
        return ids, [float(x) for x in lps]

    def _call(
        self,
        method: str,
        url: str,
        route: str,
        body: dict[str, Any] | None,
        *,
        what: str,
        ok: tuple[int, ...] = (200,),
        first: int = 0,
    ) -> tuple[int, str]:
        """``(status, text)`` of a request, retried on failure (on the next server when ``first`` picks one)."""
        import httpx

        err = ""
        for attempt in range(self.retries + 1):
            target = url if route != "/v1/completions" else self.urls[(first + attempt) % len(self.urls)]
            try:
                r = self._http.request(method, target + route, json=body)
            except httpx.HTTPError as exc:
                err = f"{target} could not be reached to {what} ({type(exc).__name__}: {str(exc)[:200]})"
                continue
            if r.status_code in ok:
                return r.status_code, r.text
            if r.status_code == 404 and "lora_adapter" in route:
                raise RolloutServerError(f"rollout server {target} has no {route} route: {_LORA_HELP}")
            if r.status_code in (401, 403):
                raise RolloutServerError(
                    f"rollout server {target} refused to {what} ({r.status_code}: {r.text[:200]}); put its token in the "
                    "environment variable AGENTRL_ROLLOUT_API_KEY (vLLM's --api-key; for agentrl-train serve its --admin-token, "
                    "which every route accepts: the adapter routes need it)"
                )
            if 400 <= r.status_code < 500 and r.status_code != 429:
                raise RolloutServerError(f"rollout server {target} refused to {what} ({r.status_code}: {r.text[:300]})")
            err = f"{target} failed to {what} ({r.status_code}: {r.text[:200]})"
        raise RolloutServerError(
            f"rollout server {err}, {self.retries + 1} tries; is the server running (vllm serve ... or agentrl-train serve ...)? "
            "The rollout is abandoned whole (no update on part of a batch)"
        )

    def close(self) -> None:
        """Unload this run's adapter from the servers (as far as they answer) and close the connections."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.version >= 0:
            for url in self.urls:
                try:
                    self._http.post(url + "/v1/unload_lora_adapter", json={"lora_name": self.name(self.version)})
                except Exception:  # a server already gone holds nothing to unload
                    pass
        self._http.close()


def _base_url(url: str) -> str:
    u = str(url).strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise ConfigError(f"--rollout-url {u[:100]!r}: use http://HOST:PORT (e.g. http://127.0.0.1:8000)")
    return u.removesuffix("/v1")


# -- the trainer's half of a server rollout -------------------------------------------------------


@torch.no_grad()
def score_rollout(policy: Any, roll: Any, tolerance: float, version: int, log: Callable[[str], None] = print) -> dict[str, float]:
    """Fill in what a server rollout leaves to the trainer: V(s), the reference's log-probs, the bootstrap values.

    One causal forward per env's chain of steps under the policy (values and its own log-probs,
    compared with the server's) and one under the reference. Returns the gap between the server's
    log-probs and the trainer's per token over the transitions sampled with the trainer's own weights
    (adapter ``version``): numerics only, warned about past ``tolerance``. Transitions of an older
    version (``--async-rollouts 1``) differ by the update since as well: that shift is returned
    apart (``rollout/stale_logprob_shift_mean``), never warned about.
    """
    policy.eval()
    cells = [(t, i) for t, row in enumerate(roll.transitions) for i, tr in enumerate(row) if tr is not None]
    items = [(roll.transitions[t][i].prompt_ids, roll.transitions[t][i].new_ids) for t, i in cells]
    gaps: list[float] = []
    shifts: list[float] = []
    for (t, i), (lp, _, value) in zip(cells, policy.sequence_logprobs_many(items)):
        tr = roll.transitions[t][i]
        tr.value = float(value)
        roll.values_TN[t, i] = tr.value
        diff = (lp.float().cpu() - torch.tensor(tr.token_logprobs)).abs().tolist()
        (gaps if tr.version == version else shifts).extend(diff)
    with policy.reference():
        for (t, i), (ref, _, _) in zip(cells, policy.sequence_logprobs_many(items)):
            roll.transitions[t][i].ref_logprobs = ref.tolist()
    for (t, i), prompt in roll.value_prompts.items():
        roll.truncation_values_TN[t, i] = float(policy.value(prompt))
    if roll.last_prompts:
        roll.last_values_N = np.array([float(policy.value(p)) for p in roll.last_prompts])
    out = {"rollout/logprob_gap_mean": float(np.mean(gaps)) if gaps else 0.0, "rollout/logprob_gap_max": max(gaps, default=0.0)}
    if shifts:
        out["rollout/stale_logprob_shift_mean"] = float(np.mean(shifts))
    if out["rollout/logprob_gap_mean"] > tolerance:
        log(
            f"rollout: the server's log-probs differ from the trainer's by {out['rollout/logprob_gap_mean']:.3g} per token "
            f"on average (max {out['rollout/logprob_gap_max']:.3g}), over --logprob-tolerance {tolerance:g}: check that the "
            "server runs the same base model, dtype and --rope-scaling, and that no sampling default (top-p, repetition "
            "penalty) of the model's generation config is applied (vLLM: --generation-config vllm)"
        )
    return out


def rollout_state(roll: Any) -> dict[str, Any]:
    """A rollout as plain data for a checkpoint (:mod:`agentrl_train.statefile`; nothing pickled)."""
    import dataclasses

    arrays = {k: getattr(roll, k) for k in _ARRAYS}
    return {
        "transitions": [[None if tr is None else dataclasses.asdict(tr) for tr in row] for row in roll.transitions],
        **arrays,
        "cut_N": roll.cut_N,
        "episodes": [dict(e) for e in roll.episodes],
        "times": [roll.env_seconds, roll.model_seconds, roll.tokens],
        "value_prompts": [[t, i, list(p)] for (t, i), p in roll.value_prompts.items()],
        "last_prompts": [list(p) for p in roll.last_prompts],
    }


def rollout_from_state(state: dict[str, Any]) -> Any:
    """The rollout :func:`rollout_state` wrote; a :class:`ConfigError` when the state is not one."""
    from agentrl_train.episodes import Transition
    from agentrl_train.rollout import Rollout

    try:
        transitions = [[None if tr is None else Transition(**tr) for tr in row] for row in state["transitions"]]
        env_s, model_s, tokens = state["times"]
        a = {k: np.asarray(state[k]) for k in _ARRAYS}
        return Rollout(
            transitions,
            a["rewards_TN"],
            a["terminated_TN"],
            a["truncated_TN"],
            a["values_TN"],
            a["truncation_values_TN"],
            a["boundaries_TN"],
            a["last_values_N"],
            episodes=list(state["episodes"]),
            env_seconds=float(env_s),
            model_seconds=float(model_s),
            tokens=int(tokens),
            valid_TN=a["valid_TN"],
            cut_N=None if state["cut_N"] is None else np.asarray(state["cut_N"]),
            value_prompts={(int(t), int(i)): list(p) for t, i, p in state["value_prompts"]},
            last_prompts=[list(p) for p in state["last_prompts"]],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"the checkpoint's pending rollout is damaged ({type(exc).__name__}: {str(exc)[:200]})") from None


_ARRAYS = (
    "rewards_TN",
    "terminated_TN",
    "truncated_TN",
    "values_TN",
    "truncation_values_TN",
    "boundaries_TN",
    "last_values_N",
    "valid_TN",
)


class Prefetch:
    """``--async-rollouts 1``: the next rollout runs in a thread while the trainer updates on this one.

    The thread only steps the envs and waits on the servers; the trainer's model is not touched
    there (its values and reference log-probs come afterwards, :func:`score_rollout`).
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self.pending: Any = None  #: the collected rollout the next update takes (None: collect it then)

    def start(self, collect: Callable[[], Any]) -> None:
        """Begin ``collect()`` in the background."""

        def run() -> None:
            try:
                self._result = collect()
            except BaseException as exc:  # raised in the trainer's thread by wait()
                self._error = exc

        self._result, self._error = None, None
        self._thread = threading.Thread(target=run, name="agentrl-prefetch", daemon=True)
        self._thread.start()

    def wait(self, *, raise_error: bool = True) -> None:
        """Let the background rollout finish; it becomes :attr:`pending` (its error is raised here, or dropped)."""
        if self._thread is None:
            return
        self._thread.join()
        self._thread = None
        if self._error is not None and raise_error:
            raise self._error
        self.pending = self._result

    def take(self) -> Any:
        """The pending rollout, handed over once (None when there is none)."""
        roll, self.pending = self.pending, None
        return roll
