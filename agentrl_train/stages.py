"""``agentrl-train stages --plan plan.yaml``: preference -> tool -> exec, one LoRA adapter per stage.

A plan (the shipped default is ``agentrl_train/plans/default.yaml``) names the base model, the reward
model's data and budget, PPO options shared by every stage, and the stages in order. Each stage runs
:func:`agentrl_train.train.train` once per env of the stage (the adapter carried from env to env) and
trains a **new named adapter** while the earlier stages' adapters are loaded **active and frozen**
(``--frozen-adapters``):

1. ``preference``: ``AgentRL/Preference-v0`` (the policy writes the query of a single-call SQL task;
   reward = the reward model's score; the reward model is trained first, in the run folder, on
   ``make-rm-data`` output);
2. ``tool``: PPO on the single-tool envs ``SQL-v0``, ``Python-v0``, ``SMTP-v0``;
3. ``exec``: PPO on ``SQLPythonSMTP-v0``.

With ``compare_single: true`` the same plan also runs with **one** adapter trained through all the stages
in sequence, same updates, and the separation table compares the two after every stage: tool-call
accuracy (greedy success on the single-tool envs, their mean), task success (SQLPythonSMTP-v0) and the
preference score (mean reward-model score on Preference-v0), all on ``eval_split``.

Run folder: ``plan.yaml`` (resolved), ``rm-data/``, ``rm/``, ``<arm>/<stage>/<env>/`` (each a ppo run
folder: config, metrics, final/, eval), ``<arm>/<stage>/eval.json``, ``separation.json`` and ``separation.md``.
"""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from agentrl_envs.errors import ConfigError
from agentrl_envs.yamlsafe import load_yaml, read_yaml_file, short_repr

__all__ = ["DEFAULT_PLAN", "load_plan", "run_stages", "separation_markdown"]

DEFAULT_PLAN = "default"
TOOL_ENVS = ("AgentRL/SQL-v0", "AgentRL/Python-v0", "AgentRL/SMTP-v0")
EXEC_ENV = "AgentRL/SQLPythonSMTP-v0"
PLAN_KEYS = {"model", "seed", "compare_single", "eval_split", "eval_episodes", "rm", "ppo", "stages"}
STAGE_KEYS = {"name", "envs", "updates", "options"}
RM_KEYS = {"data_env", "train_episodes", "test_episodes", "steps", "groups", "lr", "rank", "consistency"}


def load_plan(path: str | None) -> dict[str, Any]:
    """The plan at ``path`` (or the shipped default for None / ``default``), checked.

    Raises:
        ConfigError: missing file, bad YAML, unknown keys, no stages, a stage without envs or updates,
            duplicate stage names.
    """
    if path in (None, "", DEFAULT_PLAN):
        where = "the default plan"
        plan = load_yaml(resources.files("agentrl_train").joinpath("plans/default.yaml").read_text(encoding="utf-8"), where)
    else:
        where = f"--plan {path}"
        try:
            plan = read_yaml_file(path, where)  # size, alias and depth caps; regular files only
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ConfigError(f"--plan {path}: no such file; pass a plan YAML or 'default'") from None
    if not isinstance(plan, dict):
        raise ConfigError(f"{where}: the top level must be a mapping with 'stages' (see agentrl_train/plans/default.yaml)")
    _only(plan, PLAN_KEYS, where)
    _only(plan.get("rm") or {}, RM_KEYS, f"{where}: rm")
    stages = plan.get("stages")
    if not isinstance(stages, list) or not stages:
        raise ConfigError(f"{where}: 'stages' must be a non-empty list of {{name, envs, updates}}")
    seen: set[str] = set()
    for n, st in enumerate(stages):
        if not isinstance(st, dict):
            raise ConfigError(f"{where}: stage {n} must be a mapping {{name, envs, updates}}")
        _only(st, STAGE_KEYS, f"{where}: stage {n}")
        name = st.get("name")
        if not isinstance(name, str) or not name.isidentifier() or name in seen or name == "single":
            raise ConfigError(f"{where}: stage {n} name {short_repr(name)}: use a unique identifier (not 'single'), e.g. tool")
        seen.add(name)
        envs = st.get("envs")
        if not isinstance(envs, list) or not envs or not all(isinstance(e, str) for e in envs):
            raise ConfigError(f"{where}: stage {short_repr(name)} needs 'envs', a list of env ids")
        if not isinstance(st.get("updates"), int) or st["updates"] < 1:
            raise ConfigError(f"{where}: stage {short_repr(name)} needs 'updates', a positive int (PPO updates per env)")
    for key, options in [("ppo", plan.get("ppo")), *((f"stage {st['name']}: options", st.get("options")) for st in stages)]:
        if options is not None and not (isinstance(options, dict) and all(isinstance(k, str) for k in options)):
            raise ConfigError(f"{where}: {key} must be a mapping of ppo option names to values (e.g. {{lr: 0.0003}})")
    plan.setdefault("model", "tiny")
    plan.setdefault("seed", 0)
    plan.setdefault("compare_single", True)
    plan.setdefault("eval_split", "test")
    plan.setdefault("eval_episodes", 8)
    for key in ("ppo", "rm"):  # absent or null: none
        if plan.get(key) is None:
            plan[key] = {}
    _check_values(plan, where)
    return plan


def _check_values(plan: dict[str, Any], where: str) -> None:
    """Every value a run would use, checked before the first minute of work (the reward model trains first)."""
    from agentrl_train.env_checks import check_env_id
    from agentrl_train.preference_env import register
    from agentrl_train.rm_train import RMConfig

    register()
    if not isinstance(plan["model"], str) or not plan["model"]:
        raise ConfigError(f"{where}: model={short_repr(plan['model'])}: use 'tiny' or a local model folder")
    if not isinstance(plan["compare_single"], bool):
        raise ConfigError(f"{where}: compare_single={short_repr(plan['compare_single'])}: use true or false")
    if plan["eval_split"] not in ("train", "test", "heldout"):
        raise ConfigError(f"{where}: eval_split={short_repr(plan['eval_split'])}: use train, test or heldout")
    episodes = plan["eval_episodes"]
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ConfigError(f"{where}: eval_episodes={short_repr(episodes)}: use a positive int (greedy episodes per probe)")
    rm = plan["rm"]
    for key in ("train_episodes", "test_episodes"):
        value = rm.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: rm: {key}={short_repr(value)}: use a positive int (oracle episodes)")
    try:
        check_env_id(str(rm.get("data_env", EXEC_ENV)))
        cfg = RMConfig(data="plan", device=str(plan["ppo"].get("device", "auto")))
        for key in ("steps", "groups", "lr", "rank", "consistency"):
            if key in rm:
                if isinstance(rm[key], bool) or not isinstance(rm[key], (int, float)):
                    raise ConfigError(f"--{key}={short_repr(rm[key])}: use a number")
                setattr(cfg, key, type(getattr(cfg, key))(rm[key]))
        cfg.validate()
    except ConfigError as exc:
        raise ConfigError(f"{where}: rm: {exc}") from None
    for st in plan["stages"]:
        options = st.get("options") or {}
        if not isinstance(options, dict):
            raise ConfigError(f"{where}: stage {short_repr(st['name'])}: options must be a mapping of ppo options")
        for env_id in st["envs"]:
            try:
                check_env_id(env_id)
                _cfg(plan, Path("plan-check"), **{**options, **_env_opts(env_id, Path("rm")), "updates": st["updates"]})
            except ConfigError as exc:
                raise ConfigError(f"{where}: stage {short_repr(st['name'])} ({env_id[:200]}): {exc}") from None


def _only(d: Any, allowed: set[str], where: str) -> None:
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: must be a mapping")
    unknown = sorted(short_repr(k, 40) for k in d if k not in allowed)  # keys of any type and length
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown[:10])}; known: {', '.join(sorted(allowed))}")


def _short(env_id: str) -> str:
    return env_id.split("/")[-1]


def _cfg(plan: dict[str, Any], out: Path, **opts: Any) -> Any:
    from agentrl_train.config_io import load_config

    base = {"model": plan["model"], "seed": plan["seed"], "progress": False, "tensorboard": False, "record": False}
    # The stage's eval is probe()'s (every probe env, one policy); the ppo run's own final table is skipped.
    base.update(eval_every=0, final_eval_splits=[], eval_episodes=plan["eval_episodes"])
    return load_config(None, {**base, **plan["ppo"], **opts, "out": str(out)})


def _tiny_spec(plan: dict[str, Any]) -> Any:
    from agentrl_train.tiny import TinySpec

    ppo = plan["ppo"]
    default = TinySpec()
    return TinySpec(
        pretrain_steps=int(ppo.get("tiny_pretrain_steps", default.pretrain_steps)),
        corpus_episodes=int(ppo.get("tiny_corpus_episodes", default.corpus_episodes)),
    )


def _env_opts(env_id: str, rm_dir: Path) -> dict[str, Any]:
    from agentrl_train.preference_env import ENV_ID

    if env_id == ENV_ID:
        # One process: the reward model lives beside the policy, loaded once.
        return {"env": env_id, "env_kwargs": {"rm": str(rm_dir), "base_env": "AgentRL/SQL-v0"}, "vectorization": "sync"}
    return {"env": env_id}


def train_reward_model(plan: dict[str, Any], out: Path, log: Any) -> Path:
    """make-rm-data (train and test splits) and ``agentrl-train rm``, in the run folder; returns the RM folder."""
    from agentrl_envs.analysis.counterfactual import make_rm_data
    from agentrl_train.rm_train import RMConfig, train_rm

    r = plan["rm"]
    rm_dir = out / "rm"
    if (rm_dir / "rm.json").exists():
        return rm_dir
    data = out / "rm-data"
    env = r.get("data_env", EXEC_ENV)
    make_rm_data(env, int(r.get("train_episodes", 16)), data, seed=plan["seed"], split="train")
    make_rm_data(env, int(r.get("test_episodes", 6)), data, seed=plan["seed"], split="test")
    cfg = RMConfig(
        data=str(data), model=plan["model"], out=str(rm_dir), seed=plan["seed"], device=plan["ppo"].get("device", "auto")
    )
    for key in ("steps", "groups", "lr", "rank", "consistency"):
        if key in r:
            setattr(cfg, key, type(getattr(cfg, key))(r[key]))
    train_rm(cfg, tiny_spec=_tiny_spec(plan), log=log)
    return rm_dir


def run_arm(plan: dict[str, Any], out: Path, rm_dir: Path, arm: str, log: Any) -> list[dict[str, Any]]:
    """Train every stage of one arm (``separate``: an adapter per stage; ``single``: one adapter); rows of the table."""
    from agentrl_train.train import train

    rows = [{"arm": arm, "after": "base", **probe(plan, out / arm / "base", rm_dir, adapter="base", log=log)}]
    frozen: list[str] = []
    last_final = ""
    for st in plan["stages"]:
        adapter = st["name"] if arm == "separate" else "single"
        init = last_final if arm == "single" else ""
        for env_id in st["envs"]:
            run_dir = out / arm / st["name"] / _short(env_id)
            opts = {**(st.get("options") or {}), **_env_opts(env_id, rm_dir), "updates": st["updates"]}
            cfg = _cfg(plan, run_dir, adapter=adapter, init_adapter=init, frozen_adapters=list(frozen), **opts)
            log(f"stages [{arm}] {st['name']}: {env_id}, {st['updates']} updates, adapter {adapter!r}, frozen {frozen or '-'}")
            train(cfg, log=lambda *a, **k: None)
            init = last_final = str(run_dir / "final")
        row = probe(plan, out / arm / st["name"], rm_dir, adapter=adapter, init=last_final, frozen=frozen, log=log)
        rows.append({"arm": arm, "after": st["name"], **row})
        if arm == "separate":
            frozen = [*frozen, f"{adapter}={last_final}"]
    return rows


def probe(
    plan: dict[str, Any], folder: Path, rm_dir: Path, *, adapter: str, init: str = "", frozen: list[str] | None = None, log: Any
) -> dict[str, Any]:
    """Greedy eval of one policy on the tool envs, the exec env and Preference-v0; written to ``folder/eval.json``."""
    from agentrl_train.evaluate import evaluate
    from agentrl_train.policy import build_policy
    from agentrl_train.preference_env import ENV_ID

    folder.mkdir(parents=True, exist_ok=True)
    cfg = _cfg(plan, folder, adapter=adapter, init_adapter=init, frozen_adapters=list(frozen or []))
    policy = build_policy(cfg, log=lambda *a, **k: None)
    results: dict[str, Any] = {}
    for env_id in (*TOOL_ENVS, EXEC_ENV, ENV_ID):
        c = copy.deepcopy(cfg)
        for k, v in _env_opts(env_id, rm_dir).items():
            setattr(c.env, k, v)
        results[_short(env_id)] = evaluate(policy, c, plan["eval_split"], plan["eval_episodes"])
    row = {
        "tool_accuracy": sum(results[_short(e)]["success_rate"] for e in TOOL_ENVS) / len(TOOL_ENVS),
        **{f"{_short(e)}_success": results[_short(e)]["success_rate"] for e in TOOL_ENVS},
        "task_success": results[_short(EXEC_ENV)]["success_rate"],
        "preference_score": results[_short(ENV_ID)]["mean_return"],
        "adapters": policy.active_adapters(),
    }
    (folder / "eval.json").write_text(json.dumps({"summary": row, "envs": results}, indent=2) + "\n", encoding="utf-8")
    log(
        f"stages: {folder.name}: tool accuracy {row['tool_accuracy']:.3f}, task success {row['task_success']:.3f}, preference {row['preference_score']:.3f}"
    )
    return row


def separation_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| arm | after stage | active adapters | tool-call accuracy (SQL / Python / SMTP) | task success (SQLPythonSMTP) | preference score |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        per = " / ".join(f"{r[f'{_short(e)}_success']:.2f}" for e in TOOL_ENVS)
        lines.append(
            f"| {r['arm']} | {r['after']} | {', '.join(r['adapters'])} | {r['tool_accuracy']:.3f} ({per}) | "
            f"{r['task_success']:.3f} | {r['preference_score']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def run_stages(plan_path: str | None, out: str, *, log: Any = print, plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run a plan (both arms when ``compare_single``); writes the run folder; returns the table rows."""
    from agentrl_train.preference_env import register

    register()
    plan = plan if plan is not None else load_plan(plan_path)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.yaml").write_text(yaml.safe_dump(plan, sort_keys=False), encoding="utf-8")
    log("stages: training the reward model")
    rm_dir = train_reward_model(plan, folder, log)
    rows = run_arm(plan, folder, rm_dir, "separate", log)
    if plan["compare_single"]:
        rows += run_arm(plan, folder, rm_dir, "single", log)
    (folder / "separation.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    table = separation_markdown(rows)
    (folder / "separation.md").write_text(table, encoding="utf-8")
    log(table)
    return {"out": str(folder), "rows": rows}


def add_stages_parser(sub: Any) -> None:
    p = sub.add_parser("stages", help="preference -> tool -> exec, one adapter per stage, and the separation table")
    p.add_argument(
        "--plan", default=DEFAULT_PLAN, metavar="YAML", help="plan file (default: the shipped agentrl_train/plans/default.yaml)"
    )
    p.add_argument("--out", default="runs/stages", metavar="DIR", help="run folder (default: runs/stages)")
    p.set_defaults(func=lambda args: (run_stages(args.plan, args.out), 0)[1])
