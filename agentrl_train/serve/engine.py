"""The model side of ``agentrl-train serve``: one base LM, LoRA adapters in slots, one worker thread.

Every forward pass runs on one worker thread, one request at a time, so a request is served entirely
by the weights that were in place when it started. A hot reload reads and checks the new weights on
the caller's thread (safetensors from disk, key set, shapes, LoRA scaling, base model), and only then
copies them into the adapter's slot *on the worker thread*, between two requests: no request ever
sees a half-copied adapter and a refused adapter changes nothing. Weights are copied in place, so
memory does not grow with the number of swaps; a canary gets a second slot of the same shape, which
is kept for the next canary after a promotion or a rollback.

Adapters are read in peft's layout (``adapter_config.json`` + ``adapter_model.safetensors``, or a
run's ``final/`` folder with one such subfolder) or from a trainer checkpoint
(``checkpoints/update-N/trainable.safetensors``).

An adapter trained with added tool-call tokens (``--add-tool-tokens``: ``tool_tokens.json`` beside
its weights) needs the base with the same tokens added (a larger vocabulary): the first adapter
loaded decides, and the base is resized for it. Adapters with and without added tokens cannot be
served by one server (the prompts of one would hold token ids the other never saw), nor can
adapters that added other tokens: such an adapter is refused by name; serve it from its own server.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from agentrl_envs.errors import ConfigError
from agentrl_train.tool_tokens import ToolTokens, add_tool_tokens, read_tool_tokens

__all__ = ["AdapterMismatchError", "Engine", "Markup", "Prepared", "PromptTooLargeError", "Sampled", "find_adapter_files"]

T = TypeVar("T")
_TRAINABLE = re.compile(r"^lm\.(.+)\.lora_([AB])\.[^.]+\.weight$")
_TRAINABLE_ROWS = re.compile(r"^lm\.(.+\.token_adapter\.trainable_tokens_delta)\.[^.]+$")
_ROWS = ".token_adapter.trainable_tokens_delta"  #: peft's key of an adapter's added-token rows
_WORD = re.compile(r"\w{0,64}", re.ASCII)
#: slots of unloaded names kept for a later name of the same LoRA config (a trainer loads one name per update)
MAX_SPARE_SLOTS = 4


class AdapterMismatchError(ConfigError):
    """An adapter folder does not fit the adapter it would replace (keys, shapes, scaling or base model)."""


class PromptTooLargeError(ConfigError):
    """A conversation has more tokens than the server takes in one request, before old turns are dropped."""


class Markup(str):
    """Text the server itself wrote into a message (the ``<tool_call>`` tags around a call): its
    special-token spellings are special tokens. Every other string of a message is the client's and
    is tokenized as text."""


@dataclass
class Prepared:
    """Checked weights of one adapter, ready to copy into a slot."""

    path: str  #: the folder they came from
    tensors: dict[str, torch.Tensor]  #: peft-saved keys (no adapter name) -> weights on the model's device
    config: dict[str, Any]  #: its adapter_config.json (empty for a trainer checkpoint)
    tool_tokens: ToolTokens | None = None  #: the tool-call tokens it was trained with (tool_tokens.json)


@dataclass
class Sampled:
    """One generation of :meth:`Engine.complete`."""

    ids: list[int]  #: the new ids, a final stop id included
    logprobs: list[float]  #: log_softmax of the float32 logits at temperature 1 at each id, as the trainer computes it
    finish: str  #: "stop" (a stop id ended it) or "length" (the budget did)
    top: list[list[tuple[int, float]]]  #: per id, the ``top`` most likely ids and their log-probs (empty lists for 0)


@dataclass
class _Family:
    """The adapters served under one name: their shared LoRA config and the slots that hold them."""

    config: Any  #: peft LoraConfig shared by every slot of this name
    shapes: dict[str, tuple[int, ...]]  #: peft-saved key -> shape
    scaling: dict[str, float]  #: r / alpha facts checked on every load
    free: list[str] = field(default_factory=list)  #: slots kept for reuse
    count: int = 0


def find_adapter_files(folder: str | Path) -> tuple[Path, Path | None]:
    """The weights file of an adapter folder and its ``adapter_config.json`` (None for a checkpoint).

    Raises:
        ConfigError: no ``adapter_model.safetensors`` or ``trainable.safetensors`` there.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"adapter path {str(folder)[:200]!r} is not a folder; point at a run's final/ or an adapter folder")
    subs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    for sub in (folder, *subs):
        if (sub / "adapter_model.safetensors").is_file():
            cfg = sub / "adapter_config.json"
            return sub / "adapter_model.safetensors", cfg if cfg.is_file() else None
    if (folder / "trainable.safetensors").is_file():
        return folder / "trainable.safetensors", None
    raise ConfigError(
        f"adapter path {str(folder)[:200]!r} holds no adapter_model.safetensors (peft layout) or "
        "trainable.safetensors (a trainer checkpoint); point at a run's final/ or checkpoints/update-N/"
    )


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
        self.families: dict[str, _Family] = {}
        self.swaps = 0
        self.swap_seconds: list[float] = []
        self._params: dict[str, dict[str, torch.nn.Parameter]] = {}
        self.tool_tokens: ToolTokens | None = None  #: the tool-call tokens added to the base (by the first adapter)
        self._active: str | None = None
        self._slot_count = 0
        self._spare: list[tuple[str, str, _Family]] = []  #: (LoRA config key, slot, its old family) of unloaded names
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
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        weights, cfg_file = find_adapter_files(path)
        config: dict[str, Any] = {}
        try:
            if cfg_file is not None:
                config = json.loads(cfg_file.read_text())
            raw = load_file(weights, device="cpu")
        except (OSError, ValueError, RecursionError, SafetensorError) as exc:
            raise ConfigError(f"adapter {str(path)[:200]!r}: cannot read it ({type(exc).__name__}: {str(exc)[:200]})") from None
        if not isinstance(config, dict):
            raise ConfigError(
                f"adapter {str(path)[:200]!r}: adapter_config.json holds a {type(config).__name__}, not a JSON object; "
                "save the adapter again with peft (the old version keeps serving)"
            )
        _scaling(config, str(path))  # r / lora_alpha that are not numbers are refused here, before any slot exists
        tensors = _peft_keys(raw, weights.name == "trainable.safetensors")
        tokens = read_tool_tokens(weights.parent) if cfg_file is not None else self.tool_tokens
        if self.peft is not None and tokens != self.tool_tokens:
            raise AdapterMismatchError(_tokens_refusal(str(path), tokens, self.tool_tokens))
        if cfg_file is not None and tokens is not None and not any(k.endswith(_ROWS) for k in tensors):
            raise AdapterMismatchError(
                f"adapter {str(path)[:200]!r}: tool_tokens.json says it trains added tool-call tokens, but its weights "
                "hold no rows for them; save the adapter again"
            )
        if not tensors:
            raise AdapterMismatchError(f"adapter {str(path)[:200]!r}: {weights.name} holds no LoRA weights")
        for key, tensor in tensors.items():
            if not tensor.is_floating_point():
                raise AdapterMismatchError(
                    f"adapter {str(path)[:200]!r}: {key} holds {tensor.dtype} values, LoRA weights are floating point; "
                    "the file is not an adapter (the old version keeps serving)"
                )
        base = config.get("base_model_name_or_path")
        if base and Path(str(base)).name != Path(self.base_path).name:
            raise AdapterMismatchError(
                f"adapter {str(path)[:200]!r} was trained on base {base!r}, this server serves {self.base_path!r}; "
                "serve it with that --model (the old version keeps serving)"
            )
        fam = self.families.get(family) if family is not None else None
        if fam is not None:
            _check_fit(str(path), fam, tensors, config)
        else:
            self._check_model_fit(str(path), tensors)
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

        config = _lora_config(name, prepared)
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
        fam = _Family(config, shapes, _scaling(prepared.config, prepared.path), count=1)
        _check_fit(prepared.path, fam, prepared.tensors, prepared.config)
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
        key = _config_key(_lora_config(name, prepared))
        for i, (k, slot, old) in enumerate(self._spare):
            if k == key:
                fam = _Family(old.config, old.shapes, _scaling(prepared.config, prepared.path), count=1)
                _check_fit(prepared.path, fam, prepared.tensors, prepared.config)
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
        key = _config_key(fam.config)
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
                f"adapter {name}={prepared.path[:200]}: " + _tokens_refusal(prepared.path, prepared.tool_tokens, added)
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
            fam.count += 1
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
        before any queued later. The future gives the swap's seconds."""
        return self.submit(self._copy, slot, prepared)

    def _copy(self, slot: str, prepared: Prepared) -> float:
        t0 = time.perf_counter()
        params = self._params[slot]
        with torch.no_grad():
            for key, tensor in prepared.tensors.items():
                params[key].copy_(tensor)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        self.swaps += 1
        self.swap_seconds = [*self.swap_seconds[-999:], seconds]
        return seconds

    def _new_slot_name(self) -> str:
        self._slot_count += 1
        return f"slot{self._slot_count}"

    def _index(self, slot: str) -> None:
        marker = f".{slot}."
        params = {n.replace(marker, "."): p for n, p in self.peft.named_parameters() if marker in n and ".lora_" in n}
        rows = f"{_ROWS}.{slot}"
        params.update({n.removesuffix(f".{slot}"): p for n, p in self.peft.named_parameters() if n.endswith(rows)})
        self._params[slot] = params

    def _check_model_fit(self, path: str, tensors: dict[str, torch.Tensor]) -> None:
        """Before a first slot exists: every LoRA pair must sit on a layer of this base with its in/out sizes."""
        modules = dict(self.lm.named_modules())
        for key, tensor in tensors.items():
            if key.endswith(_ROWS):  # added tokens' rows: the base is resized for them, and their shape checked in add_family
                continue
            m = re.match(r"^base_model\.model\.(.+)\.lora_([AB])\.weight$", key)
            layer = modules.get(m.group(1)) if m else None
            if tensor.ndim != 2:
                raise AdapterMismatchError(
                    f"adapter {path[:200]!r}: {key} has shape {tuple(tensor.shape)}, a LoRA weight is a matrix; "
                    "the file is damaged or not a LoRA adapter"
                )
            if layer is None or not hasattr(layer, "in_features"):
                raise AdapterMismatchError(
                    f"adapter {path[:200]!r}: {key} is not a layer of this base; it was trained on another model"
                )
            size = tensor.shape[1] if m and m.group(2) == "A" else tensor.shape[0]
            want = layer.in_features if m and m.group(2) == "A" else layer.out_features
            if size != want:
                raise AdapterMismatchError(
                    f"adapter {path[:200]!r}: {key} has shape {tuple(tensor.shape)}, this base's layer is "
                    f"{layer.in_features}->{layer.out_features}; it was trained on another model"
                )

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
        and :class:`Markup` (text the server wrote, such as tool-call tags).

        Raises:
            PromptTooLargeError: the client's strings are over ``max_total`` tokens (before any drop).
            ConfigError: the prompt is over ``max_tokens`` even with every old turn dropped.
        """
        texts: list[str] = []  # the client's strings, by placeholder number
        nonce = secrets.token_hex(8)  # placeholders a client cannot write in advance
        pattern = re.compile(f"AGENTRLPH{nonce}N(\\d+)X")

        def hold(text: str) -> str:
            texts.append(text)
            return f"AGENTRLPH{nonce}N{len(texts) - 1}X"

        def held(value: Any) -> Any:  # the strings of a tool schema, keys included, but plain words
            if isinstance(value, str):
                return value if self._plain(value) else hold(value)  # "function", "type": the template may look
            if isinstance(value, dict):
                return {held(k) if isinstance(k, str) else k: held(v) for k, v in value.items()}
            if isinstance(value, list):
                return [held(v) for v in value]
            return value

        def content(value: Any) -> str:
            pieces = value if isinstance(value, list) else [value or ""]
            return "".join(p if isinstance(p, Markup) else hold(str(p)) for p in pieces)

        messages = [{**m, "content": content(m.get("content"))} for m in messages]
        tools = held(tools) if tools else None
        total, token_cache = 0, {}
        for i, text in enumerate(texts):  # each client string once; the count stops at the first past the cap
            token_cache[i] = self._text_ids(text)
            total += len(token_cache[i])
            if max_total is not None and total > max_total:
                raise PromptTooLargeError(
                    f"the conversation is over {max_total} tokens; this server takes at most {max_total} in one request "
                    "(old turns are dropped to fit the context only below that): send the recent turns only"
                )
        head, turns = messages[:2], messages[2:]

        def render(drop: int) -> list[int]:  # the prompt without the oldest 2 * drop turns
            text = self.tokenizer.apply_chat_template(
                head + turns[2 * drop :], tools=tools, tokenize=False, add_generation_prompt=True
            )
            ids: list[int] = []
            start = 0
            for m in pattern.finditer(text):
                ids += self._template_ids(text[start : m.start()])
                n = int(m.group(1))
                quoted = text[m.start() - 1 : m.start()] == '"' and text[m.end() : m.end() + 1] == '"'
                # inside a JSON string (a template's tojson of the tools) the text goes in JSON-escaped
                ids += self._text_ids(json.dumps(texts[n], ensure_ascii=False)[1:-1]) if quoted else token_cache[n]
                start = m.end()
            return ids + self._template_ids(text[start:])

        ids = render(0)
        if len(ids) <= max_tokens:
            return ids
        # Fewer turns, fewer tokens: bisect on how many pairs to drop (a turn at a time re-rendered a
        # 4,000-turn conversation 2,000 times, minutes of CPU for one request).
        lo, hi = 0, (len(turns) + 1) // 2  # lo is too long; hi drops every turn
        best = render(hi)
        if len(best) > max_tokens:
            raise ConfigError(
                f"the prompt is {len(best)} tokens after dropping old turns; this model takes {max_tokens} "
                "(its context minus max_tokens): send a shorter system prompt or instruction, or lower max_tokens"
            )
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ids = render(mid)
            if len(ids) <= max_tokens:
                hi, best = mid, ids
            else:
                lo = mid
        return best

    def _plain(self, text: str) -> bool:
        """A word of ASCII letters, digits and ``_`` that spells no special token: safe as template text."""
        return _WORD.fullmatch(text) is not None and not any(t in text for t in self._specials)

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


def _lora_config(name: str, prepared: Prepared) -> Any:
    """The peft ``LoraConfig`` of an adapter's adapter_config.json (for inference)."""
    from peft import LoraConfig

    if not prepared.config:
        raise ConfigError(f"adapter {name}={prepared.path}: the first version needs adapter_config.json (peft layout)")
    try:
        config = LoraConfig(**{k: v for k, v in prepared.config.items() if k in LoraConfig.__dataclass_fields__})
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"adapter {name}={prepared.path}: adapter_config.json is not a LoRA config peft accepts "
            f"({type(exc).__name__}: {str(exc)[:200]}); save the adapter again with peft"
        ) from None
    config.inference_mode = True
    return config


def _config_key(config: Any) -> str:
    """What a slot's layers depend on in a ``LoraConfig``: two adapters with equal keys can share a slot."""
    facts = {k: v for k, v in config.to_dict().items() if k not in ("base_model_name_or_path", "revision", "peft_version")}
    return json.dumps(facts, sort_keys=True, default=lambda v: sorted(map(str, v)) if isinstance(v, (set, frozenset)) else str(v))


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / temperature) in float64, finite for any temperature > 0.

    The largest logit is subtracted before dividing, so the top token's score is exactly 0 and the
    others are <= 0 (at worst -inf, probability 0): a tiny temperature gives the greedy choice instead of
    the inf - inf = NaN that dividing first gave (temperature 1e-300 failed every request).
    """
    scores = logits.double()
    return torch.softmax((scores - scores.max()) / temperature, dim=-1)


def _peft_keys(raw: dict[str, torch.Tensor], trainable: bool) -> dict[str, torch.Tensor]:
    """LoRA weights under peft's saved names (``...q_proj.lora_A.weight``), from either file layout."""
    if not trainable:
        return {k: v for k, v in raw.items() if ".lora_" in k or k.endswith(_ROWS)}
    out = {}
    for k, v in raw.items():
        m = _TRAINABLE.match(k)
        if m:
            out[f"{m.group(1)}.lora_{m.group(2)}.weight"] = v
        elif rows := _TRAINABLE_ROWS.match(k):
            out[rows.group(1)] = v
    return out


def _tokens_refusal(path: str, tokens: ToolTokens | None, served: ToolTokens | None) -> str:
    def what(t: ToolTokens | None) -> str:
        return f"added tool-call tokens {', '.join(t.tokens)} at ids {list(t.ids)}" if t else "no added tool-call tokens"

    return (
        f"adapter {path[:200]!r} was trained with {what(tokens)}, and this server's base has {what(served)}; "
        "an adapter with added tokens needs a base resized for them and cannot be served beside adapters without "
        "them (or with others): serve it from its own agentrl-train serve (the old version keeps serving)"
    )


def _scaling(config: dict[str, Any], path: str = "") -> dict[str, float]:
    """The r / alpha facts two versions of one name must share.

    Raises:
        AdapterMismatchError: one of them is not a number (or a pattern is not a JSON object).
    """
    facts: dict[str, float] = {}
    items: list[tuple[str, Any]] = [("r", config.get("r", 0)), ("lora_alpha", config.get("lora_alpha", 0))]
    for kind in ("rank_pattern", "alpha_pattern"):
        pattern = config.get(kind) or {}
        if not isinstance(pattern, dict):
            raise AdapterMismatchError(
                f"adapter {path[:200]!r}: adapter_config.json {kind} is {str(pattern)[:60]!r}, not a JSON object of numbers"
            )
        items += [(f"{kind}.{k}", v) for k, v in sorted(pattern.items())]
    for key, value in items:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise AdapterMismatchError(
                f"adapter {path[:200]!r}: adapter_config.json {key} is {str(value)[:60]!r}, not a number; "
                "save the adapter again with peft (the old version keeps serving)"
            )
        facts[key] = float(value)
    return facts


def _check_fit(path: str, fam: _Family, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    missing = sorted(set(fam.shapes) - set(tensors))
    extra = sorted(set(tensors) - set(fam.shapes))
    if missing or extra:
        what = f"missing {missing[0]}" if missing else f"unexpected {extra[0]}"
        raise AdapterMismatchError(
            f"adapter {path[:200]!r} does not fit: {what} ({len(missing)} missing, {len(extra)} unexpected); "
            "it targets other layers or another base model (the old version keeps serving)"
        )
    for key, shape in fam.shapes.items():
        if tuple(tensors[key].shape) != shape:
            raise AdapterMismatchError(
                f"adapter {path[:200]!r} does not fit: {key} has shape {tuple(tensors[key].shape)}, the served one {shape}; "
                "a different rank or base model needs its own --adapter name (the old version keeps serving)"
            )
    if config:
        got = _scaling(config, path)
        for key, want in fam.scaling.items():
            if got.get(key) != want:
                raise AdapterMismatchError(
                    f"adapter {path[:200]!r} does not fit: {key} is {got.get(key)}, the served one {want}; "
                    "serve it under its own --adapter name (the old version keeps serving)"
                )
