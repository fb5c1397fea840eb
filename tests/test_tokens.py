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


def test_a_sequence_joins_characters_split_over_tokens(embedded_dir):
    """Chinese and emoji are split over two to four byte-level tokens: in a sequence each token of the run shows
    the character with its share, alone it shows its bytes, and no token is ever a bare U+FFFD."""
    tok = AutoTokenizer.from_pretrained(embedded_dir)
    decode = TokenDecoder(tok)
    for text in ["巴黎是法国的首都", "中文分词器测试：你好，世界！", "party 🎉👍 time", "café"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        shown = decode.sequence(ids)
        assert len(shown) == len(ids) and not any("\ufffd" in s or "<0x" in s for s in shown), shown
        # each character appears whole, its pieces numbered 1/n .. n/n in order: read back, the text itself
        assert "".join(_read_back(s) for s in shown) == text, shown
    ids = tok("器", add_special_tokens=False)["input_ids"]
    assert decode.sequence(ids) == ["器(1/3)", "器(2/3)", "器(3/3)"]
    assert decode(ids) == ["<0xE5>", "<0x99>", "<0xA8>"]                      # alone: their bytes
    assert decode.sequence(ids[:2]) == ["<0xE5>", "<0x99>"]                   # a run that completes nothing


def test_a_token_with_a_whole_character_and_a_partial_one_shows_both(embedded_dir):
    tok = AutoTokenizer.from_pretrained(embedded_dir)
    decode = TokenDecoder(tok)
    ids = tok(" 🎉", add_special_tokens=False)["input_ids"]         # ' ' + the emoji's first two bytes, then two
    assert decode(ids[:1]) == [" <0xF0><0x9F>"]
    assert decode.sequence(ids) == [" 🎉(1/3)", "🎉(2/3)", "🎉(3/3)"]


def _read_back(label: str) -> str:
    """A sequence label's own text: a shared character counted once, at its first piece ("器(1/3)")."""
    import re

    return re.sub(r"(.)\((\d)/(\d)\)", lambda m: m[1] if m[2] == "1" else "", label)


def test_a_text_cut_inside_a_character_shows_its_bytes(embedded_dir):
    from lensapp.service.prompts import Prompts

    prompts = Prompts(AutoTokenizer.from_pretrained(embedded_dir), 512)
    ids = prompts.tokenizer("巴黎 🎉", add_special_tokens=False)["input_ids"]
    assert prompts.text(ids) == "巴黎 🎉"
    assert prompts.text(ids[:-1]) == "巴黎 <0xF0><0x9F><0x8E>"                # cut inside the emoji
    assert prompts.text(ids[1:]) == "<0xB4>黎 🎉"                             # begun inside a character
