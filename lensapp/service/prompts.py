"""Text -> token ids: prompts, chat templates (with the oldest turns dropped to fit), words.

The engine deals in token ids; this is where text becomes them, with the model's own tokenizer
(loaded from the same folder or hub id the engine loads). Every failure is a `RequestError`.

BOS, one rule: every prompt the model reads (a lens's, a generation's, a chat's, an intervention's, a
description's, a components readout's, an evaluation's) gets the tokenizer's BOS first when the app's
Jacobian lens was fitted so (`bos`, set by the service from the lens: jlens.fitted_with_bos), and is read
as tokenized otherwise; so a cell is the same cell in every tab, whichever lens reads it.

Words, one function (`word`): a word typed in any field is read as the model would write it after the text it
follows (tokenizing.word_ids). The rules themselves, a prompt's ids and a word's tokens, are lensapp/tokenizing.py's
pure functions, which "Show the code" writes into its scripts: here they get the app's limits and errors.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from ..config import MAX_CHAT_MESSAGES, MAX_PROMPT_CHARS
from ..results import Target
from ..tokenizing import context_of, conversation_ids, plain_ids, prompt_ids, word_ids
from .field import RequestError
from .tokens import TokenDecoder, show_bytes


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class Prompts:
    """The model's tokenizer, with the limits of this app."""

    def __init__(self, tokenizer, max_prompt_tokens: int, bos: bool = False):
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.decode = TokenDecoder(tokenizer)
        self.bos = bos          # every prompt with the tokenizer's BOS first (the Jacobian lens was fitted so)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def bos_id(self) -> int | None:
        return getattr(self.tokenizer, "bos_token_id", None)

    def ids(self, prompt: str, chat: bool = False) -> list[int]:
        """A prompt's token ids (in the chat template when `chat`; with the tokenizer's BOS first when `bos`,
        as a lens fitted so reads: see jlens.with_bos), within the token limit."""
        if chat:
            self._needs_template()
        ids = prompt_ids(self.tokenizer, prompt, chat, self.bos)
        if not ids:
            raise RequestError("the prompt has no tokens")
        if len(ids) > self.max_prompt_tokens:
            raise RequestError(f"the prompt has {len(ids)} tokens; the limit is {self.max_prompt_tokens}")
        return ids

    def word(self, word: str, after: Sequence[int]) -> Target:
        """`word` as the model would write it after the tokens `after`: the tokens that the text with the word
        joined on (`joined`) has after the text's own. Where the text's last tokens merge with the word's (the text
        ends in a space, CJK text), the word's own text is tokenized as it would go on from them."""
        return self.words([word], after)[0]

    def words(self, words: Sequence[str], after: Sequence[int]) -> list[Target]:
        """`word` for each of `words`, after the same tokens (their text tokenized once)."""
        context = context_of(self.tokenizer, after)
        before = plain_ids(self.tokenizer, context)
        return [self._word(w, context, before) for w in words]

    def forced(self, word: str | int, after: Sequence[int], vocab_size: int) -> int:
        """A forced token (service/branching.py): an id as given (within the vocabulary), or the first token of
        `word` as the model would write it after `after` (`word`)."""
        if isinstance(word, int):
            if not 0 <= word < vocab_size:
                raise RequestError(f"token id {word} is outside this model's vocabulary (0..{vocab_size - 1})")
            return word
        return self.word(word, after).token_ids[0]

    def _word(self, word: str, context: str, before: list[int]) -> Target:
        text = word.rstrip()
        if not text.strip():
            raise RequestError(f"the word {word!r} is empty")
        added = word_ids(self.tokenizer, context, text, before)
        if not added:
            raise RequestError(f"{text.strip()!r} adds no token after this text")
        return Target(text=text.strip(), token_ids=tuple(added))

    @property
    def stop_ids(self) -> set[int]:
        """The tokens a generation ends at (nothing follows a forced one)."""
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return set() if eos is None else {int(eos)}

    def conversation(self, messages: list[dict]) -> Conversation:
        """A conversation's token ids in the chat template, and how many of the oldest messages were
        dropped so it fits: to MAX_CHAT_MESSAGES first, by characters next (cheap), then by the templated prompt's
        tokens, as a page keeps its chat's latest turns (`recent_turns`)."""
        msgs, dropped = recent_turns([{"role": m["role"], "content": m["content"]} for m in messages],
                                     MAX_CHAT_MESSAGES)
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
        """The tokens as text; where they end (or break) inside a character, its bytes as <0xNN>, never U+FFFD."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if "\ufffd" not in text:
            return text
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        pieces, run = [], []
        for i in (int(i) for i in ids if int(i) not in special):
            raw = self.decode.token_bytes(i)
            if raw is None:
                run.append(i)
                continue
            if run:
                pieces.append(self.tokenizer.decode(run).encode("utf-8"))
                run = []
            pieces.append(raw)
        if run:
            pieces.append(self.tokenizer.decode(run).encode("utf-8"))
        return show_bytes(b"".join(pieces))

    def _template(self, messages: list[dict]) -> list[int]:
        self._needs_template()
        return conversation_ids(self.tokenizer, messages, self.bos)

    def _needs_template(self) -> None:
        if not self.has_chat_template:
            raise RequestError("this model's tokenizer has no chat template; turn chat off")


class Conversation(NamedTuple):
    ids: list[int]
    dropped_turns: int


def recent_turns(messages: Sequence[dict], most: int, drop: int = 0) -> tuple[list[dict], int]:
    """The conversation without its oldest turns, as `Prompts.conversation` drops them: at least `drop` messages,
    then until at most `most` are left (the last user message always stays); and how many were dropped. A page
    keeps what its chat read so, and sends only what fits (ui/chat_tab.py)."""
    msgs = list(messages)
    dropped = 0
    while (dropped < drop or len(msgs) > most) and (n := _drop_oldest_turn(msgs)):
        dropped += n
    return msgs, dropped


def _drop_oldest_turn(msgs: list[dict]) -> int:
    """Drop the oldest user message (and the reply to it) in place; 0 when only the last one is left."""
    if sum(m["role"] != "system" for m in msgs) <= 1:
        return 0
    first = next(i for i, m in enumerate(msgs) if m["role"] != "system")
    n = 2 if first + 1 < len(msgs) - 1 and msgs[first + 1]["role"] == "assistant" else 1
    del msgs[first:first + n]
    return n
