"""Soak the Python sandbox: randomized hostile programs mixed with benign ones, on one runner.

Reports escapes (a file outside the workspace, a secret in the output, a connection to the host's
loopback server, a symlink/device/setuid file left in the workspace), runner crashes (an exception
from ``run`` or a wrong answer to a benign program), leaked processes and host descriptors, memory
drift of the host and the zygote, and latency percentiles. Not part of CI (``make soak``).

With ``--shared K`` the runs go through K leases on one shared service (K envs of one process,
each with its own workspace, taking turns), while one more lease's run (another env's program,
waiting on a child) stays alive the whole time: every run must leave the other envs' workspaces
and that run alone, and the long run must finish with its right answer at the end.

Run: ``python benchmarks/soak_sandbox.py [--n 10000] [--seed 0] [--benign 0.5] [--shared 4]``.
Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl_envs.testing import descendants, with_marker
from simulators.python import RunLimits
from simulators.python.sandbox import SandboxRunner
from simulators.python.sandbox import host as sandbox_host
from simulators.python.sandbox.shared import SharedSandbox

LIMITS = RunLimits(
    wall_s=2.0, cpu_s=2, memory_bytes=512 << 20, file_bytes=1 << 20, open_files=64, processes=32, output_bytes=64 << 10
)
HOSTILE_LIMITS = RunLimits(**{**LIMITS.__dict__, "wall_s": 0.5, "cpu_s": 1})

# {outside}, {secret}, {marker}, {port} and {rand} are filled in per run.
HOSTILE = [
    "while True:\n    pass\n",
    "import time\ntime.sleep(30)\n",
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execv('/bin/sleep', ['{marker}', '100'])\n    os._exit(0)\n",
    "import subprocess\nsubprocess.Popen(['{marker}', '100'], executable='/bin/sleep', start_new_session=True)\n",
    "b = bytearray(2**40)\n",
    "x = []\nwhile True:\n    x.append(' ' * 10**7)\n",
    "x = 10**(10**8)\n",
    "import threading, time\nfor _ in range(5000):\n    threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n",
    "while True:\n    print('x' * 1000)\n",
    "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe' * 100000)\n",
    "i = 0\nwhile True:\n    open(f'f{i}', 'w').close()\n    i += 1\n",
    "with open('big', 'wb') as f:\n    f.write(b'0' * (64 << 20))\n",
    "open('{outside}/escaped-{rand}', 'w').write('x')\n",
    "open('../outside/escaped-{rand}', 'w').write('x')\n",
    "open('/tmp/agentrl-escape-{marker}-{rand}', 'w').write('x')\n",
    "import os\nos.symlink('{outside}', 'link-{rand}')\n",
    "import os\nos.link('{secret}', 'hard-{rand}')\n",
    "print(open('{secret}').read())\n",
    "print(open('/proc/1/environ', 'rb').read())\n",
    "print(open('/proc/{host_pid}/environ', 'rb').read())\n",
    "import os\nprint(dict(os.environ))\n",
    "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.2)\n",
    "import socket\nprint(socket.getaddrinfo('example.com', 80))\n",
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\n",
    "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass\n",
    "import ctypes\nctypes.string_at(0)\n",
    "def r():\n    return r()\nr()\n",
    "print(input())\n",
    "x = []\nfor _ in range(100000):\n    x = [x]\nprint(x)\n",
    "print('ALL PASSED')\nraise SystemExit(1)\n",
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.unshare(0x10000000), libc.ptrace(0, 0, 0, 0))\n",
    "import os\nos.chmod('.', 0o4777)\nopen('s', 'w').close()\nos.chmod('s', 0o4755)\n",
    "import os\nos.mkfifo('fifo-{rand}')\n",
    "import os\nos.system('cat {secret}; kill -9 -1')\n",
    "import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass\n",
    # unix sockets of the host, pathname and abstract (issue #14): the listeners must receive nothing
    "import socket\na, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\na.sendto(b'leak', '{unix_dgram}')\n",
    "import socket\na, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\na.connect('{unix_dgram}')\na.send(b'x')\n",
    "import socket\na, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\na.sendto(b'leak', '\\0{abstract}')\n",
    "import socket\na, b = socket.socketpair()\na.connect('{unix_stream}')\na.send(b'leak')\n",
    "import socket, array, os\na, b = socket.socketpair()\nfd = os.open('.', os.O_RDONLY)\n"
    "a.sendmsg([b'x'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [fd]))], 0, '{unix_stream}')\n",
    # executing what the program wrote, and squatting the copy-back's temporaries
    "import os\nfd = os.memfd_create('x', 8)\nos.write(fd, open('/bin/true', 'rb').read())\nos.execve(fd, ['t'], {})\n",
    "import os\nfd = os.memfd_create('x')\n",
    "import os\nfor i in range(120):\n    os.makedirs(f'.sandbox-copy-1-{i}/x', exist_ok=True)\n",
    "for i in range(120):\n    open(f'.agentrl-copyback-{i:032x}', 'w').close()\n",
]


def _benign(rng: random.Random) -> tuple[str, str]:
    """A benign program and its exact expected stdout."""
    kind = rng.randrange(5)
    a, b = rng.randrange(10**6), rng.randrange(1, 10**6)
    if kind == 0:
        return f"print({a} * {b}, {a} // {b})", f"{a * b} {a // b}\n"
    if kind == 1:
        rows = [(rng.randrange(100), rng.randrange(100)) for _ in range(rng.randrange(1, 50))]
        code = (
            "import csv\n"
            f"rows = {rows!r}\n"
            "with open('t.csv', 'w', newline='') as f:\n    csv.writer(f).writerows(rows)\n"
            "with open('t.csv') as f:\n    print(sum(int(x) * int(y) for x, y in csv.reader(f)))\n"
        )
        return code, f"{sum(x * y for x, y in rows)}\n"
    if kind == 2:
        return f"import json\nprint(json.dumps({{'a': {a}, 'b': [{b}]}}, sort_keys=True))", f'{{"a": {a}, "b": [{b}]}}\n'
    if kind == 3:
        return f"import statistics\nprint(statistics.median([{a}, {b}, 7]))", f"{sorted([a, b, 7])[1]}\n"
    return f"import numpy as np\nprint(int(np.arange({a % 1000 + 1}).sum()))", f"{sum(range(a % 1000 + 1))}\n"


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def leftover_processes(runner: SandboxRunner, marker: str, timeout: float = 30.0, others: int = 0) -> int:
    """Processes beyond the zygote's idle tree (plus ``others`` of runs still going on) and marked
    ones, after waiting for them to go."""
    idle = sandbox_host.idle_processes(bool(runner.layers.get("pidns")), runner.warm_slots) + others
    end = time.monotonic() + timeout
    while True:
        extra = max(0, len(descendants(runner.pid or 0)) - idle) + len(with_marker(marker))
        if extra == 0 or time.monotonic() > end:
            for pid in with_marker(marker):
                os.kill(pid, signal.SIGKILL)
            return extra
        time.sleep(0.05)


def snapshot(path: Path) -> dict[str, tuple[int, int]]:
    """Every entry below ``path``: (mode, size)."""
    found = {}
    for entry in path.rglob("*"):
        st = entry.lstat()
        found[str(entry.relative_to(path))] = (st.st_mode, st.st_size)
    return found


class Neighbour:
    """Another env's run on a lease of the shared service, alive while the soak runs (``--shared``)."""

    def __init__(self, lease: SharedSandbox, ws: Path, marker: str) -> None:
        self.lease, self.ws, self.marker = lease, ws, marker
        ws.mkdir()
        (ws / "data.txt").write_text("the neighbour's data\n")
        self.outcome: dict[str, object] = {}
        code = (
            "import subprocess\nopen('mine.txt', 'w').write('kept')\n"
            f"subprocess.run([{marker!r}, 'infinity'], executable='/bin/sleep')\nprint(open('data.txt').read(), end='')\n"
        )
        limits = RunLimits(**{**LIMITS.__dict__, "wall_s": 24 * 3600.0})
        self.thread = threading.Thread(target=lambda: self.outcome.update(res=lease.run(code, str(ws), limits)), daemon=True)
        self.thread.start()
        end = time.monotonic() + 60.0
        while not with_marker(marker) and self.thread.is_alive() and time.monotonic() < end:
            time.sleep(0.02)

    def processes(self) -> int:
        """Its processes in the service's tree: its pid 1 (with a pid namespace), its program, its child."""
        return 3 if self.lease.layers.get("pidns") else 2

    def alive(self) -> bool:
        """Its run is still going on and its workspace is as it was (its own write is not back yet)."""
        data = self.ws / "data.txt"
        untouched = sorted(os.listdir(self.ws)) == ["data.txt"] and data.read_text() == "the neighbour's data\n"
        return self.thread.is_alive() and bool(with_marker(self.marker)) and untouched

    def finish(self) -> str:
        """End its child; its program must then answer right. A problem, or ""."""
        for pid in with_marker(self.marker):
            os.kill(pid, signal.SIGKILL)
        self.thread.join(60.0)
        res = self.outcome.get("res")
        if getattr(res, "stdout", None) != "the neighbour's data\n" or (self.ws / "mine.txt").read_text() != "kept":
            return f"the neighbour's run did not finish right: {res}"
        return ""


def percentile(values: array[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--benign", type=float, default=0.5, help="share of benign programs")
    parser.add_argument("--shared", type=int, default=0, help="K envs' leases on one shared service (0: one runner)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="agentrl-soak-"))
    outside, secret = root / "outside", root / "secret.txt"
    outside.mkdir()
    secret.write_text("s3cr3t-soak\n")
    marker = f"agentrl-soak-{os.getpid()}"
    os.environ["AGENTRL_SOAK_SECRET"] = "s3cr3t-env"
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    threading.Thread(target=serve, daemon=True).start()
    unix = {"unix_dgram": socket.SOCK_DGRAM, "unix_stream": socket.SOCK_STREAM, "abstract": socket.SOCK_DGRAM}
    unix_names = {"unix_dgram": str(root / "host-dgram.sock"), "unix_stream": str(root / "host-stream.sock")}
    unix_names["abstract"] = f"agentrl-soak-{os.getpid()}"
    listeners = []
    for key, kind in unix.items():
        listener = socket.socket(socket.AF_UNIX, kind)
        listener.bind("\0" + unix_names[key] if key == "abstract" else unix_names[key])
        if kind == socket.SOCK_STREAM:
            listener.listen(8)
        listener.setblocking(False)
        listeners.append(listener)
    leases: list[SharedSandbox] = []
    neighbour: Neighbour | None = None
    if args.shared:
        leases = [SharedSandbox(LIMITS, workspace_bytes=16 << 20, workspace_files=512) for _ in range(args.shared + 1)]
        runner = leases[0].runner
        neighbour = Neighbour(leases.pop(), root / "neighbour", f"agentrl-soak-neighbour-{os.getpid()}")
    else:
        runner = SandboxRunner(LIMITS, workspace_bytes=16 << 20, workspace_files=512)
    mode = f"shared service, {args.shared} leases + a neighbour's live run" if args.shared else "one runner"
    print(f"# soak: n={args.n} seed={args.seed} tier={runner.tier} missing={runner.missing or 'nothing'}; {mode}", flush=True)

    escapes: list[str] = []
    crashes: list[str] = []
    leaked = 0
    latency = {"benign": array("d"), "hostile": array("d")}  # compact: the host's RSS is measured
    fds_start = rss_start = 0
    workspace = root / "ws0"
    env_workspaces = [root / f"env{k}" for k in range(len(leases))]
    for path in env_workspaces:
        path.mkdir()
    snapshots = {path: snapshot(path) for path in env_workspaces}
    started = time.monotonic()

    slowest: list[tuple[float, str]] = []

    for i in range(args.n):
        if leases:
            env = i % len(leases)
            workspace = env_workspaces[env]
            if i % (25 * len(leases)) < len(leases):
                for entry in list(workspace.iterdir()):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry)
                    else:
                        entry.unlink()
        elif i % 25 == 0:
            shutil.rmtree(workspace, ignore_errors=True)
            workspace = root / f"ws{i}"
            workspace.mkdir()
        if i == max(20, args.n // 10):
            fds_start = len(os.listdir("/proc/self/fd"))
            rss_start = rss_kb(os.getpid()) + sum(rss_kb(p) for p in [runner.pid or 0, *descendants(runner.pid or 0)[:1]])
        benign = rng.random() < args.benign
        if benign:
            code, expected = _benign(rng)
            limits = LIMITS
        else:
            template = rng.choice(HOSTILE)
            values = {"outside": outside, "secret": secret, "marker": marker, "port": server.getsockname()[1]}
            values.update(rand=rng.randrange(10**9), host_pid=os.getpid(), **unix_names)
            code = template
            for key, value in values.items():
                code = code.replace("{" + key + "}", str(value))
            limits = HOSTILE_LIMITS
        t = time.perf_counter()
        try:
            res = leases[env].run(code, str(workspace), limits) if leases else runner.run(code, str(workspace), limits)
        except Exception as exc:
            crashes.append(f"run {i}: {type(exc).__name__}: {exc}")
            continue
        latency["benign" if benign else "hostile"].append(time.perf_counter() - t)
        if benign and (res.exit_code, res.stdout) != (0, expected):
            crashes.append(f"run {i}: benign program answered {res.exit_code} {res.stdout[:80]!r} {res.stderr[-200:]!r}")
        if not benign:
            slowest = sorted([*slowest, (latency["hostile"][-1], code.replace("\n", "; ")[:70])], reverse=True)[:5]
        if os.listdir(outside):
            escapes.append(f"run {i}: a file appeared outside: {os.listdir(outside)}")
        if "s3cr3t" in res.stdout + res.stderr:
            escapes.append(f"run {i}: a secret reached the output")
        if accepted:
            escapes.append(f"run {i}: the host's loopback server accepted a connection")
        for listener in listeners:
            try:
                listener.recv(1) if listener.type == socket.SOCK_DGRAM else listener.accept()
                escapes.append(f"run {i}: a host unix socket ({listener.getsockname()!r}) was reached")
            except BlockingIOError:
                pass
        if list(Path("/tmp").glob(f"agentrl-escape-{marker}*")):
            escapes.append(f"run {i}: a file appeared in /tmp")
        for path in workspace.rglob("*"):
            mode = path.lstat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) or mode & 0o6000:
                escapes.append(f"run {i}: {path.name} is a {stat.filemode(mode)} in the workspace")
        if leases:  # the other envs' workspaces are as their own last runs left them
            snapshots[workspace] = snapshot(workspace)
            for other in env_workspaces:
                if other != workspace and snapshot(other) != snapshots[other]:
                    escapes.append(f"run {i}: env {env}'s run changed {other.name}'s workspace")
                    snapshots[other] = snapshot(other)
        if neighbour is not None and not neighbour.alive():
            escapes.append(f"run {i}: the neighbour's run ended: {neighbour.outcome}")
            neighbour = None
        if i % 200 == 199:
            leaked += leftover_processes(runner, marker, others=neighbour.processes() if neighbour else 0)
            print(
                f"  {i + 1} runs, {time.monotonic() - started:.0f} s, escapes {len(escapes)}, crashes {len(crashes)}, leaked {leaked}",
                flush=True,
            )

    leaked += leftover_processes(runner, marker, others=neighbour.processes() if neighbour else 0)
    fds_end = len(os.listdir("/proc/self/fd"))
    rss_end = rss_kb(os.getpid()) + sum(rss_kb(p) for p in [runner.pid or 0, *descendants(runner.pid or 0)[:1]])
    drift = (rss_end - rss_start) / rss_start if rss_start else float("nan")
    elapsed = time.monotonic() - started
    if neighbour is not None:
        problem = neighbour.finish()
        if problem:
            escapes.append(problem)
    for lease in leases:
        lease.close()
    runner.close()
    stop.set()
    server.close()
    for listener in listeners:
        listener.close()
    shutil.rmtree(root, ignore_errors=True)

    print(
        f"runs                 {args.n} in {elapsed:.0f} s ({len(latency['benign'])} benign, {len(latency['hostile'])} hostile)"
    )
    print(f"escapes              {len(escapes)}")
    print(f"runner crashes       {len(crashes)}")
    print(f"leaked processes     {leaked}")
    print(f"leaked host fds      {fds_end - fds_start}")
    print(f"memory drift         {100 * drift:+.2f}% (host + zygote RSS, {rss_start} -> {rss_end} kB)")
    for kind, values in latency.items():
        if values:
            p50, p90, p99 = (1e3 * percentile(values, q) for q in (0.5, 0.9, 0.99))
            print(f"latency {kind:8s}     p50 {p50:.1f} ms  p90 {p90:.1f} ms  p99 {p99:.1f} ms  max {1e3 * max(values):.0f} ms")
    print("slowest hostile programs: " + "; ".join(f"{1e3 * t:.0f} ms {first!r}" for t, first in slowest))
    for line in (escapes + crashes)[:20]:
        print("  " + line)
    failed = escapes or crashes or leaked or fds_end != fds_start or not abs(drift) < 0.01
    print("SOAK FAILED" if failed else "SOAK PASSED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
