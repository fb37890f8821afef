"""``agentrl-train``: ppo, sft, eval, resources (and the adapter tools), every option with its help text.

Options come from the config dataclasses (:mod:`agentrl_train.config`): each field is a flag, a
``--config run.yaml`` file sets any of them, and flags given on the command line win.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from agentrl_envs.cli.args import parse_args
from agentrl_envs.errors import AgentRLError

__all__ = ["main"]

#: Options whose default differs per command: ``--help`` shows these, and the command applies them.
COMMAND_DEFAULTS: dict[str, dict[str, Any]] = {"ppo": {}, "sft": {"out": "runs/sft", "mode": "generate"}}


def _add_config_options(p: argparse.ArgumentParser, command: str) -> None:
    """Every config option as a flag; those ``command`` does not read are hidden and refused by :func:`_check_read_by`."""
    from agentrl_train.config import SECTIONS, option_commands

    p.add_argument(
        "--config", metavar="YAML", help="YAML file of options (sections model/env/ppo/sft/run, or flat keys); flags override it"
    )
    for section, cls in SECTIONS.items():
        group: Any = None
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
            default = COMMAND_DEFAULTS[command].get(f.name, default)
            help_text = f"{f.metadata['help']} (default: {default!r})"
            if command not in option_commands(f.name):
                help_text = argparse.SUPPRESS
            elif group is None:
                group = p.add_argument_group(section, cls.__doc__)
            if isinstance(default, bool):
                (group or p).add_argument(
                    flag, dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text
                )
            else:
                metavar = f.name.upper() if not isinstance(default, (dict, list)) else "YAML"
                (group or p).add_argument(flag, dest=f.name, default=argparse.SUPPRESS, metavar=metavar, help=help_text)


def _check_read_by(command: str, args: argparse.Namespace) -> None:
    """ConfigError for a flag on the command line that ``command`` does not read (it was ignored silently).

    Only flags: a ``--config`` file may set any option, so one file serves ppo and sft.
    """
    from agentrl_train.config import ConfigError, option_commands, option_names

    given = vars(args)
    for name in option_names():
        readers = option_commands(name)
        if name in given and command not in readers:
            flag = name.replace("_", "-")
            flag = f"--{'' if given[name] else 'no-'}{flag}" if isinstance(given[name], bool) else f"--{flag}"
            raise ConfigError(
                f"{flag} only applies to agentrl-train {' and '.join(readers)}, "
                f"not {command}; drop it from the {command} command line (a --config file may keep it)"
            )


def _overrides(args: argparse.Namespace, skip: tuple[str, ...] = ("config", "command", "func", "argv")) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if k not in skip}


def _check_init_adapter(cfg: Any) -> None:
    """A wrong ``--init-adapter`` fails before the model is built or loaded (minutes), not after it."""
    if cfg.model.init_adapter:
        from agentrl_train.lora import check_adapter_folder

        check_adapter_folder(cfg.model.init_adapter, cfg.model.adapter)


def _cmd_ppo(args: argparse.Namespace) -> int:
    from agentrl_train.config import ConfigError
    from agentrl_train.config_io import load_config

    if args.nproc < 1:
        raise ConfigError(f"--nproc {args.nproc}: the number of processes must be at least 1")
    _check_read_by("ppo", args)
    overrides = _overrides(args, ("config", "command", "func", "nproc", "argv"))
    cfg = load_config(args.config, overrides)  # a bad option fails here once, not once per rank under torchrun
    _check_init_adapter(cfg)
    from agentrl_train import distributed

    if args.nproc > 1:
        from agentrl_train.config_io import make_run_dir
        from agentrl_train.env_checks import check_env_config

        check_env_config(cfg.env)
        make_run_dir(cfg)
        # torchrun's per-rank logs go into the run folder (without --log-dir it leaves a torchelastic_* folder in /tmp)
        return distributed.exec_torchrun(args.nproc, args.argv, log_dir=os.path.join(cfg.run.out, "torchrun"))
    from agentrl_train.train import train

    with distributed.setup(cfg.model.device) as dist:
        train(cfg, dist=dist, log=print if dist.is_main else (lambda *a, **k: None))
    return 0


def _cmd_sft(args: argparse.Namespace) -> int:
    from agentrl_train.config import ConfigError, TrainConfig, option_value
    from agentrl_train.config_io import load_config
    from agentrl_train.sft import sft

    overrides = _overrides(args)
    if overrides.get("resume"):  # it restarted from scratch, silently, and wrote over final/
        raise ConfigError(
            "--resume: sft keeps no checkpoints, so there is nothing to resume (a run that stopped starts over); drop --resume"
        )
    _check_read_by("sft", args)
    # sft's own defaults win over a --config file's out/mode (one file may serve ppo and sft, and its
    # out: would make sft write over the ppo run's final/); said, not silent, when the file differs
    from_file = load_config(args.config) if args.config else None
    for name, value in COMMAND_DEFAULTS["sft"].items():
        if name not in overrides and from_file is not None:
            in_file = option_value(from_file, name)
            if in_file not in (value, option_value(TrainConfig(), name)):
                print(
                    f"agentrl-train sft: --{name} {value} (sft's default; the --config file's {name}: {in_file} is not used by "
                    f"sft, which may share the file with ppo; pass --{name} to choose)",
                    file=sys.stderr,
                )
        overrides.setdefault(name, value)
    cfg = load_config(args.config, overrides)
    _check_init_adapter(cfg)
    sft(cfg)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from agentrl_train.evaluate import evaluate_run

    result = evaluate_run(
        args.run,
        args.split,
        args.episodes,
        error_profile=args.error_profile,
        checkpoint=args.checkpoint,
        sample=args.sample,
        transcripts=args.transcripts,
    )
    if args.json:
        print(json.dumps(result))
    else:
        from agentrl_train.evaluate import markdown_table

        print(markdown_table({args.split: result}), end="")
    return 0


def _cmd_resources(args: argparse.Namespace) -> int:
    from agentrl_train import resources

    data = resources.load(args.run)
    print(json.dumps(data, indent=2) if args.json else resources.table(data), end="" if not args.json else "\n")
    return 0


def _cmd_check_model(args: argparse.Namespace) -> int:
    from agentrl_train.check_model import check_model, format_report

    envs = args.envs.split(",") if args.envs else None
    report = check_model(
        args.model,
        **({"envs": envs} if envs else {}),
        episodes=args.episodes,
        long_horizon=not args.no_long_horizon,
        num_envs=args.num_envs,
        micro_batch=args.micro_batch,
        max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens=args.max_new_tokens,
        rope_scaling=args.rope_scaling,
        log=lambda *a: print(*a, file=sys.stderr),
    )
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from agentrl_train.serve.canary import CanaryRules
    from agentrl_train.serve.limits import ServeLimits
    from agentrl_train.serve.run import ADMIN_TOKEN_ENV, build_app, listen, parse_pairs, serve, token_from

    adapters = parse_pairs(args.adapter, "--adapter")
    watch = parse_pairs(args.watch, "--watch", default_name=next(iter(adapters), None))
    rules = CanaryRules(
        min_episodes=args.canary_min_episodes,
        success_margin=args.canary_success_margin,
        timeout_margin=args.canary_timeout_margin,
        auto=args.canary_auto,
    )
    token = token_from(args.token)
    admin_token = token_from(args.admin_token, ADMIN_TOKEN_ENV)
    from agentrl_envs.server.simulator import check_bind

    check_bind(args.host, token)
    if admin_token is not None:
        check_bind("0.0.0.0", admin_token)  # the same strength rule as --token
    limits = ServeLimits(
        max_messages=args.max_messages,
        max_prompt_chars=args.max_prompt_chars,
        max_prompt_tokens=args.max_prompt_tokens,
        max_concurrent_encodings=args.max_concurrent_encodings,
        header_timeout_s=args.header_timeout_s,
        body_timeout_s=args.body_timeout_s,
        max_connections=args.max_connections,
    )
    app = build_app(
        args.model,
        adapters,
        upstream=args.upstream,
        device=args.device,
        threads=args.threads,
        rope_scaling=args.rope_scaling,
        token=token,
        admin_token=admin_token,
        adapters_root=args.adapters_root,
        limits=limits,
        rules=rules,
        max_new_tokens=args.max_new_tokens,
        watch=watch,
        watch_interval_s=args.watch_interval_s,
    )
    sock = listen(args.host, args.port)
    port = sock.getsockname()[1]  # the one bound: --port 0 printed ":0"
    where = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"agentrl-train serve on http://{where}:{port} ({'bearer token required' if token else 'no token'}); Ctrl-C stops it",
        flush=True,
    )
    serve(app, args.host, port, token, sock=sock)
    return 0


def _int_in(lo: int, hi: int) -> Any:
    """An argparse type: an integer in [lo, hi] (argparse names the option and exits 2 otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}-{hi}, got {text[:40]!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}-{hi}, got {text[:40]!r}")
        return value

    parse.__name__ = "integer"  # what argparse calls the type in its own messages
    return parse


_port = _int_in(0, 65535)


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0 (0 would poll in a busy loop; nan or inf never poll)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, e.g. 2, got {text[:40]!r}") from None
    if not 0 < value < 1e6:  # also false for nan
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0 and below 1e6, e.g. 2, got {text[:40]!r}")
    return value


def _rope_scaling(text: str) -> dict[str, Any]:
    """An argparse type: a ``--rope-scaling`` mapping in YAML (agentrl_train.rope)."""
    from agentrl_envs.errors import ConfigError
    from agentrl_envs.yamlsafe import load_yaml
    from agentrl_train.rope import parse_rope_scaling

    try:
        return parse_rope_scaling(load_yaml(text, "--rope-scaling", max_bytes=4096)) or {}
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--rope-scaling").lstrip(": ")) from None


_ROPE_HELP = "{type: linear|dynamic|yarn|ntk, factor: F}: stretch the context of a rotary-position model (default: off)"


def _add_serve_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve adapters behind an OpenAI-compatible endpoint (hot reload, canary rollout)",
        description="Serve a base model and LoRA adapters on /v1/chat/completions; swap adapters in place and roll out canaries.",
    )
    _add_serve_model_options(p)
    _add_serve_access_options(p)
    _add_serve_limit_options(p)
    _add_canary_options(p)
    p.set_defaults(func=_cmd_serve)


def _add_serve_model_options(p: argparse.ArgumentParser) -> None:
    """What is served: a base model and its adapters, or a route to another server."""
    p.add_argument(
        "--model",
        default=None,
        metavar="M",
        help="'tiny', 'smollm2-135m', a .gguf file or a local Hugging Face model folder (nothing is downloaded)",
    )
    p.add_argument(
        "--adapter",
        action="append",
        metavar="NAME=DIR",
        help="serve DIR (a run's final/, a peft folder) as model NAME; repeatable",
    )
    p.add_argument(
        "--upstream",
        default=None,
        metavar="URL",
        help="route in front of another OpenAI-compatible server (e.g. vLLM) instead of --model; NAME=UPSTREAM_MODEL",
    )


def _add_serve_access_options(p: argparse.ArgumentParser) -> None:
    """Where it listens, who may call it, and where adapters may be loaded or watched from."""
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1; any other needs a token)")
    p.add_argument("--port", type=_port, default=8000, help="port, 0 for any free one (default: 8000)")
    p.add_argument(
        "--token", default=None, help="bearer token required on every route but /health (default: $AGENTRL_SERVE_TOKEN)"
    )
    p.add_argument(
        "--admin-token",
        default=None,
        help="bearer token of the admin routes (/v1/adapters...); without one they answer loopback clients only "
        "(default: $AGENTRL_SERVE_ADMIN_TOKEN)",
    )
    p.add_argument(
        "--adapters-root",
        default=None,
        metavar="DIR",
        help="POST /v1/adapters/NAME loads folders under DIR only (default: none, such loads are refused)",
    )
    p.add_argument(
        "--watch", action="append", metavar="[NAME=]DIR", help="hot-reload the newest adapter a trainer writes under DIR"
    )


def _add_serve_limit_options(p: argparse.ArgumentParser) -> None:
    """Request limits, --watch's interval, and the model's device, threads, context and token budget."""
    for flag, kind, default, what in (
        ("--max-messages", _int_in(1, 1_000_000), 1024, "messages per chat request"),
        ("--max-prompt-chars", _int_in(1, 1 << 30), 262_144, "characters of messages and tools per chat request"),
        ("--max-prompt-tokens", _int_in(1, 1 << 30), 131_072, "tokens per chat request before old turns are dropped"),
        ("--max-concurrent-encodings", _int_in(1, 1024), 2, "chat requests tokenized at once"),
        ("--max-connections", _int_in(1, 1_000_000), 256, "open connections (past it the idlest is closed)"),
        ("--header-timeout-s", _seconds, 10.0, "seconds a client may take to send a request head"),
        ("--body-timeout-s", _seconds, 30.0, "seconds a client may take to send a request body"),
    ):
        p.add_argument(flag, type=kind, default=default, metavar="N", help=f"{what} (default: {default})")
    p.add_argument(
        "--watch-interval-s", type=_seconds, default=2.0, metavar="S", help="how often --watch looks, > 0 (default: 2)"
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"], help="where the model runs (default: cpu)")
    p.add_argument("--threads", type=_int_in(1, 1024), default=1, metavar="N", help="torch threads on CPU (default: 1)")
    p.add_argument("--rope-scaling", type=_rope_scaling, default={}, metavar="YAML", help=_ROPE_HELP)
    p.add_argument(
        "--max-new-tokens",
        type=_int_in(1, 32768),
        default=256,
        metavar="N",
        help="default and cap of max_tokens, 1-32768 (default: 256)",
    )


def _add_canary_options(p: argparse.ArgumentParser) -> None:
    """The rules that promote or roll back a canary adapter."""
    p.add_argument(
        "--canary-min-episodes",
        type=int,
        default=20,
        metavar="N",
        help="episodes per side before a canary is judged (default: 20)",
    )
    p.add_argument(
        "--canary-success-margin",
        type=float,
        default=0.05,
        metavar="F",
        help="promote if success >= baseline - F (default: 0.05)",
    )
    p.add_argument(
        "--canary-timeout-margin",
        type=float,
        default=0.05,
        metavar="F",
        help="... and timeout rate <= baseline + F (default: 0.05)",
    )
    p.add_argument(
        "--canary-auto", action=argparse.BooleanOptionalAction, default=True, help="apply the rules automatically (default: on)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrl-train", description="PPO + LoRA training of tool-using LLM agents on agentrl envs"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("ppo", help="train a LoRA policy with PPO", description="Train a LoRA policy with PPO on an agentrl env.")
    _add_config_options(p, "ppo")
    p.add_argument(
        "--nproc", type=int, default=1, metavar="N", help="processes on this machine: N > 1 execs torchrun --nproc-per-node N"
    )
    p.set_defaults(func=_cmd_ppo)

    p = sub.add_parser("sft", help="behaviour cloning on oracle transcripts (warm start for generate mode)")
    _add_config_options(p, "sft")
    p.set_defaults(func=_cmd_sft)

    p = sub.add_parser("eval", help="evaluate a saved policy (a run folder) on a split")
    p.add_argument("--run", required=True, metavar="DIR", help="run folder (its final/ adapter, or --checkpoint)")
    p.add_argument("--split", default="test", choices=["train", "test", "heldout"], help="task split (default: test)")
    p.add_argument("--episodes", type=int, default=50, metavar="N", help="episodes (default: 50)")
    p.add_argument(
        "--sample",
        action="store_true",
        help="draw each action from the policy (seeded per episode) instead of taking the greedy one",
    )
    p.add_argument("--error-profile", default=None, metavar="P", help="fault profile by name or YAML path (default: the run's)")
    p.add_argument(
        "--transcripts",
        default=None,
        metavar="FILE",
        help="also write every episode (instruction, each action, observation and reward, the outcome) to FILE as JSON lines",
    )
    p.add_argument(
        "--checkpoint", default=None, metavar="NAME", help="evaluate checkpoints/NAME instead of final/ ('latest' for the newest)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (success_rate, mean_return, ...)")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("resources", help="print a run's resource map (resources.json) per stage and phase")
    p.add_argument("--run", required=True, metavar="DIR", help="run folder")
    p.add_argument("--json", action="store_true", help="print resources.json itself")
    p.set_defaults(func=_cmd_resources)

    p = sub.add_parser(
        "check-model",
        help="what to know about a base model before training on it (template, markers, context, LoRA size, memory)",
        description="Check a base model for training: does its chat template render tools, how do the tool-call "
        "markers tokenize, how long are the envs' prompts with its tokenizer against its context, how many "
        "parameters each LoRA preset trains, and a memory estimate. The weights are not loaded.",
    )
    p.add_argument("model", metavar="MODEL", help="tiny, smollm2-135m, a .gguf file or a Hugging Face folder")
    p.add_argument("--envs", metavar="ID,ID", default="", help="env ids to measure prompts on (default: all six)")
    p.add_argument("--episodes", type=_int_in(1, 1000), default=4, metavar="N", help="oracle episodes per env (default: 4)")
    p.add_argument("--no-long-horizon", action="store_true", help="skip the long-horizon SQLPythonSMTP variant")
    p.add_argument("--num-envs", type=_int_in(1, 1024), default=8, metavar="N", help="envs in a rollout, for the memory estimate")
    p.add_argument(
        "--micro-batch", type=_int_in(1, 4096), default=16, metavar="N", help="sequences per update pass, for the estimate"
    )
    p.add_argument("--max-prompt-tokens", type=_int_in(1, 1 << 20), default=1536, metavar="N", help="as for ppo (default: 1536)")
    p.add_argument("--max-new-tokens", type=_int_in(1, 1 << 16), default=160, metavar="N", help="as for ppo (default: 160)")
    p.add_argument("--rope-scaling", type=_rope_scaling, default={}, metavar="YAML", help=_ROPE_HELP)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=_cmd_check_model)

    _add_serve_parser(sub)

    for extra in ("agentrl_train.adapters.cli", "agentrl_train.rm_train", "agentrl_train.stages"):
        mod = __import__(extra, fromlist=["add_fuse_parser"])  # a broken module is an error, not a missing command
        for name in ("add_fuse_parser", "add_remap_parser", "add_rm_parsers", "add_stages_parser"):
            if hasattr(mod, name):
                getattr(mod, name)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what --nproc passes on to torchrun
    try:
        return int(args.func(args) or 0)
    except AgentRLError as exc:
        print(f"agentrl-train {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
