"""Tokenizers of the kinds a word can be misread on, each saved with a tiny random model of its own vocabulary.

- `sentencepiece`: Llama 2's and Mistral v0.x's kind. A real SentencePiece BPE model with a dummy prefix, trained
  here in a fraction of a second on a small corpus (its vocabulary holds `▁Paris`), saved as those checkpoints'
  tokenizer.json is: the SentencePiece pieces and merges, the legacy normalizer (`Prepend("▁")`, then spaces to
  `▁`), BOS first. It tokenizes exactly as the SentencePiece model itself (`check_faithful`), so `" Paris"` is
  `▁` then `▁Paris`, as in Llama 2.
- `gemma`: Gemma's kind: SentencePiece without a dummy prefix (spaces to `▁`, nothing prepended), BOS first.
- `bytelevel`: GPT-2's kind, the embedded SmolLM2 tokenizer (no BOS added).

Each gets a chat template that does not start with BOS (so the BOS rule is visible in the chat too). Nothing here
imports the app.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch

KINDS = ("sentencepiece", "gemma", "bytelevel")
CONTEXT = "The capital of France is"
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")
SENTENCES = ["The capital of France is Paris.", "Paris is a city in France.", "The capital of Italy is Rome.",
             "We went to Paris and then to Rome and London.", "Patience is a virtue, and patience is rare.",
             "The capital of Spain is Madrid.", "Water boils at one hundred degrees.",
             "Once upon a time there was a king in Paris.", "Hello, world."]


def train_sentencepiece(dummy_prefix: bool) -> bytes:
    """A SentencePiece BPE model (its serialized proto) trained on SENTENCES: byte fallback, whitespace kept as is
    (as Llama 2's), unk 0, BOS 1, EOS 2."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(SENTENCES * 50), model_writer=out, vocab_size=420,
                                   model_type="bpe", add_dummy_prefix=dummy_prefix, remove_extra_whitespaces=False,
                                   byte_fallback=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                   character_coverage=1.0, minloglevel=2)
    return out.getvalue()


def _from_sentencepiece(proto: bytes, folder: Path, dummy_prefix: bool):
    from tokenizers import Tokenizer, decoders, models, normalizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    (folder / "sp.model").write_bytes(proto)
    extracted = SentencePieceExtractor(str(folder / "sp.model")).extract(models.BPE)
    tk = Tokenizer(models.BPE(vocab=extracted["vocab"], merges=extracted["merges"], unk_token="<unk>", fuse_unk=True,
                              byte_fallback=True))
    steps = [normalizers.Prepend("▁")] if dummy_prefix else []
    tk.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
    tail = [decoders.Strip(" ", 1, 0)] if dummy_prefix else []
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()] + tail)
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(folder)
    (folder / "sp.model").unlink()
    return hf


def tokenizer_folder(kind: str, folder: Path, embedded_dir: Path) -> Path:
    """`folder` holding the tokenizer of `kind` (KINDS)."""
    from transformers import AutoTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    if kind == "bytelevel":
        tok = AutoTokenizer.from_pretrained(embedded_dir)
        tok.chat_template = CHAT_TEMPLATE
        tok.save_pretrained(folder)
    else:
        dummy = kind == "sentencepiece"
        proto = train_sentencepiece(dummy)
        _from_sentencepiece(proto, folder, dummy)
        (folder / "sentencepiece.model").write_bytes(proto)        # the reference the test checks against
    return folder


def check_faithful(folder: Path, texts: list[str]) -> None:
    """The saved tokenizer splits `texts` exactly as the SentencePiece model it was made from (where there is one)."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    if not (folder / "sentencepiece.model").exists():
        return
    sp = spm.SentencePieceProcessor(model_file=str(folder / "sentencepiece.model"))
    tok = AutoTokenizer.from_pretrained(folder)
    for text in texts:
        assert tok(text, add_special_tokens=False)["input_ids"] == sp.encode(text), text


def tiny_model(kind: str, folder: Path, embedded_dir: Path, model_type: str | None = None) -> Path:
    """A tiny random model (Gemma 2 for the Gemma-style tokenizer, Llama otherwise) with the tokenizer of `kind`,
    its final norm scaled up so its readouts are not near-uniform."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer_folder(kind, folder, embedded_dir)
    tok = AutoTokenizer.from_pretrained(folder)
    model_type = model_type or ("gemma2" if kind == "gemma" else "llama")
    torch.manual_seed(0)
    extra = {"head_dim": 16} if model_type.startswith("gemma") else {}
    cfg = AutoConfig.for_model(model_type, vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                               num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                               max_position_embeddings=128, initializer_range=0.2,
                               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **extra)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        norm = model.model.norm.weight
        norm.add_(1).mul_(8).sub_(1) if model_type.startswith("gemma") else norm.mul_(8)
    model.save_pretrained(folder)
    return folder


def model_writes(folder: Path, context: str, word: str) -> list[int]:
    """The reference for a word after a context: the tokens `context + " " + word` has after the context's, by the
    tokenizer itself."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    before = tok(context)["input_ids"]
    after = tok(context + " " + word)["input_ids"]
    assert after[:len(before)] == before, (context, word)
    return after[len(before):]


def config_of(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())
