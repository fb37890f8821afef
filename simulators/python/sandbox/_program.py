"""The program process: it prepares itself, waits for its request, locks itself down, runs the agent's code.

Forked by the zygote ahead of the request (a warm slot) into the run's own pid, mount and IPC
namespaces, it does everything that does not depend on the request first: its stdio, a new session,
every descriptor it does not need closed, the pid cap of its namespace, the read-only part of its
Landlock ruleset, fresh interpreter state. Once the request arrives: the workspace check, the overlay
over the workspace, its own user namespace (a per-run RLIMIT_NPROC count, when the host is not root),
no capabilities, no_new_privs, ``landlock_restrict_self``, seccomp, every other descriptor closed,
the rlimits, the environment; then the code runs as ``__main__`` in a fresh namespace with the file
name ``<agent>``. Nothing the request names is acted on before the request's own checks, and the
agent's code runs only after every layer is on.
"""

from __future__ import annotations

import _signal
import builtins
import ctypes
import io
import json
import os
import resource
import signal
import stat
import sys
import time
import traceback
import types
from typing import Any, NoReturn

from . import _landlock, _linux, _seccomp
from ._context import SETUP_FAILED, Context
from ._protocol import decode_request, read_frame_fd

GLOBAL_NPROC = 4096  # RLIMIT_NPROC over all concurrent runs (the user namespace's ceiling)
# The kernel's smallest pid_max (RESERVED_PIDS + 1): a run's pid namespace holds at most 300 tasks
# even where RLIMIT_NPROC does not apply (root).
PID_MAX = 301
MS_BIND, MS_NOEXEC = 0x1000, 8
_PID_MAX_TEXT = str(PID_MAX)


def program_main(ctx: Context, out_w: int, err_w: int, go_r: int, setup_w: int) -> NoReturn:
    """Entry point of the program child; never returns."""
    report_fd = setup_w
    try:
        ruleset = _prepare(ctx, out_w, err_w, go_r, setup_w)
        ctx.prepared = time.monotonic()
        header, program = decode_request(read_frame_fd(go_r))
        os.close(go_r)
    except EOFError:
        os._exit(0)  # the host went away without a request
    except BaseException as exc:
        _fail(report_fd, f"sandbox setup: {type(exc).__name__}: {exc}")
    try:
        report_fd = _lock_in(ctx, header, ruleset, setup_w)
        os.write(report_fd, _setup_report(ctx))
    except BaseException as exc:
        _fail(report_fd, f"sandbox setup: {type(exc).__name__}: {exc}")
    del ctx, header
    _run_agent(program, report_fd)


def _setup_report(ctx: Context) -> bytes:
    """The first line of the report pipe: the layers applied (probe only), when the program was ready for
    its request (``prepared``) and when the agent's code starts (``ready``)."""
    ready, overlay = time.monotonic(), b"true" if ctx.overlaid else b"false"
    if ctx.applied or ctx.errors:
        report = {
            "program": ctx.applied,
            "program_errors": ctx.errors,
            "prepared": ctx.prepared,
            "ready": ready,
            "overlay": ctx.overlaid,
        }
        return json.dumps(report).encode() + b"\n"
    return b'{"program":{},"program_errors":{},"prepared":%.9f,"ready":%.9f,"overlay":%s}\n' % (ctx.prepared, ready, overlay)


def _fail(fd: int, message: str) -> NoReturn:
    try:
        os.write(fd, json.dumps({"error": message}).encode() + b"\n")
    finally:
        os._exit(SETUP_FAILED)


def _prepare(ctx: Context, out_w: int, err_w: int, go_r: int, setup_w: int) -> int:
    """Everything that does not depend on the request; the Landlock ruleset fd (-1 without Landlock)."""
    plan = ctx.plan
    _linux.prctl(_linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.dup2(ctx.devnull, 0)
    # The zygote's other descriptors (its control socket, other runs' status pipes) are never ours.
    _close_all_but(sorted((0, 1, 2, go_r, setup_w, *ctx.rule_fds)))
    # Inherited: SIGPIPE and SIGXFSZ ignored (the interpreter's), the environment and oom_score_adj
    # 1000 (the zygote's), an empty capability bounding set.
    # SIGCHLD is at its default already (the zygote's); SIGINT raises KeyboardInterrupt, as in a cold
    # interpreter. ``_signal`` directly: ``signal.signal`` converts to enums, which writes to pages of the
    # zygote's (copy-on-write faults).
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    os.setsid()  # a new session; without a pid namespace, one killpg reaches every descendant that stays in it
    if plan.subreaper:  # without a pid namespace: orphans of the run stay below us, where the host finds them
        _linux.prctl(_linux.PR_SET_CHILD_SUBREAPER, 1)
    if plan.pid_max:
        ctx.step("pid_max", _write, "/proc/sys/kernel/pid_max", _PID_MAX_TEXT)
    ruleset = [-1]
    if plan.landlock:
        ctx.step("landlock", _static_ruleset, ctx, ruleset)
    for fd in ctx.rule_fds:
        os.close(fd)
    _reseed(ctx.numpy_mt_state)
    return ruleset[0]


def _close_all_but(keep: list[int]) -> None:
    """Close every descriptor not in ``keep`` (sorted)."""
    low = 0
    for fd in keep:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    _linux.close_from(low)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _mount_overlay(ctx: Context, workspace: str, st: os.stat_result) -> None:
    mnt = ctx.mnt
    upper = f"{mnt}/upper"
    os.chmod(upper, stat.S_IMODE(st.st_mode))
    try:
        os.chown(upper, st.st_uid, st.st_gid)
    except OSError:
        pass
    lower = workspace
    if any(c in workspace for c in ",:\\"):  # characters overlay options cannot hold
        lower = f"{mnt}/lower"
        os.mkdir(lower, 0o700)
        _linux.mount(workspace, lower, None, MS_BIND, None)
    # Redirects and metacopy off: the upper layer then holds whole files, which the copy-back
    # needs (in a user namespace "userxattr" implies no redirects and refuses redirect_dir=off).
    opts = f"lowerdir={lower},upperdir={upper},workdir={mnt}/work,metacopy=off,index=off"
    opts += ",redirect_dir=off" if ctx.root else ",userxattr"
    _linux.mount("overlay", workspace, "overlay", _linux.MS_NOSUID | _linux.MS_NODEV | MS_NOEXEC, opts)


def _enter_run_userns(ctx: Context) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    ceiling = GLOBAL_NPROC if hard == resource.RLIM_INFINITY else min(hard, GLOBAL_NPROC)
    resource.setrlimit(resource.RLIMIT_NPROC, (ceiling, ceiling))
    _linux.unshare(_linux.CLONE_NEWUSER)
    _linux.map_self(ctx.uid, ctx.gid)


def _static_ruleset(ctx: Context, out: list[int]) -> None:
    """The ruleset of every run (``out[0]``): the zygote's prepared rules plus this process's ``/proc/self``."""
    handled = _landlock.handled_fs(ctx.plan.landlock)
    ruleset = out[0] = _landlock.create_prepared_ruleset(ctx.landlock_attr)
    _landlock.add_packed_rules(ruleset, ctx.landlock_rules)
    fd = os.open("/proc/self", os.O_PATH | os.O_CLOEXEC)
    try:
        _landlock.add_path_rule(ruleset, fd, (_landlock.READ_FILE | _landlock.READ_DIR) & handled)
    finally:
        os.close(fd)


def prepared_rules(rules: list[tuple[int, int]], abi: int) -> tuple[Any, Any]:
    """The ruleset attribute and ``rules`` (O_PATH fd, access) packed once, in the zygote."""
    handled = _landlock.handled_fs(abi)
    return _landlock.ruleset_attr(abi), _landlock.pack_path_rules([(fd, access & handled) for fd, access in rules])


def make_streams(devnull: int) -> dict[str, Any]:
    """A program's ``sys.stdin``, ``stdout`` and ``stderr``, built once in the zygote.

    The objects are made on descriptors 0-2 while those are what a program's are (``/dev/null``
    and a pipe), so that what they probe then (seekable, position) is what it would be in the
    program; the zygote installs them (:func:`fresh_interpreter_state`) and writes nothing to them,
    so each program forks with them in place and unused.
    """
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    r, w = os.pipe()
    try:
        os.dup2(devnull, 0)
        os.dup2(w, 1)
        os.dup2(w, 2)
        enc, errors = sys.stdout.encoding, sys.stdout.errors
        return {
            "stdin": io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), enc, "surrogateescape"),
            "stdout": io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), enc, errors),
            "stderr": io.TextIOWrapper(
                io.BufferedWriter(io.FileIO(2, "w", closefd=False)), enc, "backslashreplace", line_buffering=True
            ),
        }
    finally:
        for fd, copy in zip((0, 1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(r)
        os.close(w)


def fresh_interpreter_state(streams: dict[str, Any]) -> None:
    """What a cold interpreter would have that the zygote does not, set once in the zygote: every
    program inherits it without writing a page (its stdio objects, ``sys.argv``, no cached temp folder)."""
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None  # type: ignore[attr-defined]
    for name, stream in streams.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    sys.argv = ["<agent>"]
    sys.dont_write_bytecode = True


_MT_KEY_BYTES = 624 * 4  # numpy's mt19937_state: uint32_t key[624]; int pos
_MT_POS_END = (624).to_bytes(4, sys.byteorder)  # pos == 624: the next draw generates a new block


def numpy_mt_state() -> int:
    """The address of the legacy global numpy generator's MT19937 state (``mt19937_state``), or 0.

    Found once in the zygote, and used only when the layout checks out here: the key and position at
    that address are the ones numpy reports, and no Gaussian is cached (a run starts without one).
    """
    np_random = sys.modules.get("numpy.random")
    try:
        bitgen = np_random.mtrand._rand._bit_generator  # type: ignore[union-attr]
        if type(bitgen).__name__ != "MT19937" or np_random.get_state()[3] != 0:  # type: ignore[union-attr]
            return 0
        state = bitgen.state["state"]
        address = int(bitgen.ctypes.state_address)
        key_ok = ctypes.string_at(address, _MT_KEY_BYTES) == state["key"].tobytes()
        pos_ok = ctypes.c_int.from_address(address + _MT_KEY_BYTES).value == int(state["pos"])
    except Exception:  # another numpy, another layout: reseed through numpy's own call
        return 0
    return address if key_ok and pos_ok else 0


def _reseed(numpy_state: int) -> None:
    """Fresh generator state, as a cold interpreter's imports would have made (the fork shares the zygote's).

    numpy's legacy global generator gets 624 words from the OS written straight into its MT19937
    key, with the position at the end (the next draw regenerates the block), as a fresh
    ``RandomState()`` seeded from the OS would be: ``numpy.random.seed`` (a 32-bit seed) touches ~40
    pages of the zygote's on its way, each a copy-on-write fault of the run.
    """
    random = sys.modules.get("random")
    if random is not None:
        random.seed()  # type: ignore[attr-defined]  # os.fork would have; the zygote forks without its hooks
    if numpy_state:
        ctypes.memmove(numpy_state, os.urandom(_MT_KEY_BYTES) + _MT_POS_END, _MT_KEY_BYTES + 4)
        return
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed(int.from_bytes(os.urandom(4), "little"))  # type: ignore[attr-defined]


def _lock_in(ctx: Context, header: dict[str, Any], ruleset: int, setup_w: int) -> int:
    """The request-dependent steps; returns the descriptor of the report pipe.

    The report pipe stays open while the agent's code runs, at the highest descriptor number the
    program may hold, so that descriptors 3 and up are free as in a cold interpreter. Its last line
    says the program is done (see :func:`_finish`); writing it early only ends the run early.
    """
    plan = ctx.plan
    workspace = header["workspace"]
    real_fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        st = os.fstat(real_fd)
    finally:
        os.close(real_fd)
    if (st.st_dev, st.st_ino) != (header["ws_dev"], header["ws_ino"]):
        raise OSError("the workspace is not the host's workspace here (a mount made after the sandbox started?)")
    if plan.pid_max and int(header["processes"]) + 2 > PID_MAX:
        ctx.step("pid_max", _write, "/proc/sys/kernel/pid_max", str(int(header["processes"]) + 2))
    if plan.overlay:
        ctx.overlaid = ctx.step("overlay", _mount_overlay, ctx, workspace, st)
    if plan.userns_run:
        ctx.step("userns_run", _enter_run_userns, ctx)
    if plan.caps:
        ctx.step("caps", _linux.clear_capabilities)
    _linux.prctl(_linux.PR_SET_NO_NEW_PRIVS, 1)
    tasks = _tasks_of_this_user() if plan.nproc and not plan.userns_run else 0
    os.chdir(workspace)
    if ruleset >= 0:
        ctx.step("landlock_restrict", _restrict, ruleset, _landlock.READ_WRITE & _landlock.handled_fs(plan.landlock))
    if plan.seccomp:  # from here on only allowed syscalls
        ctx.step("seccomp", _seccomp.install, ctx.seccomp_filter)
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    report_fd = max(4, min(int(header["open_files"]), soft) - 1)
    if setup_w != report_fd:
        os.dup2(setup_w, report_fd, inheritable=False)
    _linux.close_range(3, report_fd - 1)
    _linux.close_from(report_fd + 1)
    _set_rlimits(ctx, header, tasks)
    os.environ["HOME"] = os.environ["TMPDIR"] = workspace
    return report_fd


def _restrict(ruleset: int, workspace_access: int) -> None:
    """Add the workspace (the working directory now) to the ruleset, then enforce it."""
    fd = os.open(".", os.O_PATH | os.O_CLOEXEC)
    try:
        _landlock.add_path_rule(ruleset, fd, workspace_access)
    finally:
        os.close(fd)
    _landlock.restrict_self(ruleset)


def _set_rlimits(ctx: Context, header: dict[str, Any], other_tasks: int) -> None:
    def clamp(kind: int, soft: int, hard: int) -> None:
        _cur_soft, cur_hard = resource.getrlimit(kind)
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        resource.setrlimit(kind, (soft, hard))

    mem, cpu, fsize, nofile = (int(header[k]) for k in ("memory_bytes", "cpu_s", "file_bytes", "open_files"))
    clamp(resource.RLIMIT_AS, mem, mem)
    clamp(resource.RLIMIT_CPU, cpu, cpu + 1)
    clamp(resource.RLIMIT_FSIZE, fsize, fsize)
    clamp(resource.RLIMIT_NOFILE, nofile, nofile)
    clamp(resource.RLIMIT_CORE, 0, 0)
    if ctx.plan.nproc:
        n = int(header["processes"]) + other_tasks
        clamp(resource.RLIMIT_NPROC, n, n)


def _tasks_of_this_user() -> int:
    """Threads of every process of our uid: without a user namespace RLIMIT_NPROC counts them all."""
    uid, total = os.getuid(), 0
    with os.scandir("/proc") as it:
        for entry in it:
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == uid:
                        total += max(1, os.stat(f"/proc/{entry.name}/task").st_nlink - 2)
                except OSError:
                    continue
    return total


# -- running the agent's code ----------------------------------------------------------------------


def _run_agent(program: bytes, report_fd: int) -> NoReturn:
    """Run the program as ``__main__`` in a fresh namespace, as ``python <agent>`` would; exit."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(program, "<agent>", "exec"), main.__dict__)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:
        code = 1
        _print_exception(exc)
    os._exit(_finish(code, report_fd))


def _exit_code(exc: SystemExit) -> int:
    value = exc.code
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF if -(2**63) <= value < 2**63 else 0xFF
    try:
        print(value, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _print_exception(exc: BaseException) -> None:
    """The traceback from the agent's first frame on: no sandbox frames."""
    try:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "<agent>":
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)
    except BaseException:
        try:
            sys.stderr.write(f"{type(exc).__name__}\n")
        except BaseException:
            pass


def _finish(code: int, report_fd: int) -> int:
    """What interpreter shutdown would do (join threads, run atexit, flush), then tell the host.

    When no other thread of the program can still write, it flushes and closes its output and says
    "done" in one go (one wake-up of the host, not one per step): the host can answer without
    waiting for this process's exit. Children are the host's to check: it believes a "done" only
    once the program has neither another thread nor a child (see :func:`._monitor._quiet`), and
    otherwise waits for the program's exit as it would without one.
    """
    threading = sys.modules.get("threading")
    for step in (getattr(threading, "_shutdown", None), getattr(sys.modules.get("atexit"), "_run_exitfuncs", None)):
        if step is not None:
            try:
                step()
            except BaseException:
                pass
    try:
        alone = len(os.listdir("/proc/self/task")) == 1
    except OSError:
        alone = False
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            if stream is sys.stdout and code == 0:
                code = 120  # as CPython does when the final flush of stdout fails
    if alone:
        try:
            os.close(1)
            os.close(2)
            os.write(report_fd, b'{"done": %d}\n' % (code & 0xFF))
        except OSError:
            pass
    return code
