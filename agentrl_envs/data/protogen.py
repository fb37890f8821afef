"""Regenerate ``trajectory_pb2.py`` and its ``.pyi`` stub from ``proto/agentrl/v1/trajectory.proto``.

Run after editing the schema, from the repository root::

    python -m agentrl_envs.data.protogen           # rewrites agentrl_envs/data/trajectory_pb2.py(i)
    python -m agentrl_envs.data.protogen --check   # exits 1 if the committed files are stale

It needs ``grpcio-tools`` (in the ``[dev]`` extra), which ships ``protoc``. protoc names the module
after the .proto path (``agentrl.v1.trajectory_pb2``); the generated classes would then carry that
as their ``__module__`` and fail to unpickle, so the one occurrence is rewritten to the module's
real name. ``tests/data/test_codec.py`` regenerates into a temporary folder and compares bytes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from importlib import resources
from pathlib import Path

from agentrl_envs.data.errors import StorageError

__all__ = ["OUTPUTS", "check", "generate"]

PROTO_NAME = "agentrl/v1/trajectory.proto"
MODULE_AS_GENERATED = "'agentrl.v1.trajectory_pb2'"
MODULE_REAL = "'agentrl_envs.data.trajectory_pb2'"
OUTPUTS = ("trajectory_pb2.py", "trajectory_pb2.pyi")
PACKAGE_DIR = Path(__file__).resolve().parent


def _proto_root() -> Path:
    root = Path(str(resources.files("agentrl_envs.proto")))
    if not (root / PROTO_NAME).is_file():
        raise StorageError(f"{root / PROTO_NAME} is missing: run from a checkout or an install that ships the .proto files")
    return root


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on the trajectory schema and write the outputs into ``out_dir``.

    Args:
        out_dir: an existing folder; ``trajectory_pb2.py`` and ``trajectory_pb2.pyi`` land there.

    Returns:
        The paths written.

    Raises:
        StorageError: grpcio-tools is not installed, or protoc failed.
    """
    try:
        from grpc_tools import protoc
    except ImportError as exc:
        raise StorageError("regenerating the protobuf code needs grpcio-tools: pip install -e '.[dev]'") from exc
    root = _proto_root()
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{root}", f"--python_out={tmp}", f"--pyi_out={tmp}", str(root / PROTO_NAME)]
        if protoc.main(args) != 0:
            raise StorageError(f"protoc failed on {root / PROTO_NAME}; its message is above")
        generated = Path(tmp) / "agentrl" / "v1"
        code = (generated / OUTPUTS[0]).read_text(encoding="utf-8")
        if code.count(MODULE_AS_GENERATED) != 1:
            raise StorageError(f"protoc output changed shape: expected one {MODULE_AS_GENERATED}; update protogen.py")
        written = []
        for name, text in (
            (OUTPUTS[0], code.replace(MODULE_AS_GENERATED, MODULE_REAL)),
            (OUTPUTS[1], (generated / OUTPUTS[1]).read_text(encoding="utf-8")),
        ):
            path = out_dir / name
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def check() -> list[str]:
    """Names of the committed generated files that differ from a fresh generation (empty when fresh)."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return [name for name in OUTPUTS if (Path(tmp) / name).read_bytes() != (PACKAGE_DIR / name).read_bytes()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl_envs.data.protogen", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the committed files are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = check()
        print("stale: " + ", ".join(stale) if stale else "up to date")
        return 1 if stale else 0
    for path in generate(PACKAGE_DIR):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
