"""Simulated code-execution service: run a program in the episode workspace."""

from simulators.python.subprocess_runner import PythonResult, PythonRunner, RunLimits

__all__ = ["PythonResult", "PythonRunner", "RunLimits"]
