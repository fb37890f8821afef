"""The registered environments. Each class is an env card, as Gymnasium's own envs are."""

from __future__ import annotations

from typing import ClassVar

from agentrl_envs.env import ToolUseEnv

__all__ = ["HTTPEnv", "PythonEnv", "SMTPEnv", "SQLEnv", "SQLPythonSMTPEnv", "WorkplaceEnv"]

_COMMON_ARGS = """
    ## Arguments

    ``gym.make(id, **kwargs)``, all optional:

    - ``split``: ``"train"`` (default), ``"test"`` (same domains, disjoint data seeds and template
      parameters) or ``"heldout"`` (a domain never seen in train or test).
    - ``domain``: restrict to one domain of the split (``retail``, ``finance``, ``hr``; heldout:
      ``logistics``).
    - ``max_steps``: step limit (default: 3 x the gold plan's calls + 4, at least 10); reaching it
      truncates the episode.
    - ``candidates``: K > 0 puts K shuffled actions in ``info["candidates"]``: the oracle's next
      action and K-1 plausible wrong ones (for classic RL and GLAM-style scoring).
    - ``candidates_difficulty``: ``"easy"`` (default) or ``"hard"`` (wrong candidates keep the
      instruction's entities and figures and change the meaning; a word-overlap heuristic scores
      like chance on them).
    - ``render_mode``: ``"ansi"`` returns the transcript from ``render()``.
    - ``backend``: ``"sim"`` (default), ``"direct"``, ``"http://host:port"`` (``agentrl-envs serve``),
      a dict of per-tool backends (``{"sql": "postgresql://...", "smtp": "smtp://..."}``) or a
      :class:`~agentrl_envs.backends.Backend` instance.
    - ``error_profile``: ``"none"`` (default), a shipped profile (``realistic``, ``flaky``,
      ``outage``, ``rate-limited``, ``auth-expiry``) or the path of a YAML profile.
    - ``aux_reward``: the dense auxiliary reward and its schedule (``None``: the default; ``False``:
      none; a number: a constant weight; a dict of ``schedule``, ``start``, ``end``, ``steps``, ``terms``).
    - ``realtime``: sleep for simulated latencies instead of only advancing the virtual clock.
    - ``time_budget_s``: virtual seconds before the episode is truncated.
    - ``format_penalty``: reward for an unparseable action (default -0.1).
    - ``python_timeout_s``, ``sql_deadline_s``: service limits (default 5 s and 2 s).
    - ``python_sandbox``, ``allow_unsafe_sandbox``: run Python in the hardened sandbox (default);
      accept its rlimits-only tier.
    - ``mail_domains``: recipient domains mail may go to (default ``"company"``; ``None``: any).

    After ``gym.make``, ``training_step``, ``aux_reward`` and ``candidates`` can be changed
    (``vec_env.set_attr``, ``env.set_wrapper_attr``), validated as above; other attributes are refused.
"""

_COMMON_SPACES = """
    ## Action Space

    ``UnicodeText(200000)``: one tool call per step, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    (free text around it is allowed), a bare JSON object with the same keys, OpenAI's
    ``{"type": "function", "function": {...}}`` or Llama 3's ``{"name": ..., "parameters": {...}}``
    (``info["call_format"]`` says which). Several calls in one turn are refused. Any string is a legal
    action: text that is not one well-formed call of an available tool gets an error observation
    and the format penalty. A non-str action raises ``TypeError``.

    ## Observation Space

    ``UnicodeText(16000)``: after reset, the task instruction; after a step, the tool result as text
    (tables as CSV lines capped at 20 rows with a truncation note; errors with their type and status).

    ``info`` always holds ``task_id``, ``domain``, ``split``, ``step``, ``reward_components``,
    ``tool``, ``tool_result``, ``fault``, ``virtual_time_s``, ``subtask_index``,
    ``subtask_boundary`` (the tool type changed) and ``sandbox_tier``. At reset also ``instruction``,
    ``tools`` (OpenAI function schemas), ``system_prompt`` and ``max_steps``; at the end ``success``,
    ``task_components``, ``partial_credit`` and ``fault_stats``.

    ## Rewards

    ``task``: 1.0 on the final step when every required component of the task holds (the components
    are in ``info["task_components"]``); ``aux``: the dense auxiliary reward for newly completed
    progress times the schedule weight; ``fault``: the error profile's penalty for a fault;
    ``format``: the format penalty. The step reward is their sum.

    ## Episode End

    Terminated when the agent calls ``finish``; truncated at ``max_steps`` or when the virtual
    time budget is spent. After the end, ``oracle_action()`` answers a ``finish`` call, so that
    ``vec_env.call("oracle_action")`` works at a vector env's NEXT_STEP autoreset step.
"""

_HISTORY = """
    ## Version History

    - v0: initial release.
"""


class SQLEnv(ToolUseEnv):
    __doc__ = (
        """``AgentRL/SQL-v0``: answer a question about a company database with read-only SQL.

    ## Description

    Each episode draws a domain, a data set and one of five question templates (counts, monthly
    totals, top entity, averages, distinct entities over a threshold). The agent queries the
    episode's private SQLite copy with the ``sql`` tool and answers with ``finish``. Required
    components: ``queried`` (a query returned rows) and ``answer`` (the expected figure or name).
"""
        + _COMMON_SPACES
        + _COMMON_ARGS
        + _HISTORY
    )
    kind: ClassVar[str] = "sql"
    tool_names: ClassVar[tuple[str, ...]] = ("sql", "finish")


class PythonEnv(ToolUseEnv):
    __doc__ = (
        """``AgentRL/Python-v0``: compute a statistic from a CSV file with Python.

    ## Description

    The workspace holds the domain's fact table as ``data/<table>.csv``. Five templates: median,
    population standard deviation, percentage share, month-over-month change, sum of the five
    largest values. The agent runs programs with the ``python`` tool (cwd is the workspace) and
    answers with ``finish``. Required components: ``computed`` (a successful run printed the
    figure) and ``answer``.
"""
        + _COMMON_SPACES
        + _COMMON_ARGS
        + _HISTORY
    )
    kind: ClassVar[str] = "python"
    tool_names: ClassVar[tuple[str, ...]] = ("python", "finish")


class SMTPEnv(ToolUseEnv):
    __doc__ = (
        """``AgentRL/SMTP-v0``: send the right email to the right people.

    ## Description

    The instruction gives a figure and the staff directory. Five templates: to a unit's manager,
    with the director in Cc, to all analysts, with a workspace file attached, to two managers with
    two figures. Required component: ``emailed`` (an accepted message to exactly the required
    recipients with the figures in the body and the required attachments).
"""
        + _COMMON_SPACES
        + _COMMON_ARGS
        + _HISTORY
    )
    kind: ClassVar[str] = "smtp"
    tool_names: ClassVar[tuple[str, ...]] = ("smtp", "finish")


class SQLPythonSMTPEnv(ToolUseEnv):
    __doc__ = (
        """``AgentRL/SQLPythonSMTP-v0``: query, compute in Python from the saved CSV, email the result.

    ## Description

    Every sub-task needs the three tools in order: a ``sql`` query (its result is saved as
    ``results/qN.csv``), a ``python`` program that computes the figure from that file, and an
    ``smtp`` message to the right people, found in the ``staff`` table. Five templates (median,
    month-over-month change, share, standard deviation, mean count). ``long_horizon=True`` chains
    five sub-tasks (16 gold calls) for credit-assignment studies; ``info["subtask_index"]`` and
    ``info["subtask_boundary"]`` mark where sub-tasks and tool types change. Required components
    per sub-task: ``queried``, ``computed``, ``emailed`` (prefixed ``sN.`` when there are several).

    - ``long_horizon``: chain five sub-tasks (default False).
"""
        + _COMMON_SPACES
        + _COMMON_ARGS
        + _HISTORY
    )
    kind: ClassVar[str] = "pipeline"
    tool_names: ClassVar[tuple[str, ...]] = ("sql", "python", "smtp", "finish")


class HTTPEnv(ToolUseEnv):
    __doc__ = (
        """``AgentRL/HTTP-v0``: work with the company's internal REST service (CRM and ticketing).

    ## Description

    The ``http`` tool calls a REST service built from the episode's own data: every table of the
    domain (entities, facts, ``staff``) and a ``tickets`` table are collections (``GET
    /v1/<table>`` with exact-match filters and ``limit``/``offset`` pagination, ``GET
    /v1/<table>/<id>``); tickets take ``POST``, ``PATCH`` and ``DELETE``. ``GET /openapi.json``
    describes it. Bad requests are answered 4xx with a message (unknown field, wrong type, an
    assignee who is not staff, ...). Five templates: look up an entity's key by name, count tickets
    of a status and priority (a listing's ``total``), open a ticket for an entity assigned to a
    unit's manager, close a ticket, reassign one to a unit's analyst. Required components: ``api``
    (a successful answer of the service shows the required record, state or count) and, for the two
    questions, ``answer``. Writes last for the episode and are checked on what the service answers.

    A real service: ``backend={"http": "https://gateway.internal"}`` (paths are appended to the base
    URL; only its host is allowed, redirects are not followed) or an
    :class:`~agentrl_envs.backends.rest.RESTBackend` with its own ``allow_hosts`` and
    ``allow_methods``.
"""
        + _COMMON_SPACES
        + _COMMON_ARGS
        + _HISTORY
    )
    kind: ClassVar[str] = "http"
    tool_names: ClassVar[tuple[str, ...]] = ("http", "finish")


class WorkplaceEnv(ToolUseEnv):
    __doc__ = (
        """``AgentRL/Workplace-v0``: a long-horizon day at work with all four tools.

    ## Description

    Every task chains four sub-tasks, in an order drawn per task: two of ``AgentRL/SQLPythonSMTP-v0``
    (a ``sql`` query, a ``python`` program on the CSV it saved, an ``smtp`` message to the right
    people) and two ticket changes on the company REST service of ``AgentRL/HTTP-v0`` (open a
    ticket, close one, reassign one, with the ``http`` tool): 8 gold calls and ``finish``. The
    database also holds the ``tickets`` table as it was at the start (the REST service is where
    changes happen). Required components per sub-task (prefixed ``s1.`` .. ``s4.``):
    ``queried``, ``computed``, ``emailed`` for the pipeline ones, ``api`` for the ticket ones;
    ``info["subtask_index"]`` and ``info["subtask_boundary"]`` mark where sub-tasks and tools change.
"""
        + _COMMON_SPACES
        + _COMMON_ARGS
        + _HISTORY
    )
    kind: ClassVar[str] = "workplace"
    tool_names: ClassVar[tuple[str, ...]] = ("sql", "python", "smtp", "http", "finish")
