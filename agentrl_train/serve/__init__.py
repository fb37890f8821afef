"""``agentrl-train serve``: trained adapters behind an OpenAI-compatible endpoint, hot reload, canaries.

- :mod:`~agentrl_train.serve.engine`: the base model, adapter slots and the one model thread (torch).
- :mod:`~agentrl_train.serve.canary`: routing, per-version numbers, promote/rollback rules (no torch).
- :mod:`~agentrl_train.serve.app`: the ASGI app and its routes; :func:`serve` runs it under uvicorn.
- :mod:`~agentrl_train.serve.completions`: vLLM's ``/v1/completions`` and runtime LoRA bodies and answers (no torch).
"""

from __future__ import annotations

from agentrl_train.serve.app import ServeApp, latest_adapter
from agentrl_train.serve.canary import CanaryRules, Router, Target, sticky_unit
from agentrl_train.serve.run import serve

__all__ = ["CanaryRules", "Router", "ServeApp", "Target", "latest_adapter", "serve", "sticky_unit"]
