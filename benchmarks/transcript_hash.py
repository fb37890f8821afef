"""One hash over the transcripts of every registered env id: a refactor that changes behaviour changes it.

For each id and each of ``--seeds`` seeds (default 200), one episode with ``candidates=3``: even seeds follow the
oracle, odd seeds pick a seeded random candidate (so error paths are covered too). Every reset and step adds its
observation, reward, terminated, truncated and info (JSON, sorted keys) to one SHA-256.

The Python tool runs with ``python_sandbox=False`` (the same programs, no sandbox processes), so the hash is
quick on 2 cores; the sandbox's own determinism is tested in tests/sandbox.

Run: ``python benchmarks/transcript_hash.py [--seeds 200]``. Prints one line per id and the total hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import gymnasium as gym  # noqa: E402

import agentrl_envs  # noqa: E402


def _record(digest: Any, *parts: Any) -> None:
    digest.update(json.dumps(parts, sort_keys=True, default=repr).encode())
    digest.update(b"\n")


def env_hash(env_id: str, seeds: int) -> str:
    """The SHA-256 of ``seeds`` episodes of ``env_id``."""
    import numpy as np

    digest = hashlib.sha256()
    env = gym.make(env_id, candidates=3, python_sandbox=False)
    try:
        core = env.unwrapped
        for seed in range(seeds):
            obs, info = env.reset(seed=seed)
            _record(digest, obs, info)
            rng = np.random.default_rng(seed)
            done = False
            while not done:
                if seed % 2 == 0:
                    action = core.oracle_action()  # type: ignore[attr-defined]
                else:
                    action = info["candidates"][int(rng.integers(len(info["candidates"])))]
                obs, reward, terminated, truncated, info = env.step(action)
                _record(digest, action, obs, float(reward), terminated, truncated, info)
                done = terminated or truncated
    finally:
        env.close()
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    args = parser.parse_args()
    total = hashlib.sha256()
    for env_id in agentrl_envs.ENV_IDS:
        h = env_hash(env_id, args.seeds)
        print(f"{env_id:28s} {h}", flush=True)
        total.update(h.encode())
    print(f"{'total':28s} {total.hexdigest()}")


if __name__ == "__main__":
    main()
