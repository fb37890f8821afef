"""The zygote: a small, warm interpreter that forks the supervisors of sandboxed runs.

Started by the host as a fresh ``python -I -S`` (never a fork of the host, which may hold torch),
it enters its own user (when not root), mount and network namespaces, imports the allowed modules
once, then becomes pid 1 of its own pid namespace, so that its death takes every run with it. A
probe run tells it which layers work on this machine (the tier). After that, each frame from the
host is answered with a warm supervisor: one ``unshare(CLONE_NEWPID)`` + ``fork()``, prepared ahead
of its request (see :mod:`._supervisor`), whose pipes go to the host.

Stdlib only, and nothing from the ``simulators`` package: the host loads these files as the
package ``_agentrl_sandbox``.
"""

from __future__ import annotations

import fcntl
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, NoReturn

from . import _landlock, _linux, _seccomp
from ._context import SETUP_FAILED, Context, Plan
from ._protocol import decode_result, encode_request, recv_frame, send_json, write_all
from ._supervisor import supervisor_main

FULL, REDUCED, UNSAFE = "FULL", "REDUCED", "UNSAFE"
#: layers a run needs for tier FULL
REQUIRED = ("rlimits", "pidns", "netns", "ipcns", "process_cap", "no_capabilities", "seccomp", "landlock")
_ISOLATING = ("pidns", "netns", "seccomp", "landlock")

_PROBE_PROGRAM = """\
import json, os, socket
r = {}
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    r['seccomp'] = False
except PermissionError:
    r['seccomp'] = True
except OSError:
    r['seccomp'] = False
try:
    open(%r).read()
    r['landlock'] = False
except PermissionError:
    r['landlock'] = True
except OSError:
    r['landlock'] = False
with open('/proc/self/status') as f:
    r['cap_eff'] = int([l for l in f if l.startswith('CapEff:')][0].split()[1], 16)
with open('/proc/self/net/dev') as f:
    r['interfaces'] = sorted(l.split(':')[0].strip() for l in f.readlines()[2:])
r['parent_is_pid1'] = os.getppid() == 1
with open('probe.txt', 'w') as f:
    f.write('ok')
print(json.dumps(r))
"""


def main(control_fd: int) -> NoReturn:
    sock = socket.socket(fileno=control_fd)
    config = json.loads(recv_frame(sock))
    zygote = _Zygote(sock, config)
    zygote.start()
    zygote.serve()


@dataclass
class _Slot:
    """A forked supervisor waiting for its request."""

    pid: int
    pidfd: int
    request_w: int
    result_r: int


class _Zygote:
    def __init__(self, sock: socket.socket, config: dict[str, Any]) -> None:
        self.sock = sock
        self.config = config
        self.disable = set(config.get("disable", ()))
        self.root = os.geteuid() == 0
        self.uid, self.gid = os.geteuid(), os.getegid()
        self.layers: dict[str, bool] = {}
        self.notes: list[str] = []
        self.zns = -1
        self.supervisors: dict[int, int] = {}  # pid -> pidfd, without a pid namespace only
        self.notes += [f"{name}: disabled by configuration" for name in sorted(self.disable)]

    def _try(self, name: str, fn: Any) -> bool:
        if name in self.disable:
            self.layers[name] = False
            return False
        try:
            fn()
        except OSError as exc:
            self.layers[name] = False
            self.notes.append(f"{name}: {exc}")
            return False
        self.layers[name] = True
        return True

    # -- start-up ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Namespaces, imports, the pid namespace fork, the probe run, the hello."""
        privileged = self.root
        if not self.root:
            privileged = self._try("userns", self._enter_userns)
        mntns = privileged and self._try("mntns", self._enter_mntns)
        if privileged:
            self._try("netns", lambda: _linux.unshare(_linux.CLONE_NEWNET))
        self._import_modules()
        pidns = privileged and self._try("pidns", lambda: _linux.unshare(_linux.CLONE_NEWPID))
        if pidns:
            self._become_pid1()
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if not pidns:
            _linux.prctl(_linux.PR_SET_CHILD_SUBREAPER, 1)
        abi = _landlock.abi_version() if "landlock" not in self.disable else 0
        try:
            seccomp_filter: _seccomp.Prepared | None = _seccomp.Prepared(_seccomp.build_filter())
        except OSError as exc:
            seccomp_filter = None
            self.notes.append(f"seccomp: {exc}")
        self._inheritable_state(privileged)
        wants_overlay = mntns and self.config.get("workspace_bytes") is not None and "workspace_tmpfs" not in self.disable
        plan = Plan(
            pidns=pidns,
            subreaper=not pidns,
            mntns=mntns,
            ipcns=privileged and "ipcns" not in self.disable,
            pid_max=pidns and "pid_max" not in self.disable,
            overlay=bool(wants_overlay),
            userns_run=bool(self.layers.get("userns")) and "userns_run" not in self.disable,
            nproc=not self.root,
            caps=privileged,
            landlock=abi,
            seccomp=bool(seccomp_filter) and "seccomp" not in self.disable,
        )
        self.ctx = Context(
            plan=plan,
            root=self.root,
            uid=0 if self.layers.get("userns") else self.uid,
            gid=0 if self.layers.get("userns") else self.gid,
            rules=self._landlock_rules(),
            seccomp_filter=seccomp_filter,
            mnt=self.config["mnt"],
            workspace_bytes=int(self.config.get("workspace_bytes") or 0),
            workspace_files=int(self.config.get("workspace_files", 4096)),
            devnull=os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC),
            control_fd=self.sock.fileno(),
            env=dict(self.config["env"]),
        )
        hello = self._probe()
        send_json(self.sock, hello)

    def _inheritable_state(self, privileged: bool) -> None:
        """What every run inherits, set once here rather than in each run."""
        os.environ.clear()
        os.environ.update(self.config["env"])
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")  # under memory pressure the sandbox goes first
        except OSError:
            pass
        if privileged:  # our effective capabilities stay; no run can regain one through execve
            try:
                _linux.drop_bounding_set(_linux.cap_last_cap())
            except OSError as exc:
                self.notes.append(f"capability bounding set: {exc}")

    def _enter_userns(self) -> None:
        _linux.unshare(_linux.CLONE_NEWUSER)
        _linux.map_self(self.uid, self.gid)

    def _enter_mntns(self) -> None:
        _linux.unshare(_linux.CLONE_NEWNS)
        _linux.mount(None, "/", None, _linux.MS_REC | _linux.MS_PRIVATE, None)

    def _import_modules(self) -> None:
        for name in self.config.get("preimport", ()):
            try:
                importlib.import_module(name)
            except Exception as exc:  # an optional module may be missing or broken
                self.notes.append(f"preimport {name}: {type(exc).__name__}")
        self.numpy_dirs: list[str] = []
        path = self.config.get("numpy_path")
        if path:
            sys.path.append(path)
            try:
                import numpy
                import numpy.random

                pkg = os.path.dirname(numpy.__file__)
                self.numpy_dirs = [pkg, pkg + ".libs"]
            except Exception as exc:
                self.notes.append(f"numpy: {type(exc).__name__}: {exc}")
            finally:
                sys.path.remove(path)
        if len(os.listdir("/proc/self/task")) > 1:
            self.notes.append("the zygote has threads after its imports: namespaces may fail")

    def _become_pid1(self) -> None:
        """Fork the real zygote as pid 1 of the new pid namespace; this process waits and mirrors its exit."""
        pid = os.fork()
        if pid:
            self.sock.close()
            _, status = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        _linux.prctl(_linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        self.zns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def _landlock_rules(self) -> list[tuple[int, int]]:
        ro, rw, file_ro = _landlock.READ_ONLY, _landlock.READ_FILE | _landlock.WRITE_FILE, _landlock.READ_FILE
        wanted: list[tuple[str, int]] = [(p, ro) for p in sys.path if os.path.isdir(p)]
        wanted += [(p, ro) for p in self.numpy_dirs]
        wanted += [(p, ro) for p in ("/usr/lib", "/lib", "/lib64", "/usr/lib64", "/usr/bin", "/bin", "/usr/share/zoneinfo")]
        wanted += [(os.path.realpath(sys.executable), file_ro | _landlock.EXECUTE), ("/etc/ld.so.cache", file_ro)]
        wanted += [("/dev/null", rw)] + [(p, file_ro) for p in ("/dev/zero", "/dev/urandom", "/dev/random")]
        venv_cfg = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "pyvenv.cfg")
        wanted.append((venv_cfg, file_ro))
        rules, seen = [], set()
        for path, access in wanted:
            opened = _landlock.open_rule_path(path)
            if opened is None:
                continue
            fd, is_dir = opened
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) in seen:
                os.close(fd)
                continue
            seen.add((st.st_dev, st.st_ino))
            rules.append((fd, access if is_dir else access & _landlock.FILE_RIGHTS))
        return rules

    def _probe(self) -> dict[str, Any]:
        """One run of a fixed program with every planned layer, recording which ones hold."""
        plan = self.ctx.plan
        workspace, secret = self.config["probe_workspace"], self.config["probe_secret"]
        st = os.stat(workspace)
        header = {
            "probe": True,
            "workspace": workspace,
            "ws_dev": st.st_dev,
            "ws_ino": st.st_ino,
            "deadline": time.monotonic() + 20.0,
            "cpu_s": 10,
            "memory_bytes": 1 << 30,
            "file_bytes": 1 << 20,
            "open_files": 64,
            "processes": 64,
            "output_bytes": 1 << 16,
        }
        self.ctx.probe = True
        try:
            result, out = self._run_blocking(header, (_PROBE_PROGRAM % secret).encode())
        finally:
            self.ctx.probe = False
        info = result.get("probe", {})
        applied, errors = info.get("applied", {}), info.get("errors", {})
        for name, message in errors.items():
            self.notes.append(f"{name}: {message}")
        try:
            seen = json.loads(out)
        except ValueError:
            seen = {}
            self.notes.append(f"probe run failed: {result.get('setup_error') or result}")
        plan.mntns = plan.mntns and applied.get("mntns", False)
        plan.ipcns = plan.ipcns and plan.mntns
        plan.pid_max = plan.pid_max and applied.get("pid_max", False)
        plan.overlay = plan.overlay and plan.mntns and applied.get("tmpfs", False) and applied.get("overlay", False)
        plan.userns_run = plan.userns_run and applied.get("userns_run", False)
        plan.caps = plan.caps and applied.get("caps", False)
        landlock_held = applied.get("landlock") and applied.get("landlock_restrict") and seen.get("landlock")
        plan.landlock = plan.landlock if landlock_held else 0
        plan.seccomp = plan.seccomp and applied.get("seccomp", False) and bool(seen.get("seccomp"))
        layers = {
            "rlimits": bool(seen),
            "pidns": plan.pidns and bool(seen.get("parent_is_pid1")),
            "netns": bool(self.layers.get("netns")) and seen.get("interfaces") == ["lo"],
            "ipcns": plan.ipcns,
            "mntns": plan.mntns,
            "workspace_tmpfs": plan.overlay,
            "process_cap": plan.pid_max or (plan.nproc and (plan.userns_run or not self.layers.get("userns"))),
            "no_capabilities": seen.get("cap_eff") == 0,
            "seccomp": plan.seccomp,
            "landlock": bool(plan.landlock),
        }
        if not self.root:
            layers["userns"] = bool(self.layers.get("userns"))
        missing = [name for name in REQUIRED if not layers[name]]
        if not missing:
            tier = FULL
        elif any(layers[name] for name in _ISOLATING):
            tier = REDUCED
        else:
            tier = UNSAFE
        try:
            os.unlink(os.path.join(workspace, "probe.txt"))
        except OSError:
            pass
        return {
            "tier": tier,
            "missing": missing,
            "layers": layers,
            "notes": self.notes,
            "numpy": bool(self.numpy_dirs),
            "landlock_abi": plan.landlock,
            "root": self.root,
        }

    # -- serving ----------------------------------------------------------------------------------

    def serve(self) -> NoReturn:
        """One slot (a warm supervisor) per request frame: its request pipe, result pipe and pidfd."""
        gc.collect()
        gc.freeze()  # a fork's first writes then copy the pages it touches, not every object's header
        while True:
            if not self.ctx.plan.pidns:
                ready, _, _ = select.select([self.sock], [], [], 1.0)
                self._sweep_orphans()
                if not ready:
                    continue
            try:
                recv_frame(self.sock)
            except (EOFError, OSError):
                break
            try:
                slot = self._fork_slot()
            except OSError as exc:
                try:
                    send_json(self.sock, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                except OSError:
                    break
                continue
            try:
                send_json(self.sock, {"ok": True, "pid": slot.pid}, [slot.request_w, slot.result_r, slot.pidfd])
            except OSError:
                break  # the host hung up
            finally:
                os.close(slot.request_w)
                os.close(slot.result_r)
                if self.ctx.plan.pidns:
                    os.close(slot.pidfd)
        self._sweep_orphans(everything=True)
        os._exit(0)

    def _fork_slot(self) -> _Slot:
        """Fork a supervisor (pid 1 of a new pid namespace) that prepares a run and waits for its request."""
        plan = self.ctx.plan
        result_r, result_w = os.pipe()
        request_r, request_w = os.pipe()
        try:
            fcntl.fcntl(request_w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except OSError:
            pass
        if plan.pidns:
            _linux.unshare(_linux.CLONE_NEWPID)
        try:
            pid = _linux.fork()
        except BaseException:
            if plan.pidns:
                _linux.setns(self.zns, _linux.CLONE_NEWPID)
            for fd in (result_r, result_w, request_r, request_w):
                os.close(fd)
            raise
        if pid == 0:
            try:
                os.close(result_r)
                os.close(request_w)
                supervisor_main(self.ctx, request_r, result_w)
            finally:
                os._exit(SETUP_FAILED)
        if plan.pidns:
            _linux.setns(self.zns, _linux.CLONE_NEWPID)
        os.close(result_w)
        os.close(request_r)
        pidfd = os.pidfd_open(pid)
        if not plan.pidns:
            self.supervisors[pid] = pidfd
        return _Slot(pid, pidfd, request_w, result_r)

    def _run_blocking(self, header: dict[str, Any], program: bytes) -> tuple[dict[str, Any], bytes]:
        """The probe: one run in this process's own hands."""
        slot = self._fork_slot()
        data = bytearray()
        try:
            write_all(slot.request_w, encode_request(header, program))
            os.close(slot.request_w)
            while True:
                ready, _, _ = select.select([slot.result_r], [], [], max(0.0, header["deadline"] + 5.0 - time.monotonic()))
                if not ready:
                    signal.pidfd_send_signal(slot.pidfd, signal.SIGKILL)
                    break
                chunk = os.read(slot.result_r, 1 << 20)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(slot.result_r)
            if self.ctx.plan.pidns:
                os.close(slot.pidfd)
        try:
            result, out, _err = decode_result(bytes(data))
        except Exception as exc:
            return {"setup_error": f"probe: {exc}"}, b""
        return result, out

    def _sweep_orphans(self, everything: bool = False) -> None:
        """Without a pid namespace: kill whatever was reparented to us (we are a subreaper)."""
        for pid, pidfd in list(self.supervisors.items()):
            if select.select([pidfd], [], [], 0)[0]:
                os.close(pidfd)
                del self.supervisors[pid]
        try:
            with open("/proc/thread-self/children") as f:
                kids = [int(p) for p in f.read().split()]
        except OSError:
            return
        for kid in kids:
            if everything or kid not in self.supervisors:
                try:
                    os.kill(kid, signal.SIGKILL)
                except OSError:
                    pass
