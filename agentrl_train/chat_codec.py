"""The policy's text side: chat-template rendering and the token streams the model reads and writes.

:class:`ChatCodec` holds a tokenizer and turns conversations into token ids: the prompt of a step
(oldest turns dropped past a budget), the next prompt continued from the sampled ids without
re-tokenizing them (token in, token out), a whole transcript with its assistant mask (SFT), a
candidate action's tokens, and whether sampled ids end an action. Content that users and tools
wrote never becomes special tokens (a tool result that spells ``<|im_start|>`` stays text).
:class:`~agentrl_train.policy.Policy` is a ChatCodec over its model's tokenizer; the codec needs no
model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl_envs.errors import ConfigError

__all__ = ["STOP_STRINGS", "ChatCodec", "stop_token_ids"]

STOP_STRINGS = ("</tool_call>",)  #: text that ends an action, whatever its tokenization


class ChatCodec:
    """Conversations to token ids and back for one tokenizer (with a chat template).

    Args:
        tokenizer: a transformers tokenizer.
        context_length: the model's positions (named in the error when a prompt cannot fit), or None.
    """

    def __init__(self, tokenizer: Any, context_length: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.stop_ids = stop_token_ids(tokenizer)
        self._specials: list[str] | None = None

    def encode_prompt(self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None, max_tokens: int) -> list[int]:
        """Chat-template the messages (generation prompt added), dropping the oldest turns past ``max_tokens``.

        The system prompt (with the tools) and the first user message (the instruction) are always
        kept: when they alone exceed ``max_tokens`` this is a :class:`ConfigError` naming
        ``--max-prompt-tokens``, not a prompt cut from the left (which would drop the system prompt).
        """
        keep_head, turns = messages[:2], messages[2:]
        while True:
            text = self.tokenizer.apply_chat_template(keep_head + turns, tools=tools, tokenize=False, add_generation_prompt=True)
            ids = self._tokenize(text, _untrusted(keep_head + turns))
            if len(ids) <= max_tokens:
                return ids
            if not turns:
                raise ConfigError(
                    f"the system prompt, tools and instruction alone take {len(ids)} tokens, more than "
                    f"--max-prompt-tokens {max_tokens}: raise --max-prompt-tokens (the model's context allows "
                    f"{self.context_length or 'an unknown number of'} tokens)"
                )
            turns = turns[2:] if len(turns) >= 2 else []

    def render(self, messages: list[dict[str, str]], tools: Any, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt)

    def continue_stream(
        self, stream: list[int], messages: list[dict[str, str]], tools: Any, new_ids: list[int], max_tokens: int
    ) -> list[int]:
        """Token in, token out: the next prompt is this prompt + the sampled ids + the template's tokens
        for the rest of the turn and the tool's reply (``messages`` ends with the assistant turn and the
        tool turn). The sampled ids are never re-tokenized, and what they already hold (an end-of-turn
        token the model sampled) is not added again: the tail is the rendering's text after the
        prompt's text and the sampled ids' decoded text. Past ``max_tokens`` the oldest turns go (the
        prompt is encoded afresh, as is a template that does not continue the sampled text).
        """
        before = self.render(messages[:-2], tools, True)
        sampled = self.tokenizer.decode(new_ids, skip_special_tokens=False)
        after = self.render(messages, tools, True)
        rest = after[len(before) :] if after.startswith(before) else None
        # Some templates put whitespace between the generation prompt and the content (the tiny
        # model's: "<|im_start|>assistant" then "\n" + content); that glue is the template's text.
        at = rest.find(sampled) if rest is not None and sampled else 0 if rest is not None else -1
        if at < 0 or at > 4 or (rest or "")[:at].strip():  # a template that rewrites the action (or not prefix-stable)
            return self.encode_prompt(messages, tools, max_tokens)
        assert rest is not None
        glue = self._tokenize(rest[:at]) if at else []
        tail = self._tokenize(rest[at + len(sampled) :], [messages[-1]["content"]])
        out = [*stream, *glue, *new_ids, *tail]
        if len(out) > max_tokens:
            return self.encode_prompt(messages, tools, max_tokens)
        return out

    def _tokenize(self, text: str, untrusted: Sequence[str] = ()) -> list[int]:
        """Token ids of rendered chat text; inside ``untrusted`` content special-token text stays text.

        A tool result or a user message that spells ``<|im_start|>`` or ``<tool_call>`` must not
        become those tokens: the model would see a forged turn. Each occurrence of such content in
        ``text`` is tokenized with ``split_special_tokens=True``, the template around it as usual
        (so content without special-token text tokenizes exactly as before).
        """
        specials = self._special_texts()
        hostile = sorted({c for c in untrusted if c and any(t in c for t in specials)}, key=len, reverse=True)
        if not hostile:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        out: list[int] = []
        rest = text
        while rest:
            hits = [(rest.find(c), c) for c in hostile if rest.find(c) >= 0]
            if not hits:
                out += self.tokenizer(rest, add_special_tokens=False)["input_ids"]
                break
            at, c = min(hits, key=lambda h: (h[0], -len(h[1])))
            if at:
                out += self.tokenizer(rest[:at], add_special_tokens=False)["input_ids"]
            out += self.tokenizer(c, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            rest = rest[at + len(c) :]
        return out

    def _special_texts(self) -> list[str]:
        if self._specials is None:
            enc = getattr(self.tokenizer, "added_tokens_encoder", {}) or {}
            self._specials = [t for t in {*enc, *self.tokenizer.all_special_tokens} if t]
        return self._specials

    def encode_episode(self, messages: list[dict[str, str]], tools: Any) -> tuple[list[int], list[bool]]:
        """Token ids of a whole transcript and a mask that is True on the assistant's tokens only."""
        ids: list[int] = []
        mask: list[bool] = []
        done = ""
        for n in range(1, len(messages) + 1):
            if messages[n - 1]["role"] == "assistant":
                head = self.render(messages[: n - 1], tools, True)
                full = self.render(messages[:n], tools, False)
                if not (head.startswith(done) and full.startswith(head)):
                    raise ConfigError("the chat template is not prefix-stable; cannot mask assistant tokens for SFT")
                h = self._tokenize(head[len(done) :], _untrusted(messages))
                b = self.tokenizer(full[len(head) :], add_special_tokens=False)["input_ids"]
                ids += h + b
                mask += [False] * len(h) + [True] * len(b)
                done = full
            else:
                full = self.render(messages[:n], tools, False)
                if not full.startswith(done):
                    raise ConfigError("the chat template is not prefix-stable; cannot mask assistant tokens for SFT")
                t = self._tokenize(full[len(done) :], _untrusted(messages))
                ids += t
                mask += [False] * len(t)
                done = full
        return ids, mask

    def encode_action(self, text: str) -> list[int]:
        """Tokens of a candidate action, ended by the end-of-turn token."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        eos = self.tokenizer.eos_token_id
        return [*ids, eos] if eos is not None else ids

    def stops(self, ids: Sequence[int]) -> bool:
        """Whether an action ends with its last token: an end-of-turn token, or the text completes ``</tool_call>``.

        ``</tool_call>`` is several tokens for many tokenizers (SmolLM2's), so the decoded text of
        the last tokens is checked; it is at most 12 characters, so 16 tokens hold it.
        """
        if ids and ids[-1] in self.stop_ids:
            return True
        return any(s in self.tokenizer.decode(list(ids[-16:]), skip_special_tokens=False) for s in STOP_STRINGS)


def _untrusted(messages: Sequence[dict[str, str]]) -> list[str]:
    """The contents whose special-token text must stay text: what users and tools wrote."""
    return [str(m.get("content") or "") for m in messages if m.get("role") in ("user", "tool")]


def stop_token_ids(tokenizer: Any) -> set[int]:
    """Token ids that end an action: EOS, ``</tool_call>`` and the end-of-turn tokens the tokenizer has."""
    out = {i for i in (tokenizer.eos_token_id,) if i is not None}
    for s in ("</tool_call>", "<|im_end|>", "<|eot_id|>", "<|end|>"):
        i = tokenizer.convert_tokens_to_ids(s)
        if isinstance(i, int) and i != tokenizer.unk_token_id and i >= 0:
            out.add(i)
    return out
