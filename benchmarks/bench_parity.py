"""Parity of every path to the agentrl envs: oracle success, the same rewards as ``gym.make``, and per-call cost.

For each path a user reaches the envs by (in-process ``gym.make``; TRL's ``environment_factory``
class; Stable-Baselines3's ``CandidatesDiscrete`` view; an ``agentrl-envs openenv`` server through
OpenEnv's own client; verifiers' ``load_environment`` taskset and eval runner; ``agentrl-envs mcp``
over streamable HTTP and over stdio through the ``mcp`` SDK's client; ``skyrl_gym.make``;
``gem.make``), every id and seed is played by the oracle in lockstep with a ``gym.make`` twin made
with the same keyword arguments and seed: the twin picks the oracle's action, steps it, and the path
is sent the same action. A path's rewards are *the same* when every step's reward (TRL and verifiers:
the running return, which is what they expose) equals the twin's exactly, and the path's task text
and episode end are the twin's too. Each id and seed is played with faults off and with
``error_profile="flaky"``.

The per-call time is the wall time of the path's own step call (a method call, an HTTP or WebSocket
round trip, a JSON-RPC call over a pipe) around the env's ``step``; the gym.make row is
``env.step`` itself, and the ratios are against it over the same episodes. verifiers' eval runner
owns its rollout loop, so its row times the env call its harness makes per turn
(``AgentRLState.step``), and its success and returns come from ``run_eval`` with a scripted oracle
model on loopback, each trace's transcript replayed through ``gym.make``.

Servers run on 127.0.0.1 free ports, started and stopped by the benchmark. A path whose library is
not installed is reported as missing, not measured.

Run: ``python benchmarks/bench_parity.py [--seeds 2] [--env-ids ID ...] [--paths NAME ...] [--md PATH]``.
Prints a Markdown table; never asserts. Exit status 1 when a measured path missed a success or a reward.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import agentrl_envs  # noqa: E402
from agentrl_envs.core.actions import parse_action  # noqa: E402
from agentrl_envs.testing import free_port, serve_in_thread, start_cli_server, stop_process  # noqa: E402

PROFILES = ("none", "flaky")
#: SB3's view needs ``candidates=K``; the twin is made with it too (the candidates draw from the env's generator).
SB3_CANDIDATES = 4


@dataclass
class Step:
    """What a path reports for one call: the step's reward or the running return, the end, success."""

    done: bool
    reward: float | None = None
    total: float | None = None
    success: bool | None = None


@dataclass
class Tally:
    """One path's episodes."""

    episodes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROFILES, 0))
    solved: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROFILES, 0))
    same: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROFILES, 0))
    step_s: list[float] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    def add(self, profile: str, solved: bool, same: bool, step_s: list[float], what: str) -> None:
        self.episodes[profile] += 1
        self.solved[profile] += solved
        self.same[profile] += same
        self.step_s += step_s
        if not same:
            self.mismatches.append(what)


Reset = Callable[[], Any]
Call = Callable[[Any], Any]


async def _maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def lockstep(
    tally: Tally,
    env_id: str,
    seed: int,
    profile: str,
    reset: Reset,
    call: Call,
    prepare: Callable[[str], Any] = lambda action: action,
    **twin_kwargs: Any,
) -> None:
    """Play the oracle of ``env_id``/``seed`` on a path and on a ``gym.make`` twin; add the episode to ``tally``.

    Args:
        reset: starts the path's episode; returns its task text (or None where the path shows none).
        call: sends one prepared action; returns a :class:`Step` (awaitable or not). Only this is timed.
        prepare: turns the oracle's action text into what ``call`` takes (a tool call, an index).
    """
    twin = gym.make(env_id, error_profile=profile, **twin_kwargs)
    try:
        instruction, _ = twin.reset(seed=seed)
        shown = await _maybe(reset())
        same = shown is None or shown == instruction
        total, step_s, done, step = 0.0, [], False, Step(done=False)
        while not done:
            action = twin.unwrapped.oracle_action()  # type: ignore[attr-defined]
            _, reward, terminated, truncated, info = twin.step(action)
            total += float(reward)
            done = bool(terminated or truncated)
            argument = prepare(action)
            start = time.perf_counter()
            step = await _maybe(call(argument))
            step_s.append(time.perf_counter() - start)
            same = same and step.done == done
            same = same and (step.reward is None or step.reward == float(reward))
            same = same and (step.total is None or step.total == total)
        twin_success = bool(info.get("success"))
        solved = bool(step.success) and twin_success
        tally.add(profile, solved, same, step_s, f"{env_id} seed {seed} {profile}")
    finally:
        twin.close()


# -- the paths ---------------------------------------------------------------------------------------


async def gym_api_path(tally: Tally, env_ids: Sequence[str], seeds: Sequence[int], make: Any) -> None:
    """A path whose envs speak Gymnasium's reset/step (``make(env_id, error_profile=...)``: gym.make, gem.make)."""
    for env_id in env_ids:
        for profile in PROFILES:
            env = make(env_id, error_profile=profile)
            for seed in seeds:

                def call(action: str, env: Any = env) -> Step:
                    _, reward, terminated, truncated, info = env.step(action)
                    return Step(terminated or truncated, reward=float(reward), success=info.get("success"))

                await lockstep(tally, env_id, seed, profile, lambda env=env, seed=seed: env.reset(seed=seed)[0], call)
            env.close()


async def gym_make_path(tally: Tally, env_ids: Sequence[str], seeds: Sequence[int]) -> None:
    await gym_api_path(tally, env_ids, seeds, gym.make)


async def trl_path(tally: Tally, env_ids: Sequence[str], seeds: Sequence[int]) -> None:
    from agentrl_envs.integrations.trl import environment_factory

    for env_id in env_ids:
        for profile in PROFILES:
            env = environment_factory(env_id, error_profile=profile)()
            tools = gym.make(env_id).unwrapped.tools  # type: ignore[attr-defined]

            def call(tool_call: Any, env: Any = env) -> Step:
                getattr(env, tool_call.name)(**tool_call.arguments)  # TRL calls the tool method with the model's arguments
                return Step(env.done, total=env.get_reward(), success=env.info.get("success"))

            for seed in seeds:
                await lockstep(
                    tally,
                    env_id,
                    seed,
                    profile,
                    lambda env=env, seed=seed: env.reset(seed=seed),
                    call,
                    lambda action, tools=tools: parse_action(action, tools),
                )


async def sb3_path(tally: Tally, env_ids: Sequence[str], seeds: Sequence[int]) -> None:
    importlib.import_module("stable_baselines3")  # the path is SB3's; its absence is a missing row
    from agentrl_envs.wrappers.candidates_discrete import CandidatesDiscrete

    for env_id in env_ids:
        for profile in PROFILES:
            env = CandidatesDiscrete(gym.make(env_id, error_profile=profile, candidates=SB3_CANDIDATES))
            last: dict[str, Any] = {}

            def reset(env: Any = env, seed: int = 0, last: dict[str, Any] = last) -> str:
                _, last["info"] = env.reset(seed=seed)
                return str(last["info"]["observation_text"])

            def call(index: int, env: Any = env, last: dict[str, Any] = last) -> Step:
                _, reward, terminated, truncated, last["info"] = env.step(index)
                return Step(terminated or truncated, reward=float(reward), success=last["info"].get("success"))

            for seed in seeds:
                await lockstep(
                    tally,
                    env_id,
                    seed,
                    profile,
                    lambda reset=reset, seed=seed: reset(seed=seed),
                    call,
                    lambda action, last=last: last["info"]["candidates"].index(action),  # the oracle is a candidate
                    candidates=SB3_CANDIDATES,
                )
            env.close()


async def openenv_path(tally: Tally, env_ids: Sequence[str], seeds: Sequence[int]) -> None:
    from openenv.core import GenericEnvClient

    proc, url = start_cli_server(["openenv", env_ids[0]], "stdout")
    try:
        for env_id in env_ids:
            tools = gym.make(env_id).unwrapped.tools  # type: ignore[attr-defined]
            for profile in PROFILES:
                async with GenericEnvClient(base_url=url) as remote:

                    async def reset(remote: Any = remote, seed: int = 0, env_id: str = env_id, profile: str = profile) -> str:
                        result = await remote.reset(seed=seed, env_id=env_id, error_profile=profile)
                        return str(result.observation["text"])

                    async def call(tool_call: Any, remote: Any = remote) -> Step:
                        result = await remote.step({"tool": tool_call.name, "arguments": tool_call.arguments})
                        info = result.observation["info"]
                        return Step(bool(result.done), reward=result.reward, success=info.get("success"))

                    for seed in seeds:
                        await lockstep(
                            tally,
                            env_id,
                            seed,
                            profile,
                            lambda reset=reset, seed=seed: reset(seed=seed),
                            call,
                            lambda action, tools=tools: parse_action(action, tools),
                        )
    finally:
        stop_process(proc)


async def verifiers_path(tally: Tally, env_ids: Sequence[str], seeds: Sequence[int]) -> None:
    importlib.import_module("verifiers.v1")
    sys.path.insert(0, str(ROOT / "environments" / "agentrl_env"))  # the Hub package, as the tests import it
    from agentrl_envs.integrations.verifiers_env import AgentRLState, load_environment

    for env_id in env_ids:
        for profile in PROFILES:
            env = load_environment(env_id, num_tasks=len(seeds), seed=seeds[0], error_profile=profile)
            for task in env.taskset:
                state = AgentRLState()

                async def reset(state: Any = state, data: Any = task.data) -> str:
                    return str(await state.start(data))

                async def call(action: str, state: Any = state) -> Step:
                    await state.step(action)
                    return Step(state.done, total=state.episode_return, success=state.success)

                await lockstep(tally, env_id, task.data.seed, profile, reset, call)
                await state.close()
    # success and the return over verifiers' own eval runner (its rollouts; rewards from the traces)
    for env_id in env_ids:
        for profile in PROFILES:
            await _verifiers_eval(tally, env_id, seeds, profile)


async def _verifiers_eval(tally: Tally, env_id: str, seeds: Sequence[int], profile: str) -> None:
    import verifiers.v1 as vf
    from verifiers.v1.cli.eval.runner import run_eval
    from verifiers.v1.configs.cli.eval import EvalConfig
    from verifiers.v1.dialects.chat import message_to_wire
    from verifiers.v1.runtimes import SubprocessConfig

    from agentrl_envs.integrations.oracle_chat import OracleChat, transcript_actions
    from agentrl_envs.integrations.verifiers_env import TASKSET_ID, AgentRLTasksetConfig

    oracle = OracleChat(env_id, seeds, error_profile=profile)
    make_kwargs = {"error_profile": profile}
    taskset = AgentRLTasksetConfig(id=TASKSET_ID, env_id=env_id, seed=seeds[0], num_tasks=len(seeds), make_kwargs=make_kwargs)
    agent = vf.AgentConfig(harness=vf.HarnessConfig(id=TASKSET_ID), runtime=SubprocessConfig())
    with serve_in_thread(oracle.app(), free_port()) as url, tempfile.TemporaryDirectory(prefix="bench-parity-vf-") as out:
        config = EvalConfig(
            env=vf.SingleAgentEnvConfig(taskset=taskset, agent=agent),
            model="oracle",
            client=vf.EvalClientConfig(base_url=f"{url}/v1", api_key_var="AGENTRL_BENCH_NO_KEY"),
            rich=None,
            push=False,
            output_dir=Path(out),
        )
        episodes = await run_eval(config)
    for trace in (t for episode in episodes for t in episode.traces):
        seed = trace.task.data.seed
        actions = transcript_actions([message_to_wire(m) for m in trace.messages])
        twin = gym.make(env_id, error_profile=profile)
        twin.reset(seed=seed)
        total = 0.0
        for action in actions:
            _, reward, terminated, truncated, info = twin.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        twin.close()
        same = trace.ok and trace.reward == total and trace.metrics["success"] == float(bool(info.get("success")))
        tally.add(profile, trace.ok and trace.metrics["success"] == 1.0, same, [], f"vf-eval {env_id} seed {seed} {profile}")


async def _mcp_play(tally: Tally, client: Any, env_id: str, seeds: Sequence[int], profile: str) -> None:
    tools = gym.make(env_id).unwrapped.tools  # type: ignore[attr-defined]

    async def reset(seed: int) -> str:
        result = await client.call_tool("reset", {"seed": seed})
        return str(result.content[0].text)

    async def call(tool_call: Any) -> Step:
        result = (await client.call_tool(tool_call.name, tool_call.arguments)).structured_content
        return Step(bool(result["done"]), reward=result["reward"], success=result["info"].get("success"))

    for seed in seeds:
        await lockstep(
            tally, env_id, seed, profile, lambda seed=seed: reset(seed), call, lambda action: parse_action(action, tools)
        )


async def mcp_http_path(tally: Tally, env_ids: Sequence[str], seeds: Sequence[int]) -> None:
    from mcp.client import Client

    keys = [(env_id, profile) for env_id in env_ids for profile in PROFILES]
    with ThreadPoolExecutor(len(keys)) as pool:  # the servers start side by side
        futures = [
            pool.submit(start_cli_server, ["mcp", env_id, "--transport", "http", "--error-profile", profile], "stderr")
            for env_id, profile in keys
        ]
    started = [f.result() for f in futures if f.exception() is None]
    try:
        if len(started) != len(keys):
            raise RuntimeError(f"MCP servers did not start: {[str(f.exception()) for f in futures if f.exception()]}")
        for (env_id, profile), (_, url) in zip(keys, started):
            async with Client(url + "/mcp") as client:
                await _mcp_play(tally, client, env_id, seeds, profile)
    finally:
        for proc, _ in started:
            stop_process(proc)


async def mcp_stdio_path(tally: Tally, env_ids: Sequence[str], seeds: Sequence[int]) -> None:
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    for env_id in env_ids:
        for profile in PROFILES:
            args = ["-m", "agentrl_envs", "mcp", env_id, "--error-profile", profile]
            params = StdioServerParameters(command=sys.executable, args=args, cwd=str(ROOT))
            async with Client(stdio_client(params)) as client:
                await _mcp_play(tally, client, env_id, seeds, profile)


async def skyrl_path(tally: Tally, env_ids: Sequence[str], seeds: Sequence[int]) -> None:
    import skyrl_gym

    import agentrl_envs.integrations.skyrl_gym_env  # noqa: F401  (registers the ids with skyrl_gym)

    for env_id in env_ids:
        for profile in PROFILES:
            for seed in seeds:
                env = skyrl_gym.make(env_id, env_config={"error_profile": profile}, extras={"seed": seed})

                def reset(env: Any = env) -> str:
                    return str(env.init([])[0][-1]["content"])

                def call(action: str, env: Any = env) -> Step:
                    out = env.step(action)
                    return Step(out["done"], reward=out["reward"], success=out["metadata"]["success"])

                await lockstep(tally, env_id, seed, profile, reset, call)
                env.close()


async def gem_path(tally: Tally, env_ids: Sequence[str], seeds: Sequence[int]) -> None:
    import gem

    import agentrl_envs.integrations.gem_env  # noqa: F401  (registers the ids with gem)

    await gym_api_path(tally, env_ids, seeds, gem.make)


Path_ = Callable[[Tally, Sequence[str], Sequence[int]], Awaitable[None]]
#: name -> (how it is reached, the module it needs, the runner)
PATHS: dict[str, tuple[str, str, Path_]] = {
    "gym.make": ("`env.step` in process", "gymnasium", gym_make_path),
    "TRL": ("`environment_factory` class, tool methods", "agentrl_envs.integrations.trl", trl_path),
    "SB3": (f"`CandidatesDiscrete`, `candidates={SB3_CANDIDATES}`", "stable_baselines3", sb3_path),
    "OpenEnv": ("`agentrl-envs openenv`, `GenericEnvClient` over /ws", "openenv.core", openenv_path),
    "verifiers": (
        "`load_environment` tasks through the harness's env call, then `run_eval` (each episode twice)",
        "verifiers.v1",
        verifiers_path,
    ),
    "MCP http": ("`agentrl-envs mcp --transport http`, SDK client", "mcp", mcp_http_path),
    "MCP stdio": ("`agentrl-envs mcp`, SDK client over a pipe", "mcp", mcp_stdio_path),
    "SkyRL-Gym": ("`skyrl_gym.make`, `BaseTextEnv.step`", "skyrl_gym", skyrl_path),
    "GEM": ("`gem.make`, `Env.step`", "gem", gem_path),
}


def _us(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples) * 1e6, q)) if samples else float("nan")


def table(results: dict[str, Tally | str]) -> str:
    """The Markdown table: one row per path."""
    header = (
        "| path | reached through | episodes | oracle success (faults off / flaky) | rewards = gym.make (off / flaky) "
        "| median µs/call | p90 µs/call | median / gym.make | p90 / gym.make |"
    )
    lines = [header, "|" + "---|" * 9]
    base = results.get("gym.make")
    base_med = _us(base.step_s, 50) if isinstance(base, Tally) else float("nan")
    base_p90 = _us(base.step_s, 90) if isinstance(base, Tally) else float("nan")
    for name, result in results.items():
        how = PATHS[name][0]
        if isinstance(result, str):
            lines.append(f"| {name} | {how} | not measured: {result} | | | | | | |")
            continue
        off, flaky = PROFILES
        n = sum(result.episodes.values())
        success = f"{result.solved[off]}/{result.episodes[off]} / {result.solved[flaky]}/{result.episodes[flaky]}"
        same = f"{result.same[off]}/{result.episodes[off]} / {result.same[flaky]}/{result.episodes[flaky]}"
        med, p90 = _us(result.step_s, 50), _us(result.step_s, 90)
        lines.append(
            f"| {name} | {how} | {n} | {success} | {same} | {med:,.0f} | {p90:,.0f} | {med / base_med:.2f} | {p90 / base_p90:.2f} |"
        )
    return "\n".join(lines)


async def run(paths: Sequence[str], env_ids: Sequence[str], seeds: Sequence[int]) -> dict[str, Tally | str]:
    results: dict[str, Tally | str] = {}
    for name in paths:
        _, module, runner = PATHS[name]
        try:
            importlib.import_module(module)
        except ImportError as exc:
            results[name] = f"{module} is not installed ({exc.name})"
            continue
        tally = Tally()
        start = time.perf_counter()
        await runner(tally, env_ids, seeds)
        print(f"  {name}: {sum(tally.episodes.values())} episodes in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        results[name] = tally
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 per id and fault profile")
    parser.add_argument("--env-ids", nargs="+", default=list(agentrl_envs.ENV_IDS), metavar="ID")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS), metavar="NAME")
    parser.add_argument("--md", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: use 1 or more")
    unknown = [e for e in args.env_ids if e not in agentrl_envs.ENV_IDS]
    if unknown:
        parser.error(f"unknown env ids {unknown}; registered: {', '.join(agentrl_envs.ENV_IDS)}")
    paths = ["gym.make", *(p for p in args.paths if p != "gym.make")]  # the baseline is always measured
    seeds = list(range(args.seeds))
    start = time.perf_counter()
    results = asyncio.run(run(paths, args.env_ids, seeds))
    elapsed = time.perf_counter() - start
    footer = (
        f"\n{len(args.env_ids)} ids x {len(seeds)} seeds x {len(PROFILES)} fault profiles per path; "
        f"{elapsed:.0f} s on {platform.machine()} ({platform.python_version()}, {sys.platform})."
    )
    text = table(results) + "\n" + footer
    print(text)
    for name, result in results.items():
        if isinstance(result, Tally) and result.mismatches:
            print(f"{name}: rewards differ from gym.make in {result.mismatches[:5]}", file=sys.stderr)
    if args.md is not None:
        args.md.write_text(text + "\n")
    failed = [
        name
        for name, r in results.items()
        if isinstance(r, Tally) and (r.mismatches or sum(r.solved.values()) < sum(r.episodes.values()))
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
