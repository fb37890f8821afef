"""How often a 2-rank gloo run dies at exit after finishing its work (printed, not asserted).

    python benchmarks/ddp_exit_loop.py [--runs 40]

Each run is ``torchrun --standalone --nproc-per-node=2`` of a small worker that does what a
trainer's rank does last: ``agentrl_train.distributed.setup()``, a DDP model through
``wrap_trainable``, three synced backwards and one ``Dist.sum``; rank 0 then waits 2 s (the
final evaluation) while rank 1 exits. Before ``Dist`` kept its collective tensors until teardown,
rank 1 was killed by SIGABRT ("terminate called without an active exception", pytorch#179291) in
5 of 89 runs on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = """
import time, torch
from agentrl_train import distributed
from agentrl_train.distributed import wrap_trainable

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.l(x).pow(2).sum()

def work(dist):
    torch.manual_seed(0)
    tr = wrap_trainable(M(), dist)
    for _ in range(3):
        with tr.no_sync(last=True):
            tr.backward(tr(torch.randn(8, 64)))
    dist.sum(1.0)

def main():
    with distributed.setup("cpu") as dist:
        work(dist)
        if dist.is_main:
            time.sleep(2.0)

main()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40, help="torchrun launches (default 40)")
    args = ap.parse_args()
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    aborted = failed = 0
    with tempfile.TemporaryDirectory(prefix="ddp-exit-") as tmp:
        worker = Path(tmp) / "worker.py"
        worker.write_text(WORKER)
        for i in range(args.runs):
            # --log-dir: without it torchrun leaves a torchelastic_* folder in /tmp per launch
            cmd = [torchrun, "--standalone", "--nproc-per-node=2", f"--log-dir={tmp}/logs-{i}", str(worker)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp)
            if proc.returncode != 0:
                failed += 1
                if "terminate called" in proc.stderr or "SIGABRT" in proc.stderr:
                    aborted += 1
                print(f"run {i + 1}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[0][:160]}")
    print(f"{args.runs} runs: {failed} failed, {aborted} of them a rank killed by SIGABRT at exit")


if __name__ == "__main__":
    main()
