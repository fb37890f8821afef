"""The registered environments. Each class is an env card, as Gymnasium's own envs are.

Every card states its own arguments, ``info`` keys and version history: nothing is glued in from
shared text, so a card cannot promise what its env does not do. ``tests/envs/test_env_cards.py``
checks that every ``gym.make`` keyword of every registered id, and every ``info`` key an episode
produces, is named in that id's card.
"""

from __future__ import annotations

from typing import ClassVar

from agentrl_envs.core.env import ToolUseEnv

__all__ = [
    "HTTPEnv",
    "PythonEnv",
    "SMTPEnv",
    "SQLEnv",
    "SQLPythonSMTPEnv",
    "SQLPythonSMTPEnvV0",
    "WorkplaceEnv",
    "WorkplaceEnvV0",
]


def earlier_card(current: type, env_id: str, differences: str) -> str:
    """The env card of an earlier version: ``current``'s, named ``env_id``, with what differs first."""
    card = current.__doc__ or ""
    first, rest = card.split("\n", 1)
    head, description = rest.split("## Description\n", 1)
    return (
        f"``{env_id}``: the earlier version of {first.split(':', 1)[0]}, kept registered to reproduce results measured on it.\n"
        f"{head}## Description\n\n    The card of the current version, except: {differences}\n{description}"
    )


class SQLEnv(ToolUseEnv):
    """``AgentRL/SQL-v0``: answer a question about a company database with read-only SQL.

    ## Description

    Each episode draws a domain, a data set and one of five question templates (counts, monthly
    totals, top entity, averages, distinct entities over a threshold). The agent queries the
    episode's private SQLite copy with the ``sql`` tool and answers with ``finish``. Required
    components: ``queried`` (a query returned rows) and ``answer`` (the expected figure or name).

    ## Action Space

    ``UnicodeText(200000)``: one tool call per step, of ``sql {"query": str}`` (one read-only
    SELECT, SQLite dialect; its result is also saved as ``results/qN.csv``) or ``finish {"answer":
    str}``. Accepted forms: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (free text
    around it allowed), a bare JSON object with the same keys, OpenAI's ``{"type": "function",
    "function": {...}}`` or Llama 3's ``{"name": ..., "parameters": {...}}``. Several calls in one
    turn are refused. Any string is a legal action: text that is not one well-formed call of
    ``sql`` or ``finish`` gets an error observation and the format penalty. A non-str action raises
    ``TypeError``.

    ## Observation Space

    ``UnicodeText(16000)``: after reset, the task instruction; after a step, the query result as
    CSV lines (at most 20 rows shown, with a note saying how many there are and where all of them
    were saved) or the error with its type and status.

    ``info`` keys, each with one type across steps:

    - every step: ``task_id``, ``domain``, ``split``, ``step``, ``reward_components`` (``task``,
      ``aux``, ``fault``, ``format``), ``tool`` (``"sql"``, ``"finish"`` or None for an unparsed
      action), ``tool_result`` (``{}`` after reset; else ``tool``, ``ok``, ``status``,
      ``error_type``, ``error``, and for ``sql`` ``columns``, ``row_count``, ``csv_path``,
      ``truncated``), ``fault`` (``{}``, or its ``type``, ``status`` and ``origin``),
      ``virtual_time_s``, ``subtask_index``, ``subtask_boundary`` (always False here: one tool),
      ``sandbox_tier`` (``none``: this env runs no Python and starts no sandbox) and
      ``call_format`` (``hermes``, ``json``, ``openai``, ``llama3`` or ``none``);
    - at reset: ``instruction``, ``tools`` (OpenAI function schemas of ``sql`` and ``finish``),
      ``system_prompt`` and ``max_steps``;
    - at the end: ``success``, ``task_components`` (``queried``, ``answer``), ``partial_credit`` and
      ``fault_stats`` (``faults``, ``retries``, ``recoveries``; ``recovery_rate`` after a fault);
    - with ``candidates=K``: ``candidates`` at reset and after every step that does not end the
      episode.

    ## Rewards

    ``task``: 1.0 on the final step when ``queried`` and ``answer`` both hold; ``aux``: 0.3 times
    the schedule weight for the first query that returns rows; ``fault``: the error profile's
    penalty for a fault; ``format``: the format penalty. The step reward is their sum.

    ## Episode End

    Terminated when the agent calls ``finish``; truncated at ``max_steps`` or when the virtual
    time budget is spent. After the end, ``oracle_action()`` answers a ``finish`` call, so that
    ``vec_env.call("oracle_action")`` works at a vector env's NEXT_STEP autoreset step.

    ## Arguments

    ``gym.make("AgentRL/SQL-v0", **kwargs)``, all optional:

    - ``split``: ``"train"`` (default), ``"test"`` (same domains, disjoint data seeds and template
      parameters) or ``"heldout"`` (a domain never seen in train or test).
    - ``domain``: one domain of the split (``retail``, ``finance``, ``hr``; heldout: ``logistics``).
    - ``max_steps``: step limit (default: 3 x the gold plan's calls + 4, at least 10).
    - ``time_budget_s``: virtual seconds before the episode is truncated (default None: no budget).
    - ``candidates``: K > 0 puts K shuffled actions in ``info["candidates"]``: the oracle's next
      action and K-1 plausible wrong ones (wrong queries, wrong answers).
    - ``candidates_difficulty``: ``"easy"`` (default) or ``"hard"`` (wrong candidates keep the
      instruction's entities and figures and change the meaning).
    - ``render_mode``: ``"ansi"`` returns the transcript from ``render()``.
    - ``backend``: ``"sim"`` (default), ``"direct"``, ``"http://host:port"`` (``agentrl-envs
      serve``), ``{"sql": "postgresql://..."}`` or a :class:`~agentrl_envs.backends.Backend`.
    - ``error_profile``: ``"none"`` (default), a shipped profile (``realistic``, ``flaky``,
      ``outage``, ``rate-limited``, ``auth-expiry``) or the path of a YAML profile.
    - ``aux_reward``: ``None`` (default: 0.3 per first useful query, weight 0.8 -> 0.1 linearly over
      1,000,000 training steps), ``False`` (none), a number (a constant weight) or a dict of
      ``schedule``, ``start``, ``end``, ``steps``, ``terms``.
    - ``format_penalty``: reward for an unparseable action (default -0.1).
    - ``sql_deadline_s``: deadline of one statement (default 2.0 s).
    - ``realtime``: sleep for simulated latencies instead of only advancing the virtual clock.
    - ``long_horizon``: False only; True is refused (only ``AgentRL/SQLPythonSMTP-v0`` chains
      sub-tasks).
    - ``python_timeout_s``, ``python_sandbox``, ``allow_unsafe_sandbox``, ``mail_domains``: accepted
      so every id takes the same keywords; they configure services this env's tools never call.

    After ``gym.make``, ``training_step``, ``aux_reward`` and ``candidates`` can be changed
    (``vec_env.set_attr``, ``env.set_wrapper_attr``), validated as above; other attributes are refused.

    ## Version History

    - v0: initial release (agentrl 0.1.0).
    """

    kind: ClassVar[str] = "sql"
    tool_names: ClassVar[tuple[str, ...]] = ("sql", "finish")


class PythonEnv(ToolUseEnv):
    """``AgentRL/Python-v0``: compute a statistic from a CSV file with Python.

    ## Description

    The workspace holds the domain's fact table as ``data/<table>.csv``. Five templates: median,
    population standard deviation, percentage share, month-over-month change, sum of the five
    largest values. The agent runs programs with the ``python`` tool (cwd is the workspace) and
    answers with ``finish``. Required components: ``computed`` (a successful run printed the
    figure) and ``answer``.

    ## Action Space

    ``UnicodeText(200000)``: one tool call per step, of ``python {"code": str}`` (runs in the
    hardened sandbox with the workspace as cwd, the standard library and numpy when installed, no
    network, a time limit and a 1 MiB output cap) or ``finish {"answer": str}``. Accepted forms:
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (free text around it allowed), a
    bare JSON object with the same keys, OpenAI's ``{"type": "function", "function": {...}}`` or
    Llama 3's ``{"name": ..., "parameters": {...}}``. Several calls in one turn are refused. Any
    string is a legal action: text that is not one well-formed call of ``python`` or ``finish``
    gets an error observation and the format penalty. A non-str action raises ``TypeError``.

    ## Observation Space

    ``UnicodeText(16000)``: after reset, the task instruction; after a step, the program's stdout
    and stderr (clipped) and its exit status, or the error with its type and status.

    ``info`` keys, each with one type across steps:

    - every step: ``task_id``, ``domain``, ``split``, ``step``, ``reward_components`` (``task``,
      ``aux``, ``fault``, ``format``), ``tool`` (``"python"``, ``"finish"`` or None for an unparsed
      action), ``tool_result`` (``{}`` after reset; else ``tool``, ``ok``, ``status``,
      ``error_type``, ``error``, and for ``python`` ``stdout``, ``stderr``, ``exit_code``,
      ``timed_out``), ``fault`` (``{}``, or its ``type``, ``status`` and ``origin``),
      ``virtual_time_s``, ``subtask_index``, ``subtask_boundary`` (always False here: one tool),
      ``sandbox_tier`` (how isolated programs run: ``FULL``, ``REDUCED``, ``UNSAFE``, ``BASIC``
      without the sandbox, or ``unknown`` when the backend does not say) and ``call_format`` (``hermes``, ``json``, ``openai``, ``llama3`` or ``none``);
    - at reset: ``instruction``, ``tools`` (OpenAI function schemas of ``python`` and ``finish``),
      ``system_prompt`` and ``max_steps``;
    - at the end: ``success``, ``task_components`` (``computed``, ``answer``), ``partial_credit``
      and ``fault_stats`` (``faults``, ``retries``, ``recoveries``; ``recovery_rate`` after a fault);
    - with ``candidates=K``: ``candidates`` at reset and after every step that does not end the
      episode.

    ## Rewards

    ``task``: 1.0 on the final step when ``computed`` and ``answer`` both hold; ``aux``: 0.2 times
    the schedule weight for the first run that computes the figure; ``fault``: the error profile's
    penalty for a fault; ``format``: the format penalty. The step reward is their sum.

    ## Episode End

    Terminated when the agent calls ``finish``; truncated at ``max_steps`` or when the virtual
    time budget is spent. After the end, ``oracle_action()`` answers a ``finish`` call, so that
    ``vec_env.call("oracle_action")`` works at a vector env's NEXT_STEP autoreset step.

    ## Arguments

    ``gym.make("AgentRL/Python-v0", **kwargs)``, all optional:

    - ``split``: ``"train"`` (default), ``"test"`` (same domains, disjoint data seeds and template
      parameters) or ``"heldout"`` (a domain never seen in train or test).
    - ``domain``: one domain of the split (``retail``, ``finance``, ``hr``; heldout: ``logistics``).
    - ``max_steps``: step limit (default: 3 x the gold plan's calls + 4, at least 10).
    - ``time_budget_s``: virtual seconds before the episode is truncated (default None: no budget).
    - ``candidates``: K > 0 puts K shuffled actions in ``info["candidates"]``: the oracle's next
      action and K-1 plausible wrong ones (wrong programs, wrong answers).
    - ``candidates_difficulty``: ``"easy"`` (default) or ``"hard"`` (wrong candidates keep the
      instruction's entities and figures and change the meaning).
    - ``render_mode``: ``"ansi"`` returns the transcript from ``render()``.
    - ``backend``: ``"sim"`` (default), ``"direct"``, ``"http://host:port"`` (``agentrl-envs
      serve``) or a :class:`~agentrl_envs.backends.Backend`.
    - ``error_profile``: ``"none"`` (default), a shipped profile (``realistic``, ``flaky``,
      ``outage``, ``rate-limited``, ``auth-expiry``) or the path of a YAML profile.
    - ``aux_reward``: ``None`` (default: 0.2 per first computing run, weight 0.8 -> 0.1 linearly over
      1,000,000 training steps), ``False`` (none), a number (a constant weight) or a dict of
      ``schedule``, ``start``, ``end``, ``steps``, ``terms``.
    - ``format_penalty``: reward for an unparseable action (default -0.1).
    - ``python_timeout_s``: time limit of one run (default 5.0 s, wall clock or CPU).
    - ``python_sandbox``: run programs in the hardened sandbox (default True);
      ``allow_unsafe_sandbox``: accept its rlimits-only tier where the machine allows no more
      (default False: refuse).
    - ``realtime``: sleep for simulated latencies instead of only advancing the virtual clock.
    - ``long_horizon``: False only; True is refused (only ``AgentRL/SQLPythonSMTP-v0`` chains
      sub-tasks).
    - ``sql_deadline_s``, ``mail_domains``: accepted so every id takes the same keywords; they
      configure services this env's tools never call.

    After ``gym.make``, ``training_step``, ``aux_reward`` and ``candidates`` can be changed
    (``vec_env.set_attr``, ``env.set_wrapper_attr``), validated as above; other attributes are refused.

    ## Version History

    - v0: initial release (agentrl 0.1.0).
    """

    kind: ClassVar[str] = "python"
    tool_names: ClassVar[tuple[str, ...]] = ("python", "finish")


class SMTPEnv(ToolUseEnv):
    """``AgentRL/SMTP-v0``: send the right email to the right people.

    ## Description

    The instruction gives a figure and the staff directory. Five templates: to a unit's manager,
    with the director in Cc, to all analysts, with a workspace file attached, to two managers with
    two figures. Required component: ``emailed`` (an accepted message to exactly the required
    recipients with the figures in the body and the required attachments).

    ## Action Space

    ``UnicodeText(200000)``: one tool call per step, of ``smtp {"to": str | [str], "subject": str,
    "body": str, "cc"?: [str], "attachments"?: [path]}`` (validated like a strict mail server; the
    sender is set by the env) or ``finish {"answer": str}``. Accepted forms: ``<tool_call>{"name":
    ..., "arguments": {...}}</tool_call>`` (free text around it allowed), a bare JSON object with the
    same keys, OpenAI's ``{"type": "function", "function": {...}}`` or Llama 3's ``{"name": ...,
    "parameters": {...}}``. Several calls in one turn are refused. Any string is a legal action:
    text that is not one well-formed call of ``smtp`` or ``finish`` gets an error observation and
    the format penalty. A non-str action raises ``TypeError``.

    ## Observation Space

    ``UnicodeText(16000)``: after reset, the task instruction; after a step, the server's answer
    (accepted with a message id and the recipients, or refused with the reason, type and status).

    ``info`` keys, each with one type across steps:

    - every step: ``task_id``, ``domain``, ``split``, ``step``, ``reward_components`` (``task``,
      ``aux``, ``fault``, ``format``), ``tool`` (``"smtp"``, ``"finish"`` or None for an unparsed
      action), ``tool_result`` (``{}`` after reset; else ``tool``, ``ok``, ``status``,
      ``error_type``, ``error``, and for ``smtp`` ``message_id``, ``to``, ``cc``, ``attachments``),
      ``fault`` (``{}``, or its ``type``, ``status`` and ``origin``), ``virtual_time_s``,
      ``subtask_index``, ``subtask_boundary`` (always False here: one tool), ``sandbox_tier``
      (``none``: this env runs no Python and starts no sandbox) and ``call_format`` (``hermes``,
      ``json``, ``openai``, ``llama3`` or ``none``);
    - at reset: ``instruction``, ``tools`` (OpenAI function schemas of ``smtp`` and ``finish``),
      ``system_prompt`` and ``max_steps``;
    - at the end: ``success``, ``task_components`` (``emailed``), ``partial_credit`` and
      ``fault_stats`` (``faults``, ``retries``, ``recoveries``; ``recovery_rate`` after a fault);
    - with ``candidates=K``: ``candidates`` at reset and after every step that does not end the
      episode.

    ## Rewards

    ``task``: 1.0 on the final step when ``emailed`` holds; ``aux``: 0.5 times the schedule weight
    for the first accepted message that does the task's mail; ``fault``: the error profile's
    penalty for a fault; ``format``: the format penalty. The step reward is their sum.

    ## Episode End

    Terminated when the agent calls ``finish``; truncated at ``max_steps`` or when the virtual
    time budget is spent. After the end, ``oracle_action()`` answers a ``finish`` call, so that
    ``vec_env.call("oracle_action")`` works at a vector env's NEXT_STEP autoreset step.

    ## Arguments

    ``gym.make("AgentRL/SMTP-v0", **kwargs)``, all optional:

    - ``split``: ``"train"`` (default), ``"test"`` (same domains, disjoint data seeds and template
      parameters) or ``"heldout"`` (a domain never seen in train or test).
    - ``domain``: one domain of the split (``retail``, ``finance``, ``hr``; heldout: ``logistics``).
    - ``max_steps``: step limit (default: 3 x the gold plan's calls + 4, at least 10).
    - ``time_budget_s``: virtual seconds before the episode is truncated (default None: no budget).
    - ``candidates``: K > 0 puts K shuffled actions in ``info["candidates"]``: the oracle's next
      action and K-1 plausible wrong ones (wrong recipients, figures, Cc or attachments).
    - ``candidates_difficulty``: ``"easy"`` (default) or ``"hard"`` (wrong candidates keep the
      instruction's entities and figures and change the meaning).
    - ``render_mode``: ``"ansi"`` returns the transcript from ``render()``.
    - ``backend``: ``"sim"`` (default), ``"direct"``, ``"http://host:port"`` (``agentrl-envs
      serve``), ``{"smtp": "smtp://host:port"}`` or a :class:`~agentrl_envs.backends.Backend`.
    - ``error_profile``: ``"none"`` (default), a shipped profile (``realistic``, ``flaky``,
      ``outage``, ``rate-limited``, ``auth-expiry``) or the path of a YAML profile.
    - ``aux_reward``: ``None`` (default: 0.5 per first useful message, weight 0.8 -> 0.1 linearly
      over 1,000,000 training steps), ``False`` (none), a number (a constant weight) or a dict of
      ``schedule``, ``start``, ``end``, ``steps``, ``terms``.
    - ``format_penalty``: reward for an unparseable action (default -0.1).
    - ``mail_domains``: recipient domains mail may go to (default ``"company"``: the domain's own;
      a list of domains; ``None``: any).
    - ``realtime``: sleep for simulated latencies instead of only advancing the virtual clock.
    - ``long_horizon``: False only; True is refused (only ``AgentRL/SQLPythonSMTP-v0`` chains
      sub-tasks).
    - ``python_timeout_s``, ``sql_deadline_s``, ``python_sandbox``, ``allow_unsafe_sandbox``:
      accepted so every id takes the same keywords; they configure services this env's tools never
      call.

    After ``gym.make``, ``training_step``, ``aux_reward`` and ``candidates`` can be changed
    (``vec_env.set_attr``, ``env.set_wrapper_attr``), validated as above; other attributes are refused.

    ## Version History

    - v0: initial release (agentrl 0.1.0).
    """

    kind: ClassVar[str] = "smtp"
    tool_names: ClassVar[tuple[str, ...]] = ("smtp", "finish")


class SQLPythonSMTPEnv(ToolUseEnv):
    """``AgentRL/SQLPythonSMTP-v1``: query, compute in Python from the saved CSV, email the result.

    ## Description

    Every sub-task needs the three tools in order: a ``sql`` query (its result is saved as
    ``results/qN.csv``), a ``python`` program that computes the figure from that file, and an
    ``smtp`` message to the right people, found in the ``staff`` table. Five templates (median,
    month-over-month change, share, standard deviation, mean count). The gold plan
    (``oracle_action()``, and the right one of the candidates) makes four calls per sub-task: the
    query, the program, a ``staff`` lookup of the recipients (``SELECT name, email, role, unit FROM
    staff WHERE ...``, left out once a tool result has shown their addresses) and the message. The
    lookup is the oracle's way to the addresses, not a component: it earns no reward of its own. In
    candidates mode it is a step to choose: until a result has shown the addresses, the candidates
    are the lookup, other ``staff`` queries (the whole table shows them too) and an early ``finish``;
    the email is not among them.
    ``long_horizon=True`` chains five sub-tasks (up to 21 gold calls: a lookup is left out when an
    earlier result showed the addresses) for credit-assignment studies; ``info["subtask_index"]`` and
    ``info["subtask_boundary"]`` mark where sub-tasks and tool types change. Required components
    per sub-task: ``queried``, ``computed``, ``emailed`` (prefixed ``sN.`` when there are several).

    ## Action Space

    ``UnicodeText(200000)``: one tool call per step, of ``sql {"query": str}`` (one read-only
    SELECT, SQLite dialect), ``python {"code": str}`` (the hardened sandbox, cwd the workspace),
    ``smtp {"to", "subject", "body", "cc"?, "attachments"?}`` or ``finish {"answer": str}``.
    Accepted forms: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (free text around
    it allowed), a bare JSON object with the same keys, OpenAI's ``{"type": "function", "function":
    {...}}`` or Llama 3's ``{"name": ..., "parameters": {...}}``. Several calls in one turn are
    refused. Any string is a legal action: text that is not one well-formed call of an available
    tool gets an error observation and the format penalty. A non-str action raises ``TypeError``.

    ## Observation Space

    ``UnicodeText(16000)``: after reset, the task instruction; after a step, the tool result as
    text (tables as CSV lines capped at 20 rows with a truncation note; program output; the mail
    server's answer; errors with their type and status).

    ``info`` keys, each with one type across steps:

    - every step: ``task_id``, ``domain``, ``split``, ``step``, ``reward_components`` (``task``,
      ``aux``, ``fault``, ``format``), ``tool`` (the tool called, or None for an unparsed action),
      ``tool_result`` (``{}`` after reset; else ``tool``, ``ok``, ``status``, ``error_type``,
      ``error``, and per tool: ``sql`` ``columns``, ``row_count``, ``csv_path``, ``truncated``;
      ``python`` ``stdout``, ``stderr``, ``exit_code``, ``timed_out``; ``smtp`` ``message_id``,
      ``to``, ``cc``, ``attachments``), ``fault`` (``{}``, or its ``type``, ``status`` and
      ``origin``), ``virtual_time_s``, ``subtask_index`` (the first sub-task not yet complete),
      ``subtask_boundary`` (the tool type changed), ``sandbox_tier`` (``FULL``, ``REDUCED``,
      ``UNSAFE``, ``BASIC`` without the sandbox, or ``unknown``) and ``call_format`` (``hermes``, ``json``, ``openai``, ``llama3`` or
      ``none``);
    - at reset: ``instruction``, ``tools`` (OpenAI function schemas of the four tools),
      ``system_prompt`` and ``max_steps``;
    - at the end: ``success``, ``task_components`` (``queried``, ``computed``, ``emailed``, or
      ``s1.queried`` ... ``s5.emailed`` with ``long_horizon``), ``partial_credit`` and
      ``fault_stats`` (``faults``, ``retries``, ``recoveries``; ``recovery_rate`` after a fault);
    - with ``candidates=K``: ``candidates`` at reset and after every step that does not end the
      episode.

    ## Rewards

    ``task``: 1.0 on the final step when every required component holds; ``aux``: the schedule
    weight times 0.3 (a query), 0.2 (a computing run) or 0.5 (an accepted message) when the call
    newly completes its tool's part of a sub-task, divided by the number of sub-tasks; ``fault``:
    the error profile's penalty for a fault; ``format``: the format penalty. The step reward is
    their sum.

    ## Episode End

    Terminated when the agent calls ``finish``; truncated at ``max_steps`` or when the virtual
    time budget is spent. After the end, ``oracle_action()`` answers a ``finish`` call, so that
    ``vec_env.call("oracle_action")`` works at a vector env's NEXT_STEP autoreset step.

    ## Arguments

    ``gym.make("AgentRL/SQLPythonSMTP-v1", **kwargs)``, all optional:

    - ``split``: ``"train"`` (default), ``"test"`` (same domains, disjoint data seeds and template
      parameters) or ``"heldout"`` (a domain never seen in train or test).
    - ``domain``: one domain of the split (``retail``, ``finance``, ``hr``; heldout: ``logistics``).
    - ``long_horizon``: chain five sub-tasks, up to 21 gold calls (default False).
    - ``max_steps``: step limit (default: 3 x the gold plan's calls + 4, at least 10).
    - ``time_budget_s``: virtual seconds before the episode is truncated (default None: no budget).
    - ``candidates``: K > 0 puts K shuffled actions in ``info["candidates"]``: the oracle's next
      action and K-1 plausible wrong ones (for classic RL and GLAM-style scoring).
    - ``candidates_difficulty``: ``"easy"`` (default) or ``"hard"`` (wrong candidates keep the
      instruction's entities and figures and change the meaning; a word-overlap heuristic scores
      like chance on them).
    - ``render_mode``: ``"ansi"`` returns the transcript from ``render()``.
    - ``backend``: ``"sim"`` (default), ``"direct"``, ``"http://host:port"`` (``agentrl-envs
      serve``), a dict of per-tool backends (``{"sql": "postgresql://...", "smtp": "smtp://..."}``)
      or a :class:`~agentrl_envs.backends.Backend` instance.
    - ``error_profile``: ``"none"`` (default), a shipped profile (``realistic``, ``flaky``,
      ``outage``, ``rate-limited``, ``auth-expiry``) or the path of a YAML profile.
    - ``aux_reward``: ``None`` (default: the three terms above, weight 0.8 -> 0.1 linearly over
      1,000,000 training steps), ``False`` (none), a number (a constant weight) or a dict of
      ``schedule``, ``start``, ``end``, ``steps``, ``terms``.
    - ``format_penalty``: reward for an unparseable action (default -0.1).
    - ``python_timeout_s``, ``sql_deadline_s``: service limits (default 5.0 s and 2.0 s).
    - ``python_sandbox``: run programs in the hardened sandbox (default True);
      ``allow_unsafe_sandbox``: accept its rlimits-only tier where the machine allows no more
      (default False: refuse).
    - ``mail_domains``: recipient domains mail may go to (default ``"company"``: the domain's own;
      a list of domains; ``None``: any).
    - ``realtime``: sleep for simulated latencies instead of only advancing the virtual clock.

    After ``gym.make``, ``training_step``, ``aux_reward`` and ``candidates`` can be changed
    (``vec_env.set_attr``, ``env.set_wrapper_attr``), validated as above; other attributes are refused.

    ## Version History

    - v1: the gold plan looks the recipients up in the ``staff`` table before each email (oracle,
      candidates, and the default ``max_steps``: 19 for one sub-task, 67 with ``long_horizon``).
      Without it, transcripts of the oracle show addresses that no earlier turn contains, so a
      model trained on them cannot learn where they come from. A given sequence of actions earns
      the rewards and success it earned in v0 (within v0's step limit).
    - v0: initial release (agentrl 0.1.0); ``long_horizon`` is part of it. Still registered
      (:class:`SQLPythonSMTPEnvV0`), for reproducing results measured on it.
    """

    kind: ClassVar[str] = "pipeline"
    tool_names: ClassVar[tuple[str, ...]] = ("sql", "python", "smtp", "finish")
    oracle_lookup: ClassVar[bool] = True


class SQLPythonSMTPEnvV0(SQLPythonSMTPEnv):
    __doc__ = earlier_card(
        SQLPythonSMTPEnv,
        "AgentRL/SQLPythonSMTP-v0",
        "v0's gold plan has no ``staff`` lookup: three calls per sub-task (16 gold calls with ``long_horizon``), "
        "and the default ``max_steps`` is 16 (52 with ``long_horizon``).",
    )
    oracle_lookup: ClassVar[bool] = False


class HTTPEnv(ToolUseEnv):
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

    ## Action Space

    ``UnicodeText(200000)``: one call per step of ``http {"method": "GET"|"POST"|"PATCH"|"DELETE", "path": str, "body"?: object, "query"?: object}`` or ``finish {"answer": str}``.
    Accepted forms: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (free text around
    it allowed), a bare JSON object with the same keys, OpenAI's ``{"type": "function", "function":
    {...}}`` or Llama 3's ``{"name": ..., "parameters": {...}}``. Several calls in one turn are
    refused. Any string is a legal action: text that is not one well-formed call of an available
    tool gets an error observation and the format penalty. A non-str action raises ``TypeError``.

    ## Observation Space

    ``UnicodeText(16000)``: after reset, the task instruction; after a step, the service's answer as
    ``http ok [HTTP <status>]`` and its JSON body (clipped), or the error with its type and status.

    ``info`` keys, each with one type across steps:

    - every step: ``task_id``, ``domain``, ``split``, ``step``, ``reward_components`` (``task``,
      ``aux``, ``fault``, ``format``), ``tool`` (the tool called, or None for an unparsed action),
      ``tool_result`` (``{}`` after reset; else ``tool``, ``ok``, ``status``, ``error_type``,
      ``error`` and ``http_status``), ``fault`` (``{}``, or its ``type``, ``status`` and
      ``origin``), ``virtual_time_s``, ``subtask_index``, ``subtask_boundary``, ``sandbox_tier``
      (``none``: this env runs no Python and starts no sandbox) and ``call_format`` (``hermes``,
      ``json``, ``openai``, ``llama3`` or ``none``);
    - at reset: ``instruction``, ``tools`` (OpenAI function schemas of ``http`` and ``finish``),
      ``system_prompt`` and ``max_steps``;
    - at the end: ``success``, ``task_components`` (``api``, and ``answer`` for the questions),
      ``partial_credit`` and ``fault_stats`` (``faults``, ``retries``, ``recoveries``;
      ``recovery_rate`` after a fault);
    - with ``candidates=K``: ``candidates`` at reset and after every step that does not end the
      episode.

    ## Rewards

    ``task``: 1.0 on the final step when every required component holds; ``aux``: the schedule
    weight times 0.5 when a call newly completes its sub-task's ``api`` step; ``fault``: the error
    profile's penalty for a fault; ``format``: the format penalty. The step reward is their sum.

    ## Episode End

    Terminated when the agent calls ``finish``; truncated at ``max_steps`` or when the virtual
    time budget is spent. After the end, ``oracle_action()`` answers a ``finish`` call.

    ## Arguments

    ``gym.make("AgentRL/HTTP-v0", **kwargs)``, all optional:

    - ``split``: ``"train"`` (default), ``"test"`` or ``"heldout"`` (a domain never seen in train
      or test).
    - ``domain``: one domain of the split (``retail``, ``finance``, ``hr``; heldout: ``logistics``).
    - ``long_horizon``: refused (only ``AgentRL/SQLPythonSMTP-v0`` has the variant).
    - ``max_steps``: step limit (default: 3 x the gold plan's calls + 4, at least 10).
    - ``time_budget_s``: virtual seconds before the episode is truncated (default None).
    - ``candidates``: K > 0 puts K shuffled actions in ``info["candidates"]``: the oracle's next
      action and K-1 plausible wrong ones.
    - ``candidates_difficulty``: ``"easy"`` (default) or ``"hard"``.
    - ``backend``: ``"sim"`` (default), ``"direct"``, ``"http://host:port"`` (``agentrl-envs
      serve``), ``{"http": "https://gateway.internal"}`` (a real REST service) or a
      :class:`~agentrl_envs.backends.Backend` instance.
    - ``aux_reward``: ``None`` (default: the term above, weight 0.8 -> 0.1 linearly over 1,000,000
      training steps), ``False`` (none), a number (a constant weight) or a dict of ``schedule``,
      ``start``, ``end``, ``steps``, ``terms``.
    - ``python_timeout_s``, ``sql_deadline_s``, ``python_sandbox``, ``allow_unsafe_sandbox``,
      ``mail_domains``: accepted for a uniform signature; they limit tools this env does not offer.
    - ``render_mode``: ``"ansi"`` returns the transcript from ``render()``.
    - ``error_profile``: ``"none"`` (default), a shipped profile (``realistic``, ``flaky``,
      ``outage``, ``rate-limited``, ``auth-expiry``) or the path of a YAML profile; faults apply to
      ``http`` calls like to every tool.
    - ``format_penalty``: reward for an unparseable action (default -0.1).
    - ``realtime``: sleep for simulated latencies instead of only advancing the virtual clock.

    After ``gym.make``, ``training_step``, ``aux_reward`` and ``candidates`` can be changed
    (``vec_env.set_attr``, ``env.set_wrapper_attr``), validated as above; other attributes are refused.

    ## Version History

    - v0: initial release (the ``http`` tool).
    """

    kind: ClassVar[str] = "http"
    tool_names: ClassVar[tuple[str, ...]] = ("http", "finish")


class WorkplaceEnv(ToolUseEnv):
    """``AgentRL/Workplace-v1``: a long-horizon day at work with all four tools.

    ## Description

    Every task chains four sub-tasks, in an order drawn per task: two of ``AgentRL/SQLPythonSMTP-v1``
    (a ``sql`` query, a ``python`` program on the CSV it saved, an ``smtp`` message to the right
    people) and two ticket changes on the company REST service of ``AgentRL/HTTP-v0`` (open a
    ticket, close one, reassign one, with the ``http`` tool): 8 gold calls, a ``staff`` lookup
    before each of the two emails (as in ``AgentRL/SQLPythonSMTP-v1``) and ``finish``. The
    database also holds the ``tickets`` table as it was at the start (the REST service is where
    changes happen; REST writes are not visible to SQL). Required components per sub-task (prefixed
    ``s1.`` .. ``s4.``): ``queried``, ``computed``, ``emailed`` for the pipeline ones, ``api`` for
    the ticket ones; ``info["subtask_index"]`` and ``info["subtask_boundary"]`` mark where sub-tasks
    and tools change.

    ## Action Space

    ``UnicodeText(200000)``: one call per step of ``sql {"query": str}``, ``python {"code": str}``, ``smtp {"to", "subject", "body", "cc"?, "attachments"?}``, ``http {"method", "path", "body"?, "query"?}`` or ``finish {"answer": str}``.
    Accepted forms: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (free text around
    it allowed), a bare JSON object with the same keys, OpenAI's ``{"type": "function", "function":
    {...}}`` or Llama 3's ``{"name": ..., "parameters": {...}}``. Several calls in one turn are
    refused. Any string is a legal action: text that is not one well-formed call of an available
    tool gets an error observation and the format penalty. A non-str action raises ``TypeError``.

    ## Observation Space

    ``UnicodeText(16000)``: after reset, the task instruction; after a step, the tool result as
    text (tables as CSV lines capped at 20 rows with a truncation note; program output; the mail
    server's answer; the REST service's status and JSON body; errors with their type and status).

    ``info`` keys, each with one type across steps:

    - every step: ``task_id``, ``domain``, ``split``, ``step``, ``reward_components`` (``task``,
      ``aux``, ``fault``, ``format``), ``tool`` (the tool called, or None for an unparsed action),
      ``tool_result`` (``{}`` after reset; else ``tool``, ``ok``, ``status``, ``error_type``,
      ``error``, and per tool: ``sql`` ``columns``, ``row_count``, ``csv_path``, ``truncated``;
      ``python`` ``stdout``, ``stderr``, ``exit_code``, ``timed_out``; ``smtp`` ``message_id``,
      ``to``, ``cc``, ``attachments``; ``http`` ``http_status``), ``fault`` (``{}``, or its
      ``type``, ``status`` and ``origin``), ``virtual_time_s``, ``subtask_index``,
      ``subtask_boundary``, ``sandbox_tier`` and ``call_format``;
    - at reset: ``instruction``, ``tools`` (OpenAI function schemas of the five tools),
      ``system_prompt`` and ``max_steps``;
    - at the end: ``success``, ``task_components`` (``s1.queried`` ... ``s4.api``),
      ``partial_credit`` and ``fault_stats`` (``faults``, ``retries``, ``recoveries``;
      ``recovery_rate`` after a fault);
    - with ``candidates=K``: ``candidates`` at reset and after every step that does not end the
      episode.

    ## Rewards

    ``task``: 1.0 on the final step when every required component holds; ``aux``: the schedule
    weight times the tool's term (0.3 a query, 0.2 a computing run, 0.5 an accepted message, 0.5 a
    REST answer) when the call newly completes its part of a sub-task, divided by the number of
    sub-tasks; ``fault``: the error profile's penalty; ``format``: the format penalty.

    ## Episode End

    Terminated when the agent calls ``finish``; truncated at ``max_steps`` or when the virtual
    time budget is spent. After the end, ``oracle_action()`` answers a ``finish`` call.

    ## Arguments

    ``gym.make("AgentRL/Workplace-v0", **kwargs)``, all optional:

    - ``split``: ``"train"`` (default), ``"test"`` or ``"heldout"`` (a domain never seen in train
      or test).
    - ``domain``: one domain of the split (``retail``, ``finance``, ``hr``; heldout: ``logistics``).
    - ``long_horizon``: refused (the env is long-horizon already).
    - ``max_steps``: step limit (default: 3 x the gold plan's calls + 4, at least 10).
    - ``time_budget_s``: virtual seconds before the episode is truncated (default None).
    - ``candidates``: K > 0 puts K shuffled actions in ``info["candidates"]``.
    - ``candidates_difficulty``: ``"easy"`` (default) or ``"hard"``.
    - ``backend``: ``"sim"`` (default), ``"direct"``, ``"http://host:port"`` (``agentrl-envs
      serve``), a dict of per-tool backends (``{"sql": "postgresql://...", "smtp": "smtp://...",
      "http": "https://gateway.internal"}``) or a :class:`~agentrl_envs.backends.Backend` instance.
    - ``aux_reward``: ``None`` (default: the terms above, weight 0.8 -> 0.1 linearly over 1,000,000
      training steps), ``False`` (none), a number or a dict of ``schedule``, ``start``, ``end``,
      ``steps``, ``terms``.
    - ``python_timeout_s``, ``sql_deadline_s``: service limits (default 5.0 s and 2.0 s).
    - ``python_sandbox``: run programs in the hardened sandbox (default True);
      ``allow_unsafe_sandbox``: accept its rlimits-only tier (default False: refuse).
    - ``mail_domains``: recipient domains mail may go to (default ``"company"``; ``None``: any).
    - ``render_mode``: ``"ansi"`` returns the transcript from ``render()``.
    - ``error_profile``: ``"none"`` (default), a shipped profile (``realistic``, ``flaky``,
      ``outage``, ``rate-limited``, ``auth-expiry``) or the path of a YAML profile; faults apply to
      ``http`` calls like to every tool.
    - ``format_penalty``: reward for an unparseable action (default -0.1).
    - ``realtime``: sleep for simulated latencies instead of only advancing the virtual clock.

    After ``gym.make``, ``training_step``, ``aux_reward`` and ``candidates`` can be changed
    (``vec_env.set_attr``, ``env.set_wrapper_attr``), validated as above; other attributes are refused.

    ## Version History

    - v1: the gold plan looks the recipients up in the ``staff`` table before each email, as in
      ``AgentRL/SQLPythonSMTP-v1`` (oracle, candidates, default ``max_steps`` 37). A given
      sequence of actions earns the rewards and success it earned in v0 (within v0's step limit).
    - v0: initial release (all four tools, long horizon). Still registered
      (:class:`WorkplaceEnvV0`).
    """

    kind: ClassVar[str] = "workplace"
    tool_names: ClassVar[tuple[str, ...]] = ("sql", "python", "smtp", "http", "finish")
    oracle_lookup: ClassVar[bool] = True


class WorkplaceEnvV0(WorkplaceEnv):
    __doc__ = earlier_card(
        WorkplaceEnv,
        "AgentRL/Workplace-v0",
        "v0's gold plan has no ``staff`` lookup: 8 gold calls and ``finish``, and the default ``max_steps`` is 31.",
    )
    oracle_lookup: ClassVar[bool] = False
