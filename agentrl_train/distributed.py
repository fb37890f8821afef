"""Several processes with torchrun: one rank per process, global statistics all-reduced.

``setup()`` reads torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); without it the
run is a single process and every hook is a no-op. Gradients of the trainable parameters (LoRA and
value head) go through :class:`torch.nn.parallel.DistributedDataParallel` (:func:`wrap_trainable`),
summed (not averaged) across ranks once per optimizer step; because the loop normalizes each loss by
the *global* count of valid units, that sum is the gradient of the whole batch whatever its split
across ranks and micro-batches. The sum is DDP's own C++ all-reduce (an average) of losses scaled by
the world size (:meth:`Trainable.backward`). No Python runs on gloo's threads: no Python comm hook,
and a backward that parks no Python object in the works it launches; otherwise a rank whose process
group was dropped right after a backward deadlocked (``~ProcessGroupGloo`` joins those threads while
holding the GIL that they wait for).

The latest tensors handed to a collective from Python (a window of 64) are kept alive by
:class:`Dist` until the process group is gone (:func:`setup` tears down in that order). Gloo's worker thread drops its last
reference to a finished work a moment after the caller's ``all_reduce`` has returned; if the
Python tensor had died meanwhile, that drop is the tensor's last and its decref needs the GIL:
at interpreter exit the thread then dies inside a C++ destructor and the rank aborts with
"terminate called without an active exception" (pytorch/pytorch#179291; seen here as a rank
killed by SIGABRT after it had finished its work, about 1 run in 20).

A rank that dies makes the collectives of the others fail (gloo: at once when the peer's socket
closes, else after ``AGENTRL_DIST_TIMEOUT_S``, default 300); :func:`setup` turns that into a
:class:`PeerLostError` that says how to resume.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from agentrl_envs.errors import AgentRLError, ConfigError

__all__ = ["Dist", "PeerLostError", "Trainable", "exec_torchrun", "setup", "wrap_trainable"]


class PeerLostError(AgentRLError):
    """Another rank died or stopped answering; this rank stops instead of hanging."""


class Dist:
    """Rank, world size and the collective operations the training loop needs."""

    def __init__(self, rank: int = 0, world: int = 1, device: torch.device | None = None) -> None:
        self.rank, self.world = rank, world
        self.device = device or torch.device("cpu")  #: where collective tensors live (cuda under nccl)
        self.is_main = rank == 0
        #: seconds this rank spent in collectives: statistics and checks from launch to completion, and
        #: DDP's gradient all-reduce as the time its backward waited on it (:meth:`Trainable.backward`)
        self.comm_s = 0.0
        #: the latest tensors handed to collectives, kept until the process group is destroyed (module
        #: docstring). Only the last few can still be held by a gloo thread (each collective completes
        #: before the next starts), so a bounded window does: a long run does not keep them all.
        self._handed: collections.deque[torch.Tensor] = collections.deque(maxlen=64)

    def _all_reduce(self, t: torch.Tensor, op: Any = None) -> torch.Tensor:
        """``all_reduce`` of ``t`` in place (sum unless ``op``), keeping ``t`` alive until teardown."""
        import torch.distributed as td

        self._handed.append(t)
        td.all_reduce(t, op=op or td.ReduceOp.SUM)
        return t

    def release(self) -> None:
        """Drop the kept tensors; only once the process group is destroyed (:func:`setup` does it)."""
        self._handed.clear()

    @property
    def active(self) -> bool:
        return self.world > 1

    def _reduce(self, values: list[float], op: Any = None) -> list[float]:
        if not self.active:
            return values
        import torch.distributed as td

        t0 = time.perf_counter()
        t = self._all_reduce(torch.tensor(values, dtype=torch.float64, device=self.device), op or td.ReduceOp.SUM)
        self.comm_s += time.perf_counter() - t0
        return t.tolist()

    def sum(self, x: float) -> float:
        return self._reduce([float(x)])[0]

    def moments(self, x: np.ndarray) -> tuple[int, float, float]:
        n, s, ss = self._reduce([float(x.size), float(x.sum()), float((x * x).sum())])
        return int(n), s, ss

    def decide(self, flag: bool) -> bool:
        """One decision for all ranks (true if any rank says so)."""
        return self._reduce([1.0 if flag else 0.0])[0] > 0

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as td

            td.barrier()

    def check_same_weights(self, policy: Any, when: str = "at start") -> None:
        """Every rank must hold identical trainable weights (the model seed is shared).

        Compares a SHA-256 of every trainable tensor's bytes, so any difference (not only one that
        changes a sum) is caught. Raises:
            AgentRLError: the weights differ on some rank.
        """
        if not self.active:
            return
        import torch.distributed as td

        h = hashlib.sha256()
        for name, p in policy.trainable_parameters():
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        local = torch.tensor(list(h.digest()), dtype=torch.int64, device=self.device)
        lo = self._all_reduce(local.clone(), td.ReduceOp.MIN)
        hi = self._all_reduce(local.clone(), td.ReduceOp.MAX)
        if not torch.equal(lo, hi):
            raise AgentRLError(
                f"rank {self.rank}: trainable weights differ across ranks {when}; every rank must use the same "
                "--seed, --model and --init-adapter (and the same code and library versions)"
            )

    def max_weight_diff(self, policy: Any) -> float:
        """Largest absolute difference of any trainable weight between ranks (0.0 when in sync)."""
        if not self.active:
            return 0.0
        import torch.distributed as td

        flat = torch.cat([p.detach().double().reshape(-1).to(self.device) for _, p in policy.trainable_parameters()])
        lo = self._all_reduce(flat.clone(), td.ReduceOp.MIN)
        hi = self._all_reduce(flat.clone(), td.ReduceOp.MAX)
        return float((hi - lo).max()) if flat.numel() else 0.0

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (a JSON value: statistics, not code), in rank order, on every rank.

        Two all-reduces of byte tensors this rank keeps (not ``all_gather_object``, whose tensors
        die with the call: see the module docstring): the longest JSON text, then every rank's bytes
        in its own row of a zero matrix. JSON, not pickle: bytes that arrive from another process
        are never a program.
        """
        if not self.active:
            return [obj]
        import json

        import torch.distributed as td

        data = json.dumps(obj, separators=(",", ":")).encode()
        longest = int(self._all_reduce(torch.tensor([len(data)], dtype=torch.int64, device=self.device), td.ReduceOp.MAX)[0])
        rows = torch.zeros((self.world, longest + 8), dtype=torch.uint8)
        rows[self.rank, :8] = torch.tensor(list(len(data).to_bytes(8, "little")), dtype=torch.uint8)
        rows[self.rank, 8 : 8 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        rows = self._all_reduce(rows.to(self.device)).cpu()
        out = []
        for r in range(self.world):
            row = rows[r].numpy().tobytes()
            out.append(json.loads(row[8 : 8 + int.from_bytes(row[:8], "little")]))
        return out


class Trainable:
    """The module the loop calls for a micro-batch's loss, DDP-wrapped over the trainable set it was built for.

    ``names`` is that set; :func:`wrap_trainable` builds a new wrapper when it changes (a stage that
    trains another adapter), because DDP registers its parameters once: gradients of parameters that
    became trainable later are never all-reduced and the ranks drift apart without an error.
    """

    def __init__(
        self, module: torch.nn.Module, names: tuple[str, ...], ddp: torch.nn.Module | None, dist: Dist | None = None
    ) -> None:
        self.module, self.names, self.ddp, self.dist = module, names, ddp, dist
        self._timed_iteration = -1  # the last DDP iteration whose all-reduce wait went into dist.comm_s

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return (self.ddp or self.module)(*args, **kwargs)

    def no_sync(self, last: bool) -> Any:
        """Skip the all-reduce (gradients accumulate locally) on every micro-batch but the last."""
        if self.ddp is None or last:
            return contextlib.nullcontext()
        return self.ddp.no_sync()  # type: ignore[operator]

    def backward(self, loss: torch.Tensor) -> None:
        """Backward a micro-batch's loss; under DDP the gradients come out summed across ranks.

        Call it inside :meth:`no_sync`'s context. DDP's built-in (C++) all-reduce averages, so the loss
        is scaled by the world size first (for a power-of-two world the scaling and the average are
        exact: the gradients are bit for bit the sum). On the syncing micro-batch, the time the backward
        waited on the all-reduce goes into ``dist.comm_s``.
        """
        if self.ddp is None or self.dist is None:
            loss.backward()
            return
        _backward_keeping_python_off_gloo(loss * self.dist.world)
        if self.ddp.require_backward_grad_sync:  # type: ignore[union-attr]
            self.dist.comm_s += self._allreduce_wait_s()

    def _allreduce_wait_s(self) -> float:
        """Seconds from the last gradient being ready to the all-reduce's completion, by DDP's own timer.

        DDP's reducer stamps when the backward's compute ended and when its all-reduce finished (a CPU
        clock under gloo, checked here: a rank that arrives late makes the other wait that long; CUDA
        events on a GPU, not measured here) (``backward_comm_time`` runs from the first bucket's launch, so it also
        holds the part that overlapped the compute; that part is ``backward_compute_comm_overlap_time``).
        The difference is the wait on the other ranks and the wire. The logger copies the stamps into
        its data only when asked (DDP asks at the next synced forward), so this asks right away.
        """
        ddp: Any = self.ddp
        ddp.logger.set_runtime_stats_and_log()
        data = ddp._get_ddp_logging_data()
        if data.get("iteration", -1) == self._timed_iteration or "backward_comm_time" not in data:
            return 0.0  # no fresh stamps (a backward that launched no bucket)
        self._timed_iteration = data["iteration"]
        wait_ns = data["backward_comm_time"] - data.get("backward_compute_comm_overlap_time", 0)
        return max(wait_ns, 0) / 1e9


def _backward_keeping_python_off_gloo(loss: torch.Tensor) -> None:
    """``loss.backward()`` without the Python object torch parks in thread-local state meanwhile.

    torch 2.13's ``backward`` stores a ``contextvars.Context`` in C++ thread-local state while the
    engine runs (it carries torch.compile settings to device threads; this loop compiles nothing).
    Every gloo work that DDP launches from the backward captures that state, so gloo's run-loop
    thread, which frees the work once it is done, must take the GIL to drop it. A thread that holds
    the GIL and joins that loop meanwhile (``~ProcessGroupGloo`` when the last reference to the group
    goes right after a backward) then waits forever: seen as a rank hung at exit (gdb: the run loop in
    ``~AsyncWork`` -> ``~ThreadLocalState`` -> ``take_gil``). The engine itself, called here directly
    with the gradient ``backward`` would pass, stores nothing.
    """
    engine = getattr(torch.autograd.Variable, "_execution_engine", None)
    if engine is None:  # a torch without the handle: the plain backward (test_ddp's drop test would hang)
        loss.backward()
        return
    grad = torch.ones_like(loss, memory_format=torch.preserve_format)
    engine.run_backward((loss,), (grad,), False, False, (), True, True)  # keep_graph, create_graph, inputs, ...


def trainable_names(module: torch.nn.Module) -> tuple[str, ...]:
    return tuple(n for n, p in module.named_parameters() if p.requires_grad)


def wrap_trainable(module: torch.nn.Module, dist: Dist, current: Trainable | None = None) -> Trainable:
    """``module`` (whose forward is a micro-batch's loss) under DDP over its trainable parameters only.

    Frozen parameters and buffers are left out of DDP entirely (not broadcast, not bucketed), so the
    wrapper costs nothing for the base model. Gradients are summed across ranks, not averaged (the
    loss is already divided by the global count): :meth:`Trainable.backward` scales the loss by the
    world size under DDP's averaging all-reduce. Returns ``current`` unchanged when its
    trainable set is still the module's; call this before each update (the loop does) so that a
    changed adapter gets a new wrapper.
    """
    names = trainable_names(module)
    if current is not None and current.module is module and current.names == names:
        return current
    if not names:
        raise ConfigError("nothing to train: no parameter of the policy requires a gradient (is the adapter frozen?)")
    if not dist.active:
        return Trainable(module, names, None)
    from torch.nn.parallel import DistributedDataParallel as DDP

    frozen = [n for n, p in module.named_parameters() if not p.requires_grad] + [n for n, _ in module.named_buffers()]
    DDP._set_params_and_buffers_to_ignore_for_model(module, frozen)
    # device_ids=None: DDP leaves the inputs (transitions, not tensors) where they are on CPU and GPU alike.
    ddp = DDP(
        module,
        device_ids=None,
        init_sync=False,  # the start check compares the weights instead of silently copying rank 0's
    )
    # No comm hook: DDP's own C++ all-reduce (Trainable.backward scales the loss so its average is the
    # sum). A Python hook's callback runs on gloo's run-loop thread, which ~ProcessGroupGloo joins while
    # holding the GIL that callback needs (see _backward_keeping_python_off_gloo for the other way in).
    ddp._set_ddp_runtime_logging_sample_rate(1)  # stamp every synced backward (default: 10, then 1 in 100)
    return Trainable(module, names, ddp, dist)


@contextlib.contextmanager
def setup(device: str = "auto") -> Iterator[Dist]:
    """A :class:`Dist` for this process: torchrun's process group, or a single process.

    Args:
        device: the run's ``--device``: nccl when it resolves to CUDA (one GPU per local rank), else gloo.

    Raises:
        ConfigError: more local ranks than CUDA devices.
        PeerLostError: a collective failed because another rank died or timed out.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        yield Dist()
        return
    import torch.distributed as td

    cuda = device != "cpu" and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda and local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"LOCAL_RANK {local_rank} but this machine has {torch.cuda.device_count()} CUDA device(s): use "
            "--nproc-per-node <= the GPU count, or --device cpu (gloo) for more processes"
        )
    timeout_s = float(os.environ.get("AGENTRL_DIST_TIMEOUT_S", "300"))
    td.init_process_group(backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    where = torch.device("cpu")
    if cuda:
        where = torch.device("cuda", local_rank)
        torch.cuda.set_device(where)
    dist = Dist(td.get_rank(), td.get_world_size(), where)
    try:
        yield dist
    except (td.DistError, RuntimeError) as exc:
        if not _is_comm_failure(exc):
            raise
        raise PeerLostError(
            f"rank {dist.rank}: lost another rank of {dist.world} ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
            f"the run stopped (collective timeout {timeout_s:g} s, AGENTRL_DIST_TIMEOUT_S). Restart it with --resume and "
            "the same number of ranks to continue from the latest checkpoint"
        ) from None
    finally:
        _teardown(dist)


def _teardown(dist: Dist) -> None:
    """Destroy the process group, then drop the tensors its works may still hold.

    The run's DDP wrappers are garbage by now, often in reference cycles: collected first, so the
    process group's last reference goes (and gloo's threads are joined) while the interpreter is
    whole and :class:`Dist` still owns every tensor a work holds. A failure here is printed, not
    raised: the run's work is done and saved.
    """
    import gc

    import torch.distributed as td

    try:
        gc.collect()
        td.destroy_process_group()
        gc.collect()
    except Exception as exc:
        print(f"rank {dist.rank}: destroying the process group failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    else:
        dist.release()


def _is_comm_failure(exc: BaseException) -> bool:
    import torch.distributed as td

    if isinstance(exc, td.DistError):
        return True
    text = str(exc).lower()
    return any(k in text for k in ("connection closed", "connection reset", "timed out", "gloo", "nccl", "broken pipe"))


def exec_torchrun(nproc: int, argv: list[str], log_dir: str | None = None) -> int:
    """``agentrl-train ppo --nproc N ...`` -> ``torchrun ... --nproc-per-node N [--log-dir D] -m agentrl_train ppo ...``, on loopback."""
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        raise ConfigError("--nproc: torchrun is not installed next to this Python; pip install -e '.[train]'")
    args = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        args.append(a)
    # One machine: rendezvous, store and gloo's sockets on loopback only (docs/security.md); the
    # ranks trust each other's tensors, so nothing else on the network may join.
    launch = [
        torchrun,
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:0",
        "--local-addr=127.0.0.1",
        f"--nproc-per-node={nproc}",
    ]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if log_dir is not None:
        launch.append(f"--log-dir={log_dir}")
    os.execv(torchrun, [*launch, "-m", "agentrl_train", *args])
    return 0  # pragma: no cover
