"""``agentrl-train serve``: trained adapters behind an OpenAI-compatible endpoint, hot reload, canaries.

- :mod:`~agentrl_train.serve.app`: the ASGI app (:class:`ServeApp`): routing, access, chat and feedback.
- :mod:`~agentrl_train.serve.run`: builds the app for the CLI; :func:`serve` runs it under uvicorn.
- :mod:`~agentrl_train.serve.engine`: the base model, adapter slots and the one model thread (torch).
- :mod:`~agentrl_train.serve.weights`: an adapter's files and weights, read and checked before a swap (torch).
- :mod:`~agentrl_train.serve.prompts`: the client's text kept from becoming special tokens; old turns dropped to fit.
- :mod:`~agentrl_train.serve.canary`: routing, per-version numbers, promote/rollback rules (no torch).
- :mod:`~agentrl_train.serve.generation`: the chat and completion routes a local model answers.
- :mod:`~agentrl_train.serve.upstream`: chat completions proxied to another OpenAI-compatible server.
- :mod:`~agentrl_train.serve.admin`: hot reloads, canaries, decisions and vLLM's runtime LoRA routes.
- :mod:`~agentrl_train.serve.watch`: ``--watch``, the newest adapter under a folder loaded as it appears.
- :mod:`~agentrl_train.serve.status`: ``/v1/models``, ``/v1/adapters`` and ``/metrics``, and the server's counters.
- :mod:`~agentrl_train.serve.chat`: OpenAI's chat request and reply (no torch).
- :mod:`~agentrl_train.serve.completions`: vLLM's ``/v1/completions`` and runtime LoRA bodies and answers (no torch).
- :mod:`~agentrl_train.serve.wire`: the error answer, bodies read under their limits, JSON checked (no torch).
- :mod:`~agentrl_train.serve.limits`: request sizes, deadlines and the connection cap.
"""

from __future__ import annotations

from agentrl_train.serve.app import ServeApp
from agentrl_train.serve.canary import CanaryRules, Router, Target, sticky_unit
from agentrl_train.serve.run import serve
from agentrl_train.serve.watch import latest_adapter

__all__ = ["CanaryRules", "Router", "ServeApp", "Target", "latest_adapter", "serve", "sticky_unit"]
