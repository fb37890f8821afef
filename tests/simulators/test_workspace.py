"""An agent that breaks its own workspace gets its own error, never a service fault (issue #14, item 4).

``simulators.workspace`` repairs ``results/`` and writes without following planted links; the env
answers the agent's damage with agent-origin errors (no service-fault penalty), the episode goes
on, and no observation or info shows a host path.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401 - registers the env ids
from agentrl_envs.agents import OracleAgent
from agentrl_envs.core.actions import format_call
from simulators import workspace as ws_module
from simulators.workspace import WorkspaceError, write_files

CSV = "a,b\r\n1,2\r\n"


# -- the module: repairs and planted links ------------------------------------------------------


def _break(ws: Path, how: str, outside: Path) -> None:
    results = ws / "results"
    if how == "file":
        shutil.rmtree(results)
        results.write_text("the agent's own file")
    elif how == "missing":
        shutil.rmtree(results)
    elif how == "symlink_dir":
        shutil.rmtree(results)
        os.symlink(outside, results)
    elif how == "fifo":
        shutil.rmtree(results)
        os.mkfifo(results)
    elif how == "unwritable":
        os.chmod(results, 0)
    elif how == "csv_is_dir":
        (results / "q1.csv" / "inner").mkdir(parents=True)
    elif how == "csv_is_symlink":
        os.symlink(outside / "victim.txt", results / "q1.csv")
    elif how == "csv_unwritable":
        (results / "q1.csv").write_text("old")
        os.chmod(results / "q1.csv", 0)


@pytest.mark.parametrize(
    "how", ["file", "missing", "symlink_dir", "fifo", "unwritable", "csv_is_dir", "csv_is_symlink", "csv_unwritable"]
)
def test_results_dir_is_repaired(tmp_path: Path, how: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("untouched")
    ws = Path(ws_module.create(str(tmp_path), {"data/in.txt": "x"}))
    _break(ws, how, outside)
    write_files(str(ws), {"results/q1.csv": CSV})
    results = ws / "results"
    assert results.is_dir() and not results.is_symlink()
    assert stat.S_IMODE(results.stat().st_mode) & 0o700 == 0o700
    assert (results / "q1.csv").read_bytes() == CSV.encode() and not (results / "q1.csv").is_symlink()
    assert sorted(p.name for p in results.iterdir()) == ["q1.csv"]  # no temporary left
    assert (outside / "victim.txt").read_text() == "untouched" and sorted(os.listdir(outside)) == ["victim.txt"]
    assert (ws / "data" / "in.txt").read_text() == "x"


def test_a_full_disk_is_a_workspace_error_without_host_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = ws_module.create(str(tmp_path), {})

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(ws, "results", "x"))

    monkeypatch.setattr(ws_module.os, "write", full)
    with pytest.raises(WorkspaceError) as info:
        write_files(ws, {"results/q1.csv": CSV, "results/q2.csv": CSV})
    message = str(info.value)
    assert "results/q1.csv" in message and "No space left on device" in message
    assert str(tmp_path) not in message and "/tmp" not in message
    monkeypatch.undo()
    assert os.listdir(os.path.join(ws, "results")) == []  # no temporary left


@pytest.mark.parametrize("rel", ["q1.csv", "data/q1.csv", "results/", "results/a/b.csv", "../results/q1.csv"])
def test_only_files_directly_in_results_are_written(tmp_path: Path, rel: str) -> None:
    ws = ws_module.create(str(tmp_path), {})
    with pytest.raises(ValueError, match="only files directly in results/"):
        write_files(ws, {rel: CSV})


# -- the env: damage is the agent's error, and the episode goes on --------------------------------

ENV_ID = "AgentRL/SQLPythonSMTP-v1"

DAMAGE = {
    "results_replaced_by_file": "import shutil\nshutil.rmtree('results')\nopen('results', 'w').write('mine')\n",
    "results_deleted": "import shutil\nshutil.rmtree('results')\n",
    "results_unreadable": "import os\nos.chmod('results', 0)\n",
    "csv_names_taken_by_dirs": "import os\nfor i in range(2, 30):\n    os.makedirs(f'results/q{i}.csv/x', exist_ok=True)\n",
    "csv_names_unreadable": "import os\nfor i in range(2, 30):\n    open(f'results/q{i}.csv', 'w').close()\n    os.chmod(f'results/q{i}.csv', 0)\n",
    "everything_deleted": "import os, shutil\nfor n in os.listdir('.'):\n    shutil.rmtree(n) if os.path.isdir(n) else os.remove(n)\n",
    "temporaries_planted": "import os\nfor i in range(200):\n    os.makedirs(f'.sandbox-copy-1-{i}/d', exist_ok=True)\n    os.makedirs(f'results/.sandbox-copy-1-{i}', exist_ok=True)\n",
}


@pytest.fixture(scope="module")
def env() -> Iterator[gym.Env[str, str]]:
    e = gym.make(ENV_ID, python_timeout_s=5.0)
    yield e
    e.close()


def _host_paths(env: gym.Env[str, str]) -> list[str]:
    backend = env.unwrapped._backend  # type: ignore[attr-defined]
    backend._ready(env.unwrapped._episode_id)  # type: ignore[attr-defined]  (episodes open at first use)
    app = backend.app
    workspace = app.workspace_of(env.unwrapped._episode_id)  # type: ignore[attr-defined]
    return [workspace, os.path.dirname(workspace), "/tmp/", "agentrl-ws-", "agentrl-sandbox-"]


def _check_step(env: gym.Env[str, str], step: tuple[Any, ...], leaks: list[str]) -> None:
    obs, _reward, _terminated, _truncated, info = step
    assert env.observation_space.contains(obs)
    text = obs + json.dumps(info, default=str)
    for leak in leaks:
        assert leak not in text, f"{leak!r} shown to the agent: {obs[:500]!r}"
    fault = info["fault"]
    assert not fault or fault["origin"] == "agent", (fault, obs[:500])
    assert info["reward_components"]["fault"] == 0.0, (info["reward_components"], obs[:500])
    status = info["tool_result"].get("status") if info["tool_result"] else None
    assert status is None or status < 500, obs[:500]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_broken_workspace_is_the_agents_error(env: gym.Env[str, str], damage: str) -> None:
    obs, info = env.reset(seed=77)
    leaks = _host_paths(env)
    step = env.step(format_call("sql", {"query": "SELECT 1 AS one"}))  # a pending result, saved on next use
    _check_step(env, step, leaks)
    step = env.step(format_call("python", {"code": DAMAGE[damage]}))
    _check_step(env, step, leaks)
    assert step[4]["tool_result"]["ok"] is True, step[0]
    step = env.step(format_call("sql", {"query": "SELECT 2 AS two"}))
    csv_path = step[4]["tool_result"]["csv_path"]
    _check_step(env, step, leaks)
    for action in (
        format_call("python", {"code": f"print(open({csv_path!r}).read())"}),
        format_call("python", {"code": "import os\nprint(sorted(os.listdir('.')))"}),
        format_call("smtp", {"to": "ops@example.com", "subject": "r", "body": "see attached", "attachments": [csv_path]}),
        format_call("smtp", {"to": "ops@example.com", "subject": "r", "body": "x", "attachments": ["results/q1.csv"]}),
    ):
        step = env.step(action)
        _check_step(env, step, leaks)
    step = env.step(format_call("python", {"code": f"print(open({csv_path!r}).read())"}))
    assert step[4]["tool_result"]["ok"] is True and "two" in step[0], step[0]
    obs, info = step[0], step[4]
    agent = OracleAgent(env)
    for _ in range(100):
        step = env.step(agent.act(obs, info))
        _check_step(env, step, leaks)
        obs, _reward, terminated, truncated, info = step
        if terminated or truncated:
            break
    assert info["success"] is True, info.get("task_components")


# -- a really full disk (a small tmpfs, in a mount namespace of a child process) -------------------

_FULL_DISK = r"""
import json, os, sys
from simulators.app import SimulatorApp, template_fingerprint
root = sys.argv[1]
os.system(f"mount -t tmpfs -o size=1m tmpfs {root}")
app = SimulatorApp(workspace_root=root)
out = {}
try:
    tables = {"t": {"columns": [["a", "TEXT"]], "rows": [["x" * 1000]] * 300}}
    fp = template_fingerprint("fp", tables)
    out["put"] = app.put_database(fp, {"tables": tables})
    out["open"] = app.open_episode({"episode_id": "e1", "database": fp})
    out["fill"] = app.tool("e1", "python", {"code": "open('big.bin', 'wb').write(b'0' * (3 << 20))\nprint('wrote')"})
    out["small"] = app.tool("e1", "python", {"code": "open('small.bin', 'wb').write(b'0' * 900_000)\nprint('ok')"})
    out["sql"] = app.tool("e1", "sql", {"query": "SELECT a FROM t"})[0]  # about 300 kB: more than is left
    out["after_sql"] = app.tool("e1", "python", {"code": "print('after')"})
    out["again"] = app.tool("e1", "python", {"code": "print('again')"})
    out["workspace"] = app.workspace_of("e1")
finally:
    app.close()
print(json.dumps(out))
"""


def test_a_full_disk_is_never_a_success_nor_a_service_fault(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a small tmpfs in a private mount namespace")
    root = tmp_path / "small"
    root.mkdir()
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", _FULL_DISK, str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    workspace = out.pop("workspace")
    text = json.dumps(out)
    assert workspace not in text and str(root) not in text, text[:2000]
    assert out["put"][0] == 204 and out["open"][0] == 201, (out["put"], out["open"])
    status, fill = out["fill"]
    assert status == 200 and fill["ok"], fill
    result = fill["result"]
    assert result["exit_code"] == 125, result  # it printed "wrote", but its file was not kept
    assert "wrote" in result["stdout"] and "could not keep 'big.bin'" in result["stderr"], result["stderr"]
    assert "No space left on device" in result["stderr"]
    assert out["small"][1]["result"]["exit_code"] == 0, out["small"]
    assert out["sql"] == 200, out["sql"]
    status, after = out["after_sql"]
    assert status == 409 and after["error"]["type"] == "workspace", after  # the CSV did not fit
    assert "No space left on device" in after["error"]["message"]
    assert out["again"][0] == 200 and out["again"][1]["result"]["stdout"] == "again\n", out["again"]


@pytest.mark.parametrize("how", ["file", "symlink_dir", "csv_is_symlink", "csv_is_dir"])
def test_put_file_of_a_mounted_sql_result_repairs_results(tmp_path: Path, how: str) -> None:
    """A real SQL backend's CSV reaches the workspace through put_file: the same repair, no followed links."""
    from simulators.app import SimulatorApp

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("untouched")
    app = SimulatorApp(workspace_root=str(tmp_path), python_sandbox=False)
    try:
        assert app.open_episode({"episode_id": "e"})[0] == 201
        ws = Path(app.workspace_of("e") or "")
        _break(ws, how, outside)
        assert app.put_file("e", "results/q1.csv", {"text": CSV}) == (204, None)
        assert (ws / "results" / "q1.csv").read_bytes() == CSV.encode() and not (ws / "results").is_symlink()
        status, reply = app.put_file("e", "results/../../outside/victim.txt", {"text": "x"})
        assert status == 400 and "outside the workspace" in str(reply)
    finally:
        app.close()
    assert (outside / "victim.txt").read_text() == "untouched" and os.listdir(outside) == ["victim.txt"]


# -- workspaces of processes that were killed ---------------------------------------------------


def test_a_workspace_name_records_its_owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from simulators import _owners

    monkeypatch.setattr(ws_module, "_swept", set())
    path = ws_module.create(str(tmp_path), {"data/in.csv": CSV})
    owner = _owners.owner_of(os.getpid())
    assert owner is not None
    assert os.path.basename(path).startswith("agentrl-ws-" + "-".join(map(str, owner)) + "-")
    assert ws_module._read_owner(path, os.path.basename(path)) == owner
    assert (Path(path) / "data" / "in.csv").read_bytes() == CSV.encode() and (Path(path) / "results").is_dir()


def test_the_first_workspace_in_a_folder_sweeps_those_whose_owner_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from simulators import _owners

    ns = _owners.pid_namespace()
    owner = _owners.owner_of(os.getpid())
    assert owner is not None
    pid, start, _ = owner
    names = {
        "dead": f"agentrl-ws-999999999-1-{ns}-abcdefgh",  # no such process
        "reused": f"agentrl-ws-{pid}-{start + 1}-{ns}-abcdefgh",  # a live pid, started at another time
        "alive": f"agentrl-ws-{pid}-{start}-{ns}-abcdefgh",
        "other-namespace": f"agentrl-ws-999999999-1-{ns + 1}-abcdefgh",
        "old-style": "agentrl-ws-ppd9mmlo",  # made before names recorded an owner: never judged
        "garbage": "agentrl-ws-1-x-2-abcdefgh",
        "other-prefix": f"agentrl-wsx-999999999-1-{ns}-abcdefgh",
    }
    for name in names.values():
        (tmp_path / name / "results").mkdir(parents=True)
        (tmp_path / name / "results" / "q1.csv").write_text(CSV)
    (tmp_path / f"agentrl-ws-999999998-1-{ns}-file").write_text("a file, not a workspace")
    (tmp_path / f"agentrl-ws-999999997-1-{ns}-link").symlink_to(tmp_path / names["alive"])
    monkeypatch.setattr(ws_module, "_swept", set())
    made = ws_module.create(str(tmp_path), {})
    left = {p.name for p in tmp_path.iterdir()} - {os.path.basename(made)}
    assert left == {names[k] for k in ("alive", "other-namespace", "old-style", "garbage", "other-prefix")} | {
        f"agentrl-ws-999999998-1-{ns}-file",
        f"agentrl-ws-999999997-1-{ns}-link",
    }
    # once per folder and process: a dead owner's folder that appears later waits for the next process
    (tmp_path / names["dead"]).mkdir()
    ws_module.create(str(tmp_path), {})
    assert (tmp_path / names["dead"]).is_dir()


def test_a_killed_process_leaves_a_workspace_the_next_one_removes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = (
        "import sys, time\n"
        "from simulators import workspace\n"
        "print(workspace.create(sys.argv[1], {'data/in.csv': 'a\\n'}), flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        left = proc.stdout.readline().strip()
        assert os.path.isdir(left)
    finally:
        proc.kill()  # SIGKILL: no clean-up runs
        proc.wait()
    assert os.path.isdir(left)
    monkeypatch.setattr(ws_module, "_swept", set())
    mine = ws_module.create(str(tmp_path), {})
    assert not os.path.exists(left) and os.path.isdir(mine)
