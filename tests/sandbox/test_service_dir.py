"""A squatted well-known sandbox service directory is never used and never an error (issue #33, 13).

The service's sockets live at a path every process of a user can find: ``<tmp>/agentrl-sandbox-<uid>``
(or under ``$XDG_RUNTIME_DIR``). Another user can make that path first (a directory of theirs, a
symlink, a file, a directory open to all); ``env.reset`` used to raise :class:`SandboxError`. Now a
private directory (0700, this user's, not a symlink) in ``<tmp>`` takes its place, shared by this
user's processes. ``$AGENTRL_SANDBOX_DIR``, a choice the user made, is still refused when unsafe
(``test_service.py``).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

import agentrl_envs  # noqa: F401 - registers the ids
from simulators.python.sandbox.service import DIR_ENV, IDLE_ENV, SCOPE_ENV, ServiceLease, service_dir

from .conftest import SUITE_LIMITS

OTHER_UID = 65534  # nobody
SQUATS = ["other_users_dir", "symlink_to_other_users_dir", "dangling_symlink", "file", "dir_open_to_all", "dir_of_mode_0750"]


@pytest.fixture
def tmp_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A short private stand-in for the system temp dir (a socket path has at most 107 bytes)."""
    root = tempfile.mkdtemp(prefix="sbxtmp-")
    os.chmod(root, 0o1777)  # a shared temp dir: anyone may make entries, sticky
    monkeypatch.setattr(tempfile, "tempdir", root)
    monkeypatch.delenv(DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv(IDLE_ENV, "0")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _squat(path: str, kind: str, elsewhere: str) -> None:
    """Make ``path`` what another user could have made there before us."""
    if kind in ("other_users_dir", "symlink_to_other_users_dir") and os.getuid() != 0:
        pytest.skip("making a directory another user owns needs root")
    if kind == "other_users_dir":
        os.mkdir(path, 0o700)
        os.chown(path, OTHER_UID, OTHER_UID)
    elif kind == "symlink_to_other_users_dir":
        os.mkdir(elsewhere, 0o777)
        os.chown(elsewhere, OTHER_UID, OTHER_UID)
        os.symlink(elsewhere, path)
    elif kind == "dangling_symlink":
        os.symlink(elsewhere, path)
    elif kind == "file":
        Path(path).write_text("")
    elif kind == "dir_open_to_all":
        os.mkdir(path)
        os.chmod(path, 0o777)
    else:
        os.mkdir(path)
        os.chmod(path, 0o750)


def _assert_private(path: str, root: str) -> None:
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700, (path, oct(st.st_mode))
    assert os.path.dirname(path) == root and os.path.basename(path).startswith(f"agentrl-sandbox-svc-{os.getuid()}-")


@pytest.mark.parametrize("kind", SQUATS)
def test_a_squatted_well_known_dir_gives_a_private_fallback(tmp_root: str, kind: str) -> None:
    well_known = os.path.join(tmp_root, f"agentrl-sandbox-{os.getuid()}")
    _squat(well_known, kind, os.path.join(tmp_root, "elsewhere"))
    with pytest.warns(UserWarning, match="uses the private"):
        first = service_dir()
    _assert_private(first, tmp_root)
    with pytest.warns(UserWarning):
        assert service_dir() == first  # every process of this user finds the same one
    elsewhere = os.path.join(tmp_root, "elsewhere")
    assert not os.path.isdir(elsewhere) or os.listdir(elsewhere) == []  # nothing written where a symlink points


def test_a_squatted_runtime_dir_gives_a_private_fallback_too(tmp_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tempfile.mkdtemp(prefix="sbxrun-")
    try:
        os.chmod(os.path.join(runtime), 0o700)
        os.mkdir(os.path.join(runtime, "agentrl-sandbox"), 0o755)
        monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
        with pytest.warns(UserWarning, match="mode drwxr-xr-x"):
            _assert_private(service_dir(), tmp_root)
    finally:
        shutil.rmtree(runtime)


def test_the_fallback_skips_entries_of_its_prefix_that_are_not_private(tmp_root: str) -> None:
    """Another user can make ``agentrl-sandbox-svc-<uid>-*`` entries too; they are passed over."""
    prefix = os.path.join(tmp_root, f"agentrl-sandbox-svc-{os.getuid()}-")
    Path(prefix + "0file").write_text("")
    os.symlink(tmp_root, prefix + "1link")
    os.mkdir(prefix + "2open", 0o777)
    os.chmod(prefix + "2open", 0o777)
    _squat(os.path.join(tmp_root, f"agentrl-sandbox-{os.getuid()}"), "file", "")
    with pytest.warns(UserWarning):
        found = service_dir()
    _assert_private(found, tmp_root)
    assert not found.endswith(("0file", "1link", "2open"))


def test_a_usable_well_known_dir_is_used_as_before(tmp_root: str) -> None:
    assert service_dir() == os.path.join(tmp_root, f"agentrl-sandbox-{os.getuid()}")
    assert [n for n in os.listdir(tmp_root) if n.startswith("agentrl-sandbox-svc-")] == []


@pytest.mark.parametrize("kind", ["other_users_dir", "dangling_symlink", "dir_open_to_all"])
def test_a_lease_runs_behind_a_squatted_dir(tmp_root: str, kind: str) -> None:
    workspace = os.path.join(tmp_root, "workspace")
    os.mkdir(workspace, 0o700)
    _squat(os.path.join(tmp_root, f"agentrl-sandbox-{os.getuid()}"), kind, os.path.join(tmp_root, "elsewhere"))
    with pytest.warns(UserWarning), ServiceLease(SUITE_LIMITS) as lease:
        assert lease.run("print(6 * 7)", workspace).stdout == "42\n"
        _assert_private(os.path.dirname(lease.socket_path), tmp_root)


def test_env_reset_works_behind_a_squatted_dir(tmp_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's case: the machine-wide service (as every vector-env worker uses it), its path squatted."""
    monkeypatch.setenv(SCOPE_ENV, "machine")
    _squat(os.path.join(tmp_root, f"agentrl-sandbox-{os.getuid()}"), "dir_open_to_all", "")
    if os.getuid() == 0:
        os.chown(os.path.join(tmp_root, f"agentrl-sandbox-{os.getuid()}"), OTHER_UID, OTHER_UID)
    with pytest.warns(UserWarning, match="uses the private"):
        env = gym.make("AgentRL/Python-v0")
        try:
            _obs, info = env.reset(seed=0)
            _obs, _reward, _terminated, _truncated, info = env.step(env.unwrapped.oracle_action())
            assert info["sandbox_tier"] in ("FULL", "REDUCED", "UNSAFE"), info
        finally:
            env.close()
