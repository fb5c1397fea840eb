"""Token ids -> display strings that say exactly what the token is.

`tokenizer.decode([id])` turns a token holding part of a UTF-8 character into U+FFFD;
here such a token shows its bytes instead (`<0xE5><0xB7>`), so two different tokens never
look the same. Whitespace stays as-is: showing it (`␣`, `↵`) is the chart's job.
"""

from __future__ import annotations

from functools import lru_cache


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed (the standard table, as in tokenizers' ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenDecoder:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._bytes = _byte_decoder()
        self.decode_one = lru_cache(maxsize=200_000)(self._decode_one)

    def _decode_one(self, token_id: int) -> str:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if "\ufffd" not in text:
            return text
        piece = self.tokenizer.convert_ids_to_tokens(token_id) or ""
        if piece and all(ch in self._bytes for ch in piece):          # byte-level BPE piece
            raw = bytes(self._bytes[ch] for ch in piece)
        elif piece.startswith("<0x") and piece.endswith(">"):           # sentencepiece byte fallback
            return piece
        else:
            return text
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "".join(f"<0x{b:02X}>" if b >= 0x80 else chr(b) for b in raw)

    def __call__(self, ids: list[int]) -> list[str]:
        return [self.decode_one(int(i)) for i in ids]
