"""Text -> token ids: prompts, chat templates (with the oldest turns dropped to fit), target words.

The engine deals in token ids; this is where text becomes them, with the model's own tokenizer
(loaded from the same folder or hub id the engine loads). Every failure is a `RequestError`.
"""

from __future__ import annotations

from typing import NamedTuple

from ..config import MAX_PROMPT_CHARS
from ..jlens import with_bos
from ..results import Target
from .field import RequestError
from .tokens import TokenDecoder


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class Prompts:
    """The model's tokenizer, with the limits of this app."""

    def __init__(self, tokenizer, max_prompt_tokens: int):
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.decode = TokenDecoder(tokenizer)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def bos_id(self) -> int | None:
        return getattr(self.tokenizer, "bos_token_id", None)

    def ids(self, prompt: str, chat: bool = False, bos: bool = False) -> list[int]:
        """A prompt's token ids (in the chat template when `chat`; with the tokenizer's BOS first when `bos`,
        as a lens fitted so reads: see jlens.with_bos), within the token limit."""
        if chat:
            ids = self._template([{"role": "user", "content": prompt}])
        else:
            ids = list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        if bos and ids:
            ids = with_bos(ids, self.bos_id)
        if not ids:
            raise RequestError("the prompt has no tokens")
        if len(ids) > self.max_prompt_tokens:
            raise RequestError(f"the prompt has {len(ids)} tokens; the limit is {self.max_prompt_tokens}")
        return ids

    def target(self, word: str) -> Target:
        """A target is scored as it would follow the prompt: a leading space is added unless it has one."""
        word = word.strip()
        ids = tuple(self.tokenizer(" " + word, add_special_tokens=False)["input_ids"])
        if not ids:
            raise RequestError(f"target {word!r} has no tokens")
        return Target(text=word, token_ids=ids)

    def conversation(self, messages: list[dict]) -> Conversation:
        """A conversation's token ids in the chat template, and how many of the oldest messages were
        dropped so it fits: by characters first (cheap), then by the templated prompt's tokens."""
        msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
        dropped = 0
        while sum(len(m["content"]) for m in msgs) > MAX_PROMPT_CHARS and (n := _drop_oldest_turn(msgs)):
            dropped += n
        while True:
            ids = self._template(msgs)
            if len(ids) <= self.max_prompt_tokens:
                return Conversation(ids, dropped)
            n = _drop_oldest_turn(msgs)
            if not n:
                raise RequestError(f"the message has {len(ids)} tokens; the limit is {self.max_prompt_tokens}")
            dropped += n

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _template(self, messages: list[dict]) -> list[int]:
        if not self.has_chat_template:
            raise RequestError("this model's tokenizer has no chat template; turn chat off")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


class Conversation(NamedTuple):
    ids: list[int]
    dropped_turns: int


def _drop_oldest_turn(msgs: list[dict]) -> int:
    """Drop the oldest user message (and the reply to it) in place; 0 when only the last one is left."""
    if sum(m["role"] != "system" for m in msgs) <= 1:
        return 0
    first = next(i for i, m in enumerate(msgs) if m["role"] != "system")
    n = 2 if first + 1 < len(msgs) - 1 and msgs[first + 1]["role"] == "assistant" else 1
    del msgs[first:first + n]
    return n
