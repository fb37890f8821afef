"""Reward validation report: ``agentrl-envs check-rewards ID``, a Markdown page with PNG plots.

It runs each agent on the train and heldout splits and checks:

- (a) reward terms (``info["reward_components"]``): no spikes and no dominating values. A *spike* is a
  non-zero value more than ``spike_k`` robust sigmas from its term's median, where the robust sigma
  is ``max(1.4826 * MAD, 0.1 * |median| + 0.01)`` over the term's non-zero values (the floor keeps a
  term that is nearly always one value from flagging its rare other values). A *dominating* value
  is a single non-``task`` value at least ``max_dominance`` times the success reward in size: one
  such step outweighs solving the task;
- (b) cross-tool correlations: per episode, each term summed over the steps of each tool type
  (``info["tool"]``), correlated with each other and with success (informational; a bonus that
  anti-correlates with success is listed as a warning);
- (c) temporal credit assignment on the long-horizon variant (SQLPythonSMTP only): the weight with
  which the terminal reward reaches each step under GAE and under the hierarchical estimator
  (:mod:`agentrl_envs.rewards.advantages`); the hierarchical weight at the first step must reach
  ``min_credit``;
- (d) domain shift: success and mean return per agent on train and heldout; the success gap must
  stay within ``max_domain_gap``; the oracle must reach ``min_oracle_success`` and the random agent
  stay at or below ``max_random_success`` on each split; the oracle's mean return must beat the
  random agent's by ``min_return_gap``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import textwrap
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from agentrl_envs.errors import ConfigError
from agentrl_envs.rewards import RewardConfig
from agentrl_envs.rewards.advantages import credit_weights, subtask_boundaries

__all__ = ["AGENTS", "Thresholds", "add_arguments", "check_rewards", "cmd_check_rewards"]

AGENTS = ("oracle", "random")
SPLITS = ("train", "heldout")
#: The ids with a long-horizon variant (the credit section); v0 has fixed-length oracle episodes.
LONG_HORIZON_ENVS = ("AgentRL/SQLPythonSMTP-v1", "AgentRL/SQLPythonSMTP-v0")
CREDIT_EPISODES = 3
IMAGES = ("rewards_distribution.png", "correlation.png", "credit_assignment.png", "domain_shift.png")


@dataclass(frozen=True)
class Thresholds:
    """Pass/fail limits of :func:`check_rewards`.

    Attributes:
        min_oracle_success: the oracle's success rate on each split must reach this.
        max_random_success: the random agent's success rate on each split must not exceed this.
        min_return_gap: oracle mean return minus random mean return (all splits) must reach this.
        spike_k: robust sigmas beyond which a non-zero term value is a spike.
        max_spikes: spikes allowed over all terms.
        max_dominance: a non-task value of size >= this x the success reward dominates; none allowed.
        max_domain_gap: |train - heldout| success rate allowed per agent.
        min_credit: hierarchical credit weight the first step of a long-horizon episode must keep.
    """

    min_oracle_success: float = 0.95
    max_random_success: float = 0.2
    min_return_gap: float = 0.5
    spike_k: float = 8.0
    max_spikes: int = 0
    max_dominance: float = 1.0
    max_domain_gap: float = 0.2
    min_credit: float = 0.5

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
                raise ConfigError(f"threshold {f.name}={value!r}: use a finite non-negative number")


@dataclass
class _Episode:
    agent: str
    split: str
    success: bool
    ret: float
    steps: list[tuple[str, dict[str, float]]] = field(default_factory=list)  # (tool, reward components)


def check_rewards(
    env_id: str,
    episodes: int,
    agents: Any = AGENTS,
    out_dir: str | Path = "reward-report",
    thresholds: Thresholds | None = None,
    seed: int = 0,
    gamma: float = 0.99,
    lam: float = 0.95,
    error_profile: str = "none",
    progress: bool = True,
) -> tuple[bool, Path]:
    """Run the agents and write ``out_dir/report.md``, its PNG plots and ``summary.json``.

    Args:
        env_id: a registered agentrl id.
        episodes: episodes per agent and split (episode i uses reset seed ``seed + i``).
        agents: names from :data:`AGENTS`, as a list or a comma-separated string.
        out_dir: where the report goes (created if missing).
        thresholds: pass/fail limits (default :class:`Thresholds`).
        seed: first reset seed, and the random agent's seed.
        gamma, lam: discount and GAE lambda of the credit-assignment section.
        error_profile: fault profile of the runs (``"none"``: no faults).
        progress: show a tqdm bar on stderr.

    Returns:
        ``(passed, path of report.md)``.

    Raises:
        ConfigError: unknown env id or agent, episodes < 1, a negative seed, gamma or lam outside [0, 1],
            or an unwritable ``out_dir``.
    """
    import agentrl_envs
    from agentrl_envs.analysis.counterfactual import _writable_dir

    names = _agent_names(agents)
    if env_id not in agentrl_envs.ALL_IDS:
        raise ConfigError(f"unknown environment {str(env_id)[:80]!r}; available: {', '.join(agentrl_envs.ENV_IDS)}")
    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes < 1:
        raise ConfigError(f"episodes={episodes!r}: use a positive number of episodes per agent and split")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed={seed!r}: use a non-negative int")
    credit_weights(1, gamma, lam)  # checks gamma and lam before any episode runs
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(
            "check-rewards draws its plots with matplotlib: pip install -e '.[report]' from a checkout (or matplotlib)"
        )
    limits = thresholds or Thresholds()
    out = _writable_dir(out_dir)
    for stale in IMAGES:  # a report from an earlier run must not show through
        (out / stale).unlink(missing_ok=True)
    from tqdm import tqdm

    credit_n = min(episodes, CREDIT_EPISODES) if env_id in LONG_HORIZON_ENVS else 0
    bar = tqdm(
        total=len(names) * len(SPLITS) * episodes + credit_n, desc=f"check-rewards {env_id}", unit="ep", disable=not progress
    )
    try:
        runs = _run(env_id, names, episodes, seed, error_profile, bar)
        credit = _credit(env_id, credit_n, seed, gamma, lam, error_profile, bar) if credit_n else None
    finally:
        bar.close()
    terms = _term_stats(runs, limits)
    corr = _correlation(runs)
    domain = {a: {s: _summary([e for e in runs if e.agent == a and e.split == s]) for s in SPLITS} for a in names}
    checks = _checks(terms, credit, domain, limits)
    passed = all(c["passed"] for c in checks)
    title = f"{env_id}, faults {error_profile}, {episodes} episodes per agent and split from seed {seed}"
    images = _plots(out, terms, corr, credit, domain, gamma, lam, title)
    params = {"env_id": env_id, "episodes": episodes, "agents": names, "seed": seed, "gamma": gamma, "lam": lam}
    params["error_profile"] = error_profile
    summary = {"passed": passed, "params": params, "thresholds": asdict(limits), "checks": checks}
    public_terms = {t: {k: v for k, v in s.items() if k != "values"} for t, s in terms.items()}
    summary.update(terms=public_terms, domain=domain, credit=credit, correlation_warnings=corr["warnings"])
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float) + "\n", encoding="utf-8")
    path = out / "report.md"
    path.write_text(_markdown(summary, corr, images, limits), encoding="utf-8")
    return passed, path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``agentrl-envs check-rewards``; every threshold is an option."""
    parser.add_argument("env_id", metavar="ID", help="environment id, e.g. AgentRL/SQLPythonSMTP-v1")
    parser.add_argument("--episodes", type=int, default=20, help="episodes per agent and split (default 20)")
    parser.add_argument("--agents", default="oracle,random", help=f"comma-separated agents ({', '.join(AGENTS)})")
    parser.add_argument("--out", default="reward-report", help="output directory (default reward-report)")
    parser.add_argument("--seed", type=int, default=0, help="first reset seed; episode i uses seed+i")
    parser.add_argument("--gamma", type=float, default=0.99, help="discount for the credit-assignment plot")
    parser.add_argument("--lam", type=float, default=0.95, help="GAE lambda for the credit-assignment plot")
    parser.add_argument("--error-profile", default="none", help="fault profile of the runs (default none)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    for f in fields(Thresholds):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, type=type(f.default), default=f.default, help=f"threshold (default {f.default})")


def cmd_check_rewards(args: argparse.Namespace) -> int:
    """``agentrl-envs check-rewards ID ...``: 0 when every check passes, 1 when one fails."""
    limits = Thresholds(**{f.name: getattr(args, f.name) for f in fields(Thresholds)})
    passed, path = check_rewards(
        args.env_id,
        args.episodes,
        args.agents,
        args.out,
        limits,
        seed=args.seed,
        gamma=args.gamma,
        lam=args.lam,
        error_profile=args.error_profile,
        progress=not args.no_progress,
    )
    summary = json.loads((path.parent / "summary.json").read_text(encoding="utf-8"))
    for c in summary["checks"]:
        print(f"{'PASS' if c['passed'] else 'FAIL'}  {c['name']}: {c['value']} ({c['rule']})")
    print(f"{'passed' if passed else 'FAILED'}: report at {path}", file=sys.stdout if passed else sys.stderr)
    return 0 if passed else 1


# -- running -------------------------------------------------------------------------------------


def _agent_names(agents: Any) -> list[str]:
    names = [a.strip() for a in agents.split(",")] if isinstance(agents, str) else [str(a) for a in agents]
    names = list(dict.fromkeys(n for n in names if n))
    bad = [n for n in names if n not in AGENTS]
    if not names or bad:
        shown = ", ".join(repr(b[:40]) for b in bad) or "none given"
        raise ConfigError(f"agents ({shown}): use a comma-separated list of {', '.join(AGENTS)}")
    return names


def _make_agent(name: str, env: Any, seed: int) -> Any:
    from agentrl_envs.agents import OracleAgent, RandomAgent

    return OracleAgent(env) if name == "oracle" else RandomAgent(env, seed=seed)


def _run(env_id: str, names: list[str], episodes: int, seed: int, error_profile: str, bar: Any) -> list[_Episode]:
    import gymnasium as gym

    runs = []
    for name in names:
        for split in SPLITS:
            env = gym.make(env_id, split=split, error_profile=error_profile)
            agent = _make_agent(name, env, seed + 7919 * SPLITS.index(split))
            try:
                for i in range(episodes):
                    observation, info = env.reset(seed=seed + i)
                    episode, done = _Episode(name, split, False, 0.0), False
                    while not done:
                        observation, reward, terminated, truncated, info = env.step(agent.act(observation, info))
                        episode.steps.append((str(info["tool"]), {k: float(v) for k, v in info["reward_components"].items()}))
                        episode.ret += float(reward)
                        done = terminated or truncated
                    episode.success = bool(info["success"])
                    runs.append(episode)
                    bar.update(1)
            finally:
                env.close()
    return runs


def _credit(env_id: str, n: int, seed: int, gamma: float, lam: float, error_profile: str, bar: Any) -> dict[str, Any]:
    import gymnasium as gym

    env = gym.make(env_id, long_horizon=True, error_profile=error_profile)
    agent = _make_agent("oracle", env, seed)
    curves: dict[str, list[np.ndarray[Any, Any]]] = {"gae": [], "hier_tool": [], "hier_subtask": []}
    try:
        for i in range(n):
            observation, info = env.reset(seed=seed + i)
            infos, done = [], False
            while not done:
                observation, _, terminated, truncated, info = env.step(agent.act(observation, info))
                infos.append(info)
                done = terminated or truncated
            T = len(infos)
            # Reversed: index d is d steps before the rewarded last step.
            curves["gae"].append(credit_weights(T, gamma, lam)[::-1])
            curves["hier_tool"].append(credit_weights(T, gamma, lam, subtask_boundaries(infos))[::-1])
            curves["hier_subtask"].append(credit_weights(T, gamma, lam, subtask_boundaries(infos, by="subtask"))[::-1])
            bar.update(1)
    finally:
        env.close()
    longest = max(len(c) for c in curves["gae"])
    out: dict[str, Any] = {"episodes": n, "mean_length": float(np.mean([len(c) for c in curves["gae"]]))}
    for key, items in curves.items():
        out[key] = [float(np.mean([c[d] for c in items if len(c) > d])) for d in range(longest)]
    return out


# -- statistics ----------------------------------------------------------------------------------


def _term_stats(runs: list[_Episode], limits: Thresholds) -> dict[str, dict[str, Any]]:
    success = RewardConfig().success
    names = list(dict.fromkeys(k for e in runs for _, comp in e.steps for k in comp))
    out = {}
    for term in names:
        values = np.array([comp.get(term, 0.0) for e in runs for _, comp in e.steps])
        nonzero = values[values != 0]
        med = float(np.median(nonzero)) if nonzero.size else 0.0
        mad = float(np.median(np.abs(nonzero - med))) if nonzero.size else 0.0
        sigma = max(1.4826 * mad, 0.1 * abs(med) + 0.01)
        spikes = nonzero[np.abs(nonzero - med) > limits.spike_k * sigma]
        dominating = nonzero[np.abs(nonzero) >= limits.max_dominance * success] if term != "task" else nonzero[:0]
        out[term] = {
            "steps": int(values.size),
            "nonzero": int(nonzero.size),
            "mean_per_episode": float(values.sum() / max(1, len(runs))),
            "min": float(values.min()) if values.size else 0.0,
            "max": float(values.max()) if values.size else 0.0,
            "median_nonzero": med,
            "robust_sigma": sigma,
            "spikes": int(spikes.size),
            "spike_values": sorted({round(float(v), 4) for v in spikes})[:5],
            "dominating": int(dominating.size),
            "dominating_values": sorted({round(float(v), 4) for v in dominating})[:5],
            "values": nonzero.tolist(),
        }
    return out


def _correlation(runs: list[_Episode]) -> dict[str, Any]:
    labels = sorted({f"{term}@{tool}" for e in runs for tool, comp in e.steps for term in comp})
    table = np.zeros((len(runs), len(labels) + 1))
    index = {label: j for j, label in enumerate(labels)}
    for i, e in enumerate(runs):
        for tool, comp in e.steps:
            for term, value in comp.items():
                table[i, index[f"{term}@{tool}"]] += value
        table[i, -1] = float(e.success)
    labels.append("success")
    varying = [j for j in range(len(labels)) if len(runs) > 1 and table[:, j].std() > 0]
    constant = [labels[j] for j in range(len(labels)) if j not in varying]
    kept = [labels[j] for j in varying]
    matrix = np.ones((len(varying), len(varying)))
    if len(varying) >= 2:
        matrix = np.atleast_2d(np.asarray(np.corrcoef(table[:, varying].T), dtype=np.float64))
    warnings = []
    if "success" in kept:
        s = kept.index("success")
        for j, label in enumerate(kept[:-1]):
            if not label.startswith("task@") and table[:, varying[j]].mean() > 0 and matrix[j, s] < -0.2:
                warnings.append(f"{label} is a bonus that anti-correlates with success (r = {matrix[j, s]:+.2f})")
    return {"labels": kept, "matrix": np.atleast_2d(matrix).tolist(), "constant": constant, "warnings": warnings}


def _summary(runs: list[_Episode]) -> dict[str, float]:
    n = len(runs)
    return {
        "episodes": n,
        "success": sum(e.success for e in runs) / n if n else 0.0,
        "mean_return": float(np.mean([e.ret for e in runs])) if n else 0.0,
        "mean_steps": float(np.mean([len(e.steps) for e in runs])) if n else 0.0,
    }


def _checks(
    terms: dict[str, Any], credit: dict[str, Any] | None, domain: dict[str, Any], limits: Thresholds
) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []

    def add(name: str, value: float, rule: str, passed: bool) -> None:
        shown = int(value) if isinstance(value, (int, np.integer)) else round(float(value), 4)
        checks.append({"name": name, "value": shown, "rule": rule, "passed": bool(passed)})

    spikes = sum(t["spikes"] for t in terms.values())
    add(
        "reward spikes",
        spikes,
        f"<= {limits.max_spikes} (abs(x - median) > {limits.spike_k} robust sigmas)",
        spikes <= limits.max_spikes,
    )
    dominating = sum(t["dominating"] for t in terms.values())
    add("dominating values", dominating, f"0 non-task values with abs(x) >= {limits.max_dominance} x success", dominating == 0)
    for agent, splits in domain.items():
        gap = abs(splits["train"]["success"] - splits["heldout"]["success"])
        add(f"{agent} domain gap", gap, f"<= {limits.max_domain_gap}", gap <= limits.max_domain_gap)
        for split, s in splits.items():
            if agent == "oracle":
                add(
                    f"oracle success ({split})",
                    s["success"],
                    f">= {limits.min_oracle_success}",
                    s["success"] >= limits.min_oracle_success,
                )
            else:
                add(
                    f"random success ({split})",
                    s["success"],
                    f"<= {limits.max_random_success}",
                    s["success"] <= limits.max_random_success,
                )
    if "oracle" in domain and "random" in domain:
        gap = np.mean([domain["oracle"][s]["mean_return"] - domain["random"][s]["mean_return"] for s in SPLITS])
        add("oracle - random mean return", gap, f">= {limits.min_return_gap}", gap >= limits.min_return_gap)
    if credit is not None:
        first = min(credit["hier_tool"][-1], credit["hier_subtask"][-1])
        add("hierarchical credit at the first step", first, f">= {limits.min_credit}", first >= limits.min_credit)
    return checks


# -- output --------------------------------------------------------------------------------------


def _plots(
    out: Path,
    terms: dict[str, Any],
    corr: dict[str, Any],
    credit: dict[str, Any] | None,
    domain: dict[str, Any],
    gamma: float,
    lam: float,
    title: str,
) -> dict[str, str]:
    from matplotlib.figure import Figure  # the Agg canvas, no pyplot state: headless and thread-safe

    images: dict[str, str] = {}

    def save(fig: Any, name: str, what: str = "") -> None:
        # every image names the run that drew it, wrapped to the figure's width
        fig.suptitle(textwrap.fill(f"{title}{what}", width=int(fig.get_figwidth() * 13)), fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=80)
        images[name.split(".")[0]] = name

    shown = [t for t, s in terms.items() if s["nonzero"]] or list(terms)[:1]
    fig = Figure(figsize=(3.2 * max(1, len(shown)), 2.8))
    for ax, term in zip(np.atleast_1d(fig.subplots(1, max(1, len(shown)), squeeze=False)[0]), shown):
        s = terms[term]
        if s["values"]:
            ax.hist(s["values"], bins=30, color="tab:blue")
        for v in s["spike_values"] + s["dominating_values"]:
            ax.axvline(v, color="tab:red", linestyle="--", linewidth=1)
        ax.set_title(f"{term}: {s['nonzero']}/{s['steps']} steps non-zero", fontsize=9)
        ax.set_xlabel("value (non-zero steps)", fontsize=8)
    save(fig, "rewards_distribution.png")

    labels, matrix = corr["labels"], np.array(corr["matrix"])
    fig = Figure(figsize=(1.6 + 0.55 * max(2, len(labels)), 1.2 + 0.5 * max(2, len(labels))))
    ax = fig.subplots()
    if len(labels) >= 2:
        image = ax.imshow(matrix, vmin=-1, vmax=1, cmap="coolwarm")
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        for i in range(len(labels)):
            for j in range(len(labels)):
                ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6)
        fig.colorbar(image, ax=ax, shrink=0.8)
    else:
        ax.text(0.5, 0.5, "fewer than two varying terms", ha="center", va="center")
        ax.set_axis_off()
    ax.set_title("per-episode term sums by tool: correlation", fontsize=9)
    save(fig, "correlation.png")

    if credit is not None:
        fig = Figure(figsize=(6.4, 3.2))
        ax = fig.subplots()
        d = np.arange(len(credit["gae"]))
        ax.plot(d, credit["gae"], "o-", markersize=3, label=f"GAE (gamma={gamma}, lambda={lam})")
        ax.plot(d, credit["hier_tool"], "s-", markersize=3, label="hierarchical, tool-change boundaries")
        ax.plot(d, credit["hier_subtask"], "^-", markersize=3, label="hierarchical, sub-task boundaries")
        ax.set_xlabel("steps before the rewarded step")
        ax.set_ylabel("weight of the terminal reward")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, "credit_assignment.png", f"; credit: long horizon, oracle, {credit['episodes']} episodes")

    fig = Figure(figsize=(7.0, 2.8))
    axes = fig.subplots(1, 2)
    agents = list(domain)
    for ax, key in zip(axes, ("success", "mean_return")):
        for k, split in enumerate(SPLITS):
            ax.bar(np.arange(len(agents)) + 0.38 * k, [domain[a][split][key] for a in agents], width=0.38, label=split)
        ax.set_xticks(np.arange(len(agents)) + 0.19, agents)
        ax.set_title(key.replace("_", " "), fontsize=9)
        ax.axhline(0, color="black", linewidth=0.5)
    axes[0].legend(fontsize=7)
    save(fig, "domain_shift.png")
    return images


def _markdown(summary: dict[str, Any], corr: dict[str, Any], images: dict[str, str], limits: Thresholds) -> str:
    p, terms, credit = summary["params"], summary["terms"], summary["credit"]
    lines = [
        f"# Reward check: {p['env_id']}: {'PASSED' if summary['passed'] else 'FAILED'}",
        "",
        f"Agents {', '.join(p['agents'])}; {p['episodes']} episodes per agent and split (seeds {p['seed']}..."
        f"{p['seed'] + p['episodes'] - 1}); error profile `{p['error_profile']}`.",
        "",
        "## Checks",
        "",
        "| check | value | rule | result |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {c['name']} | {c['value']} | {c['rule']} | {'pass' if c['passed'] else '**FAIL**'} |" for c in summary["checks"]
    ]
    lines += [
        "",
        "## (a) Reward terms",
        "",
        f"A spike is a non-zero value more than {limits.spike_k} robust sigmas from its term's median (robust sigma ="
        " max(1.4826 MAD, 0.1 |median| + 0.01) over the non-zero values). A dominating value is a single non-task"
        f" value of size >= {limits.max_dominance} x the success reward.",
        "",
        "| term | non-zero steps | mean per episode | min | max | median (non-zero) | spikes | dominating |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for term, s in terms.items():
        lines.append(
            f"| {term} | {s['nonzero']}/{s['steps']} | {s['mean_per_episode']:+.3f} | {s['min']:+.3f} | {s['max']:+.3f} | "
            f"{s['median_nonzero']:+.3f} | {s['spikes']} {s['spike_values'] or ''} | {s['dominating']} {s['dominating_values'] or ''} |"
        )
    lines += ["", f"![reward terms]({images['rewards_distribution']})", "", "## (b) Cross-tool correlation", ""]
    lines.append(
        "Per episode, each term summed over the steps of each tool type (`term@tool`; `None` is an action that"
        " named no valid tool), correlated across episodes of all agents and splits, with success."
    )
    if corr["constant"]:
        lines += ["", "Constant over every episode (left out): " + ", ".join(f"`{c}`" for c in corr["constant"]) + "."]
    lines += ["", *[f"- warning: {w}" for w in corr["warnings"]], "", f"![correlation]({images['correlation']})", ""]
    lines += ["## (c) Temporal credit assignment", ""]
    if credit is None:
        lines.append(f"Not applicable: only {' and '.join(LONG_HORIZON_ENVS)} have a long-horizon variant.")
    else:
        lines.append(
            f"Oracle on the long-horizon variant ({credit['episodes']} episodes, {credit['mean_length']:.0f} steps): the"
            f" weight with which the terminal reward reaches a step d steps earlier (gamma={p['gamma']}, lambda={p['lam']})."
            " GAE gives (gamma lambda)^d; the hierarchical estimator gives gamma^d lambda^(steps left in the step's own"
            " sub-task). Tool-change boundaries (`info['subtask_boundary']`) fire at every step of the"
            " sql -> python -> smtp chain, so with them the estimator reduces to discounted Monte Carlo returns;"
            " sub-task boundaries (`info['subtask_index']`) keep GAE inside each sub-task."
        )
        lines += ["", "| steps before | GAE | hierarchical (tool) | hierarchical (sub-task) |", "|---|---|---|---|"]
        for d in sorted({x for x in (5, 10, 15, len(credit["gae"]) - 1) if x < len(credit["gae"])}):
            lines.append(f"| {d} | {credit['gae'][d]:.3f} | {credit['hier_tool'][d]:.3f} | {credit['hier_subtask'][d]:.3f} |")
        lines += ["", f"![credit assignment]({images['credit_assignment']})"]
    lines += [
        "",
        "## (d) Domain shift",
        "",
        "| agent | split | episodes | success | mean return | mean steps |",
        "|---|---|---|---|---|---|",
    ]
    for agent, splits in summary["domain"].items():
        for split, s in splits.items():
            lines.append(
                f"| {agent} | {split} | {s['episodes']} | {s['success']:.1%} | {s['mean_return']:+.3f} | {s['mean_steps']:.1f} |"
            )
    lines += ["", f"![domain shift]({images['domain_shift']})", ""]
    return "\n".join(lines)
