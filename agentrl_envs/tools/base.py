"""The Tool protocol: everything the env suite knows about one tool, in one class.

A tool owns its function-calling schema and argument checks, the observation text of a result
(``render``), its structured summary in ``info["tool_result"]`` (``summarize``), what counts as a
successful call (``succeeded``), its default aux reward term, the words that name it in service
logs (``fit-profile``), the URL schemes of real services that can serve it alone (``backend=``
mounts) and the extra virtual latency its own work costs under a fault profile. Faults, aux terms,
mounts, ``fit-profile`` and the server read these from the registry in :mod:`agentrl_envs.tools`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from agentrl_envs.backends.base import ToolResponse
from agentrl_envs.errors import ActionError, ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from agentrl_envs.backends.base import Backend
    from agentrl_envs.tasks.base import SubTask, Task
    from agentrl_envs.tasks.state import StepState

__all__ = ["Tool", "check_arguments", "pick"]

# Python types allowed for each JSON-schema type used by the tools.
_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "array": (list,), "object": (dict,)}


@dataclass(frozen=True)
class Tool:
    """Base class of the tools. Subclasses set ``name``, ``description`` and ``parameters``.

    ``parameters`` is a JSON schema object (``properties``, ``required``) as in OpenAI function
    calling; :meth:`schema` returns the function-calling entry, usable with
    ``tokenizer.apply_chat_template(tools=...)``.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    #: False for a tool the env answers itself (``finish``): no backend, no faults, no aux term.
    service: ClassVar[bool] = True
    #: The default aux reward term, paid when a call newly completes this tool's part of a sub-task.
    aux_term: ClassVar[float | None] = None
    #: Lower-case words that name this tool in service logs (``fit-profile`` maps calls by them).
    log_names: ClassVar[tuple[str, ...]] = ()
    #: URL prefixes of real services that serve this tool alone (``backend={"<tool>": url}``).
    backend_schemes: ClassVar[tuple[str, ...]] = ()
    #: The task component this tool's step of a sub-task reports (``queried``); None when no task checks it.
    component: ClassVar[str | None] = None
    #: True for a tool whose gold program reads the saved result of the sub-task's query.
    reads_query_csv: ClassVar[bool] = False
    #: True for the tool whose backend should hold the episode workspace (the one that runs programs).
    hosts_workspace: ClassVar[bool] = False
    #: The argument naming workspace files a call sends along (read from the workspace's backend).
    file_argument: ClassVar[str | None] = None

    def schema(self, facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The function-calling entry; ``facts`` are what the backend reports (``{"numpy": True}``)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.describe(facts or {}), "parameters": self.parameters},
        }

    def describe(self, facts: Mapping[str, Any]) -> str:
        """The description the agent sees, given the backend's ``facts`` (default: ``description``)."""
        return self.description

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check argument names and types; return the arguments to send (raise ActionError)."""
        return check_arguments(self.name, self.parameters, arguments)

    def render(self, response: ToolResponse) -> str:
        """The observation text of a response."""
        if response.ok:
            return f"{self.name} ok"
        return render_error(self.name, response)

    def succeeded(self, response: ToolResponse) -> bool:
        """Whether the call did what was asked (default: the service answered ok)."""
        return response.ok

    def summarize(self, response: ToolResponse) -> dict[str, Any]:
        """``info["tool_result"]``: the common fields, then :meth:`details` of a successful call."""
        out: dict[str, Any] = {
            "tool": self.name,
            "ok": self.succeeded(response),
            "status": response.status,
            "error_type": response.error_type,
            "error": response.error,
        }
        if response.ok:
            out.update(self.details(response))
        return out

    def details(self, response: ToolResponse) -> dict[str, Any]:
        """The tool's own fields of a successful call's summary (keep each key's type fixed)."""
        return {}

    def work_latency_s(self, response: ToolResponse, faults: Any) -> float:
        """Virtual seconds the call's own work took under a profile's ``faults`` (a ToolFaults)."""
        return 0.0

    # -- progress (agentrl_envs.tasks.progress): what completes this tool's step of a sub-task ------

    def observe(
        self, subs: Sequence[SubTask], states: Sequence[StepState], arguments: dict[str, Any], response: ToolResponse
    ) -> list[int]:
        """Record one result of this tool in the sub-tasks' states; return the indices of those it moved forward."""
        return []

    def gold_call(self, sub: SubTask, state: StepState) -> dict[str, Any] | None:
        """The gold plan's arguments for this tool's step of ``sub`` when that step is due, else None."""
        return None

    # -- candidates (agentrl_envs.candidates): wrong calls that look like the right one ---------------

    def perturb(self, task: Task, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """Arguments of plausible wrong calls near the gold call's ``arguments`` (``candidates_difficulty="easy"``)."""
        return []

    def perturb_hard(self, task: Task, arguments: dict[str, Any], context: str) -> list[dict[str, Any]]:
        """Meaning-changing variants that keep the instruction's entities and figures (``"hard"``)."""
        return []

    def guess(self, task: Task) -> dict[str, Any] | None:
        """Arguments of a generic exploratory call of this tool, offered as a wrong candidate (or None)."""
        return None

    def random_arguments(self, task: Task | None, rng: np.random.Generator, number: float) -> dict[str, Any]:
        """Plausible random arguments, for :class:`~agentrl_envs.agents.RandomAgent` (``number``: a random figure)."""
        return {}

    def real_backend(self, url: str, **options: Any) -> Backend:
        """The backend of a real service at ``url`` (one of :attr:`backend_schemes`).

        Raises:
            ConfigError: the tool has no real backend for that URL.
        """
        raise ConfigError(f"backend[{self.name!r}]={url[:80]!r}: the {self.name} tool has no backend for this URL")


def pick(rng: np.random.Generator, options: Sequence[Any]) -> Any:
    """One of ``options``, uniformly (one draw of ``rng``)."""
    return options[int(rng.integers(len(options)))]


def render_error(tool: str, response: ToolResponse) -> str:
    return f"{tool} error [{response.error_type}, status {response.status}]: {response.error}"


def check_arguments(tool: str, parameters: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = parameters.get("properties", {})
    required: list[str] = parameters.get("required", [])
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        shown = ", ".join(repr(u[:40]) for u in unknown[:5])
        raise ActionError("bad_arguments", f"{tool}: unknown argument(s) {shown}; expected {sorted(props)}")
    missing = [r for r in required if r not in arguments]
    if missing:
        raise ActionError("bad_arguments", f"{tool}: missing required argument(s) {missing}")
    for key, value in arguments.items():
        spec = props[key]
        if _has_surrogate(value):
            raise ActionError(
                "bad_arguments",
                f"{tool}: argument {key!r} holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode text",
            )
        allowed = spec.get("type")
        kinds = allowed if isinstance(allowed, list) else [allowed]
        if not any(_matches(kind, spec, value) for kind in kinds):
            want = " or ".join(_describe(k, spec) for k in kinds)
            raise ActionError("bad_arguments", f"{tool}: argument {key!r} must be {want}, got {type(value).__name__}")
    return arguments


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


def _matches(kind: str, spec: dict[str, Any], value: Any) -> bool:
    if kind == "array":
        item_kind = spec.get("items", {}).get("type", "string")
        return isinstance(value, list) and all(isinstance(v, _JSON_TYPES[item_kind]) for v in value)
    return isinstance(value, _JSON_TYPES[kind])


def _describe(kind: str, spec: dict[str, Any]) -> str:
    if kind == "array":
        return f"a list of {spec.get('items', {}).get('type', 'string')}s"
    return f"a {kind}"
