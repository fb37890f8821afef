"""The trainer's own tools-aware ChatML template, for models whose template drops ``tools``.

Some instruct models render a conversation with ChatML markers but ignore ``tools=`` (SmolLM2's
template does): the policy would never see the tools' argument schemas. :func:`ensure_tools_template`
renders a probe conversation with and without a probe tool; when the tool's name or argument does
not appear, and the tokenizer has the ChatML markers, it sets :data:`TOOLS_CHATML` on the tokenizer
(in memory; the model folder is not changed) and says so once.

:data:`TOOLS_CHATML` follows Hermes / Qwen2.5:

- the system turn carries the tool schemas as JSON lines in ``<tools></tools>`` and the instruction
  to answer with ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``;
- an assistant turn is its content, then its ``tool_calls`` (if any) in the same ``<tool_call>``
  form the envs parse; the turn and its ``<|im_end|>`` sit inside ``{% generation %}`` so
  ``return_assistant_tokens_mask`` marks what the policy wrote;
- a tool result is a user turn ``<tool_response>...</tool_response>``, one per message (Qwen2.5
  merges consecutive results into one turn, which makes a rendering depend on the next message);
- it is prefix-stable: the rendering of ``messages[:n]`` (with the generation prompt when message
  ``n`` is the assistant's) is a prefix of the rendering of ``messages[:n + 1]``, which token-in /
  token-out rollouts and SFT masks rely on.
"""

from __future__ import annotations

from typing import Any

from agentrl_envs.errors import ConfigError

__all__ = ["TOOLS_CHATML", "ensure_tools_template", "tools_problem"]

# Every newline is printed by an expression: transformers renders with trim_blocks and lstrip_blocks.
TOOLS_CHATML = (
    "{%- if messages and messages[0]['role'] == 'system' %}{%- set sys = messages[0]['content'] %}"
    "{%- set rest = messages[1:] %}{%- else %}{%- set sys = none %}{%- set rest = messages %}{%- endif %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}{%- if sys %}{{- sys + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>{"name": <function-name>, "arguments": <args-json-object>}'
    "</tool_call><|im_end|>\\n' }}"
    "{%- elif sys is not none %}{{- '<|im_start|>system\\n' + sys + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in rest %}"
    "{%- if m['role'] == 'assistant' %}{{- '<|im_start|>assistant\\n' }}{% generation %}{{- m['content'] or '' }}"
    "{%- for call in m['tool_calls'] or [] %}{%- set f = call['function'] if call['function'] is defined else call %}"
    "{{- '<tool_call>{\"name\": ' + f['name'] | tojson + ', \"arguments\": ' }}"
    "{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif %}"
    "{{- '}</tool_call>' }}{%- endfor %}{{- '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
    "{%- elif m['role'] == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + m['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool_q7",
        "description": "a probe",
        "parameters": {"type": "object", "properties": {"probe_arg_q7": {"type": "string"}}, "required": ["probe_arg_q7"]},
    },
}
_PROBE = [
    {"role": "system", "content": "You solve tasks."},
    {"role": "user", "content": "Do the task."},
    {"role": "assistant", "content": '<tool_call>{"name": "probe_tool_q7", "arguments": {"probe_arg_q7": "x"}}</tool_call>'},
    {"role": "tool", "content": "ok"},
]


def tools_problem(tokenizer: Any) -> str | None:
    """Why the tokenizer's chat template cannot show tools to the model; None if it can.

    Raises:
        ConfigError: the template does not render a plain conversation (system, user, assistant, tool).
    """
    try:
        plain = tokenizer.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
    except Exception as exc:
        raise ConfigError(
            f"its chat template does not render a conversation of system, user, assistant and tool messages "
            f"({type(exc).__name__}: {str(exc)[:200]}); set tokenizer.chat_template to one that does "
            "(e.g. Qwen2.5's) and save it with the model"
        ) from None
    try:
        text = tokenizer.apply_chat_template(_PROBE, tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True)
    except Exception as exc:
        return f"it fails when given tools ({type(exc).__name__}: {str(exc)[:200]})"
    if text == plain:
        return "it ignores `tools` (the rendering is the same with and without them)"
    if "probe_tool_q7" not in text.replace(_PROBE[2]["content"], "") or "probe_arg_q7" not in text.replace(
        _PROBE[2]["content"], ""
    ):
        return "it does not show the tools' names and arguments"
    return None


def ensure_tools_template(tokenizer: Any, model: str, log: Any = print) -> None:
    """Make the tokenizer's template show ``tools``: keep the model's own if it does, else ChatML's.

    Raises:
        ConfigError: the template drops tools and the tokenizer has no ChatML markers to fall back on,
            or it does not render a plain conversation.
    """
    problem = tools_problem(tokenizer)
    if problem is None:
        return
    vocab = tokenizer.get_vocab()
    if "<|im_start|>" not in vocab or "<|im_end|>" not in vocab:
        raise ConfigError(
            f"--model {model}: its chat template cannot show the tools to the model: {problem}; and its tokenizer "
            "has no ChatML markers (<|im_start|>, <|im_end|>) for the trainer's own template. Set "
            "tokenizer.chat_template to one that renders `tools` (e.g. Qwen2.5's or Llama 3.1's) and save it "
            "with the model"
        )
    tokenizer.chat_template = TOOLS_CHATML
    log(
        f"model {model}: its chat template cannot show tools ({problem}); using the trainer's tools-aware "
        "ChatML template (agentrl_train.chat_template.TOOLS_CHATML) instead"
    )
