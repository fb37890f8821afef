"""The ``python`` tool's route: run a program with the episode workspace as working directory."""

from __future__ import annotations

import os
from typing import Any

from simulators.routes import Reply, ToolRoute, err, ok

__all__ = ["ROUTE", "hide_path"]


def hide_path(text: str, workspace: str) -> str:
    """The program's output with the host's workspace path shown as ``/workspace``.

    A program's cwd, ``HOME`` and ``TMPDIR`` are the episode's host directory, whose name is random:
    printing it would reveal a host path and make two runs of one episode differ.
    """
    for path in {workspace, os.path.realpath(workspace)}:
        if path and path in text:
            text = text.replace(path, "/workspace")
    return text


def handle(app: Any, episode: Any, payload: dict[str, Any]) -> Reply:
    """Run ``code`` in the app's runner (the sandbox or a plain subprocess)."""
    code = payload.get("code")
    if not isinstance(code, str):
        return err(422, "bad_arguments", "'code' must be a string")
    if len(code) > 100_000:
        return err(413, "too_large", f"code is {len(code)} characters; the limit is 100000")
    if "\x00" in code:
        return err(400, "bad_request", "code contains a NUL character")
    workspace = episode.workspace
    result = app.runner.run(code, workspace)
    return ok(
        {
            "exit_code": result.exit_code,
            "stdout": hide_path(result.stdout, workspace),
            "stderr": hide_path(result.stderr, workspace),
            "timed_out": result.timed_out,
            "output_truncated": result.output_truncated,
            "sandbox_tier": app.sandbox_tier,
        }
    )


ROUTE = ToolRoute(
    name="python",
    summary="run a Python program with the workspace as working directory",
    handler=handle,
    request={"type": "object", "required": ["code"], "properties": {"code": {"type": "string"}}},
    result={
        "exit_code": {"type": "integer"},
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "timed_out": {"type": "boolean"},
        "output_truncated": {"type": "boolean"},
        "sandbox_tier": {"enum": ["FULL", "REDUCED", "UNSAFE", "BASIC"]},
    },
    result_name="PythonResult",
    errors=(400, 401, 403, 404, 413, 422, 429, 500, 503),
    lane="python",
)
