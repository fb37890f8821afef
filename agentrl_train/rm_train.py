"""Reward-model training, evaluation and distillation (``agentrl-train rm``, ``rm-eval``, ``rm-distill``).

Training reads top to bottom in :func:`train_rm`: each step draws ``groups`` calls (a gold call and its
perturbations), scores every row on its cleaned text, and adds

- the preference loss: pairwise Bradley-Terry ``softplus(-(s_gold - s_perturbed))`` over the
  perturbations of the same call (default), or pointwise ``(s - label)^2`` (labels 1 / -0.5);
- the consistency term ``c * (s(decorated raw) - sg(s(clean)))^2``: the same call written in another
  accepted convention (fenced, OpenAI, Llama 3, chatty, indented), scored without cleaning, must score
  like its clean form, so the model does not pay for format (``sg``: no gradient through the target);
- with ``--domain-adapt``: only the adapter's last 2 layers and the head train, and domain contrastive
  pairs join the Bradley-Terry pairs: the benign gold query against the same query with its WHERE
  clause dropped (unfiltered) and against a query of the staff's e-mail addresses (a sensitive column).

:func:`evaluate_rm` gives pairwise accuracy (gold above each of its perturbations) and AUC (gold vs
perturbed rows) per split and domain, the held-out domain included. :func:`distill` trains a student on
the teacher's mean score, each row weighted by :func:`uncertainty_weights` of the teacher's variance
over dropout samples (uncertain rows count less).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from agentrl_envs.errors import ConfigError
from agentrl_train.reward_model import (
    DECORATIONS,
    RewardModel,
    RMRow,
    build_rm,
    clean_action,
    decorate,
    load_rm,
    load_rm_data,
    save_rm,
)

__all__ = ["RMConfig", "distill", "domain_pairs", "evaluate_rm", "train_rm", "uncertainty_weights"]


@dataclass
class RMConfig:
    """Options of ``agentrl-train rm`` (flags are the field names with dashes)."""

    data: str = ""  #: make-rm-data output folder or one .parquet file
    model: str = "tiny"  #: 'tiny', 'smollm2-135m', a .gguf file or a local Hugging Face model folder
    out: str = "runs/rm"  #: output folder
    loss: str = "pairwise"  #: pairwise (Bradley-Terry) or pointwise (labels 1 / -0.5)
    steps: int = 150  #: optimizer steps
    groups: int = 4  #: calls (gold + its perturbations) per step
    lr: float = 2e-3  #: AdamW learning rate
    rank: int = 8  #: LoRA rank
    consistency: float = 1.0  #: weight of the raw-vs-clean consistency term (0: off)
    clean: bool = True  #: clean inputs (the env's format-invariant form) before scoring
    domain_adapt: bool = False  #: train only the last 2 layers (+ head) and add domain contrastive pairs
    init: str = ""  #: start from this reward-model folder (e.g. for --domain-adapt on a trained RM)
    train_split: str = "train"  #: rows of this split train; every split is evaluated
    max_tokens: int = 384  #: tokens per input (prompt cut from the left)
    head_dropout: float = 0.1  #: dropout before the head
    seed: int = 0  #: seed of the model, the batches and the decorations
    device: str = "auto"  #: auto, cpu or cuda

    def validate(self) -> RMConfig:
        if self.loss not in ("pairwise", "pointwise"):
            raise ConfigError(f"--loss={self.loss!r}: use pairwise or pointwise")
        for name in ("steps", "groups", "lr", "rank", "max_tokens"):
            if not (getattr(self, name) > 0 and math.isfinite(getattr(self, name))):  # lr=inf trained to garbage
                raise ConfigError(f"--{name.replace('_', '-')}={getattr(self, name)!r}: use a finite value > 0")
        if not (math.isfinite(self.consistency) and self.consistency >= 0):
            raise ConfigError(f"--consistency={self.consistency!r}: use a finite value >= 0")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"--device={self.device!r}: use auto, cpu or cuda")
        if not 0 <= self.head_dropout < 1:
            raise ConfigError(f"--head-dropout={self.head_dropout!r}: use a value in [0, 1)")
        return self


def groups_of(rows: list[RMRow]) -> list[list[RMRow]]:
    """Rows by call, gold first; calls without a gold row or without a perturbation are left out."""
    by: dict[str, list[RMRow]] = defaultdict(list)
    for r in rows:
        by[r.group].append(r)
    out = []
    for g in by.values():
        gold = [r for r in g if r.label > 0]
        bad = [r for r in g if r.label <= 0]
        if gold and bad:
            out.append([gold[0], *bad])
    return out


def domain_pairs(group: list[RMRow]) -> list[tuple[RMRow, RMRow]]:
    """Contrastive pairs of one SQL gold call: (benign, unfiltered) and (benign, sensitive column)."""
    import sqlglot
    from sqlglot import exp

    from agentrl_envs.core.actions import format_call, parse_action

    gold = group[0]
    if gold.tool != "sql":
        return []
    try:
        query = parse_action(gold.action).arguments["query"]
        tree = sqlglot.parse_one(query, read="sqlite")
    except Exception:
        return []
    worse = [format_call("sql", {"query": "SELECT name, email FROM staff"})]
    where = tree.find(exp.Where)
    if where is not None:
        where.pop()
        worse.append(format_call("sql", {"query": tree.sql(dialect="sqlite")}))
    return [(gold, RMRow(gold.group, gold.split, gold.domain, "sql", gold.prompt, w, -0.5, "domain.contrast")) for w in worse]


def step_loss(
    rm: RewardModel, batch: list[list[RMRow]], cfg: RMConfig, rng: random.Random
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one step on ``batch`` (calls, gold first) and its parts.

    Every text of a call (its rows cleaned, their decorated raw forms, the domain contrasts) is scored in
    one forward over the call's shared prompt.
    """
    rows = [r for g in batch for r in g]
    texts = [clean_action(r.action) if rm.clean else r.action for r in rows]
    prompts = [r.prompt for r in rows]
    n = len(rows)
    raw: list[str] = []
    if cfg.consistency > 0:
        raw = [decorate(r.action, rng.choice(DECORATIONS)) for r in rows]
    pairs = [p for g in batch for p in domain_pairs(g)] if cfg.domain_adapt else []
    contrast = [b.action for _, b in pairs]
    all_scores = rm.score(
        prompts + prompts[: len(raw)] + [b.prompt for _, b in pairs],
        texts + raw + [clean_action(c) for c in contrast],
        clean=False,
    )
    scores = all_scores[:n]
    at, loss_terms = 0, []
    for g in batch:
        s = scores[at : at + len(g)]
        at += len(g)
        if cfg.loss == "pairwise":
            loss_terms.append(F.softplus(-(s[0] - s[1:])).mean())
        else:
            loss_terms.append(((s - torch.tensor([r.label for r in g], device=s.device)) ** 2).mean())
    pref = torch.stack(loss_terms).mean()
    loss, parts = pref, {"preference": float(pref.detach())}
    if pairs:
        gold_at = {id(g[0]): sum(len(h) for h in batch[:j]) for j, g in enumerate(batch)}
        sg = scores[torch.tensor([gold_at[id(a)] for a, _ in pairs], device=scores.device)]
        dom = F.softplus(-(sg - all_scores[n + len(raw) :])).mean()
        loss, parts["domain"] = loss + dom, float(dom.detach())
    if raw:
        cons = ((all_scores[n : n + len(raw)] - scores.detach()) ** 2).mean()
        loss, parts["consistency"] = loss + cfg.consistency * cons, float(cons.detach())
    return loss, parts


def train_rm(cfg: RMConfig, *, log: Any = print, tiny_spec: Any = None) -> dict[str, Any]:
    """Train a reward model; writes it, ``metrics.jsonl`` and ``eval.json`` to ``cfg.out``; returns the summary."""
    cfg.validate()
    rows = load_rm_data(cfg.data)
    train_groups = groups_of([r for r in rows if r.split == cfg.train_split])
    if not train_groups:
        splits = sorted({r.split for r in rows})
        raise ConfigError(
            f"--data {cfg.data}: no calls with a gold row and a perturbation in split {cfg.train_split!r} "
            f"(splits present: {', '.join(splits)}); pass --train-split or make more data"
        )
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    if cfg.init:
        rm = load_rm(cfg.init, model=cfg.model, device=cfg.device, log=log)
        spec = _spec_of(rm) or tiny_spec
    else:
        rm = build_rm(
            cfg.model, device=cfg.device, tiny_spec=tiny_spec, log=log, rank=cfg.rank, alpha=2.0 * cfg.rank,
            max_tokens=cfg.max_tokens, head_dropout=cfg.head_dropout, clean=cfg.clean,
        )  # fmt: skip
        spec = tiny_spec
    rm.clean = cfg.clean
    rm.settings["clean"] = cfg.clean
    if cfg.domain_adapt:
        trained = rm.train_only_last_layers(2)
        log(f"rm: --domain-adapt trains {len(trained)} tensors (layers >= {rm.num_layers() - 2} and the head)")
    params = [p for _, p in rm.trainable_parameters()]
    head = [p for n, p in rm.trainable_parameters() if n.startswith("head.")]
    lora = [p for n, p in rm.trainable_parameters() if not n.startswith("head.")]
    opt = torch.optim.AdamW([{"params": lora, "lr": cfg.lr}, {"params": head, "lr": 5 * cfg.lr}], weight_decay=0.0)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "metrics.jsonl", "w", encoding="utf-8") as metrics:
        rm.train()
        for step in range(cfg.steps):
            batch = rng.sample(train_groups, min(cfg.groups, len(train_groups)))
            loss, parts = step_loss(rm, batch, cfg, rng)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            metrics.write(json.dumps({"step": step + 1, "loss": float(loss.detach()), **parts}) + "\n")
            if (step + 1) % 50 == 0 or step + 1 == cfg.steps:
                log(
                    f"rm: step {step + 1}/{cfg.steps} loss {float(loss.detach()):.4f} "
                    + " ".join(f"{k} {v:.4f}" for k, v in parts.items())
                )
    rm.eval()
    table = evaluate_rm(rm, rows)
    (out / "eval.json").write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    save_rm(rm, out, model=cfg.model, tiny_spec=spec, extra={"config": asdict(cfg)})
    log(markdown(table))
    return {"out": str(out), "eval": table}


def _spec_of(rm: RewardModel) -> Any:
    from agentrl_train.tiny import TinySpec

    meta = getattr(rm, "meta", {}) or {}
    return TinySpec(**meta["tiny_spec"]) if meta.get("tiny_spec") else None


# -- evaluation ----------------------------------------------------------------------------------


def auc(pos: list[float], neg: list[float]) -> float:
    """P(score of a gold row > score of a perturbed row), ties counted half; NaN when a side is empty."""
    if not pos or not neg:
        return math.nan
    p, n = np.asarray(pos)[:, None], np.asarray(neg)[None, :]
    return float(((p > n) + 0.5 * (p == n)).mean())


@torch.no_grad()
def score_rows(rm: RewardModel, rows: list[RMRow], batch: int = 16) -> list[float]:
    rm.eval()
    out: list[float] = []
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        out += rm.score([r.prompt for r in chunk], [r.action for r in chunk]).tolist()
    return out


def evaluate_rm(rm: RewardModel, rows: list[RMRow]) -> dict[str, dict[str, Any]]:
    """Pairwise accuracy and AUC per ``split/domain`` (and ``split/all``)."""
    scores = dict(zip((id(r) for r in rows), score_rows(rm, rows)))
    cells: dict[str, list[list[RMRow]]] = defaultdict(list)
    for g in groups_of(rows):
        cells[f"{g[0].split}/{g[0].domain}"].append(g)
        cells[f"{g[0].split}/all"].append(g)
    table: dict[str, dict[str, Any]] = {}
    for key in sorted(cells):
        gs = cells[key]
        wins = [scores[id(g[0])] > scores[id(r)] for g in gs for r in g[1:]]
        pos = [scores[id(g[0])] for g in gs]
        neg = [scores[id(r)] for g in gs for r in g[1:]]
        table[key] = {"calls": len(gs), "pairs": len(wins), "accuracy": float(np.mean(wins)), "auc": auc(pos, neg)}
    return table


def markdown(table: dict[str, dict[str, Any]]) -> str:
    lines = ["| split/domain | calls | pairs | pairwise accuracy | AUC |", "|---|---|---|---|---|"]
    for key, r in table.items():
        lines.append(f"| {key} | {r['calls']} | {r['pairs']} | {r['accuracy']:.3f} | {r['auc']:.3f} |")
    return "\n".join(lines) + "\n"


# -- distillation --------------------------------------------------------------------------------


def uncertainty_weights(var: np.ndarray) -> np.ndarray:
    """Per-row weights from the teacher's score variance: ``exp(-var / mean(var))``, scaled to mean 1.

    Strictly decreasing in the variance; all 1 when the teacher is equally sure everywhere.
    """
    var = np.asarray(var, dtype=np.float64)
    if var.size == 0:
        return var
    if not np.all(np.isfinite(var)) or np.any(var < 0):
        raise ConfigError("teacher variances must be finite and >= 0; the teacher's scores are broken (NaN?)")
    scale = float(var.mean())
    w = np.exp(-var / scale) if scale > 0 else np.ones_like(var)
    return w / w.mean()


@torch.no_grad()
def teacher_stats(teacher: RewardModel, rows: list[RMRow], samples: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of the teacher's score of each row over ``samples`` dropout samples."""
    if getattr(teacher.dropout, "p", 0.0) <= 0 and teacher.settings.get("lora_dropout", 0.0) <= 0:
        raise ConfigError(
            "the teacher has no dropout (head_dropout 0): its uncertainty cannot be sampled; train it with --head-dropout > 0"
        )
    torch.manual_seed(seed)
    teacher.train()
    draws = []
    for _ in range(samples):
        s = []
        for i in range(0, len(rows), 16):
            chunk = rows[i : i + 16]
            s += teacher.score([r.prompt for r in chunk], [r.action for r in chunk]).tolist()
        draws.append(s)
    teacher.eval()
    arr = np.asarray(draws)
    return arr.mean(0), arr.var(0)


def distill(
    teacher_dir: str,
    student_model: str,
    data: str,
    out: str,
    *,
    steps: int = 100,
    batch: int = 16,
    lr: float = 2e-3,
    rank: int = 4,
    samples: int = 8,
    seed: int = 0,
    device: str = "auto",
    student_spec: Any = None,
    log: Any = print,
) -> dict[str, Any]:
    """Distil a teacher reward model into a student (smaller base or rank), weighting rows by teacher certainty."""
    for name, value in (("steps", steps), ("batch", batch), ("rank", rank), ("samples", samples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"--{name}={value!r}: use an integer > 0")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
        raise ConfigError(f"--lr={lr!r}: use a finite value > 0")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ConfigError(f"--seed={seed!r}: use an integer in [0, 2**32)")  # numpy's generators refuse negative seeds
    rows = load_rm_data(data)
    teacher = load_rm(teacher_dir, device=device, log=log)
    mean, var = teacher_stats(teacher, rows, samples, seed)
    weights = uncertainty_weights(var)
    del teacher
    torch.manual_seed(seed)
    student = build_rm(student_model, device=device, tiny_spec=student_spec, log=log, rank=rank, alpha=2.0 * rank)
    params = [p for _, p in student.trainable_parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    target, w = torch.tensor(mean, dtype=torch.float32), torch.tensor(weights, dtype=torch.float32)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    student.train()
    with open(folder / "metrics.jsonl", "w", encoding="utf-8") as metrics:
        for step in range(steps):
            idx = rng.choice(len(rows), size=min(batch, len(rows)), replace=False)
            s = student.score([rows[i].prompt for i in idx], [rows[i].action for i in idx])
            wi = w[idx].to(s.device)
            loss = (wi * (s - target[idx].to(s.device)) ** 2).sum() / wi.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            metrics.write(json.dumps({"step": step + 1, "loss": float(loss.detach())}) + "\n")
    student.eval()
    with open(folder / "distill_weights.jsonl", "w", encoding="utf-8") as f:
        for r, m, v, wt in zip(rows, mean, var, weights):
            f.write(json.dumps({"group": r.group, "kind": r.kind, "teacher_mean": m, "teacher_var": v, "weight": wt}) + "\n")
    table = evaluate_rm(student, rows)
    (folder / "eval.json").write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    save_rm(student, folder, model=student_model, tiny_spec=student_spec, extra={"teacher": str(teacher_dir)})
    log(markdown(table))
    return {"out": str(folder), "eval": table, "teacher_var": var.tolist(), "weights": weights.tolist()}


# -- command line --------------------------------------------------------------------------------


#: help text of each ``agentrl-train rm`` option (the field comments of RMConfig)
_RM_HELP = {
    "data": "make-rm-data output folder or one .parquet file",
    "model": "'tiny', 'smollm2-135m', a .gguf file or a local Hugging Face model folder",
    "out": "output folder",
    "loss": "pairwise (Bradley-Terry) or pointwise (labels 1 / -0.5)",
    "steps": "optimizer steps",
    "groups": "calls (gold + its perturbations) per step",
    "lr": "AdamW learning rate",
    "rank": "LoRA rank",
    "consistency": "weight of the raw-vs-clean consistency term (0: off)",
    "clean": "clean inputs (the env's format-invariant form) before scoring",
    "domain_adapt": "train only the last 2 layers (+ head) and add domain contrastive pairs",
    "init": "start from this reward-model folder (e.g. for --domain-adapt on a trained RM)",
    "train_split": "rows of this split train; every split is evaluated",
    "max_tokens": "tokens per input (prompt cut from the left)",
    "head_dropout": "dropout before the head",
    "seed": "seed of the model, the batches and the decorations",
    "device": "auto, cpu or cuda",
}


def add_rm_parsers(sub: Any) -> None:
    """``rm``, ``rm-eval`` and ``rm-distill`` sub-commands of ``agentrl-train``."""
    p = sub.add_parser("rm", help="train a reward model on make-rm-data output", description=__doc__.split("\n\n")[0])
    for f in RMConfig.__dataclass_fields__.values():
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default, help=_RM_HELP[f.name])
        else:
            p.add_argument(
                flag,
                dest=f.name,
                type=type(f.default),
                default=f.default,
                required=f.name == "data",
                help=f"{_RM_HELP[f.name]} (default: {f.default!r})",
            )
    p.set_defaults(func=_cmd_rm)

    p = sub.add_parser("rm-eval", help="pairwise accuracy and AUC of a reward model per split and domain")
    p.add_argument("--rm", required=True, metavar="DIR", help="reward-model folder (agentrl-train rm --out)")
    p.add_argument("--data", required=True, metavar="DIR_OR_PARQUET", help="make-rm-data output (train, test, heldout files)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_rm_eval)

    p = sub.add_parser("rm-distill", help="distil a reward model into a smaller one, weighted by teacher certainty")
    p.add_argument("--teacher", required=True, metavar="DIR", help="teacher reward-model folder")
    p.add_argument("--student-model", default="tiny", metavar="M", help="'tiny' or a local model folder")
    p.add_argument("--data", required=True, metavar="DIR_OR_PARQUET", help="make-rm-data output the student trains on")
    p.add_argument("--out", default="runs/rm-student", metavar="DIR", help="student folder (default: runs/rm-student)")
    for name, kind, default, what in (
        ("steps", int, 100, "optimizer steps"),
        ("batch", int, 16, "rows per step"),
        ("lr", float, 2e-3, "AdamW learning rate"),
        ("rank", int, 4, "the student's LoRA rank"),
    ):
        p.add_argument(f"--{name}", type=kind, default=default, help=f"{what} (default: {default})")
    p.add_argument("--samples", type=int, default=8, help="dropout samples of the teacher per row (default: 8)")
    p.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    p.set_defaults(func=_cmd_rm_distill)


def _cmd_rm(args: argparse.Namespace) -> int:
    cfg = RMConfig(**{k: getattr(args, k) for k in RMConfig.__dataclass_fields__})
    train_rm(cfg)
    return 0


def _cmd_rm_eval(args: argparse.Namespace) -> int:
    table = evaluate_rm(load_rm(args.rm, device=args.device, log=lambda *a, **k: None), load_rm_data(args.data))
    print(json.dumps(table) if args.json else markdown(table), end="\n" if args.json else "")
    return 0


def _cmd_rm_distill(args: argparse.Namespace) -> int:
    distill(
        args.teacher, args.student_model, args.data, args.out, steps=args.steps, batch=args.batch, lr=args.lr,
        rank=args.rank, samples=args.samples, seed=args.seed, device=args.device,
    )  # fmt: skip
    return 0
