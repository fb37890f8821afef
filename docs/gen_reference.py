"""MkDocs hook: generate the reference pages from the code at build time.

Nothing here is committed as Markdown: every page below is built from what the package exposes, so it
cannot drift from the code.

- ``reference/envs/*.md``: one page per registered id, from its env card (the class docstring), its
  ``gym.make`` keywords (the ``__init__`` signature), its spaces and the schemas of its tools;
- ``reference/cli.md``: ``--help`` of every command of ``agentrl-envs`` and ``agentrl-train``, from the
  argparse parsers;
- ``reference/config.md``: every ``agentrl-train`` option, from the config dataclasses;
- ``reference/error-profiles.md``: the shipped fault profiles (``error_profiles/*.yaml``);
- ``reference/trajectory-schema.md``: the protobuf messages of ``proto/agentrl/v1``.

Registered in ``mkdocs.yml`` under ``hooks:``; the pages are named in its ``nav`` like any other.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # build from a checkout without installing it


def env_slug(env_id: str) -> str:
    """``AgentRL/SQL-v0`` -> ``sql-v0``: the page name of an env id."""
    return env_id.split("/", 1)[1].lower()


def _markdown(docstring: str) -> str:
    """An env card's reST-flavoured docstring as Markdown: ``code`` -> `code`, :class:`~a.B` -> `B`."""
    text = re.sub(r":(?:class|func|meth|mod|data|attr):`~?([^`]+)`", lambda m: f"`{m.group(1).split('.')[-1]}`", docstring)
    return text.replace("``", "`")


def _table_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def env_page(env_id: str) -> str:
    import gymnasium as gym

    from agentrl_envs.tools import TOOLS

    spec = gym.spec(env_id)
    module, _, name = str(spec.entry_point).partition(":")
    cls = getattr(__import__(module, fromlist=[name]), name)
    summary, _, body = inspect.cleandoc(cls.__doc__ or "").partition("\n")
    env = gym.make(env_id, python_sandbox=False)  # no sandbox process for a page
    try:
        spaces = (env.action_space, env.observation_space)
    finally:
        env.close()

    lines = [f"# {env_id}", "", _markdown(summary), ""]
    lines += [
        "| | |",
        "|---|---|",
        f"| Make | `gym.make({env_id!r})` after `import agentrl_envs` |",
        f"| Class | `{module}.{name}` |",
        f"| Tools | {', '.join(f'`{t}`' for t in cls.tool_names)} |",
        f"| Action space | `{spaces[0]!r}` |",
        f"| Observation space | `{spaces[1]!r}` |",
        "",
    ]
    lines += [_markdown(body).strip(), ""]

    lines += ["## Keywords and defaults", "", "From the signature of `gym.make`'s entry point:", ""]
    lines += ["| keyword | default |", "|---|---|"]
    for param in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        default = "required" if param.default is param.empty else f"`{param.default!r}`"
        lines.append(f"| `{param.name}` | {_table_cell(default)} |")
    lines.append("")

    lines += ["## Tool schemas", "", 'The OpenAI function schemas the env puts in `info["tools"]` at reset:', ""]
    for tool_name in cls.tool_names:
        lines += [f"### `{tool_name}`", "", "```json", json.dumps(TOOLS[tool_name].schema(), indent=2), "```", ""]
    return "\n".join(lines)


def envs_index(env_ids: list[str]) -> str:
    import gymnasium as gym

    lines = [
        "# Environments",
        "",
        "Every id that `import agentrl_envs` registers, with its env card (earlier versions last).",
        "",
    ]
    lines += ["| id | tools | summary |", "|---|---|---|"]
    for env_id in env_ids:
        module, _, name = str(gym.spec(env_id).entry_point).partition(":")
        cls = getattr(__import__(module, fromlist=[name]), name)
        summary = _markdown(inspect.cleandoc(cls.__doc__ or "").splitlines()[0]).split(": ", 1)[-1]
        tools = ", ".join(cls.tool_names)
        lines.append(f"| [`{env_id}`]({env_slug(env_id)}.md) | {tools} | {_table_cell(summary)} |")
    return "\n".join(lines) + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:  # argparse keeps its subparsers here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def cli_page() -> str:
    from agentrl_envs.cli.main import _parser as envs_parser
    from agentrl_train.cli import build_parser as train_parser

    os.environ["COLUMNS"] = "110"  # argparse wraps --help to the terminal width
    lines = ["# Command line", "", "Generated from the argparse parsers: what `COMMAND --help` prints.", ""]
    for prog, parser in (("agentrl-envs", envs_parser()), ("agentrl-train", train_parser())):
        lines += [f"## `{prog}`", "", "```text", parser.format_help().rstrip(), "```", ""]
        for name, sub in _subcommands(parser):
            lines += [f"### `{prog} {name}`", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def config_page() -> str:
    from agentrl_train.config import SECTIONS, option_commands

    lines = [
        "# Trainer configuration",
        "",
        "Every option of `agentrl-train ppo` and `agentrl-train sft` is a field of one of the dataclasses of",
        "`agentrl_train.config`. Each is a command-line flag (`num_envs` -> `--num-envs`) and a YAML key of",
        "`--config run.yaml`, nested by section or flat; flags override the file. Generated from the dataclasses.",
        "",
    ]
    for section, cls in SECTIONS.items():
        lines += [f"## `{section}`: `{cls.__name__}`", "", inspect.cleandoc(cls.__doc__ or ""), ""]
        lines += ["| option | flag | default | read by | meaning |", "|---|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            flag = "--" + f.name.replace("_", "-")
            commands = ", ".join(option_commands(f.name))
            lines.append(
                f"| `{f.name}` | `{flag}` | `{_table_cell(repr(default))}` | {commands} | {_table_cell(f.metadata.get('help', ''))} |"
            )
        lines.append("")
    return "\n".join(lines)


def error_profiles_page() -> str:
    lines = [
        "# Error profiles",
        "",
        "The fault profiles shipped in the wheel (`error_profiles/*.yaml`), usable by name:",
        '`gym.make(id, error_profile="flaky")`, `agentrl-envs eval ID --error-profile flaky`. The schema and',
        "`fit-profile` are described in the [faults guide](../guide/faults.md), which also shows a profile at work.",
        "",
    ]
    paths = sorted((ROOT / "error_profiles").glob("*.yaml"))
    lines += ["| profile | what it models |", "|---|---|"]
    texts = {p.stem: p.read_text(encoding="utf-8") for p in paths}
    for stem, text in texts.items():
        found = re.search(r"^description:\s*(.+)$", text, re.M)
        lines.append(f"| [`{stem}`](#{stem}) | {_table_cell(found.group(1).strip() if found else '')} |")
    lines.append("")
    for stem, text in texts.items():
        lines += [f"## {stem}", "", "```yaml", text.rstrip(), "```", ""]
    return "\n".join(lines)


def _proto_messages(text: str) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """``(message, its comment, [(field type, field name, comment)])`` from a .proto file."""
    found = []
    for m in re.finditer(r"((?://[^\n]*\n)*)message (\w+) \{(.*?)\n\}", text, re.S):
        comment = " ".join(line.strip()[2:].strip() for line in m.group(1).splitlines())
        fields, above = [], []
        for line in m.group(3).splitlines():
            fm = re.match(r"\s*((?:repeated |optional )?[\w.<>, ]+?)\s+(\w+)\s*=\s*\d+;\s*(?://\s*(.*))?$", line)
            if fm:
                fields.append((fm.group(1), fm.group(2), " ".join([*above, fm.group(3) or ""]).strip()))
                above = []
            elif line.strip().startswith("//"):
                above.append(line.strip()[2:].strip())  # a comment on the lines above a field
            else:
                above = []
        found.append((m.group(2), comment, fields))
    return found


def trajectory_schema_page() -> str:
    lines = [
        "# Trajectory schema",
        "",
        "What the replay buffer, Arrow and Parquet shards and JSON-lines exports hold: the protobuf messages of",
        "`proto/agentrl/v1/`, importable as `from agentrl_envs.data import Trajectory, Step`. Generated from the",
        "`.proto` sources; the",
        "[recording guide](../guide/recording.md) says how they are stored.",
        "",
    ]
    # trajectory.proto first: it is what the stores hold; tool.proto is the simulator's wire reference
    for path in sorted((ROOT / "proto" / "agentrl" / "v1").glob("*.proto"), key=lambda p: p.name != "trajectory.proto"):
        text = path.read_text(encoding="utf-8")
        lines += [f"## `{path.relative_to(ROOT).as_posix()}`", ""]
        for message, comment, fields in _proto_messages(text):
            lines += [f"### `{message}`", "", comment, "", "| field | type | meaning |", "|---|---|---|"]
            lines += [f"| `{name}` | `{_table_cell(kind)}` | {_table_cell(doc)} |" for kind, name, doc in fields]
            lines.append("")
        lines += ['??? note "The source"', "", "    ```protobuf"]
        lines += [f"    {line}" if line else "" for line in text.rstrip().splitlines()]
        lines += ["    ```", ""]
    return "\n".join(lines)


def pages() -> dict[str, str]:
    """Every generated page: its path under docs/ -> its Markdown."""
    import agentrl_envs

    env_ids = [*agentrl_envs.ENV_IDS, *agentrl_envs.EARLIER_IDS]  # earlier versions last
    out = {"reference/envs/index.md": envs_index(env_ids)}
    out.update({f"reference/envs/{env_slug(env_id)}.md": env_page(env_id) for env_id in env_ids})
    out["reference/cli.md"] = cli_page()
    out["reference/config.md"] = config_page()
    out["reference/error-profiles.md"] = error_profiles_page()
    out["reference/trajectory-schema.md"] = trajectory_schema_page()
    return out


def on_files(files: Files, config: Any) -> Files:
    """MkDocs event: add the generated pages to the build (they exist only there)."""
    for src_uri, content in pages().items():
        existing = files.get_file_from_path(src_uri)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, src_uri, content=content))
    return files
