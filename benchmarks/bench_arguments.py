"""Tool-argument checks: the hand-written checker against jsonschema and pydantic, in one run.

Run from the repository root (jsonschema is in the ``dev`` extra)::

    .venv/bin/python benchmarks/bench_arguments.py           # ~30 s
    .venv/bin/python benchmarks/bench_arguments.py --quick   # fewer calls

The question (issue #15, item 5): should ``agentrl_envs.tools.base.check_arguments``, which checks
every tool call's arguments on every env step, use a library instead of a hand-written JSON-schema
subset? Checkers compared on the same argument dicts:

- ``hand-written``: the checker of ``tools/base.py`` before the switch (copied below, unchanged:
  unknown names, missing names, then each value's type and lone surrogates).
- ``pydantic``: today's :func:`~agentrl_envs.tools.base.check_arguments`: a strict pydantic
  ``TypeAdapter`` (a TypedDict built once per tool from its ``parameters``), the same surrogate walk,
  and the translation of pydantic's errors to the agent-facing message on failure;
  ``(layer) pydantic TypeAdapter`` is the adapter's ``validate_python`` alone.
- ``jsonschema``: a ``Draft202012Validator`` per tool, compiled once from its ``parameters`` (plus
  ``additionalProperties: false``, which the hand-written checker implies): ``is_valid`` and the same
  surrogate walk for a valid call, ``best_match(iter_errors(...))`` (the error a message would be
  written from) for an invalid one. Its message translation is not counted, which favours it.

The calls: every distinct call the oracle makes in ``--episodes`` episodes of ``AgentRL/Workplace-v0``
(all tools), plus one call per registered tool with every argument set (from its schema); the
invalid ones are made from those by mechanical edits (an unknown argument, each required one
dropped, each value of a wrong type, a list of a wrong item type, a value outside an ``enum``, a lone
surrogate). Every checker's verdict on every call is compared with the expected one first (and the
pydantic checker's messages with the hand-written one's), so the timed work is the same work.

Printed: CPU time per call (this thread's, so a busy machine changes it less than wall time),
the median over ``--rounds`` rounds that alternate the checkers, valid and invalid calls apart and
per tool, and the ratio to the hand-written checker; then the same figures against one env step,
a SQL point lookup on ``AgentRL/SQL-v0`` measured in the same run (docs/design.md's budget: +0.3 ms over
raw sqlite3 for that step, of which +0.27 ms was spent when this was written). Nothing here asserts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import gymnasium as gym  # noqa: E402

import agentrl_envs  # noqa: E402, F401 - registers the env ids
from agentrl_envs.core.actions import format_call, parse_action  # noqa: E402
from agentrl_envs.errors import ActionError  # noqa: E402
from agentrl_envs.text.table import format_table  # noqa: E402
from agentrl_envs.tools import TOOLS  # noqa: E402
from agentrl_envs.tools.base import _arguments_checker, _has_surrogate, check_arguments  # noqa: E402

Call = tuple[str, dict[str, Any]]
Checker = Callable[[str, dict[str, Any]], Any]

# -- the hand-written checker of tools/base.py before issue #15 (the baseline) ----------------------

_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "array": (list,), "object": (dict,)}


def hand_written_check(tool: str, parameters: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = parameters.get("properties", {})
    required: list[str] = parameters.get("required", [])
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        shown = ", ".join(repr(u[:40]) for u in unknown[:5])
        raise ActionError("bad_arguments", f"{tool}: unknown argument(s) {shown}; expected {sorted(props)}")
    missing = [r for r in required if r not in arguments]
    if missing:
        raise ActionError("bad_arguments", f"{tool}: missing required argument(s) {missing}")
    for key, value in arguments.items():
        spec = props[key]
        if _has_surrogate(value):
            raise ActionError(
                "bad_arguments",
                f"{tool}: argument {key!r} holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode text",
            )
        allowed = spec.get("type")
        kinds = allowed if isinstance(allowed, list) else [allowed]
        if not any(_hand_matches(kind, spec, value) for kind in kinds):
            want = " or ".join(_hand_describe(k, spec) for k in kinds)
            raise ActionError("bad_arguments", f"{tool}: argument {key!r} must be {want}, got {type(value).__name__}")
    return arguments


def _hand_matches(kind: str, spec: dict[str, Any], value: Any) -> bool:
    if kind == "array":
        item_kind = spec.get("items", {}).get("type", "string")
        return isinstance(value, list) and all(isinstance(v, _JSON_TYPES[item_kind]) for v in value)
    return isinstance(value, _JSON_TYPES[kind])


def _hand_describe(kind: str, spec: dict[str, Any]) -> str:
    if kind == "array":
        return f"a list of {spec.get('items', {}).get('type', 'string')}s"
    return f"a {kind}"


# -- the calls ------------------------------------------------------------------------------------------

_SAMPLE = {"string": "results/q1.csv", "object": {"status": "open"}, "array": ["ops@example.com"]}
_WRONG = {"string": 7, "object": "[1, 2]", "array": "ops@example.com"}


def oracle_calls(episodes: int) -> list[Call]:
    """The distinct calls the oracle makes in ``episodes`` episodes of the env with every tool."""
    env = gym.make("AgentRL/Workplace-v0")
    core: Any = env.unwrapped
    seen: dict[str, Call] = {}
    try:
        for seed in range(episodes):
            env.reset(seed=seed)
            done = False
            while not done:
                action = core.oracle_action()
                call = parse_action(action)
                seen.setdefault(format_call(call.name, call.arguments), (call.name, call.arguments))
                _, _, terminated, truncated, _ = env.step(action)
                done = terminated or truncated
    finally:
        env.close()
    return list(seen.values())


def full_call(name: str) -> dict[str, Any]:
    """A valid call of tool ``name`` with every argument set, from its schema."""
    out: dict[str, Any] = {}
    for key, spec in TOOLS[name].parameters["properties"].items():
        kind = spec["type"][-1] if isinstance(spec["type"], list) else spec["type"]
        out[key] = spec["enum"][0] if "enum" in spec else _SAMPLE[kind]
    return out


def invalid_calls(valid: list[Call]) -> list[tuple[Call, bool]]:
    """Edits of valid calls that make them invalid, each with whether the hand-written checker catches it
    (it left ``enum`` to the http tool's own request checks)."""
    out: list[tuple[Call, bool]] = []
    for name, arguments in valid:
        props = TOOLS[name].parameters["properties"]
        out.append(((name, {**arguments, "timeout_s": 3600}), True))
        for key in TOOLS[name].parameters.get("required", []):
            out.append(((name, {k: v for k, v in arguments.items() if k != key}), True))
        for key, value in arguments.items():
            spec = props[key]
            kinds = spec["type"] if isinstance(spec["type"], list) else [spec["type"]]
            out.append(((name, {**arguments, key: 7 if "string" in kinds else _WRONG[kinds[0]]}), True))
            if "array" in kinds:
                out.append(((name, {**arguments, key: ["ops@example.com", 7]}), True))
            if "enum" in spec:
                out.append(((name, {**arguments, key: "PUT"}), False))
            if isinstance(value, str):
                out.append(((name, {**arguments, key: value[:10] + "\ud800"}), True))
    return out


# -- the checkers ---------------------------------------------------------------------------------------


def jsonschema_checkers() -> tuple[Checker, Checker] | None:
    try:
        import jsonschema
    except ImportError:
        return None
    validators = {
        name: jsonschema.Draft202012Validator({**tool.parameters, "additionalProperties": False}) for name, tool in TOOLS.items()
    }
    for tool in TOOLS.values():
        jsonschema.Draft202012Validator.check_schema(tool.parameters)
    best_match = jsonschema.exceptions.best_match

    def valid(name: str, arguments: dict[str, Any]) -> bool:
        return validators[name].is_valid(arguments) and not any(_has_surrogate(v) for v in arguments.values())

    def first_error(name: str, arguments: dict[str, Any]) -> Any:
        error = best_match(validators[name].iter_errors(arguments))
        if error is None and any(_has_surrogate(v) for v in arguments.values()):
            return "surrogate"
        return error

    return valid, first_error


def verdict(check: Callable[[str, dict[str, Any], dict[str, Any]], Any], name: str, arguments: dict[str, Any]) -> str | None:
    """None for a call the checker accepts, else its message."""
    try:
        check(name, TOOLS[name].parameters, arguments)
    except ActionError as exc:
        return exc.message
    return None


def agreement(valid: list[Call], invalid: list[tuple[Call, bool]], js: tuple[Checker, Checker] | None) -> list[str]:
    """Lines about calls a checker judges other than expected (none expected)."""
    problems: list[str] = []
    same = 0
    for name, arguments in valid:
        for label, check in (("hand-written", hand_written_check), ("pydantic", check_arguments)):
            if verdict(check, name, arguments) is not None:
                problems.append(f"{label} refuses a valid {name} call: {verdict(check, name, arguments)}")
        if js is not None and not js[0](name, arguments):
            problems.append(f"jsonschema refuses a valid {name} call")
    for (name, arguments), hand_catches in invalid:
        new, old = verdict(check_arguments, name, arguments), verdict(hand_written_check, name, arguments)
        if new is None:
            problems.append(f"pydantic accepts an invalid {name} call {sorted(arguments)}")
        if (old is not None) != hand_catches:
            problems.append(f"hand-written: unexpected verdict on {name} {sorted(arguments)}")
        if old is not None and new is not None:
            same += old == new
        if js is not None and js[0](name, arguments):
            problems.append(f"jsonschema accepts an invalid {name} call {sorted(arguments)}")
    caught = sum(h for _, h in invalid)
    problems.append(f"(pydantic's message equals the hand-written one on {same} of the {caught} invalid calls both refuse)")
    return problems


# -- timing --------------------------------------------------------------------------------------------


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    start = time.thread_time_ns()
    fn()
    return (time.thread_time_ns() - start) / calls / 1000


def time_checkers(
    checkers: dict[str, Callable[[list[Call]], None]], calls: list[Call], reps: int, rounds: int
) -> dict[str, float]:
    """Median over rounds of CPU µs per call; each round runs every checker ``reps`` times over ``calls``."""
    samples: dict[str, list[float]] = {label: [] for label in checkers}
    labels = list(checkers)
    for r in range(rounds):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            fn = checkers[label]
            samples[label].append(per_call_us(lambda fn=fn: [fn(calls) for _ in range(reps)], reps * len(calls)))
    return {label: statistics.median(s) for label, s in samples.items()}


def runners(js: tuple[Checker, Checker] | None, invalid: bool) -> dict[str, Callable[[list[Call]], None]]:
    params = {name: tool.parameters for name, tool in TOOLS.items()}
    adapters = {name: _arguments_checker(name, p) for name, p in params.items()}

    def catching(check: Callable[[str, dict[str, Any], dict[str, Any]], Any]) -> Callable[[list[Call]], None]:
        def run(calls: list[Call]) -> None:
            for name, arguments in calls:
                try:
                    check(name, params[name], arguments)
                except ActionError:
                    pass

        return run

    def layer(calls: list[Call]) -> None:
        for name, arguments in calls:
            adapters[name](arguments)

    out = {
        "hand-written": catching(hand_written_check),
        "pydantic": catching(check_arguments),
        "(layer) pydantic TypeAdapter": layer,
    }
    if js is not None:
        judge = js[1] if invalid else js[0]

        def run_js(calls: list[Call]) -> None:
            for name, arguments in calls:
                judge(name, arguments)

        out["jsonschema"] = run_js
    return out


def point_lookup_step_us(steps: int) -> float:
    """Median CPU µs of one ``env.step`` SQL point lookup on AgentRL/SQL-v0 (the budgeted step)."""
    from agentrl_envs.tasks.domains import DOMAINS

    env = gym.make("AgentRL/SQL-v0", max_steps=steps + 10)
    try:
        env.reset(seed=0)
        core: Any = env.unwrapped
        action = format_call("sql", {"query": f"SELECT * FROM {DOMAINS[core.task.domain].fact} WHERE id = 17"})
        for _ in range(10):
            env.step(action)
        return statistics.median(per_call_us(lambda: env.step(action), 1) for _ in range(steps))
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    parser.add_argument("--episodes", type=int, default=4, help="oracle episodes of AgentRL/Workplace-v0 to take calls from")
    parser.add_argument("--rounds", type=int, default=9, help="rounds alternating the checkers (the median is printed)")
    args = parser.parse_args()
    reps, rounds, steps = (20, 5, 100) if args.quick else (100, args.rounds, 400)

    valid = oracle_calls(1 if args.quick else args.episodes) + [(name, full_call(name)) for name in TOOLS]
    invalid = invalid_calls(valid)
    js = jsonschema_checkers()
    counts = ", ".join(f"{name} {sum(n == name for n, _ in valid)}" for name in TOOLS)
    print(f"{len(valid)} valid calls ({counts}), {len(invalid)} invalid ones")
    if js is None:
        print("jsonschema is not installed (`pip install -e '.[dev]'`): its rows are left out")
    for line in agreement(valid, invalid, js):
        print("  " + line)

    ok = time_checkers(runners(js, invalid=False), valid, reps, rounds)
    bad = time_checkers(runners(js, invalid=True), [c for c, _ in invalid], max(1, reps // 4), rounds)
    tools = {name: time_checkers(runners(js, invalid=False), [c for c in valid if c[0] == name], reps, rounds) for name in TOOLS}
    step = point_lookup_step_us(steps)
    start = time.perf_counter()
    for name, tool in TOOLS.items():
        _arguments_checker(name, dict(tool.parameters))  # a copy: a schema object not seen before, so it is built
    build_ms = (time.perf_counter() - start) * 1000

    base_ok, base_bad = ok["hand-written"], bad["hand-written"]
    rows = [
        [
            label,
            f"{ok[label]:.2f}",
            f"{ok[label] / base_ok:.2f}x",
            f"{bad[label]:.2f}",
            f"{bad[label] / base_bad:.2f}x",
            f"{ok[label] - base_ok:+.2f}",
            f"{100 * ok[label] / step:.1f}%",
        ]
        for label in ok
    ]
    header = ["checker", "valid us/call", "ratio", "invalid us/call", "ratio", "valid vs hand us", "share of a step"]
    print()
    print(
        format_table(
            header,
            rows,
            align="lrrrrrr",
            title=f"CPU per call, median of {rounds} rounds (valid: {reps}x{len(valid)} calls; invalid: {max(1, reps // 4)}x{len(invalid)})",
            footer=[
                f"one env.step SQL point lookup on AgentRL/SQL-v0: {step:.0f} us CPU (median of {steps}; "
                "budget +300 us over raw sqlite3)",
                "share of a step = valid us/call / that step",
                f"pydantic's adapters are built once per tool, on its first call: {build_ms:.1f} ms for all {len(TOOLS)} tools",
            ],
            boxed=True,
        )
    )
    per_tool = [[name, *(f"{tools[name][label]:.2f}" for label in ok)] for name in TOOLS]
    print()
    print(format_table(["tool (valid calls)", *ok], per_tool, align="l" + "r" * len(ok), title="per tool, us/call", boxed=True))


if __name__ == "__main__":
    main()
