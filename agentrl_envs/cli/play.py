"""``agentrl-envs play``: an episode played by typing tool calls, with shorthands per tool."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from agentrl_envs.cli.argtypes import make_env, parse_splits
from agentrl_envs.core.actions import format_call

#: one line of ``play``'s help per tool: its shorthand and what it does
PLAY_SHORTHANDS = {
    "sql": "  sql SELECT ...                 run a query",
    "python": "  python print(1)                run code (\\n for newlines)",
    "smtp": '  smtp {"to": ..., ...}          send mail (JSON arguments)',
    "http": '  http GET /v1/tickets?limit=5   a REST call (POST and PATCH take a JSON body: http POST /v1/x {"a": 1})',
    "finish": "  finish 42                      end with an answer",
}


def play_help(tool_names: Sequence[str]) -> str:
    """What ``play`` prints at the start and on ``:help``: the shorthands of this env's tools only."""
    lines = ["Type one tool call per line:"]
    lines += [PLAY_SHORTHANDS[name] for name in tool_names if name in PLAY_SHORTHANDS]
    lines += [
        "  <tool_call>{...}</tool_call> or a bare JSON call also work; a number picks a candidate.",
        "  :help shows this, :render shows the transcript, :quit leaves.",
    ]
    return "\n".join(lines)


def cmd_play(args: argparse.Namespace, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    read_line = _line_reader(stdin or sys.stdin, out)
    env = make_env(args, parse_splits(args.split)[0], render_mode="ansi")
    try:
        observation, info = env.reset(seed=args.seed)
        print(f"== {args.env_id} | task {info['task_id']} | max {info['max_steps']} steps ==", file=out)
        print(observation, file=out)
        help_text = play_help(list(getattr(env.unwrapped, "tool_names", PLAY_SHORTHANDS)))
        print(f"\n{help_text}", file=out)
        _show_candidates(info, out)
        total = 0.0
        while True:
            line = read_line()
            if line is None:
                print("\n(end of input: episode abandoned)", file=out)
                return 0
            if not line.strip():  # an empty line costs no step: it asks again
                continue
            if line.strip() in (":quit", ":q"):
                return 0
            if line.strip() == ":help":
                print(help_text, file=out)
                continue
            if line.strip() == ":render":
                print(env.render(), file=out)
                continue
            action = _shorthand(line, info.get("candidates"))
            observation, reward, terminated, truncated, info = env.step(action)
            total += float(reward)
            parts = ", ".join(f"{k} {v:+.2f}" for k, v in info["reward_components"].items() if v)
            print(observation, file=out)
            fault = info.get("fault") or {}
            if fault:
                print(f"[fault: {fault.get('type')} (status {fault.get('status')}, {fault.get('origin')})]", file=out)
            print(
                f"[step {info['step']} | reward {reward:+.2f}{' (' + parts + ')' if parts else ''} | return {total:+.2f}]",
                file=out,
            )
            if terminated or truncated:
                verdict = "SOLVED" if info["success"] else "NOT SOLVED"
                comps = ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in info["task_components"].items())
                print(f"\n== {verdict} | {comps} | return {total:+.2f} ==", file=out)
                return 0
            _show_candidates(info, out)
    finally:
        env.close()


def _line_reader(stdin: TextIO, out: TextIO) -> Callable[[], str | None]:
    """What ``play`` reads its lines with: ``None`` at the end of input.

    At a terminal it is :func:`input` with :mod:`readline` (arrow keys, history) where Python has it;
    from a pipe or file, plain lines.
    """
    if stdin is sys.stdin and out is sys.stdout and stdin.isatty():
        with contextlib.suppress(ImportError):  # no readline on Windows: input() without line editing
            import readline  # noqa: F401  (imported for its side effect on input())

        def read_terminal() -> str | None:
            print(file=out)
            try:
                return input("> ")
            except EOFError:
                return None

        return read_terminal

    def read_stream() -> str | None:
        print("\n> ", end="", file=out, flush=True)
        line = stdin.readline()
        return line.rstrip("\n") if line else None

    return read_stream


def _show_candidates(info: dict[str, Any], out: TextIO) -> None:
    for i, cand in enumerate(info.get("candidates") or [], 1):
        print(f"  [{i}] {cand[:300]}", file=out)


def _shorthand(line: str, candidates: list[str] | None) -> str:
    text = line.strip()
    if candidates and text.isdigit() and 1 <= int(text) <= len(candidates):
        return candidates[int(text) - 1]
    head, _, rest = text.partition(" ")
    if head == "sql" and rest:
        return format_call("sql", {"query": rest})
    if head == "python" and rest:
        return format_call("python", {"code": rest.replace("\\n", "\n")})
    if head == "finish":
        return format_call("finish", {"answer": rest})
    if head == "http" and rest:
        arguments = _http_shorthand(rest)
        if arguments is not None:
            return format_call("http", arguments)
    if head == "smtp" and rest.startswith("{"):
        try:
            arguments = json.loads(rest)
        except (ValueError, RecursionError):
            return line  # the env explains what is wrong with it
        if isinstance(arguments, dict):
            return format_call("smtp", arguments)
    return line


def _http_shorthand(rest: str) -> dict[str, Any] | None:
    """``METHOD /path[?k=v&...] [JSON body]`` as the http tool's arguments (None: not that shape; the
    line then goes to the env as typed, which explains what is wrong with it)."""
    method, _, tail = rest.strip().partition(" ")
    target, _, body_text = tail.strip().partition(" ")
    if not target.startswith("/"):
        return None
    path, _, query_text = target.partition("?")
    arguments: dict[str, Any] = {"method": method.upper(), "path": path}
    if query_text:
        arguments["query"] = {k: _scalar(v) for k, v in urllib.parse.parse_qsl(query_text, keep_blank_values=True)}
    if body_text.strip():
        try:
            body = json.loads(body_text)
        except (ValueError, RecursionError):
            return None
        if not isinstance(body, dict):
            return None
        arguments["body"] = body
    return arguments


def _scalar(text: str) -> Any:
    """A query value as the JSON number or boolean it spells (``limit=5`` is 5), else the text."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return value if isinstance(value, (int, float, bool)) else text
