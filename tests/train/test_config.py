"""Config: defaults that validate, YAML + flags, and clear errors naming the option."""

from __future__ import annotations

import pytest
import yaml

from agentrl_envs.errors import ConfigError
from agentrl_train.cli import build_parser, main
from agentrl_train.config import TrainConfig, load_config, option_names


def test_defaults_validate_and_options_are_unique() -> None:
    TrainConfig().validate()
    assert "num_envs" in option_names() and "lr" in option_names()


def test_yaml_then_flags(tmp_path) -> None:
    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump({"ppo": {"lr": 0.01, "updates": 3}, "num_envs": 2}))
    cfg = load_config(f, {"updates": "5"})
    assert cfg.ppo.lr == 0.01 and cfg.ppo.updates == 5 and cfg.env.num_envs == 2


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"lrr": 1}, "did you mean 'lr'"),
        ({"lr": -1e-3}, r"--lr=-0\.001: use a value > 0"),
        ({"lr": "fast"}, "--lr='fast': use a number"),
        ({"lr": "nan"}, "finite"),
        ({"num_envs": 0}, "--num-envs=0"),
        ({"num_envs": 2.5}, "integer"),
        ({"mode": "greedy"}, "use one of candidates, generate"),
        ({"gamma": 1.5}, r"\[0, 1\]"),
        ({"candidates": 1}, "K >= 2"),
        ({"ent_start": 0.001, "ent_end": 0.01}, "decays"),
        ({"adapter": "my adapter"}, "letters"),
        ({"resume": "maybe"}, "true or false"),
        ({"eval_splits": ["train", "valid"]}, "eval-splits"),
        ({"critic_grad": "both"}, "--critic-grad='both': use one of shared, head"),
        ({"anchor_coef": -1}, "--anchor-coef"),
        ({"reference_weight": 1.5}, r"--reference-weight=1\.5: use a value in \[0, 1\]"),
        ({"reference_weight": "nan"}, "finite"),
    ],
)
def test_bad_values_name_the_option(overrides, match) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("ppo: [1, 2]", "must be a mapping"),
        ("- a\n- b", "top level"),
        ("ppo: {lrate: 1}", "in section 'ppo'"),
        ("{{{", "not valid YAML"),
    ],
)
def test_bad_yaml(tmp_path, text, match) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(f)
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.yaml")


def test_every_cli_option_has_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.dest in ("help",):
                continue
            assert action.help, f"agentrl-train {name} {action.option_strings}: no help text"


def test_cli_reports_errors_without_a_traceback(capsys, tmp_path) -> None:
    assert main(["ppo", "--lr", "-1", "--out", str(tmp_path)]) == 2
    assert "--lr=-1.0: use a value > 0" in capsys.readouterr().err
    assert main(["ppo", "--env", "AgentRL/Nope-v0", "--out", str(tmp_path)]) == 2
    assert "no such env id" in capsys.readouterr().err
    assert main(["eval", "--run", str(tmp_path / "nothing")]) == 2
    assert "not a run folder" in capsys.readouterr().err


def test_nproc_checks_options_once_and_keeps_torchrun_logs_in_the_run_folder(monkeypatch, capsys, tmp_path) -> None:
    import os

    launched: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: launched.append(argv))
    run = tmp_path / "run"
    # bad options fail in this process with one message, before torchrun starts N ranks that each fail
    assert main(["ppo", "--nproc", "2", "--lr", "-1", "--out", str(run)]) == 2
    assert "--lr=-1.0: use a value > 0" in capsys.readouterr().err
    assert main(["ppo", "--nproc", "2", "--env", "AgentRL/Nope-v0", "--out", str(run)]) == 2
    assert "no such env id" in capsys.readouterr().err
    assert main(["ppo", "--nproc", "0", "--out", str(run)]) == 2
    assert "--nproc 0: the number of processes must be at least 1" in capsys.readouterr().err
    assert launched == []
    # good options: torchrun gets the same arguments without --nproc, and its logs go under the run folder
    assert main(["ppo", "--nproc=2", "--updates", "3", "--out", str(run)]) == 0
    (argv,) = launched
    assert argv[1:] == [
        "--standalone",
        "--nproc-per-node=2",
        f"--log-dir={run / 'torchrun'}",
        "-m",
        "agentrl_train",
        "ppo",
        "--updates",
        "3",
        "--out",
        str(run),
    ]
    assert argv[0].endswith("torchrun")
