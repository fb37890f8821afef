"""The policy: a causal LM with named LoRA adapters and a value head on the shared backbone (none for
the critic-free group advantages, where every value is 0).

One forward of the backbone gives token log-probs (the LM head is applied to the positions that need
them only) and the value of the state (a linear head on the last prompt token's hidden state). The
reference policy for the KL penalty is the same model with other adapters active (a frozen copy of the
starting adapter, see :meth:`Policy.set_reference`) or with every adapter disabled: no second model.

Two ways to act, both with the same code for sampling and for the update, so the log-probs computed
during the update equal the rollout's:

- :meth:`Policy.score_candidates`: the K candidate actions of ``info["candidates"]`` scored by their
  tokens' log-probs given one shared prompt (the prompt's keys/values computed once and repeated K
  times); mean per token (default) or sum.
- :meth:`Policy.generate` / :meth:`Policy.sequence_logprobs`: token-level sampling until
  ``</tool_call>`` or a budget; the trainer keeps the sampled ids (token in, token out).

The text side (chat rendering, prompt and transcript token ids) is :class:`~agentrl_train.chat_codec.ChatCodec`,
which the policy is; where LoRA goes and how saved adapters are found is :mod:`agentrl_train.lora`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from agentrl_envs.errors import ConfigError
from agentrl_train.chat_codec import ChatCodec
from agentrl_train.lora import find_adapter_weights, lora_config, lora_targets, rescale_saved_lora
from agentrl_train.tool_tokens import ToolTokens, check_same, peft_token_indices, read_tool_tokens, write_tool_tokens

if TYPE_CHECKING:
    from agentrl_train.config import TrainConfig

__all__ = ["Policy", "PromptState", "ScoreOut", "build_policy", "prefix_chains"]

REFERENCE = "initial_reference"  #: the frozen copy of the starting adapter (never saved, never trained)


@dataclass
class ScoreOut:
    """Candidates scored on one prompt."""

    scores_K: torch.Tensor  #: per-candidate score (mean or sum of token log-probs)
    value: torch.Tensor  #: V(prompt), a scalar
    token_logprobs: list[torch.Tensor]  #: per candidate, its tokens' log-probs


@dataclass
class PromptState:
    """A prompt's keys/values, kept between an episode's steps so that each step encodes only its new tokens.

    Valid for the weights that computed it: drop it when the adapter changes (``collect`` starts
    every rollout without any).
    """

    ids: list[int]  #: the prompt's token ids
    cache: Any  #: its keys/values (a transformers DynamicCache)
    last_hidden: torch.Tensor  #: the last prompt token's hidden state, [H]


class Policy(ChatCodec, nn.Module):
    """A base LM wrapped by peft with named adapters, plus a value head (optional).

    Args:
        lm: the base causal LM (frozen).
        tokenizer: its tokenizer (with a chat template).
        adapter: name of the adapter to create and train.
        lora: ``lora_targets(...)`` output.
        dropout: LoRA dropout.
        value_head: create the value head (False for the critic-free group advantages: no parameters,
            nothing saved, every value 0).
        tool_tokens: the tool-call markers :func:`agentrl_train.tool_tokens.add_tool_tokens` added to
            ``lm`` and ``tokenizer``: their embedding (and untied output) rows are trained with the
            adapter (peft ``trainable_token_indices``) and saved with it.
    """

    def __init__(
        self,
        lm: Any,
        tokenizer: Any,
        adapter: str,
        lora: dict[str, Any],
        dropout: float = 0.0,
        *,
        value_head: bool = True,
        tool_tokens: ToolTokens | None = None,
    ) -> None:
        nn.Module.__init__(self)
        ChatCodec.__init__(self, tokenizer, getattr(lm.config, "max_position_embeddings", None))
        from peft import get_peft_model

        self.lora = lora
        self.tool_tokens = tool_tokens
        tokens = peft_token_indices(lm, tool_tokens) if tool_tokens is not None else None
        self.lm = get_peft_model(lm, lora_config(lora, dropout, tokens), adapter_name=adapter)
        self.adapter = adapter
        self.frozen_adapters: list[str] = []
        #: the adapters of the reference policy (KL penalty, candidate baselines); None: the base model alone
        self.reference_adapters: list[str] | None = None
        hidden = int(lm.config.hidden_size)
        dev = next(lm.parameters()).device
        self._device = dev
        self.value_head: nn.Linear | None = None
        if value_head:
            self.value_head = nn.Linear(hidden, 1, device=dev, dtype=torch.float32)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
        self.critic_detach = False

    # -- structure ------------------------------------------------------------------------------

    @property
    def _lora_model(self) -> Any:
        """peft's LoraModel (``set_adapter`` takes a list of names there)."""
        return self.lm.base_model

    @property
    def causal(self) -> Any:
        """The transformers causal LM under the adapters (``.model``, ``.lm_head``; attributes untyped)."""
        return self.lm.base_model.model

    @property
    def device(self) -> torch.device:
        return self._device

    def trainable_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.named_parameters() if p.requires_grad]

    def load_adapter_weights(self, folder: str | Path, option: str = "--init-adapter") -> None:
        """Load saved weights of this adapter (a ``save`` folder or a peft adapter folder).

        An adapter saved with added tool-call tokens (:data:`~agentrl_train.tool_tokens.TOKENS_FILE`)
        loads onto a policy that added the same ones; an adapter without them onto a policy with them
        leaves the new rows at their start (the sub-words' mean).

        Raises:
            ConfigError: naming ``option`` and the file: no adapter there, a damaged file, weights
                that do not fit this model, or added tool-call tokens that are not this policy's.
        """
        from peft.utils import set_peft_model_state_dict

        folder = Path(folder)
        f = find_adapter_weights(folder, self.adapter)
        if f is None:
            raise ConfigError(f"{option} {folder}: no adapter_model.safetensors there; point at a run's final/ folder")
        saved = read_tool_tokens(f.parent)
        if saved is not None or self.tool_tokens is None:
            check_same(saved, self.tool_tokens, f"{option} {folder}")
        weights = self._read_safetensors(f, option, folder)
        rescale_saved_lora(weights, f.parent / "adapter_config.json", self.lm, self.adapter)
        if saved is None and self.tool_tokens is not None:  # the added rows stay at their start
            for n, p in self.lm.named_parameters():
                if n.endswith(f".trainable_tokens_delta.{self.adapter}"):
                    weights[n.removesuffix(f".{self.adapter}")] = p.detach().clone()
        try:
            result = set_peft_model_state_dict(self.lm, weights, adapter_name=self.adapter)
        except Exception as exc:
            raise ConfigError(
                f"{option} {folder}: {f} does not fit this model ({type(exc).__name__}: {str(exc).splitlines()[0]})"
            ) from None
        bad = [k for k in getattr(result, "unexpected_keys", []) if "lora" in k or "trainable_tokens" in k]
        if bad:
            raise ConfigError(f"{option} {folder}: weights do not fit this model ({bad[0]} ...)")
        vh = folder / "value_head.safetensors"
        if vh.exists() and self.value_head is not None:  # a critic-free policy starts from an adapter alone
            try:
                self.value_head.load_state_dict(self._read_safetensors(vh, option, folder))
            except RuntimeError as exc:
                reason = str(exc).splitlines()[0]
                raise ConfigError(f"{option} {folder}: {vh} does not fit this model's value head ({reason})") from None

    def _read_safetensors(self, f: Path, option: str, folder: Path) -> dict[str, torch.Tensor]:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(f, device=str(self.device))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"{option} {folder}: {f} is damaged ({reason}); save or copy it again") from None

    def add_frozen_adapter(self, name: str, folder: str | Path) -> None:
        """Load a saved adapter (an earlier stage's) under ``name``, active beside the trained one and frozen.

        The trained adapter stays last in the active list; the frozen adapters are part of the initial
        policy that :meth:`set_reference` takes as the reference.

        Raises:
            ConfigError: the name is taken, or the folder holds no adapter for this model.
        """
        if name == self.adapter or name in self.frozen_adapters:
            raise ConfigError(f"adapter name {name!r} is already used in this policy; give each stage its own name")
        root = Path(folder)
        path = next((p for p in (root / name, root) if (p / "adapter_config.json").is_file()), None)
        if path is None:
            raise ConfigError(
                f"frozen adapter {name}={folder}: no adapter_config.json in {root / name} or {root}; point at a run's final/"
            )
        if read_tool_tokens(path) is not None:
            raise ConfigError(
                f"frozen adapter {name}={folder}: it trains added tool-call tokens, and two active adapters cannot both "
                "set those rows; a frozen stage with --add-tool-tokens is not supported: train the stages without "
                "--add-tool-tokens, or start the next stage from it with --init-adapter"
            )
        try:
            self.lm.load_adapter(str(path), adapter_name=name, is_trainable=False)
        except Exception as exc:
            raise ConfigError(f"frozen adapter {name}={folder}: does not fit this model ({type(exc).__name__}: {exc})") from None
        self.frozen_adapters.append(name)
        self._lora_model.set_adapter([*self.frozen_adapters, self.adapter])  # the LoraModel takes a list
        for pname, p in self.lm.named_parameters():
            if any(f".{n}." in pname for n in self.frozen_adapters):
                p.requires_grad_(False)

    def active_adapters(self) -> list[str]:
        """Adapters active in a forward pass, frozen ones first, the trained one last."""
        return [*self.frozen_adapters, self.adapter]

    def save(self, folder: str | Path) -> None:
        """peft ``save_pretrained`` layout (``folder/<adapter>/``) plus ``value_head.safetensors`` when there is a value head."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        # the added tokens' rows are saved as trainable_token_indices; never the full embedding matrices
        self.lm.save_pretrained(str(folder), selected_adapters=[self.adapter], save_embedding_layers=False)
        if self.tool_tokens is not None:
            write_tool_tokens(folder / self.adapter, self.tool_tokens)
        if self.value_head is None:
            return
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in self.value_head.state_dict().items()}, folder / "value_head.safetensors"
        )

    def set_reference(self, kind: str) -> None:
        """Choose the reference policy: ``initial`` (the policy as it is now, frozen) or ``base`` (no adapters).

        ``initial`` is what InstructGPT and TRL use: after SFT, the KL penalty keeps PPO near the SFT
        policy, not near a base model that cannot call the tools. The trained adapter's weights are
        copied into a frozen adapter ``REFERENCE`` (when they are not all zero, i.e. loaded from
        ``--init-adapter``); earlier stages' frozen adapters belong to the initial policy too. With a
        fresh adapter and no frozen ones both choices are the base model.
        """
        if kind == "base":
            self.reference_adapters = None
            return
        if kind != "initial":
            raise ConfigError(f"--reference={kind!r}: use initial or base")
        names = list(self.frozen_adapters)
        trained = {n: p for n, p in self.lm.named_parameters() if _of_adapter(n, self.adapter)}
        if any(bool(p.detach().abs().sum() > 0) for n, p in trained.items() if "lora_B" in n):
            if REFERENCE not in self.lm.peft_config:
                self.lm.add_adapter(REFERENCE, self.lm.peft_config[self.adapter])
            own = dict(self.lm.named_parameters())
            with torch.no_grad():
                for n, p in trained.items():
                    own[_rename_adapter(n, self.adapter, REFERENCE)].copy_(p)
            names.append(REFERENCE)
        self.reference_adapters = names or None
        self._activate([*self.frozen_adapters, self.adapter])

    def _activate(self, names: list[str]) -> None:
        """Make ``names`` the active adapters; only the trained adapter's weights keep requiring grad.

        (peft's ``set_adapter`` marks every active adapter trainable and every other one frozen.)
        """
        self._lora_model.set_adapter(names)
        for pname, p in self.lm.named_parameters():
            if "lora_" in pname or ".trainable_tokens_delta." in pname:
                p.requires_grad_(_of_adapter(pname, self.adapter))

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """The reference policy (:meth:`set_reference`): the base model, or the initial policy's adapters."""
        if self.reference_adapters is None:
            with self.lm.disable_adapter():
                yield
            return
        self._activate(self.reference_adapters)
        try:
            yield
        finally:
            self._activate([*self.frozen_adapters, self.adapter])

    # -- acting -----------------------------------------------------------------------------------

    def _prompt(self, prompt_ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
        ids = torch.tensor([list(prompt_ids)], device=self.device)
        out = self.causal.model(input_ids=ids, use_cache=True)
        return out.last_hidden_state, out.cache

    def _value(self, hidden_last: torch.Tensor) -> torch.Tensor:
        if self.value_head is None:  # critic-free: a constant 0, outside the graph
            return torch.zeros((), device=hidden_last.device)
        if self.critic_detach:  # --critic-grad head: the value loss trains the head only
            hidden_last = hidden_last.detach()
        return self.value_head(hidden_last.float()).squeeze(-1)

    def _logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.causal.lm_head(hidden).float()
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), logp

    def score_candidates(self, prompt_ids: Sequence[int], candidates: Sequence[Sequence[int]], scoring: str = "mean") -> ScoreOut:
        """Score K candidates on one prompt in one batched forward over the prompt's cached keys/values."""
        hidden_1P, cache = self._prompt(prompt_ids)
        P, K = len(prompt_ids), len(candidates)
        lens = [len(c) for c in candidates]
        C = max(lens)
        pad = self.tokenizer.pad_token_id or 0
        cand_KC = torch.full((K, C), pad, dtype=torch.long, device=self.device)
        for k, c in enumerate(candidates):
            cand_KC[k, : len(c)] = torch.tensor(c, device=self.device)
        cache.batch_repeat_interleave(K)
        pos_KC = torch.arange(P, P + C, device=self.device).expand(K, C)
        hidden_KC = self.causal.model(input_ids=cand_KC, cache=cache, use_cache=True, position_ids=pos_KC).last_hidden_state
        # Token j of a candidate is predicted by the hidden state before it: the prompt's last, then its own.
        pred_KC = torch.cat([hidden_1P[:, -1:].expand(K, 1, -1), hidden_KC[:, :-1]], dim=1)
        lp_KC, _ = self._logprobs(pred_KC, cand_KC)
        mask_KC = torch.arange(C, device=self.device).expand(K, C) < torch.tensor(lens, device=self.device).unsqueeze(1)
        lp_KC = lp_KC * mask_KC
        total_K = lp_KC.sum(1)
        scores = total_K / torch.tensor(lens, device=self.device, dtype=total_K.dtype) if scoring == "mean" else total_K
        return ScoreOut(scores, self._value(hidden_1P[0, -1]), [lp_KC[k, : lens[k]] for k in range(K)])

    def extend_prompt(self, prompt_ids: Sequence[int], state: PromptState | None = None) -> PromptState | None:
        """The keys/values of ``prompt_ids``: only the tokens past ``state``'s prompt are encoded when that is a prefix.

        Returns None for a model whose cache cannot be cut back after scoring (sliding-window or
        other non-plain layers): the caller then scores the prompt from scratch.
        """
        from transformers.cache_utils import DynamicLayer

        ids = list(prompt_ids)
        if state is not None and len(state.ids) <= len(ids) and ids[: len(state.ids)] == state.ids:
            if len(state.ids) == len(ids):
                return state
            new = torch.tensor([ids[len(state.ids) :]], device=self.device)
            pos = torch.arange(len(state.ids), len(ids), device=self.device)[None]
            out = self.causal.model(input_ids=new, cache=state.cache, use_cache=True, position_ids=pos)
        else:
            out = self.causal.model(input_ids=torch.tensor([ids], device=self.device), use_cache=True)
        if not all(type(layer) is DynamicLayer for layer in getattr(out.cache, "layers", [None])):
            return None
        return PromptState(ids, out.cache, out.last_hidden_state[0, -1])

    def score_candidates_on(self, state: PromptState, candidates: Sequence[Sequence[int]], scoring: str = "mean") -> ScoreOut:
        """:meth:`score_candidates` over a :class:`PromptState`'s cached keys/values (left as they were)."""
        P = len(state.ids)
        scores, token_lps = self._score_over_cache(state.cache, P, [(P, state.last_hidden, candidates)], scoring)[0]
        return ScoreOut(scores, self._value(state.last_hidden), token_lps)

    def score_candidates_many(
        self, items: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]], scoring: str = "mean"
    ) -> list[ScoreOut]:
        """:meth:`score_candidates` of many ``(prompt_ids, candidates)`` items, sharing the prompts' common prefixes.

        An episode's successive prompts are prefixes of one another, so the items are grouped into
        chains (:func:`prefix_chains`). Per chain, one forward encodes its longest prompt and a second
        one all the chain's candidates over those keys/values (:meth:`_score_over_cache`). Each result
        equals :meth:`score_candidates` of its item (up to float rounding), with gradients.
        """
        results: list[ScoreOut | None] = [None] * len(items)
        for head, members in prefix_chains([p for p, _ in items]):
            out = self.causal.model(input_ids=torch.tensor([list(items[head][0])], device=self.device), use_cache=True)
            hidden_P = out.last_hidden_state[0]
            prompts = [(len(items[m][0]), hidden_P[len(items[m][0]) - 1], items[m][1]) for m in members]
            scored = self._score_over_cache(out.cache, len(items[head][0]), prompts, scoring)
            for m, (_, last, _), (scores, token_lps) in zip(members, prompts, scored):
                results[m] = ScoreOut(scores, self._value(last), token_lps)
        return cast("list[ScoreOut]", results)  # prefix_chains puts every item in a chain

    def _score_over_cache(
        self, cache: Any, P: int, prompts: Sequence[tuple[int, torch.Tensor, Sequence[Sequence[int]]]], scoring: str
    ) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """Score the candidates of prompts that are prefixes of the ``P`` cached tokens, in one forward.

        ``prompts``: per prompt, its length ``P_m``, its last token's hidden state and its candidates.
        All candidates go through the model as one sequence under a block mask: each token sees its
        prompt's first ``P_m`` cached tokens and its own candidate's earlier tokens, at positions
        ``P_m, P_m + 1, ...``. The cache is cut back to ``P`` afterwards. Returns per prompt the scores
        (mean or sum of token log-probs) and each candidate's token log-probs.
        """
        dev = self.device
        ids: list[int] = []
        pos: list[int] = []
        rows: list[int] = []  # the row of [prompts' last hiddens; candidate hiddens] that predicts each token
        owner: list[int] = []  # the candidate (block) of each token
        lens: list[int] = []
        for m, (P_m, _, candidates) in enumerate(prompts):
            for c in candidates:
                s = len(ids)
                ids += c
                pos += range(P_m, P_m + len(c))
                rows += [m, *range(len(prompts) + s, len(prompts) + s + len(c) - 1)]
                owner += [len(lens)] * len(c)
                lens.append(len(c))
        Q = len(ids)
        mask_QS = torch.zeros(Q, P + Q, dtype=torch.bool, device=dev)
        s = 0
        for P_m, _, candidates in prompts:
            for c in candidates:
                mask_QS[s : s + len(c), :P_m] = True
                mask_QS[s : s + len(c), P + s : P + s + len(c)] = torch.ones(len(c), len(c), dtype=torch.bool, device=dev).tril()
                s += len(c)
        try:
            hidden_Q = self.causal.model(
                input_ids=torch.tensor([ids], device=dev),
                attention_mask=mask_QS[None, None],
                position_ids=torch.tensor([pos], device=dev),
                cache=cache,
                use_cache=True,
            ).last_hidden_state[0]
        finally:
            _cut_back(cache, P)  # the candidates' keys/values go again
        pred = torch.cat([torch.stack([last for _, last, _ in prompts]), hidden_Q])
        lp_T, _ = self._logprobs(pred[torch.tensor(rows, device=dev)], torch.tensor(ids, device=dev))
        total_B = torch.zeros(len(lens), device=dev, dtype=lp_T.dtype).index_add(0, torch.tensor(owner, device=dev), lp_T)
        scores_B = total_B / torch.tensor(lens, device=dev, dtype=total_B.dtype) if scoring == "mean" else total_B
        per_block = list(torch.split(lp_T, lens))
        out: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
        b = 0
        for _, _, candidates in prompts:
            out.append((scores_B[b : b + len(candidates)], per_block[b : b + len(candidates)]))
            b += len(candidates)
        return out

    def sequence_logprobs_many(
        self, items: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """:meth:`sequence_logprobs` of many ``(prompt_ids, new_ids)`` items in one causal forward per chain.

        In generate mode the next prompt continues the last one's sampled ids (token in, token out),
        so ``prompt + new_ids`` of an episode's steps are prefixes of one another: the chain's longest
        sequence holds every member's tokens at their own positions.
        """
        results: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None] = [None] * len(items)
        seqs = [[*p, *n] for p, n in items]
        for head, members in prefix_chains(seqs):
            ids = torch.tensor([seqs[head]], device=self.device)
            hidden = self.causal.model(input_ids=ids, use_cache=False).last_hidden_state[0]  # no KV cache to keep
            for m in members:
                P, N = len(items[m][0]), len(items[m][1])
                lp_N, logp_NV = self._logprobs(hidden[P - 1 : P - 1 + N], ids[0, P : P + N])
                results[m] = (lp_N, -(logp_NV.exp() * logp_NV).sum(-1), self._value(hidden[P - 1]))
        return cast("list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]", results)

    def value(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        hidden_1P, _ = self._prompt(prompt_ids)
        return self._value(hidden_1P[0, -1])

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        state: PromptState | None = None,
    ) -> tuple[list[int], list[float], float]:
        """Sample one action token by token (:meth:`generate_many` of one prompt).

        ``state``: the prompt's keys/values (:meth:`extend_prompt`), left as they were; else the
        prompt is encoded here. Returns the new ids, their log-probs under the policy (temperature 1)
        and V(prompt).
        """
        if state is None:
            hidden_1P, cache = self._prompt(prompt_ids)
            state = PromptState(list(prompt_ids), cache, hidden_1P[0, -1])
        return self.generate_many([state], max_new_tokens, greedy=greedy, generators=[generator])[0]

    @torch.no_grad()
    def generate_many(
        self,
        states: Sequence[PromptState],
        max_new_tokens: int,
        *,
        greedy: bool = False,
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> list[tuple[list[int], list[float], float]]:
        """Sample an action for each prompt, all prompts' next tokens in one batched forward per step.

        Each prompt stops at an end-of-turn token, when the decoded text of its sampled tokens
        completes ``</tool_call>`` (whatever its tokenization: :meth:`stops`), or at the budget;
        the sampled ids are kept as they are (token in, token out). The prompts' caches have
        different lengths: they are copied, left-padded, into one batch cache with an attention
        mask (positions stay each prompt's own), and a prompt that stops leaves the batch. The
        states are left as they were. Returns per prompt its new ids, their log-probs (temperature
        1) and V(prompt). Row ``i`` samples from ``generators[i]`` (None: torch's default).
        """
        from transformers.cache_utils import DynamicCache

        N = len(states)
        if N == 0:
            return []
        gens = list(generators) if generators is not None else [None] * N
        dev = self.device
        values = [float(self._value(s.last_hidden)) for s in states]
        lens = [len(s.ids) for s in states]
        if N == 1:
            cache, mask = states[0].cache, None
        else:
            S = max(lens)
            layers = []
            for layer in range(len(states[0].cache.layers)):
                ks, vs = [], []
                for st, L in zip(states, lens):
                    lay = st.cache.layers[layer]
                    ks.append(torch.nn.functional.pad(lay.keys[..., :L, :], (0, 0, S - L, 0)))
                    vs.append(torch.nn.functional.pad(lay.values[..., :L, :], (0, 0, S - L, 0)))
                layers.append((torch.cat(ks), torch.cat(vs)))
            cache = DynamicCache(ddp_cache_data=layers)
            mask = torch.arange(S, device=dev)[None, :] >= torch.tensor([S - L for L in lens], device=dev)[:, None]
        ids: list[list[int]] = [[] for _ in range(N)]
        lps: list[list[float]] = [[] for _ in range(N)]
        active = list(range(N))
        h_AH = torch.stack([s.last_hidden for s in states])
        try:
            for step in range(max_new_tokens):
                logp_AV = torch.log_softmax(self.causal.lm_head(h_AH).float(), dim=-1)
                keep = []
                for a, i in enumerate(active):
                    if greedy:
                        tok = int(torch.argmax(logp_AV[a]))
                    else:
                        tok = int(torch.multinomial(logp_AV[a].exp(), 1, generator=gens[i]))
                    ids[i].append(tok)
                    lps[i].append(float(logp_AV[a, tok]))
                    if not self.stops(ids[i]):
                        keep.append(a)
                if not keep or step + 1 == max_new_tokens:
                    break
                if len(keep) < len(active):
                    cache.batch_select_indices(torch.tensor(keep, device=dev))
                    mask = mask[keep] if mask is not None else None
                    active = [active[a] for a in keep]
                inp = torch.tensor([[ids[i][-1]] for i in active], device=dev)
                pos = torch.tensor([[lens[i] + len(ids[i]) - 1] for i in active], device=dev)
                if mask is not None:
                    mask = torch.cat([mask, torch.ones(len(active), 1, dtype=torch.bool, device=dev)], dim=1)
                out = self.causal.model(input_ids=inp, cache=cache, use_cache=True, position_ids=pos, attention_mask=mask)
                cache, h_AH = out.cache, out.last_hidden_state[:, -1]
        finally:
            if N == 1:
                _cut_back(states[0].cache, lens[0])
        return [(ids[i], lps[i], values[i]) for i in range(N)]

    def sequence_logprobs_on(self, state: PromptState, new_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`sequence_logprobs` over a :class:`PromptState`'s cached keys/values (left as they were)."""
        P, N = len(state.ids), len(new_ids)
        ids = torch.tensor([list(new_ids)], device=self.device)
        try:
            hidden_N = self.causal.model(
                input_ids=ids,
                cache=state.cache,
                use_cache=True,
                position_ids=torch.arange(P, P + N, device=self.device)[None],
            ).last_hidden_state[0]
        finally:
            _cut_back(state.cache, len(state.ids))
        pred = torch.cat([state.last_hidden[None], hidden_N[:-1]])
        lp_N, logp_NV = self._logprobs(pred, ids[0])
        return lp_N, -(logp_NV.exp() * logp_NV).sum(-1), self._value(state.last_hidden)

    def sequence_logprobs(
        self, prompt_ids: Sequence[int], new_ids: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probs and entropies of ``new_ids`` after the prompt (one forward, with grad) and V(prompt)."""
        return self.sequence_logprobs_many([(prompt_ids, new_ids)])[0]


def _of_adapter(name: str, adapter: str) -> bool:
    """Whether a peft parameter name is adapter ``adapter``'s: ``...lora_A.<adapter>.weight`` or
    ``...token_adapter.trainable_tokens_delta.<adapter>`` (the added tokens' rows)."""
    return f".{adapter}." in name or name.endswith(f".trainable_tokens_delta.{adapter}")


def _rename_adapter(name: str, old: str, new: str) -> str:
    if name.endswith(f".trainable_tokens_delta.{old}"):
        return name[: -len(old)] + new
    return name.replace(f".{old}.", f".{new}.")


def _cut_back(cache: Any, length: int) -> None:
    """Drop what a forward appended to ``cache`` past its first ``length`` tokens (a prompt's)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def prefix_chains(seqs: Sequence[Sequence[int]]) -> list[tuple[int, list[int]]]:
    """Group sequences into chains whose members are all prefixes of the chain's head (its longest).

    Returns ``(head, members)`` index pairs, members longest first (the head among them); every index
    is in exactly one chain. An empty sequence is a chain of its own (it has no last token to share).
    """
    chains: list[tuple[int, list[int]]] = []
    lists = [list(x) for x in seqs]
    n0 = min((len(x) for x in lists if x), default=0)
    by_start: dict[tuple[int, ...], list[int]] = {}  # the first n0 tokens -> the chains (indices into ``chains``) with that start
    for i in sorted(range(len(lists)), key=lambda j: (-len(lists[j]), j)):
        s = lists[i]
        key = tuple(s[:n0])
        for c in by_start.get(key, []) if s else []:
            if lists[chains[c][0]][: len(s)] == s:
                chains[c][1].append(i)
                break
        else:
            chains.append((i, [i]))
            if s:
                by_start.setdefault(key, []).append(len(chains) - 1)
    return chains


def build_policy(cfg: TrainConfig, log: Any = print) -> Policy:
    """Base model + LoRA adapter (fresh, or ``--init-adapter``) + value head (none for a group advantage), seeded by ``--seed``."""
    from agentrl_train.config import GROUP_ADVANTAGES
    from agentrl_train.models import load_base, pick_device
    from agentrl_train.tiny import TinySpec
    from agentrl_train.tool_tokens import add_tool_tokens

    m = cfg.model
    device = pick_device(m.device)
    spec = TinySpec(pretrain_steps=m.tiny_pretrain_steps, corpus_episodes=m.tiny_corpus_episodes)
    lm, tok = load_base(m.model, device, tiny_spec=spec, log=log, threads=m.threads or 1, rope_scaling=m.rope_scaling)
    added = add_tool_tokens(lm, tok, m.model, log) if m.add_tool_tokens else None
    if m.activation_checkpointing:  # each decoder layer's forward is recomputed in the backward (training only)
        enable: Any = lm.activation_checkpointing_enable  # a transformers method (nn.Module's attribute type hides it)
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    torch.manual_seed(cfg.run.seed)
    policy = Policy(
        lm,
        tok,
        m.adapter,
        lora_targets(lm, m.lora_preset, m.lora_ranks, m.lora_alpha_ratio),
        m.lora_dropout,
        value_head=cfg.ppo.advantage not in GROUP_ADVANTAGES,
        tool_tokens=added,
    )
    policy.critic_detach = cfg.ppo.critic_grad == "head"
    if m.init_adapter:
        policy.load_adapter_weights(m.init_adapter)
    for spec in m.frozen_adapters:  # earlier stages: active and frozen (agentrl_train.stages)
        name, folder = spec.split("=", 1)
        policy.add_frozen_adapter(name, folder)
    policy.set_reference(m.reference)  # after every adapter is loaded: "initial" snapshots them
    return policy
