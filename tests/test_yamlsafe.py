"""agentrl_envs.yamlsafe: the one loader for user YAML refuses alias bombs, deep and huge documents.

Issue #33 (finding 6): a 326-byte "billion laughs" config loaded at once with ``yaml.safe_load``
(aliases share one object) and then hung or ran out of memory in the ``repr`` of an error message.
Loads of hostile documents run in a child process with a bounded wait: on the old code they never
returned (or took most of a minute), so a wait of 60 s separates the two without timing anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl_envs.errors import ConfigError
from agentrl_envs.faults import ProfileError, load_profile, parse_profile
from agentrl_envs.yamlsafe import (
    MAX_YAML_ALIASES,
    MAX_YAML_DEPTH,
    MAX_YAML_EXPANDED,
    load_yaml,
    read_yaml_file,
    short_repr,
)

ROOT = Path(__file__).resolve().parents[1]


def laughs(levels: int = 9, width: int = 9, style: str = "flow") -> str:
    """The billion-laughs document: each level an anchor holding ``width`` aliases of the one below."""
    lines = ["a0: &a0 [" + ",".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        if style == "flow":
            lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
        elif style == "mapping":
            lines.append(f"a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(width)) + "}")
        else:  # block sequences
            lines.append(f"a{i}: &a{i}\n" + "".join(f"  - *a{i - 1}\n" for _ in range(width)).rstrip("\n"))
    return "\n".join(lines) + "\n"


MERGE_BOMB = "a0: &a0 {x: [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]}\n" + "".join(
    f"a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(10)) + f", <<: *a{i - 1}}}\n" for i in range(1, 10)
)
BOMBS = {
    "billion laughs": laughs(),
    "laughs as mappings": laughs(style="mapping"),
    "laughs as block sequences": laughs(style="block"),
    "merge keys": MERGE_BOMB,
    "one wide level": "a: &a [" + ", ".join(["lol"] * 1000) + "]\nb: [" + ", ".join(["*a"] * 900) + "]\n",
    "a large scalar aliased": "a: &a '" + "x" * 500_000 + "'\nb: [*a, *a, *a, *a, *a]\n",
    "too many aliases": "a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_YAML_ALIASES + 1)) + "]\n",
    "recursive alias": "a: &a [1, *a]\n",
    "recursive mapping": "a: &a {b: *a}\n",
    "nested 10k deep": "a: " + "[" * 10_000 + "]" * 10_000,
    "nested 200 deep (block)": "".join("  " * i + f"k{i}:\n" for i in range(200)),
}


def test_the_billion_laughs_is_as_small_as_the_report_s() -> None:
    assert len(BOMBS["billion laughs"].encode()) < 500  # the report's was 326 bytes; 9**9 leaves once expanded


# The child loads every bomb through every entry point and reports each message.
_CHILD = textwrap.dedent(
    """
    import json, sys
    from agentrl_envs.errors import ConfigError
    from agentrl_envs.faults import ProfileError, load_profile, parse_profile
    from agentrl_envs.yamlsafe import load_yaml, read_yaml_file

    out = {}
    for name, path in json.loads(sys.argv[1]).items():
        text = open(path, encoding="utf-8").read()
        for entry, load in (
            ("load_yaml", lambda: load_yaml(text, "src")),
            ("read_yaml_file", lambda: read_yaml_file(path, "src")),
            ("parse_profile", lambda: parse_profile(text, "src")),
            ("load_profile", lambda: load_profile(path)),
        ):
            try:
                load()
                out[f"{name} / {entry}"] = "loaded"
            except (ConfigError, ProfileError) as exc:
                out[f"{name} / {entry}"] = str(exc)
    print(json.dumps(out))
    """
)


def run_child(script: str, *args: str, timeout: float = 60) -> str:
    """Run ``script`` in a child; a load that hangs or swaps shows up as the bounded wait running out."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_bombs_are_refused_by_every_entry_point(tmp_path: Path) -> None:
    paths = {}
    for n, (name, text) in enumerate(BOMBS.items()):
        paths[name] = str(tmp_path / f"bomb{n}.yaml")
        Path(paths[name]).write_text(text, encoding="utf-8")
    results = json.loads(run_child(_CHILD, json.dumps(paths)))
    assert len(results) == 4 * len(BOMBS)
    for key, message in results.items():
        assert message != "loaded", key
        assert len(message) < 400, (key, message)
        assert "alias" in message or "nested too deeply" in message or "expands" in message, (key, message)


@pytest.mark.parametrize("name", list(BOMBS))
def test_each_refusal_names_the_source_and_the_limit(name: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_yaml(BOMBS[name], "--config run.yaml")
    message = str(err.value)
    assert message.startswith("--config run.yaml: ")
    limits = (str(MAX_YAML_ALIASES), f"{MAX_YAML_EXPANDED:,}", str(MAX_YAML_DEPTH), "refers to itself")
    assert any(limit in message for limit in limits), message


def test_honest_anchors_and_merge_keys_still_load() -> None:
    text = textwrap.dedent(
        """
        defaults: &defaults {lr: 0.0003, seed: 1, tags: [a, b]}
        ppo:
          <<: *defaults
          seed: 2
        eval: *defaults
        """
    )
    data = load_yaml(text, "run.yaml")
    assert data["ppo"] == {"lr": 0.0003, "seed": 2, "tags": ["a", "b"]}
    assert data["eval"]["tags"] == ["a", "b"]
    # a document just under the expansion cap: a plain file of that size loads
    assert len(load_yaml("a: &a '" + "x" * 300_000 + "'\nb: [*a, *a, *a, *a, *a]\n", "src")["b"]) == 5


def test_size_cap_and_bytes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load_yaml("a: '" + "x" * (1 << 20) + "'", "src")
    with pytest.raises(ConfigError, match="larger than 100 bytes"):
        load_yaml(b"a: " + b"1" * 100, "src", max_bytes=100)
    with pytest.raises(ConfigError, match=r"not valid YAML .*UTF-8"):
        load_yaml(b"a: \xff", "src")
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(64 << 30)  # sparse: 64 GiB, refused from its size, never read
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        read_yaml_file(big, "src")


def test_python_tags_and_huge_ints_are_config_errors() -> None:
    for text in ("a: !!python/object/apply:os.system [echo hi]", "a: " + "9" * 5000, "a: 2001-13-45", "a: !!float abc"):
        with pytest.raises(ConfigError, match=r"^src: "):
            load_yaml(text, "src")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "profile.yaml"
    os.mkfifo(fifo)
    script = textwrap.dedent(
        """
        import sys
        from agentrl_envs.errors import ConfigError
        from agentrl_envs.faults import load_profile
        from agentrl_envs.yamlsafe import read_yaml_file
        for load in (lambda: read_yaml_file(sys.argv[1], "src"), lambda: load_profile(sys.argv[1])):
            try:
                load()
            except ConfigError as exc:
                print(exc)
        """
    )
    lines = run_child(script, str(fifo)).splitlines()  # on a blocking open nobody writes: the wait runs out
    assert len(lines) == 2 and all("regular file" in line for line in lines), lines


def test_short_repr_is_bounded_whatever_the_value() -> None:
    nested: list[object] = ["x" * 1_000_000]
    for _ in range(10):
        nested = [nested] * 100  # 10**20 leaves once expanded
    for value in (nested, "y" * 10_000_000, 10**5000, {str(i): i for i in range(100_000)}, b"z" * 10**6):
        assert len(short_repr(value)) <= 100
    assert short_repr(0.5) == "0.5" and short_repr("adam") == "'adam'" and short_repr([1, 2]) == "[1, 2]"


@pytest.mark.parametrize(
    "text",
    [
        "name: x\ntools: {'" + "t" * 500_000 + "': {}}\n",
        "name: x\ndefaults: {rates: {'" + "k" * 500_000 + "': 0.1}}\n",
        "name: x\npenalties: {'" + "p" * 500_000 + "': -1}\n",
    ],
    ids=["tool name", "fault type", "penalty key"],
)
def test_profile_messages_do_not_echo_huge_keys(text: str) -> None:
    with pytest.raises(ProfileError) as err:
        parse_profile(text, "big.yaml")
    assert len(str(err.value)) < 1000


def test_load_profile_refuses_bombs_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMBS["billion laughs"], encoding="utf-8")
    with pytest.raises(ProfileError, match=str(path)):
        load_profile(path)
