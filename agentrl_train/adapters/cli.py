"""``agentrl-train fuse`` and ``agentrl-train remap-adapter``.

``add_fuse_parser`` / ``add_remap_parser`` register the subcommands on the main parser's subparsers (each
sets ``func``, which takes the parsed args and returns an exit code and raises ``AgentRLError`` on bad
input); ``fuse_main`` / ``remap_main`` run one of them on their own argv and turn errors into exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from agentrl_envs.errors import AgentRLError, ConfigError

__all__ = ["add_fuse_parser", "add_remap_parser", "fuse_main", "remap_main"]


def _adapter_spec(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=DIR (e.g. tool=runs/tool/final), got {text!r}")
    return name.strip(), path.strip()


def _fuse_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="local Hugging Face folder of the base model")
    parser.add_argument(
        "--adapter",
        action="append",
        required=True,
        type=_adapter_spec,
        metavar="NAME=DIR",
        help="an adapter to fuse (peft save_pretrained folder); repeat for each",
    )
    parser.add_argument("--out", required=True, help="new folder for the fused adapter (or merged model)")
    parser.add_argument("--merge", action="store_true", help="write a full model with the deltas merged into its weights")
    parser.add_argument("--atol", type=float, default=1e-5, help="bound on the self-check's max |logit diff| (float32)")


def run_fuse(args: argparse.Namespace) -> int:
    """Fuse ``args.adapter`` onto ``args.model`` and print the report."""
    from agentrl_train.adapters.fuse import fuse_adapters

    adapters: dict[str, str] = {}
    for name, path in args.adapter:
        if name in adapters:
            raise ConfigError(f"adapter name {name!r} given twice; give each --adapter its own NAME")
        adapters[name] = path
    report = fuse_adapters(args.model, adapters, args.out, merge=args.merge, atol=args.atol)
    print(report.summary())
    return 0


def _remap_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="the adapter folder to convert")
    parser.add_argument("--to-model", required=True, help="local folder of the target model (only config.json is read)")
    parser.add_argument("--out", required=True, help="new folder for the remapped adapter")
    parser.add_argument("--rank", type=int, default=None, help="cut every module to this rank (truncated SVD; errors reported)")
    parser.add_argument("--from-model", default=None, help="local folder of the source model, to check the adapter against it")


def run_remap(args: argparse.Namespace) -> int:
    """Remap ``args.src`` to ``args.to_model``'s layout and print the mapping table."""
    from agentrl_train.adapters.remap import remap_adapter

    report = remap_adapter(args.src, args.to_model, args.out, rank=args.rank, from_model=args.from_model)
    print(report.summary())
    return 0


def add_fuse_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``fuse`` on ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    parser = subparsers.add_parser(
        "fuse",
        help="fuse LoRA adapters exactly into one adapter (or a merged model)",
        description="Fuse LoRA adapters into one whose delta is exactly sum_i s_i B_i A_i; checks itself on the logits.",
    )
    _fuse_arguments(parser)
    parser.set_defaults(func=run_fuse)
    return parser


def add_remap_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``remap-adapter`` on ``subparsers``."""
    parser = subparsers.add_parser(
        "remap-adapter",
        help="convert a LoRA adapter between fused (qkv_proj) and split (q/k/v_proj) layouts",
        description="Convert a LoRA adapter to another model's layer layout, exactly unless --rank is given.",
    )
    _remap_arguments(parser)
    parser.set_defaults(func=run_remap)
    return parser


def _main(prog: str, add: Callable[[Any], argparse.ArgumentParser], argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl-train")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add(subparsers)
    args = parser.parse_args([prog, *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args))
    except AgentRLError as exc:
        print(f"agentrl-train {prog}: error: {exc}", file=sys.stderr)
        return 2


def fuse_main(argv: Sequence[str] | None = None) -> int:
    """``agentrl-train fuse ...`` on its own (argv without the subcommand)."""
    return _main("fuse", add_fuse_parser, argv)


def remap_main(argv: Sequence[str] | None = None) -> int:
    """``agentrl-train remap-adapter ...`` on its own (argv without the subcommand)."""
    return _main("remap-adapter", add_remap_parser, argv)
