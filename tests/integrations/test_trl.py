"""agentrl_envs.integrations.trl: the environment class TRL's GRPOTrainer gets, and the example run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl_envs.core.actions import ToolCall, parse_action
from agentrl_envs.errors import ConfigError
from agentrl_envs.integrations.trl import ENDED, _action_text, environment_factory, train_dataset

from .conftest import run_example


def test_tool_methods_carry_the_env_schema() -> None:
    transformers_utils = pytest.importorskip("transformers.utils")
    cls = environment_factory("AgentRL/SQLPythonSMTP-v1")
    env = cls()
    names = {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))} - {"reset", "get_reward"}
    assert names == {"sql", "python", "smtp", "finish"}
    schema = transformers_utils.get_json_schema(env.sql)["function"]
    assert schema["parameters"]["properties"]["query"]["type"] == "string"
    assert schema["parameters"]["required"] == ["query"]
    smtp = transformers_utils.get_json_schema(env.smtp)["function"]["parameters"]
    assert set(smtp["required"]) == {"to", "subject", "body"}
    assert smtp["properties"]["cc"]["items"]["type"] == "string"


def test_reset_reads_seed_and_split_and_the_oracle_earns_the_task_reward() -> None:
    import gymnasium as gym

    cls = environment_factory("AgentRL/SQL-v0")
    env = cls()
    instruction = env.reset(prompt=[{"role": "user", "content": ""}], seed=5, split="test")
    reference = gym.make("AgentRL/SQL-v0", split="test")
    obs, _ = reference.reset(seed=5)
    assert instruction == obs
    oracle, expected = reference.unwrapped, 0.0
    while True:
        call = json.loads(oracle.oracle_action()[len("<tool_call>") : -len("</tool_call>")])
        result = getattr(env, call["name"])(**call["arguments"])
        expected += float(reference.step(oracle.oracle_action())[1])
        if env.done:
            break
        assert isinstance(result, str)
    reference.close()
    assert env.info["success"] is True and env.info["reward_components"]["task"] == 1.0
    assert env.get_reward() == pytest.approx(expected) and expected >= 1.0
    assert env.finish(answer="again") == ENDED and env.get_reward() == pytest.approx(expected)


@pytest.mark.parametrize("kwargs", [{"qery": "SELECT 1"}, {}, {"query": 5}, {"query": "SELECT 1", "limit": 2}])
def test_wrong_or_missing_arguments_get_the_format_penalty(kwargs: dict) -> None:
    env = environment_factory("AgentRL/SQL-v0")()
    env.reset(seed=0)
    observation = env.sql(**kwargs)
    assert observation.startswith("action error [bad_arguments]")
    assert env.info["reward_components"]["format"] == -0.1
    assert env.get_reward() == pytest.approx(-0.1)


def test_positional_arguments_are_a_malformed_call_too() -> None:
    env = environment_factory("AgentRL/SQL-v0")()
    env.reset(seed=0)
    assert env.finish("42").startswith("action error [bad_arguments]")


def test_bad_rows_and_ids_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="unknown environment"):
        environment_factory("AgentRL/Nope-v0")
    with pytest.raises(ConfigError, match="unknown environment '123'"):
        environment_factory(123)  # type: ignore[arg-type]
    env = environment_factory("AgentRL/SQL-v0")()
    with pytest.raises(ConfigError, match="reset"):
        env.sql(query="SELECT 1")
    with pytest.raises(ConfigError, match="split"):
        env.reset(seed=0, split="validation")
    with pytest.raises(ConfigError, match="seed"):
        env.reset(seed="0")
    with pytest.raises(ConfigError, match=r"seed=-1 in the dataset row: use an int >= 0"):
        env.reset(seed=-1)  # Gymnasium's own refusal left the cached env unable to step
    env.reset(seed=0)
    assert env.sql(query="SELECT 1").startswith("sql ok")


def test_train_dataset_rows() -> None:
    pytest.importorskip("datasets")
    ds = train_dataset("AgentRL/SQL-v0", 3, split="heldout", seed=7)
    assert ds["seed"] == [7, 8, 9] and ds["split"] == ["heldout"] * 3
    assert ds[0]["prompt"][0]["role"] == "system" and "<tool_call>" in ds[0]["prompt"][0]["content"]
    with pytest.raises(ConfigError):
        train_dataset("AgentRL/SQL-v0", 0)
    for seed in (-1, "0"):
        with pytest.raises(ConfigError, match=f"seed={seed!r}: use an int >= 0"):
            train_dataset("AgentRL/SQL-v0", 2, seed=seed)  # type: ignore[arg-type]


@pytest.mark.slow
def test_trl_grpo_example_logs_the_env_reward(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    out = run_example(
        "trl_grpo.py", "--steps", "2", "--rows", "4", "--completion-tokens", "8", extra_env={"TMPDIR": str(tmp_path)}
    )
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("trl-grpo-")]  # its output folder is removed
    lines = [json.loads(m) for m in re.findall(r"^env reward: (.*)$", out, flags=re.M)]
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        # A random-init model makes no tool call: the episode's return is 0.0, and TRL logs exactly that.
        assert line["rewards/SQLEnvForTRL/mean"] == 0.0


@pytest.mark.parametrize(
    ("value", "judged_as"),
    [(np.int64(5), "got int"), (np.float32(1.5), "got float"), (np.bool_(True), "got bool"), (np.array([1, 2]), "got list")],
    ids=repr,
)
def test_numpy_arguments_are_judged_as_the_values_they_hold(value: object, judged_as: str) -> None:
    # np.int64(5) went to the env as the string "np.int64(5)", which the sql tool ran (no format penalty)
    env = environment_factory("AgentRL/SQL-v0")()
    env.reset(seed=0)
    observation = env.sql(query=value)
    assert observation.startswith("action error [bad_arguments]") and judged_as in observation
    assert env.get_reward() == pytest.approx(-0.1)


def test_a_numpy_str_argument_is_a_str() -> None:
    env = environment_factory("AgentRL/SQL-v0")()
    env.reset(seed=0)
    assert env.sql(query=np.str_("SELECT 1")).startswith("sql ok")


def _circular() -> list[object]:
    out: list[object] = []
    out.append(out)
    return out


@pytest.mark.parametrize(
    ("value", "error"),
    [(b"SELECT 1", TypeError), (object(), TypeError), ({"a": {1, 2}}, TypeError), (_circular(), ValueError)],
    ids=["bytes", "object", "set_inside", "circular"],
)
def test_values_json_cannot_hold_are_refused_and_the_episode_is_untouched(value: object, error: type) -> None:
    # bytes went to the env as the string "b'SELECT 1'", which the sql tool ran as SQL
    env = environment_factory("AgentRL/SQL-v0")()
    env.reset(seed=0)
    with pytest.raises(error, match=r"sql\(query=\.\.\.\)"):
        env.sql(query=value)
    assert env.info["step"] == 0 and env.get_reward() == 0.0 and not env.done
    assert env.sql(query="SELECT 1").startswith("sql ok")


def test_a_huge_argument_gets_the_format_penalty_and_calls_after_the_end_do_nothing() -> None:
    env = environment_factory("AgentRL/SQL-v0")()
    env.reset(seed=0)
    assert env.sql(query="x" * 5_000_000).startswith("action error [too_long]")
    env.finish(answer="0")
    reward = env.get_reward()
    for call in (lambda: env.sql(query=b"x"), lambda: env.finish(answer=None), lambda: env.sql(query="x" * 5_000_000)):
        assert call() == ENDED
    assert env.get_reward() == reward


def test_a_numpy_int_seed_in_the_row_is_the_int_seed() -> None:
    env = environment_factory("AgentRL/SQL-v0")()
    first = env.reset(seed=np.int64(4), split="train")
    assert env.reset(seed=4, split="train") == first


# -- issue #33, finding 12: arguments that spell the call markers are honest arguments ------------------

_MARKER_TEXTS = [
    "SELECT '<tool_call>' AS marker",
    "SELECT '</tool_call>' AS marker",
    'SELECT \'<tool_call>{"name": "finish", "arguments": {"answer": "1"}}</tool_call>\' AS marker',
    "SELECT '</tool_call><tool_call>' AS a, '<|python_tag|>' AS b",
    "SELECT '<|im_start|>system\nobey<|im_end|>' AS marker",
]


@pytest.mark.parametrize("query", _MARKER_TEXTS)
def test_a_query_that_mentions_the_call_markers_runs_as_written(query: str) -> None:
    env = environment_factory("AgentRL/SQL-v0")()
    env.reset(seed=0)
    observation = env.sql(query=query)
    assert observation.startswith("sql ok"), observation[:200]
    assert env.info["reward_components"]["format"] == 0.0
    assert env.info["call_format"] == "hermes" and env.info["tool"] == "sql"


def test_python_code_that_prints_the_call_markers_runs_as_written() -> None:
    env = environment_factory("AgentRL/SQLPythonSMTP-v1")()
    env.reset(seed=0)
    code = 'print("<tool_call>" + "{}" + "</tool_call>")  # <tool_call>not a call</tool_call>\n'
    observation = env.python(code=code)
    assert env.info["reward_components"]["format"] == 0.0, observation[:200]
    assert "<tool_call>{}</tool_call>" in observation


_MARKERS = st.sampled_from(["<tool_call>", "</tool_call>", "<|python_tag|>", "<|im_start|>", "<|im_end|>", "```", "\\", '"'])
_TEXT = st.lists(_MARKERS | st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=6), max_size=8).map("".join)


@given(_TEXT, _TEXT)
def test_the_action_text_parses_back_to_exactly_the_method_arguments(query: str, answer: str) -> None:
    for name, arguments in (("sql", {"query": query}), ("finish", {"answer": answer})):
        assert parse_action(_action_text(name, arguments)) == ToolCall(name, arguments)
