"""The Tool protocol: everything the env suite knows about one tool, in one class.

A tool owns its function-calling schema and argument checks, the observation text of a result
(``render``), its structured summary in ``info["tool_result"]`` (``summarize``), what counts as a
successful call (``succeeded``), its default aux reward term, the words that name it in service
logs (``fit-profile``), the URL schemes of real services that can serve it alone (``backend=``
mounts) and the extra virtual latency its own work costs under a fault profile. Faults, aux terms,
mounts, ``fit-profile`` and the server read these from the registry in :mod:`agentrl_envs.tools`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

# typing_extensions (a dependency of pydantic): pydantic needs its TypedDict on Python < 3.12.
from typing_extensions import NotRequired, Required, TypedDict

from agentrl_envs.backends.base import ToolResponse
from agentrl_envs.errors import ActionError, ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from agentrl_envs.backends.base import Backend
    from agentrl_envs.tasks.base import SubTask, Task
    from agentrl_envs.tasks.state import StepState

__all__ = ["MAX_NESTING", "Tool", "check_arguments", "nested_deeper_than", "pick"]

#: How deeply a call's JSON may nest (objects and arrays; the call object itself counts as one level).
#: The parser checks it on the text before ``json.loads`` and :func:`check_arguments` on the values
#: before any other walk, so no recursive code downstream (pydantic, the surrogate check, ``json.dumps``
#: in a backend, a recorder) runs more than 64 levels deep: a small share of Python's 1,000-frame stack
#: even when ``env.step`` runs far down a trainer's or a vector env worker's call stack. Real tool
#: arguments nest a few levels (an HTTP body rarely past 10).
MAX_NESTING = 64


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
        """The function-calling entry; ``facts`` are what the backend reports (``{"numpy": True}``).

        A new copy on every call: ``parameters`` is the tool's one definition (the argument checks
        read it), and a caller that edits the schema it was handed must not change it for the process.
        An env calls this once, when it makes its backend, not per reset.
        """
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.describe(facts or {}),
                "parameters": _copy_json(self.parameters),
            },
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

    # -- progress (agentrl_envs.core.progress): what completes this tool's step of a sub-task ------

    def observe(
        self, subs: Sequence[SubTask], states: Sequence[StepState], arguments: dict[str, Any], response: ToolResponse
    ) -> list[int]:
        """Record one result of this tool in the sub-tasks' states; return the indices of those it moved forward."""
        return []

    def gold_call(self, sub: SubTask, state: StepState) -> dict[str, Any] | None:
        """The gold plan's arguments for this tool's step of ``sub`` when that step is due, else None."""
        return None

    # -- candidates (agentrl_envs.core.candidates): wrong calls that look like the right one ---------------

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


def _copy_json(value: Any) -> Any:
    """A copy of a JSON value's dicts and lists (a third of copy.deepcopy's time on a tool's schema: no memo)."""
    if isinstance(value, dict):
        return {key: _copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy_json(item) for item in value]
    return value


def render_error(tool: str, response: ToolResponse) -> str:
    return f"{tool} error [{response.error_type}, status {response.status}]: {response.error}"


# Tool arguments are checked by pydantic: a strict TypeAdapter built once per schema from
# the tool's ``parameters`` (still the one source; ``_arguments_type``), so the checking is the
# library's and only the wording of its errors is ours (``_explain``, the hand-written checker's
# messages word for word). Measured with ``nice -n 19 .venv/bin/python benchmarks/bench_arguments.py``
# (2026-12-01, the shared 2-core machine at load ~8; CPU per call, median of 9 rounds, the oracle's
# calls of every registered tool): hand-written 5.8 us valid / 7.0 us invalid; pydantic 3.0 / 11.8
# (0.52x / 1.69x; the adapter alone 1.4 / 2.6); jsonschema's compiled Draft202012Validator 35 / 60
# (6.1x / 8.6x, 68 us for an smtp call), against 125 us of CPU for a whole SQL point-lookup step:
# jsonschema would take a tenth of that step's +0.3 ms budget; pydantic costs less than the old code.
def check_arguments(tool: str, parameters: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """Check a call's ``arguments`` against the tool's JSON-schema ``parameters``; return them unchanged.

    The schema subset the tools use: an object of ``properties`` with ``required`` names and no
    others; each property a ``type`` (``string``, ``array`` of ``items``, ``object``, ``integer``,
    ``number``, ``boolean``, or a list of these) and, for strings, an optional ``enum``. Types are
    strict, as in JSON (``1`` is not a string, ``true`` is not a number). Strings must be valid
    Unicode text (no lone surrogates).

    Raises:
        ActionError: ``bad_arguments``, naming the argument, what was expected and what came.
        ConfigError: ``parameters`` uses a part of JSON schema outside that subset (a tool's bug).
    """
    if not isinstance(arguments, dict):
        raise ActionError("bad_arguments", f"{tool}: the arguments must be a JSON object, got {type(arguments).__name__}")
    if nested_deeper_than(arguments, MAX_NESTING):
        raise ActionError("too_deep", f"{tool}: the arguments nest deeper than {MAX_NESTING} levels; flatten them")
    if len(arguments) > len(parameters.get("properties", ())):
        # More names than the schema has, so some are unknown: said without pydantic, which would build
        # one error per extra name (a hostile call of 20,000 names: ~0.2 s).
        raise ActionError("bad_arguments", _explain(tool, parameters, arguments, None))
    error = _arguments_checker(tool, parameters)(arguments)
    if error is not None:
        raise ActionError("bad_arguments", _explain(tool, parameters, arguments, error))
    for key, value in arguments.items():
        if _has_surrogate(value):
            raise ActionError("bad_arguments", _surrogate_message(tool, key))
    return arguments


# One compiled checker per schema object (held alongside, so an id is never reused for another schema).
_CHECKERS: dict[int, tuple[dict[str, Any], Callable[[dict[str, Any]], Any]]] = {}


def _arguments_checker(tool: str, parameters: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    """A function returning None for valid arguments, else pydantic's ValidationError (built on first use)."""
    entry = _CHECKERS.get(id(parameters))
    if entry is None or entry[0] is not parameters:
        # pydantic is imported here, not at module level, so that `import agentrl_envs` stays light.
        from pydantic import ConfigDict, TypeAdapter, ValidationError

        typed_dict: Any = TypedDict
        cls = typed_dict(f"{tool}_arguments", _arguments_type(tool, parameters))
        cls.__pydantic_config__ = ConfigDict(extra="forbid", strict=True)
        validate = TypeAdapter(cls).validate_python

        def check(arguments: dict[str, Any]) -> ValidationError | None:
            try:
                validate(arguments)
            except ValidationError as exc:
                return exc
            return None

        entry = (parameters, check)
        _CHECKERS[id(parameters)] = entry
    return entry[1]


_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict[str, Any]}


def _arguments_type(tool: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The fields of a TypedDict equivalent to the ``parameters`` schema (raise ConfigError outside the subset)."""
    props = parameters.get("properties", {})
    required = parameters.get("required", [])
    if parameters.get("type", "object") != "object" or not isinstance(props, dict) or not isinstance(required, list):
        raise ConfigError(f"tool {tool!r}: parameters must be {{'type': 'object', 'properties': {{...}}, 'required': [...]}}")
    unknown = sorted(str(r) for r in required if r not in props)
    if unknown:
        raise ConfigError(f"tool {tool!r}: required argument(s) {unknown} are not in 'properties'; declare them there")
    return {key: (Required if key in required else NotRequired)[_property_type(tool, key, spec)] for key, spec in props.items()}


def _property_type(tool: str, key: str, spec: Any) -> Any:
    kinds = spec.get("type") if isinstance(spec, dict) else None
    kinds = kinds if isinstance(kinds, list) else [kinds]
    options: list[Any] = []
    for kind in kinds:
        if kind == "string" and "enum" in spec:
            enum = spec["enum"]
            if not isinstance(enum, list) or not enum or not all(isinstance(v, str) for v in enum):
                raise ConfigError(f"tool {tool!r}: argument {key!r} has enum {str(enum)[:80]}; use a non-empty list of strings")
            options.append(Literal[tuple(enum)])
        elif kind == "array":
            items = spec.get("items")
            from pydantic import Field

            list_of: Any = list  # subscripted with a type built at run time
            item_type = _property_type(tool, f"{key}[]", items) if items is not None else Any
            # fail_fast: a hostile list of 60,000 wrong items stops at the first (else 60,000 errors, ~0.3 s).
            options.append(Annotated[list_of[item_type], Field(fail_fast=True)])
        elif kind in _SCALARS:
            options.append(_SCALARS[kind])
        else:
            raise ConfigError(
                f"tool {tool!r}: argument {key!r} has type {kind!r}; use one of {sorted([*_SCALARS, 'array'])} (or a list of them)"
            )
    return options[0] if len(options) == 1 else Union[tuple(options)]  # noqa: UP007 - a Union built at run time


def _explain(tool: str, parameters: dict[str, Any], arguments: dict[str, Any], error: Any) -> str:
    """The agent-facing message of a failed check, in the order: unknown, missing, then each argument."""
    props: dict[str, Any] = parameters.get("properties", {})
    unknown = sorted((k for k in arguments if k not in props), key=str)
    if unknown:
        shown = ", ".join(repr(u[:40]) if isinstance(u, str) else repr(u)[:40] for u in unknown[:5])
        return f"{tool}: unknown argument(s) {shown}; expected {sorted(props)}"
    missing = [r for r in parameters.get("required", []) if r not in arguments]
    if missing:
        return f"{tool}: missing required argument(s) {missing}"
    # Only here are pydantic's errors read: unknown names and missing ones can be any number of errors.
    errors = error.errors(include_url=False, include_context=False, include_input=False)
    failed = {e["loc"][0] for e in errors if e.get("loc")}
    for key, value in arguments.items():
        if _has_surrogate(value):
            return _surrogate_message(tool, key)
        if key in failed:
            spec = props[key]
            enum = spec.get("enum")
            if isinstance(value, str) and enum is not None:
                return f"{tool}: {key} must be one of {', '.join(map(str, enum))}, got {value[:20]!r}"
            kinds = spec.get("type")
            want = " or ".join(_describe(k, spec) for k in (kinds if isinstance(kinds, list) else [kinds]))
            return f"{tool}: argument {key!r} must be {want}, got {type(value).__name__}"
    first = errors[0] if errors else {}
    return f"{tool}: argument {str(first.get('loc', ('?',))[0])[:40]!r}: {str(first.get('msg', 'invalid'))[:200]}"


def _surrogate_message(tool: str, key: str) -> str:
    return f"{tool}: argument {key!r} holds a lone surrogate (\\ud800-\\udfff), which is not valid Unicode text"


def _has_surrogate(value: Any) -> bool:
    """True if a string anywhere in ``value`` (dict keys too) holds a lone surrogate. Iterative: no stack limit."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):  # the http tool's body and query: names and values alike
            stack.extend(item.keys())
            stack.extend(item.values())
    return False


def nested_deeper_than(value: Any, limit: int) -> bool:
    """True if ``value`` has lists or dicts more than ``limit`` levels deep (the value itself is level 1).

    Iterative, and it stops at the first level past ``limit``, so a value nested 100,000 deep (or a
    circular one) costs at most ``limit`` levels of work per branch, never a RecursionError.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (list, tuple, dict)))
    return False


def _describe(kind: str, spec: dict[str, Any]) -> str:
    if kind == "array":
        items = spec.get("items")
        item_kind = items.get("type") if isinstance(items, dict) else None
        return f"a list of {item_kind}s" if isinstance(item_kind, str) else "a list"
    # "a object" (sic) is what the hand-written checker said, and the hostile corpus pins it.
    return f"an {kind}" if kind == "integer" else f"a {kind}"
