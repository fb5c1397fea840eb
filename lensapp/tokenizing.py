"""Text -> token ids, the app's one rule as pure functions of a Hugging Face tokenizer: a prompt's ids (as written,
or in the chat template; BOS first where a Jacobian lens was fitted so) and the tokens a word adds after a text.

service/prompts.py reads every prompt and every word through these (with the app's limits and one-line errors
around them), and "Show the code" (snippets/) writes their own source into its scripts: a script reads a prompt and
a word as the app does because it runs the same functions, not a copy that can drift. So they use only the standard
library, the tokenizer they are handed, each other and `jlens.with_bos` (which a script gets too), and they never
raise for a word the app refuses (it checks what they return).

Words: a word typed in any field (a lens's targets, a steering or ablation word and its from-word, a components
target and foil, a forced token, an evaluation's words) is read as the model would write it after the text it
follows: the tokens that `text + word` has after the text's own tokens. So on a SentencePiece tokenizer with a dummy
prefix (Llama 2, Mistral v0.x) "Paris" after "...France is" is `▁Paris`, never the lone `▁` that
`tokenize(" Paris")` starts with.
"""

from __future__ import annotations

import unicodedata

from .jlens import with_bos

# A text the word's own text is tokenized after when the context's last tokens merge with it: a line break, which
# no tokenizer merges with what follows it (byte-level BPE splits it off; SentencePiece has it as a byte).
ANCHOR = "\n"
# Punctuation that attaches to the word before it (no space before it): Unicode's closing, final and other
# punctuation (. , ; : ! ? ) ] } ' " ...), dashes and connectors.
ATTACHED = ("Pe", "Pf", "Po", "Pd", "Pc")


def prompt_ids(tokenizer, prompt: str, chat: bool, bos: bool) -> list[int]:
    """A prompt's token ids as the app reads it: as the tokenizer writes it (with its own special tokens), or with
    `chat` as a user's message in the chat template, ready for the reply; the tokenizer's BOS first when `bos`."""
    if chat:
        return conversation_ids(tokenizer, [{"role": "user", "content": prompt}], bos)
    return bos_first(tokenizer, tokenizer(prompt, add_special_tokens=True)["input_ids"], bos)


def conversation_ids(tokenizer, messages: list[dict], bos: bool) -> list[int]:
    """Messages in the tokenizer's chat template, ready for the reply, as token ids (BOS first when `bos`)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return bos_first(tokenizer, ids["input_ids"] if hasattr(ids, "keys") else ids, bos)


def bos_first(tokenizer, ids, bos: bool) -> list[int]:
    """`ids` with the tokenizer's BOS first when `bos` (a Jacobian lens fitted so reads every prompt so): none where
    it is already first (a chat template's own) or the tokenizer has none (Qwen's): jlens.with_bos."""
    ids = [int(i) for i in ids]
    return with_bos(ids, getattr(tokenizer, "bos_token_id", None)) if bos and ids else ids


def context_of(tokenizer, after) -> str:
    """The text a word is read after: the tokens `after` decoded as written (special tokens left out)."""
    return tokenizer.decode([int(i) for i in after], skip_special_tokens=True, clean_up_tokenization_spaces=False)


def plain_ids(tokenizer, text: str) -> list[int]:
    """`text`'s token ids without special tokens."""
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def word_ids(tokenizer, context: str, word: str, before: list[int] | None = None) -> list[int]:
    """The tokens `word` (as typed, trailing whitespace aside) adds after `context` as the model would write it
    there: those the context with the word joined on (`joined`) has after the context's own (`before`: its
    `plain_ids`, when known). Where the context's last tokens merge with the word's (a context ending in a space, CJK
    text), the word's own text is tokenized as it would go on from them. [] for a word that adds none."""
    text = word.rstrip()
    if not text.strip():
        return []
    before = plain_ids(tokenizer, context) if before is None else before
    full = joined(context, text)
    ids = plain_ids(tokenizer, full)
    if ids[:len(before)] == before:
        return ids[len(before):]
    # The context's last tokens merge with the word's: go on from them.
    anchor = plain_ids(tokenizer, ANCHOR)
    alone = plain_ids(tokenizer, ANCHOR + full[len(context):])
    return alone[len(anchor):] if alone[:len(anchor)] == anchor else ids[common_prefix(ids, before):]


def joined(context: str, word: str) -> str:
    """`word` after `context` as a new word: a space between them, unless the context is empty or ends in
    whitespace, the word starts with whitespace (its own, kept as typed) or with punctuation that attaches, or
    either side is written without spaces (Chinese, Japanese, Korean: East Asian wide characters)."""
    if (not context or context[-1].isspace() or word[0].isspace()
            or unicodedata.category(word[0]) in ATTACHED or unspaced(context[-1]) or unspaced(word[0])):
        return context + word
    return context + " " + word


def unspaced(ch: str) -> bool:
    return unicodedata.east_asian_width(ch) in ("W", "F")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
