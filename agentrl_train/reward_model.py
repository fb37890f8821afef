"""A reward model for tool calls: the base LM with its own LoRA adapter and a scalar head.

Trained on ``agentrl-envs make-rm-data`` output (a gold call next to its AST perturbations that really
fail) by :mod:`agentrl_train.rm_train`. This module holds the pieces that training, evaluation,
distillation and the ``preference`` stage share:

- :func:`load_rm_data`: the Parquet rows (a file or every ``*.parquet`` in a folder), checked;
- :func:`clean_action`: the env's format-invariant form of a call (parsed by
  :func:`agentrl_envs.core.actions.parse_action`, re-written by :func:`~agentrl_envs.core.actions.format_call`), so a
  fenced, OpenAI-style, Llama-3-style or chatty call scores as its canonical text;
  :func:`decorate` writes those forms (the consistency term trains on them);
- :class:`RewardModel`: ``score(prompts, actions)`` = a linear head on the mean hidden state of the action's
  tokens after the prompt; dropout before the head gives the teacher's uncertainty in distillation;
- :func:`save_rm` / :func:`load_rm`: ``rm.json`` (base model, fingerprint, settings) + the peft adapter +
  ``head.safetensors``; loading onto another base model is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agentrl_envs.errors import ActionError, ConfigError

__all__ = ["ADAPTER", "RMRow", "RewardModel", "clean_action", "decorate", "domain_of", "load_rm", "load_rm_data", "save_rm"]

ADAPTER = "rm"
REQUIRED = ("env_id", "split", "task_id", "step", "prompt", "action", "label")
DECORATIONS = ("fence", "openai", "llama3", "chatty", "indent")


@dataclass(frozen=True)
class RMRow:
    """One labelled call."""

    group: str  #: gold and perturbations of one call share it (env, split, task, step)
    split: str  #: train, test or heldout
    domain: str  #: the task's domain (retail, finance, hr; logistics is held out)
    tool: str  #: sql, python or smtp
    prompt: str  #: the instruction and the earlier steps
    action: str  #: the call's text
    label: float  #: 1.0 gold, -0.5 perturbed
    kind: str  #: "gold" or the perturbation kind


def domain_of(task_id: str) -> str:
    """The domain in a task id ``kind/domain/split/seed`` (``"?"`` when it has no such part)."""
    parts = str(task_id).split("/")
    return parts[1] if len(parts) >= 4 else "?"


def load_rm_data(path: str | Path) -> list[RMRow]:
    """Rows of a make-rm-data Parquet file, or of every ``*.parquet`` in a folder.

    Raises:
        ConfigError: missing path, no Parquet files, unreadable file, missing columns, no rows, or a
            label that is not a finite number.
    """
    import pyarrow.parquet as pq

    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.parquet"))
        if not files:
            raise ConfigError(f"--data {path}: no *.parquet files in that folder; write some with `agentrl-envs make-rm-data`")
    elif p.is_file():
        files = [p]
    else:
        raise ConfigError(
            f"--data {path}: no such file or folder; pass make-rm-data's output folder or one of its .parquet files"
        )
    rows: list[RMRow] = []
    for f in files:
        try:
            table = pq.read_table(f)
        except Exception as exc:
            raise ConfigError(f"--data {f}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
        missing = [c for c in REQUIRED if c not in table.column_names]
        if missing:
            raise ConfigError(
                f"--data {f}: missing column(s) {', '.join(missing)}; write the file with `agentrl-envs make-rm-data`"
            )
        for n, r in enumerate(table.to_pylist()):
            label = r["label"]
            if not isinstance(label, (int, float)) or isinstance(label, bool) or not math.isfinite(label):
                raise ConfigError(
                    f"--data {f}: row {n} has label {label!r}; every label must be a finite number (1.0 gold, -0.5 perturbed)"
                )
            if not isinstance(r["prompt"], str) or not isinstance(r["action"], str):
                raise ConfigError(f"--data {f}: row {n} has a prompt or action that is not text")
            group = f"{r['env_id']}|{r['split']}|{r['task_id']}|{r['step']}"
            kind = str(r.get("perturbation") or ("gold" if label > 0 else "perturbed"))
            rows.append(
                RMRow(
                    group,
                    str(r["split"]),
                    domain_of(r["task_id"]),
                    str(r.get("tool") or "?"),
                    r["prompt"],
                    r["action"],
                    float(label),
                    kind,
                )
            )
    if not rows:
        raise ConfigError(f"--data {path}: the dataset is empty (0 rows); run make-rm-data with more --episodes")
    return rows


def clean_action(text: str) -> str:
    """The env's format-invariant form of a call: parsed in any accepted convention, written canonically.

    Text that is not one valid call is returned stripped (it has no canonical form; the model scores it as is).
    """
    from agentrl_envs.core.actions import format_call, parse_action

    try:
        call = parse_action(text)
    except ActionError:
        return text.strip()
    return format_call(call.name, call.arguments)


def decorate(text: str, kind: str) -> str:
    """The same call in another convention the env accepts (``DECORATIONS``); non-calls come back unchanged."""
    from agentrl_envs.core.actions import parse_action

    try:
        call = parse_action(text)
    except ActionError:
        return text
    obj = {"name": call.name, "arguments": call.arguments}
    if kind == "fence":
        return "```json\n" + json.dumps(obj) + "\n```"
    if kind == "openai":
        return json.dumps({"type": "function", "function": {"name": call.name, "arguments": json.dumps(call.arguments)}})
    if kind == "llama3":
        return json.dumps({"name": call.name, "parameters": call.arguments})
    if kind == "chatty":
        return "Sure! I will make this call now.\n<tool_call>" + json.dumps(obj) + "</tool_call>\nLet me know if that helps."
    if kind == "indent":
        return "<tool_call>\n" + json.dumps(obj, indent=2) + "\n</tool_call>"
    raise ConfigError(f"decoration {kind!r}: use one of {', '.join(DECORATIONS)}")


def fingerprint(lm: Any) -> dict[str, Any]:
    """What identifies a base model: its architecture numbers and a hash of its input embeddings."""
    c = lm.config
    emb = lm.get_input_embeddings().weight.detach().float().cpu().flatten()[:65536]
    return {
        "model_type": c.model_type,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "vocab_size": c.vocab_size,
        "embedding_sha": hashlib.sha256(emb.numpy().tobytes()).hexdigest()[:16],
    }


class RewardModel(nn.Module):
    """Base LM + LoRA adapter ``rm`` + a scalar head.

    Args:
        lm: the base causal LM (frozen).
        tokenizer: its tokenizer.
        rank, alpha: LoRA rank and alpha on every attention and MLP projection.
        lora_dropout: LoRA dropout.
        head_dropout: dropout on the hidden state before the head (on in train mode: the teacher's
            uncertainty is the variance of its score over dropout samples).
        max_tokens: tokens kept per input (the prompt is cut from the left; the action is kept).
        clean: pass actions through :func:`clean_action` before scoring.
    """

    def __init__(
        self,
        lm: Any,
        tokenizer: Any,
        *,
        rank: int = 8,
        alpha: float = 16.0,
        lora_dropout: float = 0.0,
        head_dropout: float = 0.1,
        max_tokens: int = 384,
        clean: bool = True,
    ) -> None:
        super().__init__()
        from peft import LoraConfig, get_peft_model

        from agentrl_train.lora import lora_targets

        if rank < 1 or max_tokens < 16:
            raise ConfigError(f"reward model: rank={rank}, max_tokens={max_tokens}; use rank >= 1 and max_tokens >= 16")
        self.tokenizer = tokenizer
        self.fingerprint = fingerprint(lm)
        self.settings = {"rank": rank, "alpha": alpha, "lora_dropout": lora_dropout, "head_dropout": head_dropout}
        self.settings.update(max_tokens=max_tokens, clean=clean)
        self.max_tokens, self.clean = max_tokens, clean
        targets = lora_targets(lm)["target_modules"]
        alpha_: Any = alpha  # peft annotates an int and takes a float
        cfg = LoraConfig(r=rank, lora_alpha=alpha_, target_modules=targets, lora_dropout=lora_dropout, bias="none")
        self.lm = get_peft_model(lm, cfg, adapter_name=ADAPTER)
        dev = next(lm.parameters()).device
        self.dropout = nn.Dropout(head_dropout)
        self.head = nn.Linear(int(lm.config.hidden_size), 1, device=dev, dtype=torch.float32)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    @property
    def backbone(self) -> nn.Module:
        causal: Any = self.lm.base_model.model
        return getattr(causal, causal.base_model_prefix)

    def num_layers(self) -> int:
        causal: Any = self.lm.base_model.model
        return int(causal.config.num_hidden_layers)

    def trainable_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.named_parameters() if p.requires_grad]

    def train_only_last_layers(self, n: int = 2) -> list[str]:
        """Freeze the adapter outside the last ``n`` transformer layers (the head stays trainable); returns what trains."""
        first = self.num_layers() - n
        for name, p in self.lm.named_parameters():
            if "lora_" not in name:
                continue
            layer = _layer_index(name)
            p.requires_grad_(layer is not None and layer >= first)
        return [n for n, _ in self.trainable_parameters()]

    def encode_prompt(self, prompt: str) -> list[int]:
        """Prompt tokens, at most ``max_tokens // 2``: the head (the instruction) and the tail (the latest step)."""
        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        room = self.max_tokens // 2
        return ids if len(ids) <= room else ids[: room // 2] + ids[-(room - room // 2) :]

    def encode_action(self, action: str, clean: bool | None = None) -> list[int]:
        """Tokens of ``"> " + action`` (cleaned unless ``clean=False``), at most ``max_tokens // 2``."""
        action = clean_action(action) if (self.clean if clean is None else clean) else action
        return self.tokenizer("\n\n> " + action, add_special_tokens=False)["input_ids"][: self.max_tokens // 2] or [0]

    def score(self, prompts: Sequence[str], actions: Sequence[str], clean: bool | None = None) -> torch.Tensor:
        """Scores ``[B]`` of the calls (with grad when called under grad). Rows that share a prompt share one forward of it."""
        if len(prompts) != len(actions):
            raise ConfigError(f"score: {len(prompts)} prompts but {len(actions)} actions")
        out = torch.zeros(len(prompts), device=self.device)
        by_prompt: dict[str, list[int]] = {}
        for i, p in enumerate(prompts):
            by_prompt.setdefault(p, []).append(i)
        for p, idx in by_prompt.items():
            out = out.index_put((torch.tensor(idx, device=self.device),), self.score_group(p, [actions[i] for i in idx], clean))
        return out

    def score_group(self, prompt: str, actions: Sequence[str], clean: bool | None = None) -> torch.Tensor:
        """Scores ``[K]`` of K actions after one prompt: the prompt's keys/values computed once and repeated K times."""
        prompt_ids = self.encode_prompt(prompt) or [0]
        acts = [self.encode_action(a, clean) for a in actions]
        P, K, A = len(prompt_ids), len(acts), max(len(a) for a in acts)
        out = self.backbone(input_ids=torch.tensor([prompt_ids], device=self.device), use_cache=True)
        cache = out.cache
        cache.batch_repeat_interleave(K)
        pad = self.tokenizer.pad_token_id or 0
        ids_KA = torch.full((K, A), pad, dtype=torch.long, device=self.device)
        for k, a in enumerate(acts):
            ids_KA[k, : len(a)] = torch.tensor(a, device=self.device)
        pos_KA = torch.arange(P, P + A, device=self.device).expand(K, A)
        hidden_KAH = self.backbone(input_ids=ids_KA, cache=cache, position_ids=pos_KA).last_hidden_state
        # Mean over the action's own tokens (causal attention: a row's padding comes after them and cannot
        # change them). Pooling reads every token of the call, which a small backbone's last state does not.
        mask_KA = (
            torch.arange(A, device=self.device).expand(K, A) < torch.tensor([len(a) for a in acts], device=self.device)[:, None]
        ).float()
        pooled_KH = (hidden_KAH.float() * mask_KA[..., None]).sum(1) / mask_KA.sum(1, keepdim=True)
        return self.head(self.dropout(pooled_KH)).squeeze(-1)


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def build_rm(model: str, *, device: str = "auto", tiny_spec: Any = None, log: Any = print, **settings: Any) -> RewardModel:
    """A fresh reward model on ``model`` (``tiny`` or a local Hugging Face folder)."""
    from agentrl_train.models import load_base, pick_device

    lm, tok = load_base(model, pick_device(device), tiny_spec=tiny_spec, log=log, threads=1)  # one CPU thread, as the trainer
    return RewardModel(lm, tok, **settings)


def save_rm(rm: RewardModel, out: str | Path, *, model: str, tiny_spec: Any = None, extra: dict[str, Any] | None = None) -> Path:
    """Write ``rm.json``, the peft adapter (``out/rm/``) and ``head.safetensors``."""
    from dataclasses import asdict

    from safetensors.torch import save_file

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    rm.lm.save_pretrained(str(folder), selected_adapters=[ADAPTER])
    save_file({k: v.detach().cpu().contiguous() for k, v in rm.head.state_dict().items()}, folder / "head.safetensors")
    meta = {"model": model, "tiny_spec": asdict(tiny_spec) if tiny_spec is not None else None, "fingerprint": rm.fingerprint}
    meta.update(settings=rm.settings, **(extra or {}))
    (folder / "rm.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return folder


def load_rm(folder: str | Path, *, model: str | None = None, device: str = "auto", log: Any = print) -> RewardModel:
    """A saved reward model, on the base model it was trained on (or ``model``, which must be that same base).

    Raises:
        ConfigError: not a reward-model folder, or ``model`` is another base model than the one it was trained on.
    """
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    from agentrl_train.tiny import TinySpec

    f = Path(folder)
    if not (f / "rm.json").is_file():
        raise ConfigError(f"{folder}: not a reward-model folder (no rm.json); point at the --out folder of `agentrl-train rm`")
    meta = json.loads((f / "rm.json").read_text(encoding="utf-8"))
    spec = TinySpec(**meta["tiny_spec"]) if meta.get("tiny_spec") else None
    rm = build_rm(model or meta["model"], device=device, tiny_spec=spec, log=log, **meta["settings"])
    if rm.fingerprint != meta["fingerprint"]:
        diff = sorted(k for k in meta["fingerprint"] if meta["fingerprint"][k] != rm.fingerprint.get(k))
        raise ConfigError(
            f"{folder}: trained on base model {meta['model']!r}, but --model {model!r} differs ({', '.join(diff)}); "
            "use the base the reward model was trained on"
        )
    weights = f / ADAPTER / "adapter_model.safetensors"
    if not weights.is_file():
        raise ConfigError(f"{folder}: no {ADAPTER}/adapter_model.safetensors; the folder is incomplete, train it again")
    set_peft_model_state_dict(rm.lm, load_file(weights, device=str(rm.device)), adapter_name=ADAPTER)
    rm.head.load_state_dict(load_file(f / "head.safetensors", device=str(rm.device)))
    rm.meta = meta  # type: ignore[assignment]
    rm.eval()
    return rm
