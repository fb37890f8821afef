"""The model side of ``agentrl-train serve``: one base LM, LoRA adapters in slots, one worker thread.

Every forward pass runs on one worker thread, one request at a time, so a request is served entirely
by the weights that were in place when it started. A hot reload reads and checks the new weights on
the caller's thread (safetensors from disk, key set, shapes, LoRA scaling, base model:
:mod:`agentrl_train.serve.weights`), and only then copies them into the adapter's slot *on the worker
thread*, between two requests: no request ever sees a half-copied adapter and a refused adapter
changes nothing. Weights are copied in place, so memory does not grow with the number of swaps; a
canary gets a second slot of the same shape, which is kept for the next canary after a promotion or a
rollback.

A slot is a name (``slot1``, ``slot2``, ...) and the weights under it, nothing more: which adapter
version a slot serves, where it came from and what clients are shown is the router's
:class:`~agentrl_train.serve.canary.Target` (its ``model`` is the slot). The engine counts the swaps
(:attr:`Engine.swaps`).

An adapter trained with added tool-call tokens (``--add-tool-tokens``: ``tool_tokens.json`` beside
its weights) needs the base with the same tokens added (a larger vocabulary): the first adapter
loaded decides, and the base is resized for it. Adapters with and without added tokens cannot be
served by one server (the prompts of one would hold token ids the other never saw), nor can
adapters that added other tokens: such an adapter is refused by name; serve it from its own server.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from agentrl_envs.errors import ConfigError
from agentrl_train.serve.prompts import Placeholders, PromptTooLargeError, fit_turns
from agentrl_train.serve.weights import (
    ROWS,
    AdapterMismatchError,
    Family,
    Prepared,
    check_fit,
    check_model_fit,
    config_key,
    lora_config,
    lora_scaling,
    read_adapter,
    tokens_refusal,
)
from agentrl_train.tool_tokens import ToolTokens, add_tool_tokens

__all__ = ["Engine", "Sampled", "SwapStats"]

T = TypeVar("T")
#: slots of unloaded names kept for a later name of the same LoRA config (a trainer loads one name per update)
MAX_SPARE_SLOTS = 4


@dataclass
class Sampled:
    """One generation of :meth:`Engine.complete`."""

    ids: list[int]  #: the new ids, a final stop id included
    logprobs: list[float]  #: log_softmax of the float32 logits at temperature 1 at each id, as the trainer computes it
    finish: str  #: "stop" (a stop id ended it) or "length" (the budget did)
    top: list[list[tuple[int, float]]]  #: per id, the ``top`` most likely ids and their log-probs (empty lists for 0)


@dataclass(frozen=True)
class SwapStats:
    """Adapter weights swapped into a served slot (hot reloads and canaries; not a name's first load).

    Replaced whole after each swap, so a reader on another thread sees one consistent record.
    """

    count: int = 0
    seconds_sum: float = 0.0
    seconds_last: float = 0.0


class Engine:
    """A base LM with named LoRA adapters held in slots, and the one thread that runs the model.

    Args:
        model: ``tiny``, ``smollm2-135m``, a ``.gguf`` file or a local Hugging Face model folder (nothing is downloaded).
        device: ``cpu``, ``cuda`` or ``auto``.
        threads: torch intra-op threads on CPU.
        tiny_spec: the :class:`~agentrl_train.tiny.TinySpec` for ``model="tiny"``.
        rope_scaling: a ``--rope-scaling`` setting (:mod:`agentrl_train.rope`), as the adapters were trained with.
        log: where swap times and loads are reported.
    """

    def __init__(
        self,
        model: str,
        device: str = "cpu",
        *,
        threads: int = 1,
        tiny_spec: Any = None,
        rope_scaling: dict[str, Any] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        from agentrl_train.models import load_base, pick_device

        dev = pick_device(device)
        self.lm, self.tokenizer = load_base(model, dev, tiny_spec=tiny_spec, log=log, threads=threads, rope_scaling=rope_scaling)
        self.device = dev
        self.base_path = str(getattr(self.lm.config, "_name_or_path", "") or model)
        self.model_name = model
        self.max_positions = int(getattr(self.lm.config, "max_position_embeddings", 4096) or 4096)
        self.peft: Any = None
        self.log = log
        self.families: dict[str, Family] = {}
        self.swaps = SwapStats()  #: replaced by each swap into a served slot (:meth:`install`)
        self._params: dict[str, dict[str, torch.nn.Parameter]] = {}
        self.tool_tokens: ToolTokens | None = None  #: the tool-call tokens added to the base (by the first adapter)
        self._active: str | None = None
        self._slot_count = 0
        self._spare: list[tuple[str, str, Family]] = []  #: (LoRA config key, slot, its old family) of unloaded names
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrl-serve-model")
        self._read_tokenizer()
        # A fast tokenizer keeps split_special_tokens as one flag of its backend, set by each call: two
        # threads encoding at once (--max-concurrent-encodings) would tokenize with each other's setting.
        self._tokenizer_lock = threading.Lock()

    def _read_tokenizer(self) -> None:
        """The stop ids and the special spellings, from the tokenizer (again after tokens are added)."""
        from agentrl_train.chat_codec import stop_token_ids

        self.stop_ids = stop_token_ids(self.tokenizer)
        # special tokens and added ones (Qwen's <tool_call> is added but not "special": split_special_tokens
        # leaves it whole), longest first so that a longer spelling wins
        specials = {str(t) for t in self.tokenizer.all_special_tokens if t}
        specials |= {str(t) for t in getattr(self.tokenizer, "get_added_vocab", dict)() if t}
        self._specials = sorted(specials, key=len, reverse=True)
        self._specials_re = re.compile("|".join(map(re.escape, self._specials))) if self._specials else None

    # -- the worker ------------------------------------------------------------------------------

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn`` on the model thread (after every request and swap already queued)."""
        return self._worker.submit(fn, *args)

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)

    # -- adapters --------------------------------------------------------------------------------

    def prepare(self, family: str | None, path: str | Path) -> Prepared:
        """Read an adapter from disk and check it against ``family`` (any thread; changes nothing).

        Raises:
            ConfigError: no adapter files there, or they cannot be read.
            AdapterMismatchError: keys, shapes, LoRA scaling or base model differ from ``family``'s.
        """
        tensors, config, tokens = read_adapter(path, self.tool_tokens, self.peft is None, self.base_path)
        fam = self.families.get(family) if family is not None else None
        if fam is not None:
            check_fit(str(path), fam, tensors, config)
        else:
            check_model_fit(str(path), tensors, dict(self.lm.named_modules()))
        dtype = next(self.lm.parameters()).dtype
        for k, v in tensors.items():
            # after the cast: a finite float32 weight can overflow a float16/bfloat16 model's range
            tensors[k] = v.to(self.device, dtype=dtype)
            if not bool(torch.isfinite(tensors[k]).all()):
                bad = int((~torch.isfinite(tensors[k])).sum())
                raise AdapterMismatchError(
                    f"adapter {str(path)[:200]!r}: {k} holds {bad} NaN or infinite value(s) (as {dtype}); "
                    "the training run diverged or the file is damaged: serve an earlier checkpoint (the old version keeps serving)"
                )
        return Prepared(str(path), tensors, config, tokens)

    def add_family(self, name: str, prepared: Prepared) -> str:
        """Create the first slot of a new adapter name (at start-up) and fill it; returns the slot."""
        from peft import PeftModel, get_peft_model

        config = lora_config(name, prepared)
        slot = self._new_slot_name()
        if self.peft is None and prepared.tool_tokens is not None:
            self._add_tool_tokens(name, prepared)
        if self.peft is None:
            self.peft = get_peft_model(self.lm, config, adapter_name=slot)
            self.peft.eval()
        else:
            assert isinstance(self.peft, PeftModel)
            self.peft.add_adapter(slot, config)
        self._index(slot)
        shapes = {k: tuple(p.shape) for k, p in self._params[slot].items()}
        fam = Family(config, shapes, lora_scaling(prepared.config, prepared.path))
        check_fit(prepared.path, fam, prepared.tensors, prepared.config)
        self.families[name] = fam
        self._copy(slot, prepared)
        return slot

    def load_family(self, name: str, prepared: Prepared) -> Future[str]:
        """Queue a new adapter name at run time (``/v1/load_lora_adapter``) on the model thread, after the
        requests already queued; the future gives its slot.

        A slot an unloaded name left with the same LoRA config is reused (a trainer loads one new name per
        update, so memory stays flat); otherwise a slot is added to the model. A refused adapter leaves no slot.

        Raises (from the future):
            ConfigError: the adapter does not fit this base (peft's reason in the message).
        """
        return self.submit(self._load_family, name, prepared)

    def _load_family(self, name: str, prepared: Prepared) -> str:
        key = config_key(lora_config(name, prepared))
        for i, (k, slot, old) in enumerate(self._spare):
            if k == key:
                fam = Family(old.config, old.shapes, lora_scaling(prepared.config, prepared.path))
                check_fit(prepared.path, fam, prepared.tensors, prepared.config)
                del self._spare[i]
                self.families[name] = fam
                self._copy(slot, prepared)
                return slot
        count = self._slot_count
        try:
            return self.add_family(name, prepared)
        except Exception as exc:
            if self._slot_count != count and self.peft is not None and f"slot{self._slot_count}" in self.peft.peft_config:
                self._delete_slot(f"slot{self._slot_count}")  # the slot peft added before the check failed
            self.families.pop(name, None)
            if isinstance(exc, ConfigError):
                raise
            raise AdapterMismatchError(
                f"adapter {prepared.path[:200]!r} does not fit this base ({type(exc).__name__}: {str(exc)[:200]}); "
                "it was trained on another model or its adapter_config.json was edited"
            ) from None
        finally:
            self._active = None  # set the adapter again before the next request, whatever peft did

    def drop_family(self, name: str, slots: list[str]) -> Future[None]:
        """Queue the removal of adapter name ``name`` and its ``slots`` (``/v1/unload_lora_adapter``), after the
        requests already queued. Up to :data:`MAX_SPARE_SLOTS` slots are kept for a later name of the same
        LoRA config; the oldest others are deleted from the model."""
        return self.submit(self._drop_family, name, slots)

    def _drop_family(self, name: str, slots: list[str]) -> None:
        fam = self.families.pop(name)
        key = config_key(fam.config)
        self._spare += [(key, slot, fam) for slot in [*slots, *fam.free]]
        while len(self._spare) > MAX_SPARE_SLOTS:
            self._delete_slot(self._spare.pop(0)[1])

    def _delete_slot(self, slot: str) -> None:
        """Remove ``slot`` from the model; another slot, if any, becomes peft's active one (with none left, the
        LoRA layers hold no adapter and compute the base)."""
        self.peft.delete_adapter(slot)
        self._params.pop(slot, None)
        self._active = None
        if self.peft.peft_config:
            self.peft.set_adapter(next(iter(self.peft.peft_config)))
            self.peft.eval()

    def _add_tool_tokens(self, name: str, prepared: Prepared) -> None:
        """Add the adapter's tool-call tokens to the base (before any slot exists), as the trainer did."""
        added = add_tool_tokens(self.lm, self.tokenizer, self.model_name, self.log)
        if added != prepared.tool_tokens:
            raise AdapterMismatchError(
                f"adapter {name}={prepared.path[:200]}: " + tokens_refusal(prepared.path, prepared.tool_tokens, added)
            )
        self.tool_tokens = added
        self._read_tokenizer()

    def spare_slot(self, name: str) -> str:
        """A slot of ``name``'s shape for a canary (reused when one is free); runs on the worker."""
        fam = self.families[name]
        if fam.free:
            return fam.free.pop()

        def create() -> str:
            slot = self._new_slot_name()
            self.peft.add_adapter(slot, fam.config)
            self.peft.eval()
            self._active = None  # set the adapter again before the next request, whatever peft did
            self._index(slot)
            return slot

        return self.submit(create).result()

    def release_slot(self, name: str, slot: str) -> None:
        """Keep ``slot`` for the next canary of ``name``."""
        self.families[name].free.append(slot)

    def install(self, slot: str, prepared: Prepared) -> Future[float]:
        """Queue the copy of checked weights into ``slot``: it runs after the requests already queued and
        before any queued later. The future gives the swap's seconds, also counted in :attr:`swaps`."""
        return self.submit(self._swap, slot, prepared)

    def _swap(self, slot: str, prepared: Prepared) -> float:
        seconds = self._copy(slot, prepared)
        done = self.swaps
        self.swaps = SwapStats(done.count + 1, done.seconds_sum + seconds, seconds)
        return seconds

    def _copy(self, slot: str, prepared: Prepared) -> float:
        t0 = time.perf_counter()
        params = self._params[slot]
        with torch.no_grad():
            for key, tensor in prepared.tensors.items():
                params[key].copy_(tensor)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def _new_slot_name(self) -> str:
        self._slot_count += 1
        return f"slot{self._slot_count}"

    def _index(self, slot: str) -> None:
        marker = f".{slot}."
        params = {n.replace(marker, "."): p for n, p in self.peft.named_parameters() if marker in n and ".lora_" in n}
        rows = f"{ROWS}.{slot}"
        params.update({n.removesuffix(f".{slot}"): p for n, p in self.peft.named_parameters() if n.endswith(rows)})
        self._params[slot] = params

    # -- generation (worker thread only) ---------------------------------------------------------

    def generate(
        self, slot: str | None, prompt_ids: list[int], max_new_tokens: int, temperature: float, seed: int | None
    ) -> Future[tuple[list[int], str]]:
        """Queue a generation with ``slot`` (None: the base); the future gives the new ids (ending at a stop
        token or the budget) and why it stopped ("stop" or "length"). Temperature 0 is greedy."""
        return self.submit(self._generate, slot, prompt_ids, max_new_tokens, temperature, seed)

    def complete(
        self,
        slot: str | None,
        prompt_ids: list[int],
        max_new_tokens: int,
        temperature: float,
        seed: int | None,
        *,
        stop_ids: Iterable[int] = (),
        top: int = 0,
    ) -> Future[Sampled]:
        """:meth:`generate` with each id's log-prob (``/v1/completions``): it also stops at ``stop_ids``, and
        gives the ``top`` most likely ids of each step."""
        return self.submit(self._with_slot, slot, prompt_ids, max_new_tokens, temperature, seed, frozenset(stop_ids), top)

    def _generate(
        self, slot: str | None, prompt_ids: list[int], max_new_tokens: int, temperature: float, seed: int | None
    ) -> tuple[list[int], str]:
        sampled = self._with_slot(slot, prompt_ids, max_new_tokens, temperature, seed)
        return sampled.ids, sampled.finish

    @torch.no_grad()
    def _with_slot(
        self,
        slot: str | None,
        prompt_ids: list[int],
        max_new_tokens: int,
        temperature: float,
        seed: int | None,
        stop_ids: frozenset[int] = frozenset(),
        top: int = 0,
    ) -> Sampled:
        if slot is None and self.peft is not None and self.peft.peft_config:
            with self.peft.disable_adapter():
                return self._sample(prompt_ids, max_new_tokens, temperature, seed, stop_ids, top)
        if slot is not None and slot != self._active:
            self.peft.set_adapter(slot)
            self.peft.eval()
            self._active = slot
        return self._sample(prompt_ids, max_new_tokens, temperature, seed, stop_ids, top)

    def _sample(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        temperature: float,
        seed: int | None,
        stop_ids: frozenset[int] = frozenset(),
        top: int = 0,
    ) -> Sampled:
        causal: Any = self.peft.base_model.model if self.peft is not None else self.lm
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,))))
        stops = self.stop_ids | stop_ids
        out = causal.model(input_ids=torch.tensor([prompt_ids], device=self.device), use_cache=True)
        cache, h, pos = out.cache, out.last_hidden_state[:, -1], len(prompt_ids)
        ids: list[int] = []
        lps: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        for _ in range(max_new_tokens):
            # the trainer's own numbers (Policy.generate_many): log_softmax of the float32 logits at temperature 1,
            # greedy = their argmax, so a rollout server's ids and log-probs equal in-process sampling's
            logp = torch.log_softmax(causal.lm_head(h).float(), dim=-1)[0]
            if temperature <= 0:
                tok = int(torch.argmax(logp))
            else:
                tok = int(torch.multinomial(_probs(logp, temperature), 1, generator=gen))
            ids.append(tok)
            lps.append(float(logp[tok]))
            if top > 0:
                values, indices = torch.topk(logp, min(top, logp.shape[0]))
                tops.append(list(zip(indices.tolist(), values.tolist())))
            else:
                tops.append([])
            if tok in stops:
                return Sampled(ids, lps, "stop", tops)
            out = causal.model(
                input_ids=torch.tensor([[tok]], device=self.device),
                cache=cache,
                use_cache=True,
                position_ids=torch.tensor([[pos]], device=self.device),
            )
            cache, h, pos = out.cache, out.last_hidden_state[:, -1], pos + 1
        return Sampled(ids, lps, "length", tops)

    @property
    def vocab_size(self) -> int:
        """Token ids a prompt may hold: the tokenizer's, and rows of the model's embedding."""
        lm: Any = self.lm
        return min(len(self.tokenizer), int(lm.get_input_embeddings().num_embeddings))

    def prompt_ids(self, text: str) -> list[int]:
        """A completion's text prompt as ids, as vLLM tokenizes it: no added BOS/EOS, special spellings special."""
        return self._template_ids(text)

    def encode(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        max_tokens: int,
        *,
        max_total: int | None = None,
    ) -> list[int]:
        """Chat-template the messages; past ``max_tokens`` the oldest turns after the instruction go.

        The client's text never becomes a special token: the template is rendered with a placeholder for
        each string of the messages and tools, its own text is tokenized with special tokens on, and each
        client string with ``split_special_tokens=True`` (a user writing ``<|im_start|>system`` gets
        those characters, not a forged turn). A message's ``content`` is a string or a list of strings
        and :class:`~agentrl_train.serve.prompts.Markup` (text the server wrote, such as tool-call tags).

        Raises:
            PromptTooLargeError: the client's strings are over ``max_total`` tokens (before any drop).
            ConfigError: the prompt is over ``max_tokens`` even with every old turn dropped.
        """
        held = Placeholders(self._specials)
        messages = [{**m, "content": held.content(m.get("content"))} for m in messages]
        tools = held.held(tools) if tools else None
        client_ids = self._client_ids(held.texts, max_total)
        head, turns = messages[:2], messages[2:]

        def render(drop: int) -> list[int]:  # the prompt without the oldest 2 * drop turns
            text = self.tokenizer.apply_chat_template(
                head + turns[2 * drop :], tools=tools, tokenize=False, add_generation_prompt=True
            )
            ids: list[int] = []
            start = 0
            for m in held.pattern.finditer(text):
                ids += self._template_ids(text[start : m.start()])
                n = int(m.group(1))
                quoted = text[m.start() - 1 : m.start()] == '"' and text[m.end() : m.end() + 1] == '"'
                # inside a JSON string (a template's tojson of the tools) the text goes in JSON-escaped
                ids += self._text_ids(json.dumps(held.texts[n], ensure_ascii=False)[1:-1]) if quoted else client_ids[n]
                start = m.end()
            return ids + self._template_ids(text[start:])

        return fit_turns(render, len(turns), max_tokens)

    def _client_ids(self, texts: list[str], max_total: int | None) -> list[list[int]]:
        """Each client string's ids, tokenized once; the count stops at the first string past ``max_total`` tokens.

        Raises:
            PromptTooLargeError: the strings are over ``max_total`` tokens.
        """
        total, out = 0, []
        for text in texts:
            out.append(self._text_ids(text))
            total += len(out[-1])
            if max_total is not None and total > max_total:
                raise PromptTooLargeError(
                    f"the conversation is over {max_total} tokens; this server takes at most {max_total} in one request "
                    "(old turns are dropped to fit the context only below that): send the recent turns only"
                )
        return out

    def _template_ids(self, text: str) -> list[int]:
        if not text:
            return []
        with self._tokenizer_lock:
            return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=False)["input_ids"])

    def _text_ids(self, text: str) -> list[int]:
        """Client text as text: a spelled special or added token is cut after its first character."""
        if not text:
            return []
        pieces: list[str] = []
        start = 0
        for m in self._specials_re.finditer(text) if self._specials_re is not None else ():
            pieces += [text[start : m.start() + 1]]
            start = m.start() + 1
        pieces.append(text[start:])
        ids: list[int] = []
        with self._tokenizer_lock:
            for piece in pieces:
                if piece:
                    ids += self.tokenizer(piece, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return ids

    def decode(self, ids: list[int]) -> str:
        """The reply's text: the end-of-turn token dropped, a closing ``</tool_call>`` kept."""
        if ids and ids[-1] in self.stop_ids and self.tokenizer.convert_ids_to_tokens(ids[-1]) != "</tool_call>":
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) in float64, finite for any temperature > 0.

    The largest logit is subtracted before dividing, so the top token's score is exactly 0 and the
    others are <= 0 (at worst -inf, probability 0): a tiny temperature gives the greedy choice instead of
    the inf - inf = NaN that dividing first gave (temperature 1e-300 failed every request).
    """
    scores = logits.double()
    return torch.softmax((scores - scores.max()) / temperature, dim=-1)
