"""Config: defaults that validate, YAML + flags, and clear errors naming the option."""

from __future__ import annotations

import pytest
import yaml

from agentrl_envs.errors import ConfigError
from agentrl_train.cli import build_parser, main
from agentrl_train.config import TrainConfig, option_names
from agentrl_train.config_io import load_config


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
        ({"seed": -1}, "--seed=-1: use a value >= 0"),
        ({"seed": 2**32}, r"--seed=4294967296: use a value <= 4294967295"),
        ({"replay_mb": 0}, "--replay-mb=0: use a value > 0"),
        ({"replay_mb": -5}, "--replay-mb=-5"),
        ({"replay_mb": 10**9}, r"--replay-mb=1000000000: use a value <= 1048576"),
        ({"tiny_corpus_episodes": 0}, "--tiny-corpus-episodes=0: use a value > 0"),
        ({"max_updates_this_call": -1}, "--max-updates-this-call=-1: use a value >= 0"),
        ({"eval_episodes": 0}, "--eval-episodes=0: use a value > 0 .*--final-eval-splits"),
        ({"candidates": 10**9}, r"--candidates=1000000000: use a value <= 64"),
        ({"keep_checkpoints": 0}, "--keep-checkpoints=0: use a value > 0"),
        ({"threads": -1}, "--threads=-1: use a value >= 0"),
        ({"num_envs": 10**6}, r"--num-envs=1000000: use a value <= 256"),
        ({"env_kwargs": "{split: test}"}, "--env-kwargs: 'split' has its own option; use --split"),
        ({"env_kwargs": "{candidates: 8}"}, "use --candidates"),
        ({"env_kwargs": "{1: 2}"}, "--env-kwargs: key 1 is not a keyword name"),
        # YAML reads {attn:8} (no space after the colon) as a key "attn:8" with no value, and attn:8 as text
        (
            {"lora_ranks": "{attn:100000}"},
            "--lora-ranks: 'attn:100000' reads as one key with no value; put a space "
            "after its colon, as YAML needs: attn: 100000",
        ),
        ({"lora_ranks": "{attn: 8, mlp:4}"}, "'mlp:4' reads as one key .* mlp: 4"),
        ({"lora_ranks": "attn:8"}, r"--lora-ranks='attn:8': use a dict; .* write \{attn: 8\}"),
        ({"env_kwargs": "{max_steps:5}"}, "--env-kwargs: 'max_steps:5' reads as one key .* max_steps: 5"),
        ({"env_kwargs": "http://x"}, "--env-kwargs='http://x': use a dict$"),
        ({"lora_ranks": "[1, 2]"}, r"--lora-ranks=\[1, 2\]: use a dict"),
        ({"lora_dropout": 2}, r"--lora-dropout=2\.0: use a value in \[0, 1\)"),
        ({"lora_dropout": 1}, r"--lora-dropout=1\.0: use a value in \[0, 1\)"),
        ({"threads": 10**9}, r"--threads=1000000000: use a value <= 1024"),
        ({"adapter": "a" * 101}, r"--adapter='a{100}': .* at most 100 characters"),
        ({"advantage": "ppo"}, "--advantage='ppo': use one of gae, hierarchical, grpo, dr_grpo, rloo"),
        (
            {"advantage": "grpo"},
            r"--group-size=0: --advantage grpo compares .* at least 2 \(e\.g\. --num-envs 16 --group-size 4\)",
        ),
        ({"advantage": "rloo", "group_size": 1, "num_envs": 2}, r"--group-size=1: .* \(e\.g\. --num-envs 4 --group-size 4\)"),
        ({"advantage": "grpo", "group_size": -2}, "--group-size=-2: use a value >= 0"),
        (
            {"advantage": "dr_grpo", "group_size": 3},
            "--num-envs=16 is not a multiple of --group-size=3: .* use e.g. --num-envs 15 --group-size 3",
        ),
        ({"advantage": "grpo", "group_size": 8, "num_envs": 4}, "use e.g. --num-envs 8 --group-size 8"),
        ({"group_size": 4}, "--group-size=4 is read by the group advantages only; add --advantage grpo"),
        (
            {"advantage": "grpo", "group_size": 4, "vf_coef": 1.0},
            r"--vf-coef=1\.0: --advantage grpo has no critic \(no value head\); drop it, or use --advantage gae",
        ),
        (
            {"advantage": "rloo", "group_size": 4, "value_lr": 0.01, "critic_warmup": 3, "critic_grad": "head"},
            r"--value-lr=0\.01, --critic-warmup=3, --critic-grad='head': --advantage rloo has no critic .* drop them",
        ),
        ({"advantage": "grpo", "group_size": 4, "value_clip": 0}, "--value-clip=0.0: --advantage grpo has no critic"),
        ({"loss_agg": "mean"}, "--loss-agg='mean': use one of auto, token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"),
        ({"clip_low": 1}, r"--clip-low=1\.0: use a value in \[0, 1\)"),
        ({"clip_high": -0.1}, "--clip-high=-0.1: use a value >= 0"),
        (
            {"advantage": "grpo", "group_size": 4, "group_score": "rtg"},
            "--group-score='rtg': use one of return, return-to-go",
        ),
        (
            {"group_score": "return-to-go"},
            "--group-score=return-to-go is read by the group advantages only; add --advantage grpo .* or drop --group-score",
        ),
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


def test_config_that_is_a_folder_or_unreadable(tmp_path) -> None:
    with pytest.raises(ConfigError, match="is a folder; point at a YAML file"):
        load_config(tmp_path)
    (tmp_path / "bytes.yaml").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bytes.yaml")


def test_empty_final_eval_splits_parse_to_an_empty_list() -> None:
    assert load_config(None, {"final_eval_splits": "[]"}).run.final_eval_splits == []
    assert load_config(None, {"final_eval_splits": ""}).run.final_eval_splits == []


def test_every_cli_option_has_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.dest in ("help",):
                continue
            assert action.help, f"agentrl-train {name} {action.option_strings}: no help text"


def test_group_advantage_options_from_the_command_line(capsys, tmp_path) -> None:
    argv = ["ppo", "--advantage", "grpo", "--num-envs", "6", "--group-size", "4", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "use e.g. --num-envs 4 --group-size 4" in capsys.readouterr().err
    cfg = load_config(
        None, {"advantage": "dr_grpo", "group_size": 4, "num_envs": 8, "clip_low": 0.2, "clip_high": 0.28, "loss_agg": "auto"}
    )
    assert (cfg.ppo.group_size, cfg.ppo.clip_low, cfg.ppo.clip_high) == (4, 0.2, 0.28)
    # the critic's options at their defaults (as a PPO run's config.yaml holds them) are no error
    assert load_config(None, {**cfg.to_dict()["ppo"], "advantage": "grpo"}).ppo.advantage == "grpo"


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
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert main(["ppo", "--nproc=2", "--updates", "3", "--out", str(run)]) == 0
    (argv,) = launched
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"  # gloo's sockets on loopback too
    assert argv[1:] == [
        "--rdzv-backend=c10d",  # rendezvous on loopback, not --standalone's localhost name
        "--rdzv-endpoint=127.0.0.1:0",
        "--local-addr=127.0.0.1",
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


def _one_line_error(capsys) -> str:  # type: ignore[no-untyped-def]
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["ppo", "--lrr", "0.1"], "agentrl-train ppo: error: unrecognized arguments: --lrr 0.1; did you mean --lr?"),
        (["sft", "--sft-lrr=0.1"], "agentrl-train sft: error: unrecognized arguments: --sft-lrr=0.1; did you mean --sft-lr?"),
        (["ppo", "--no-tensorbaord"], "did you mean --no-tensorboard?"),
        (["eval", "--run", "x", "--episods", "3"], "did you mean --episodes?"),
        (["serve", "--prot", "0"], "did you mean --port?"),
        (["ppo", "--lrr", "0.1", "--updatse", "3"], "did you mean --lr (for --lrr), --updates (for --updatse)?"),
    ],
)
def test_a_misspelt_flag_names_the_closest_one(argv, hint, capsys) -> None:  # type: ignore[no-untyped-def]
    # a typo in a --config file named the option; the same typo as a flag got "unrecognized arguments" only
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and hint in err, err


@pytest.mark.parametrize("extra", [["0.1"], ["--"], ["--zzzzzzzz"], ["--lr" + "r" * 1_000_000], ["x" * 1_000_000] * 20])
def test_unknown_arguments_without_a_near_flag(extra, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        main(["ppo", *extra])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "agentrl-train ppo: error: unrecognized arguments:" in err
    assert "did you mean" not in err and len(err.splitlines()[-1]) < 500


def _adapter_folder(root, weights: bytes | None = None, config: str = '{"r": 8}'):  # type: ignore[no-untyped-def]
    """A folder laid out as Policy.save writes it: final/exec/{adapter_config.json, adapter_model.safetensors}."""
    import torch
    from safetensors.torch import save_file

    sub = root / "final" / "exec"
    sub.mkdir(parents=True)
    if weights is None:
        save_file({"base_model.model.q_proj.lora_A.weight": torch.zeros(2, 2)}, str(sub / "adapter_model.safetensors"))
    else:
        (sub / "adapter_model.safetensors").write_bytes(weights)
    (sub / "adapter_config.json").write_text(config)
    return root / "final"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda t: t / "nothing", "no such folder"),
        (lambda t: (t / "f").write_text("x") and t / "f", "is a file, not a folder"),
        (lambda t: (t / "empty").mkdir() or t / "empty", "not an adapter folder (no adapter_model.safetensors"),
        (lambda t: _adapter_folder(t, weights=b""), "is not a safetensors file"),
        (lambda t: _adapter_folder(t, weights=b"\xff" * 4096), "is not a safetensors file"),
        (lambda t: _adapter_folder(t, config="not json {"), "adapter_config.json is not a JSON object"),
        (lambda t: _adapter_folder(t, config="[1, 2]"), "adapter_config.json is not a JSON object"),
        (lambda t: (_adapter_folder(t) / "exec" / "adapter_config.json").unlink() or t / "final", "no adapter_config.json"),
        (lambda t: "x" * 5000, "cannot be read (File name too long)"),
        (lambda t: "a\x00b", "no such folder"),
    ],
)
@pytest.mark.parametrize("command", ["ppo", "sft"])
def test_init_adapter_is_checked_before_the_model_loads(command, make, message, capsys, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a wrong --init-adapter failed only after the base model was built or loaded (minutes for a first tiny build)
    import agentrl_train.sft as sft_module
    import agentrl_train.train as train_module

    def no_run(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the model loaded before --init-adapter was checked")

    monkeypatch.setattr(sft_module, "sft", no_run)
    monkeypatch.setattr(train_module, "build_policy", no_run)
    monkeypatch.setattr(train_module, "train", no_run)
    folder = make(tmp_path)
    assert main([command, "--init-adapter", str(folder), "--out", str(tmp_path / "run")]) == 2
    err = _one_line_error(capsys)
    assert f"agentrl-train {command}: error: --init-adapter " in err and message in err, err
    assert len(err) < 1000


def test_a_saved_adapter_passes_the_check(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import agentrl_train.sft as sft_module

    seen = []
    monkeypatch.setattr(sft_module, "sft", lambda cfg: seen.append(cfg))
    folder = _adapter_folder(tmp_path)
    assert main(["sft", "--init-adapter", str(folder), "--out", str(tmp_path / "run")]) == 0
    assert seen[0].model.init_adapter == str(folder)


@pytest.mark.parametrize(("flag", "progress"), [("--no-progress", False), ("--progress", True), ("--no-prog", False)])
def test_sft_takes_no_progress_as_ppo_does(flag, progress, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import agentrl_train.sft as sft_module

    seen = []
    monkeypatch.setattr(sft_module, "sft", lambda cfg: seen.append(cfg))
    assert main(["sft", flag, "--out", str(tmp_path / "run")]) == 0
    assert seen[0].run.progress is progress
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert "--no-progress" in sub.choices["sft"].format_help() and "--no-progress" in sub.choices["ppo"].format_help()


def test_cli_config_folder_and_out_file_are_one_line_errors(capsys, tmp_path) -> None:
    assert main(["ppo", "--config", str(tmp_path), "--out", str(tmp_path / "run")]) == 2
    assert f"--config {tmp_path}: is a folder" in _one_line_error(capsys)
    (tmp_path / "afile").write_text("mine\n")
    for command in ("ppo", "sft"):
        assert main([command, "--out", str(tmp_path / "afile")]) == 2
        assert f"--out {tmp_path / 'afile'}: a file (not a folder) is in the way" in _one_line_error(capsys)
        assert main([command, "--out", str(tmp_path / "afile" / "run")]) == 2
        assert "a part of that path is a file" in _one_line_error(capsys)
    assert (tmp_path / "afile").read_text() == "mine\n"
    assert main(["ppo", "--out", ""]) == 2
    assert "--out='': name a run folder" in _one_line_error(capsys)


def test_cli_unknown_env_kwargs_name_the_option_before_building_a_model(capsys, tmp_path, monkeypatch) -> None:
    import agentrl_train.train as train_module
    from agentrl_train.env_checks import check_env_kwargs

    def no_model(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("a model was built for a run with bad env_kwargs")

    monkeypatch.setattr(train_module, "build_policy", no_model)
    run = tmp_path / "run"
    assert main(["ppo", "--env-kwargs", "{foo: 1}", "--out", str(run)]) == 2
    err = _one_line_error(capsys)
    assert "--env-kwargs: AgentRL/SQLPythonSMTP-v1 takes no keyword 'foo'" in err and "candidates_difficulty" in err
    assert main(["ppo", "--env-kwargs", "{candidates_dificulty: hard}", "--out", str(run)]) == 2
    assert "did you mean 'candidates_difficulty'?" in _one_line_error(capsys)
    assert not (run / "config.yaml").exists()
    # gym.make's own keywords pass
    check_env_kwargs("AgentRL/SQL-v0", {"max_episode_steps": 3, "candidates_difficulty": "hard"})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sft", "--updates", "3"], "--updates only applies to agentrl-train ppo, not sft"),
        (["sft", "--clip", "0.1"], "--clip only applies to agentrl-train ppo, not sft"),
        (["sft", "--num-envs", "16"], "--num-envs only applies to agentrl-train ppo, not sft"),
        (["sft", "--shards"], "--shards only applies to agentrl-train ppo, not sft"),
        (["sft", "--eval-every", "2"], "--eval-every only applies to agentrl-train ppo, not sft"),
        (["sft", "--no-resume"], "--no-resume only applies to agentrl-train ppo, not sft"),
        (["sft", "--no-tensorboard"], "--no-tensorboard only applies to agentrl-train ppo, not sft"),
        (["ppo", "--episodes", "50"], "--episodes only applies to agentrl-train sft, not ppo"),
        (["ppo", "--sft-lr", "0.01"], "--sft-lr only applies to agentrl-train sft, not ppo"),
    ],
)
def test_a_flag_of_the_other_training_command_is_refused_before_building_a_model(
    argv, message, capsys, tmp_path, monkeypatch
) -> None:
    # sft listed --num-envs, --shards, --eval-every ... in its --help and ignored them silently
    import agentrl_train.sft as sft_module
    import agentrl_train.train as train_module

    def no_run(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("a run started with a flag its command does not read")

    monkeypatch.setattr(sft_module, "sft", no_run)
    monkeypatch.setattr(train_module, "build_policy", no_run)
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = _one_line_error(capsys)
    assert message in err and "drop it" in err and "a --config file may keep it" in err, err
    assert not (tmp_path / "run").exists()


def test_sft_reads_a_ppo_config_file_and_takes_the_ppo_options_it_uses(tmp_path, monkeypatch) -> None:
    # one --config file serves ppo and sft; sft's divergence message names --grad-clip, which its parser refused
    import agentrl_train.sft as sft_module

    seen = []
    monkeypatch.setattr(sft_module, "sft", lambda cfg: seen.append(cfg))
    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump({"ppo": {"updates": 3, "clip": 0.1}, "num_envs": 2, "eval_every": 1, "episodes": 7}))
    argv = ["--config", str(f), "--grad-clip", "0.5", "--max-prompt-tokens", "512", "--max-new-tokens", "64"]
    assert main(["sft", *argv, "--scoring", "sum", "--out", str(tmp_path / "sft")]) == 0
    (cfg,) = seen
    assert (cfg.ppo.grad_clip, cfg.ppo.max_prompt_tokens, cfg.ppo.max_new_tokens, cfg.ppo.scoring) == (0.5, 512, 64, "sum")
    assert (cfg.ppo.updates, cfg.env.num_envs, cfg.sft.episodes) == (3, 2, 7)


def test_help_lists_only_the_options_a_command_reads() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    sft_help, ppo_help = sub.choices["sft"].format_help(), sub.choices["ppo"].format_help()
    for flag in ("--updates", "--clip ", "--num-envs", "--shards", "--eval-every", "--resume", "--tensorboard"):
        assert flag not in sft_help and flag in ppo_help, flag
    for flag in ("--grad-clip", "--max-prompt-tokens", "--max-new-tokens", "--episodes", "--sft-lr"):
        assert flag in sft_help, flag
    assert "--episodes" not in ppo_help and "--sft-lr" not in ppo_help


def test_sft_help_shows_the_defaults_sft_applies(tmp_path, monkeypatch) -> None:
    # sft --help said --out defaults to runs/ppo and --mode to candidates; sft ran in runs/sft, generate mode
    import agentrl_train.sft as sft_module

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    helps = {c: " ".join(sub.choices[c].format_help().split()) for c in ("sft", "ppo")}
    seen = []
    monkeypatch.setattr(sft_module, "sft", lambda cfg: seen.append(cfg))
    monkeypatch.chdir(tmp_path)
    assert main(["sft"]) == 0
    (cfg,) = seen
    assert f"run folder (default: {cfg.run.out!r})" in helps["sft"] and cfg.run.out == "runs/sft"
    assert f"token-level sampling) (default: {cfg.env.mode!r})" in helps["sft"] and cfg.env.mode == "generate"
    assert "run folder (default: 'runs/ppo')" in helps["ppo"] and "sampling) (default: 'candidates')" in helps["ppo"]


def test_sft_says_when_it_does_not_use_a_config_files_out_and_mode(tmp_path, monkeypatch, capsys) -> None:
    # a --config file's out:/mode: were dropped without a word (sft's defaults win: the file may be ppo's)
    import agentrl_train.sft as sft_module

    seen = []
    monkeypatch.setattr(sft_module, "sft", lambda cfg: seen.append(cfg))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text("run: {out: runs/my-ppo}\nenv: {mode: candidates}\n")
    assert main(["sft", "--config", "run.yaml"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert seen[-1].run.out == "runs/sft" and seen[-1].env.mode == "generate"
    assert "--out runs/sft (sft's default; the --config file's out: runs/my-ppo is not used by sft" in err
    assert "--mode" not in err  # mode: candidates is also ppo's default: no telling it from a file without mode:
    assert main(["sft", "--config", "run.yaml", "--out", "runs/mine", "--mode", "generate"]) == 0
    assert seen[-1].run.out == "runs/mine" and capsys.readouterr().err == ""
