"""Tokens are shown as exactly what they are: markup stays text, split UTF-8 shows its bytes."""

from transformers import AutoTokenizer

from lensapp.service.tokens import TokenDecoder


def test_html_and_non_ascii_tokens_decode_faithfully(embedded_dir):
    tok = AutoTokenizer.from_pretrained(embedded_dir)
    decode = TokenDecoder(tok)
    for text in ["<img src=x onerror=alert(1)>", "Café naïve — déjà vu", "巴黎是法国的首都", "emoji 🙂 ok", "a\n\tb"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        pieces = decode(ids)
        assert len(pieces) == len(ids)
        assert "\ufffd" not in "".join(pieces), (text, pieces)
        if all("<0x" not in p for p in pieces):
            assert "".join(pieces) == text
    # a token holding part of a character shows its bytes, distinct from any other token
    ids = tok("🙂", add_special_tokens=False)["input_ids"]
    if len(ids) > 1:
        assert any("<0x" in p for p in decode(ids))


def test_markup_is_not_altered(embedded_dir):
    tok = AutoTokenizer.from_pretrained(embedded_dir)
    decode = TokenDecoder(tok)
    ids = tok("<script>alert(1)</script>", add_special_tokens=False)["input_ids"]
    assert "".join(decode(ids)) == "<script>alert(1)</script>"
