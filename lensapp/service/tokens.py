"""Token ids -> display strings that say exactly what the token is.

`tokenizer.decode([id])` turns a token holding part of a UTF-8 character into U+FFFD (byte-level
tokenizers split most Chinese, Japanese and Korean characters and emoji over two to four tokens).
Here such a token is never a bare U+FFFD:

- on its own (a cell's top-k, an alternative) it shows its whole characters as text and its partial
  ones as bytes: `<0xE5><0x99>`, so two different tokens never look the same;
- in a sequence (a prompt, a generation: `sequence`), where the tokens around it complete the
  character, each token of the run shows the character with its share: `器(1/3)`, `器(2/3)`, `器(3/3)`;
  bytes that no neighbour completes still show as bytes.

Whitespace stays as-is: showing it (`␣`, `↵`) is the chart's job.
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


def utf8_pieces(data: bytes) -> list[tuple[int, int, str | None]]:
    """data -> [(start, end, character or None)]: its characters with their byte spans, and each byte that
    starts no valid character on its own (a lone continuation byte, a cut-off sequence) as (i, i + 1, None)."""
    out, i = [], 0
    while i < len(data):
        lead = data[i]
        n = 1 if lead < 0x80 else 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else \
            4 if 0xF0 <= lead <= 0xF4 else 0
        try:
            out.append((i, i + n, data[i:i + n].decode("utf-8")) if n and i + n <= len(data) else (i, i + 1, None))
        except UnicodeDecodeError:
            out.append((i, i + 1, None))
        i = out[-1][1]
    return out


def show_bytes(data: bytes) -> str:
    """Whole characters as text, every other byte as <0xNN>."""
    return "".join(ch if ch is not None else f"<0x{data[a]:02X}>" for a, _, ch in utf8_pieces(data))


class TokenDecoder:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._bytes = _byte_decoder()
        self.decode_one = lru_cache(maxsize=200_000)(self._decode_one)
        self.token_bytes = lru_cache(maxsize=200_000)(self._token_bytes)

    def _token_bytes(self, token_id: int) -> bytes | None:
        """The raw bytes of a token that holds part of a character (None for a token that decodes whole)."""
        text = self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if "\ufffd" not in text:
            return None
        piece = self.tokenizer.convert_ids_to_tokens(token_id) or ""
        if piece and all(ch in self._bytes for ch in piece):          # byte-level BPE piece
            return bytes(self._bytes[ch] for ch in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):     # sentencepiece byte fallback
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                return None
        return None

    def _decode_one(self, token_id: int) -> str:
        raw = self.token_bytes(token_id)
        if raw is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            return text.replace("\ufffd", "<?>") if "\ufffd" in text else text
        return show_bytes(raw)

    def __call__(self, ids: list[int]) -> list[str]:
        """Each token on its own (a cell's top-k)."""
        return [self.decode_one(int(i)) for i in ids]

    def sequence(self, ids: list[int]) -> list[str]:
        """The tokens of one sequence, in order: each as on its own, except runs of partial-character tokens,
        whose characters are joined where the run completes them (`器(1/3)`, `器(2/3)`, `器(3/3)`)."""
        ids = [int(i) for i in ids]
        out = self(ids)
        raws = [self.token_bytes(i) for i in ids]
        start = 0
        while start < len(ids):
            if raws[start] is None:
                start += 1
                continue
            end = start
            while end < len(ids) and raws[end] is not None:
                end += 1
            out[start:end] = _joined(raws[start:end])
            start = end
        return out


def _joined(raws: list[bytes]) -> list[str]:
    """A run of tokens' bytes -> each token's label: whole characters as text, a character shared with its
    neighbours with its share ("(k/n)"), bytes that complete nothing as <0xNN>."""
    data = b"".join(raws)
    bounds, at = [], 0
    for raw in raws:
        bounds.append((at, at + len(raw)))
        at += len(raw)
    labels = [""] * len(raws)
    for a, b, ch in utf8_pieces(data):
        holders = [t for t, (s, e) in enumerate(bounds) if s < b and a < e]
        for k, t in enumerate(holders):
            if ch is None:
                labels[t] += f"<0x{data[a]:02X}>"
            elif len(holders) == 1:
                labels[t] += ch
            else:
                labels[t] += f"{ch}({k + 1}/{len(holders)})"
    return labels
