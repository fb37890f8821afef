"""The trainer's YAML inputs (``--config``, a run folder's ``config.yaml``, ``--plan``, option strings)
go through agentrl_envs.yamlsafe: alias bombs, FIFOs and huge values give short ConfigErrors.

Issue #33 (finding 6): a 326-byte config whose ``lr`` was a billion-laughs list loaded at once and then
ran out of memory after 48 s, or hung, formatting ``--lr=[...]: use a number``. Hostile loads run in a
child process with a bounded wait (60 s against a load that never returned).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl_envs.errors import ConfigError
from agentrl_train.config_io import load_config, read_run_config
from agentrl_train.stages import load_plan

ROOT = Path(__file__).resolve().parents[2]
STAGES = "stages: [{name: tool, envs: [AgentRL/SQL-v0], updates: 1}]\n"


def laughs(levels: int = 9) -> str:
    """A flow list of anchors, each holding 9 aliases of the one before: 9**9 leaves once expanded."""
    items = ["&l0 [" + ",".join(["lol"] * 9) + "]"]
    items += [f"&l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


CASES = {
    # (entry point, file name, text)
    "--config, flat lr": ("config", "run.yaml", f"lr: {laughs()}\n"),
    "--config, section": ("config", "run.yaml", f"ppo: {{lr: {laughs()}}}\n"),
    "--config, env_kwargs": ("config", "run.yaml", f"env: {{env_kwargs: {laughs()}}}\n"),
    "--config, option name": ("config", "run.yaml", f"x: &k {laughs()}\n"),
    "run folder config.yaml": ("run", "config.yaml", f"ppo: {{lr: {laughs()}}}\n"),
    "--plan, model": ("plan", "plan.yaml", f"model: {laughs()}\n{STAGES}"),
    "--plan, stage name": ("plan", "plan.yaml", f"stages: [{{name: {laughs()}, envs: [AgentRL/SQL-v0], updates: 1}}]\n"),
    "--plan, ppo option": ("plan", "plan.yaml", f"ppo: {{lr: {laughs()}}}\n{STAGES}"),
    "--plan, rm": ("plan", "plan.yaml", f"rm: {{steps: {laughs()}}}\n{STAGES}"),
}

_CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from agentrl_envs.errors import ConfigError
    from agentrl_train.config_io import load_config, read_run_config
    from agentrl_train.stages import load_plan

    out = {}
    for name, (entry, path) in json.loads(sys.argv[1]).items():
        load = {"config": load_config, "run": lambda p: read_run_config(Path(p).parent), "plan": load_plan}[entry]
        try:
            load(path)
            out[name] = "loaded"
        except ConfigError as exc:
            out[name] = str(exc)
    text = Path(json.loads(sys.argv[1])["--config, flat lr"][1]).read_text()
    try:
        load_config(None, {"env_kwargs": text.removeprefix("lr: ")})
        out["option string"] = "loaded"
    except ConfigError as exc:
        out["option string"] = str(exc)
    print(json.dumps(out))
    """
)


def run_child(script: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,  # the bounded wait: the old code hung here or died of MemoryError
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_alias_bombs_are_refused_at_every_entry_point(tmp_path: Path) -> None:
    paths = {}
    for n, (name, (entry, filename, text)) in enumerate(CASES.items()):
        folder = tmp_path / str(n)
        folder.mkdir()
        (folder / filename).write_text(text, encoding="utf-8")
        paths[name] = (entry, str(folder / filename))
    results = json.loads(run_child(_CHILD, json.dumps(paths)))
    assert set(results) == {*CASES, "option string"}
    for name, message in results.items():
        assert "expands" in message and "alias bomb" in message, (name, message)
        assert len(message) < 600, (name, message)
    assert results["run folder config.yaml"].count("is damaged") == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifos_are_refused_without_blocking(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    for fifo in (tmp_path / "run.yaml", tmp_path / "plan.yaml", tmp_path / "run" / "config.yaml"):
        os.mkfifo(fifo)
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from agentrl_envs.errors import ConfigError
        from agentrl_train.config_io import load_config, read_run_config
        from agentrl_train.stages import load_plan
        root = Path(sys.argv[1])
        for load in (lambda: load_config(root / "run.yaml"), lambda: load_plan(str(root / "plan.yaml")),
                     lambda: read_run_config(root / "run")):
            try:
                load()
            except ConfigError as exc:
                print(exc)
        """
    )
    lines = run_child(script, str(tmp_path)).splitlines()  # a blocking open of a FIFO nobody writes: the wait runs out
    assert len(lines) == 3, lines
    assert "not a regular file" in lines[0] and "not a regular file" in lines[1], lines
    assert "not a run folder" in lines[2], lines  # a run folder's config.yaml must be a file


HUGE = "'" + "x" * 600_000 + "'"
HUGE_LIST = "[" + ",".join(["1"] * 200_000) + "]"


@pytest.mark.parametrize(
    "text",
    [
        f"lr: {HUGE}",
        f"lr: {HUGE_LIST}",
        f"optimizer_typo_{'y' * 500_000}: 1",
        f"{HUGE_LIST[:100_000]}]: 1",
        f"ppo: {{{HUGE}: 1}}",
        f"env: {{env_kwargs: {{{HUGE}: 1}}}}",
        f"run: {{out: {HUGE_LIST}}}",
        f"model: {{adapter: {HUGE_LIST}}}",
    ],
    ids=[
        "long string",
        "long list",
        "long key",
        "list key",
        "long section key",
        "long env_kwargs key",
        "out list",
        "adapter list",
    ],
)
def test_config_messages_stay_short_whatever_the_value(text: str, tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert len(str(err.value)) < 1000


@pytest.mark.parametrize(
    "text",
    [
        f"model: {HUGE_LIST}\n{STAGES}",
        f"eval_split: {HUGE}\n{STAGES}",
        f"stages: [{{name: {HUGE_LIST}, envs: [AgentRL/SQL-v0], updates: 1}}]\n",
        f"{{{HUGE}: 1, stages: []}}\n",
        f"{{1: a, [1, 2]: b, {HUGE}: c}}\n",
        f"ppo: {{1: 2}}\n{STAGES}",
        f"ppo: 5\n{STAGES}",
        f"stages: [{{name: tool, envs: [AgentRL/SQL-v0], updates: 1, options: [{HUGE}]}}]\n",
    ],
    ids=[
        "model list",
        "eval_split",
        "stage name",
        "unknown key",
        "keys of mixed types",
        "ppo int key",
        "ppo not a mapping",
        "options list",
    ],
)
def test_plan_messages_stay_short_whatever_the_value(text: str, tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_plan(str(path))
    assert len(str(err.value)) < 1000


def test_a_null_ppo_or_rm_section_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(f"ppo: null\nrm: null\n{STAGES}", encoding="utf-8")
    plan = load_plan(str(path))
    assert plan["ppo"] == {} and plan["rm"] == {}


def test_a_damaged_run_config_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("a: &a [1, *a]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"config\.yaml is damaged \(not readable YAML: the YAML alias \*a refers to itself"):
        read_run_config(tmp_path)
