"""The zygote: a small, warm interpreter that forks the programs of sandboxed runs.

Started by the host as a fresh ``python -I -S`` (never a fork of the host, which may hold torch),
it enters its own user (when not root), mount and network namespaces, imports the allowed modules
once, then becomes pid 1 of its own pid namespace, so that its death takes every run with it. A
probe run tells it which layers work on this machine (the tier). After that, each frame from the
host is answered with a warm slot, prepared ahead of its request: new mount and IPC namespaces with
the run's capped tmpfs, a new pid namespace whose pid 1 is a sleeping placeholder (spawned, not
forked: its death kills the run), and the program, forked into them (see :mod:`._program`). The
zygote keeps nothing of a run but the program's pid: it reaps the program and writes its wait
status on the slot's status pipe. Every other descriptor of the slot goes to the host, which
watches the run (see :mod:`._monitor`).

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
import shutil
import signal
import socket
import sys
import time
from typing import Any, NoReturn

from . import _landlock, _linux, _monitor, _seccomp
from ._context import SETUP_FAILED, Context, Plan
from ._program import fresh_interpreter_state, make_streams, numpy_mt_state, prepared_rules, program_main
from ._protocol import frame, recv_frame, send_frame_with_fds, send_json

FULL, REDUCED, UNSAFE = "FULL", "REDUCED", "UNSAFE"
#: layers a run needs for tier FULL
REQUIRED = ("rlimits", "pidns", "netns", "ipcns", "process_cap", "no_capabilities", "seccomp", "landlock")
_ISOLATING = ("pidns", "netns", "seccomp", "landlock")

_NS_FILES = ((_linux.CLONE_NEWNS, "mnt"), (_linux.CLONE_NEWIPC, "ipc"))
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)

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
r['own_pidns'] = os.getpid() == 2 and os.getppid() == 0  # pid 1 is the run's placeholder; our parent is outside
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


def _remove_scratch_if_orphaned(config: dict[str, Any]) -> None:
    """Called by the host's own child as the zygote ends: if the host died without closing its runner
    (SIGKILL, the OOM killer), remove the host's scratch folder, which nobody else would.

    The host's death shows as a new parent (``getppid()``; only the host's child can ask: pid 1 of a
    new pid namespace sees 0). A host that stops the zygote, to close or to restart it, is still the
    parent: it removes the folder itself when it closes, and a restarted zygote reuses the folder.
    """
    scratch, host = config.get("scratch"), config.get("host_pid")
    if scratch and host and (os.getppid() != host or host_is_exiting(host)):
        shutil.rmtree(scratch, ignore_errors=True)


#: ``PF_EXITING`` in ``/proc/<pid>/stat``'s flags: set as a process starts to exit, before its files close
_PF_EXITING = 0x4


def host_is_exiting(pid: int) -> bool:
    """True when ``pid`` is exiting, a zombie, or gone.

    A killed process closes its files (our socket's EOF) before its children are re-parented, so on
    a busy machine a host killed a moment ago can still be our parent when we look: its ``/proc``
    entry then shows it exiting. A host that stops us to close or restart is alive and not exiting.

    The same ``/proc/PID/stat`` parse as ``simulators._owners.start_time``, kept here on purpose: the
    zygote runs isolated (``python -I -S``) with only this package importable.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the name, in parentheses, may hold spaces
        return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & _PF_EXITING)
    except (FileNotFoundError, ProcessLookupError):
        return True
    except (OSError, IndexError, ValueError):
        return False  # unreadable: leave the folder to the host, or to the next sweep of stale folders


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
        self.kids: dict[int, tuple[int, int]] = {}  # pid -> (pidfd, status pipe or -1): programs and pid 1s
        self._replies: dict[tuple[str, ...], bytes] = {}  # a slot's reply frame, by the names of its descriptors
        self.sleep = shutil.which("sleep", path="/usr/bin:/bin") or ""
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
        if privileged and "ipcns" not in self.disable:  # an IPC namespace of our own: slots' setns back needs it
            self._try("zygote_ipcns", lambda: _linux.unshare(_linux.CLONE_NEWIPC))
        self.base_ns = {flag: os.open(f"/proc/self/ns/{name}", os.O_RDONLY | os.O_CLOEXEC) for flag, name in _NS_FILES}
        if privileged:
            self._try("netns", lambda: _linux.unshare(_linux.CLONE_NEWNET))
        self._import_modules()
        pidns = privileged and self._try("pidns", lambda: _linux.unshare(_linux.CLONE_NEWPID))
        if pidns:
            self._become_pid1()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # programs are reaped here, for their wait status
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
        rules = self._landlock_rules()
        landlock_attr, landlock_rules = prepared_rules(rules, abi) if abi else (None, None)
        devnull = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        self.ctx = Context(
            plan=plan,
            root=self.root,
            uid=0 if self.layers.get("userns") else self.uid,
            gid=0 if self.layers.get("userns") else self.gid,
            rule_fds=tuple(sorted(fd for fd, _access in rules)),
            seccomp_filter=seccomp_filter,
            mnt=self.config["mnt"],
            workspace_bytes=int(self.config.get("workspace_bytes") or 0),
            workspace_files=int(self.config.get("workspace_files", 4096)),
            devnull=devnull,
            control_fd=self.sock.fileno(),
            env=dict(self.config["env"]),
            landlock_attr=landlock_attr,
            landlock_rules=landlock_rules,
            streams=make_streams(devnull),
            numpy_mt_state=numpy_mt_state(),
        )
        self.work_dir, self.upper_dir = f"{self.ctx.mnt}/work", f"{self.ctx.mnt}/upper"
        fresh_interpreter_state(self.ctx.streams)
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
            _remove_scratch_if_orphaned(self.config)
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
            "deadline": time.monotonic() + 60.0,  # a bound for a busy machine, not an expected time
            "cpu_s": 10,
            "memory_bytes": 1 << 30,
            "file_bytes": 1 << 20,
            "open_files": 64,
            "processes": 64,
            "output_bytes": 1 << 16,
        }
        self.ctx.probe = True
        try:
            result, out, report = self._run_blocking(header, (_PROBE_PROGRAM % secret).encode())
        finally:
            self.ctx.probe = False
        applied = {**self.ctx.applied, **report.get("program", {})}
        errors = {**self.ctx.errors, **report.get("program_errors", {})}
        for name, message in errors.items():
            self.notes.append(f"{name}: {message}")
        self.ctx.applied, self.ctx.errors = {}, {}  # the probe's record; later runs' reports stay short
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
            "pidns": plan.pidns and bool(seen.get("own_pidns")),
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
        """One slot (a warm run) per request frame; between frames, reap the programs that ended."""
        gc.collect()
        gc.freeze()  # a fork's first writes then copy the pages it touches, not every object's header
        while True:
            waits: list[Any] = [self.sock, *(fd for fd, _ in self.kids.values())]
            ready, _, _ = select.select(waits, [], [], 1.0)
            self._reap()
            if not self.ctx.plan.pidns:
                self._sweep_orphans()
            if self.sock not in ready:
                continue
            try:
                recv_frame(self.sock)
            except (EOFError, OSError):
                break
            try:
                names, fds = self._fork_slot()
            except OSError as exc:
                try:
                    send_json(self.sock, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                except OSError:
                    break
                continue
            try:
                reply = self._replies.get(tuple(names))
                if reply is None:  # one per set of names (a handful): encoded once
                    reply = self._replies[tuple(names)] = frame(
                        json.dumps({"ok": True, "fds": names}, separators=(",", ":")).encode()
                    )
                send_frame_with_fds(self.sock, reply, fds)
            except OSError:
                break  # the host hung up
            finally:
                for name, fd in zip(names, fds):
                    if name not in ("prog", "pid1"):
                        os.close(fd)
        self._sweep_orphans(everything=True)
        if not self.ctx.plan.pidns:  # we are the host's child (else the process that mirrors our exit is)
            _remove_scratch_if_orphaned(self.config)
        os._exit(0)

    def _fork_slot(self) -> tuple[list[str], list[int]]:
        """Prepare one run: its namespaces and tmpfs, pid 1 and the program; (names, descriptors).

        The descriptors named "prog" and "pid1" (pidfds) stay open here too, until the process is reaped.
        """
        ctx, plan = self.ctx, self.ctx.plan
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        report_r, report_w = os.pipe()
        go_r, go_w = os.pipe()
        status_r, status_w = os.pipe()
        opened = [out_r, out_w, err_r, err_w, report_r, report_w, go_r, go_w, status_r, status_w]
        try:
            fcntl.fcntl(go_w, _F_SETPIPE_SZ, 1 << 20)  # a whole request in one write
        except OSError:
            pass
        names = ["request", "out", "err", "report", "status"]
        fds = [go_w, out_r, err_r, report_r, status_r]
        flags = (_linux.CLONE_NEWNS if plan.mntns else 0) | (_linux.CLONE_NEWIPC if plan.ipcns else 0)
        moved = 0
        pid1 = prog = -1
        try:
            if flags and ctx.step("mntns", _linux.unshare, flags):
                moved = flags
                if plan.overlay and ctx.step("tmpfs", self._mount_tmpfs):
                    upper = os.open(self.upper_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    opened.append(upper)
                    names.append("upper")
                    fds.append(upper)
            if plan.pidns:
                _linux.unshare(_linux.CLONE_NEWPID)
                moved |= _linux.CLONE_NEWPID
                pid1 = self._spawn_pid1()
                fd = os.pidfd_open(pid1)
                self.kids[pid1] = (fd, -1)
                names.append("pid1")
                fds.append(fd)
            prog = _linux.fork()
            if prog == 0:
                try:  # the program closes every descriptor it does not need, these included, first thing
                    program_main(ctx, out_w, err_w, go_r, report_w)
                finally:
                    os._exit(SETUP_FAILED)
        except BaseException:
            for fd in opened:
                os.close(fd)
            if pid1 > 0:
                os.kill(pid1, signal.SIGKILL)  # its pidfd stays in self.kids until it is reaped
            raise
        finally:
            self._restore(moved)
        fd = os.pidfd_open(prog)
        self.kids[prog] = (fd, status_w)
        names.append("prog")
        fds.append(fd)
        for w in (out_w, err_w, report_w, go_r):
            os.close(w)
        return names, fds

    def _restore(self, moved: int) -> None:
        """Back to the zygote's own namespaces after preparing a slot in new ones."""
        if moved & _linux.CLONE_NEWPID:
            _linux.setns(self.zns, _linux.CLONE_NEWPID)
        for flag, fd in self.base_ns.items():
            if moved & flag:
                _linux.setns(fd, flag)

    def _mount_tmpfs(self) -> None:
        ctx = self.ctx
        opts = f"size={ctx.workspace_bytes},nr_inodes={ctx.workspace_files + 5},mode=0700"
        _linux.mount("tmpfs", ctx.mnt, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, opts)
        os.mkdir(self.work_dir, 0o700)
        os.mkdir(self.upper_dir, 0o700)

    def _spawn_pid1(self) -> int:
        """The run's pid 1: a pauser sharing our memory (see :func:`_linux.clone_pauser`), else ``sleep``."""
        try:
            return _linux.clone_pauser()
        except OSError as exc:
            if not self.sleep:
                raise
            self.notes.append(f"pid 1 of runs: {exc}; spawning sleep instead")
        devnull = self.ctx.devnull
        actions = [(os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]
        if self.sleep:
            return os.posix_spawn(self.sleep, ["sleep", "infinity"], {}, file_actions=actions, setsid=True)
        pid = _linux.fork()  # no sleep binary: a fork that waits for its end
        if pid == 0:
            try:
                _linux.close_from(0)
                while True:
                    signal.pause()
            finally:
                os._exit(0)
        return pid

    def _reap(self) -> None:
        """Reap every ended child; a program's wait status and CPU seconds go to its status pipe."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            pidfd, status_w = self.kids.pop(pid, (-1, -1))
            if status_w >= 0:
                try:
                    os.write(status_w, b"%d %.6f" % (status, usage.ru_utime + usage.ru_stime))
                except OSError:
                    pass
                os.close(status_w)
            if pidfd >= 0:
                os.close(pidfd)

    def _run_blocking(self, header: dict[str, Any], program: bytes) -> tuple[dict[str, Any], bytes, dict[str, Any]]:
        """The probe: one run in this process's own hands."""
        names, fds = self._fork_slot()
        slot = _monitor.Slot.from_fds(names, [os.dup(fd) if name in ("prog", "pid1") else fd for name, fd in zip(names, fds)])
        real_fd = os.open(header["workspace"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            result, out, _err, report = _monitor.supervise(slot, header, program, real_fd, tick=self._reap)
        except Exception as exc:
            return {"setup_error": f"probe: {exc}"}, b"", {}
        finally:
            os.close(real_fd)
            slot.close()
        return result, out, report

    def _sweep_orphans(self, everything: bool = False) -> None:
        """Without a pid namespace: kill whatever was reparented to us (we are a subreaper)."""
        self._reap()
        try:
            with open("/proc/thread-self/children") as f:
                kids = [int(p) for p in f.read().split()]
        except OSError:
            return
        for kid in kids:
            if everything or kid not in self.kids:
                try:
                    os.kill(kid, signal.SIGKILL)
                except OSError:
                    pass
