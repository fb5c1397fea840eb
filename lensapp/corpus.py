"""Text for fitting and scoring lenses: a named corpus, a file, a folder, or a hub dataset.

    chunks = load_corpus("general")        # the default: English the embedded model wrote itself (shipped)
    fit_part, held_out = split_holdout(chunks)

Named corpora, none of which needs a download:
  general   ~550k characters of English prose that SmolLM2-135M-Instruct wrote itself, from 114 writing
            tasks (stories, letters, explanations, lists, recipes, news) with seeded sampling
            (`scripts/sample_corpus.py`; how it was made is in the .json beside it). Shipped in the package.
  pydoc     Python's own documentation (`pydoc_data.topics`, ~465k characters), which every install has.
  fortunes  Debian's `fortunes` package (quotations, literature, wisdom, people, humour, ...): English
            written elsewhere, for scoring a lens on text no fit saw. `apt-get install fortunes`.

Text is cut into chunks of about CHUNK_CHARS characters (non-blank lines), and every
HOLDOUT_EVERY-th chunk is held out: no fit ever sees it, and bench/lens_quality.py scores lenses on
it. A fit cuts its chunks into consecutive T-token windows (`token_windows`), one prompt each, so
all of the text is used: Python's docs give ~1600 prompts of 64 tokens, not 206 chunk openings.
A fit's checkpoint records a fingerprint of its prompts, so changing how text is chunked makes old
checkpoints refuse to resume rather than mix corpora.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

HOLDOUT_EVERY = 10     # chunk i is held out when i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
CHUNK_CHARS = 2000     # a corpus chunk: non-blank lines joined until at least this many characters
TEXT_SUFFIXES = {".txt", ".md", ".rst", ".text"}
GENERAL = Path(__file__).resolve().parent / "assets" / "corpus" / "smollm2_samples.txt"
FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNE_FILES = ("literature", "wisdom", "people", "humorists", "love", "pets", "food", "kids", "education",
                 "platitudes", "work", "miscellaneous", "science", "sports")
NAMED = {
    "general": "general: English prose SmolLM2-135M-Instruct wrote itself (lensapp/assets/corpus/smollm2_samples.txt)",
    "pydoc": "pydoc: pydoc_data.topics (Python stdlib docs)",
    "fortunes": "fortunes: Debian's fortunes package (/usr/share/games/fortunes)",
}


class CorpusError(ValueError):
    """A corpus that cannot be read; the message is one line meant for the user."""


def chunk_text(text: str, chunk_chars: int = CHUNK_CHARS) -> list[str]:
    """Non-blank lines joined into chunks of at least `chunk_chars` characters (the last may be shorter)."""
    chunks, lines, size = [], [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        lines.append(line)
        size += len(line) + 1
        if size >= chunk_chars:
            chunks.append("\n".join(lines))
            lines, size = [], 0
    if lines:
        chunks.append("\n".join(lines))
    return chunks


def load_corpus(spec: str | None = None, chunk_chars: int = CHUNK_CHARS) -> list[str]:
    """Chunks of a named corpus (None: `general`), a text file, a folder's text files, or `hf:<dataset>`."""
    spec = spec or "general"
    if spec == "general":
        return chunk_text(GENERAL.read_text(encoding="utf-8"), chunk_chars)
    if spec == "pydoc":
        from pydoc_data.topics import topics

        return chunk_text("\n".join(topics[key] for key in sorted(topics)), chunk_chars)
    if spec == "fortunes":
        return chunk_text(fortunes_text(), chunk_chars)
    if spec.startswith("hf:"):
        return _hf_corpus(spec[3:], chunk_chars)
    path = Path(spec).expanduser()
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        if not files:
            raise CorpusError(f"corpus folder {path} has no {'/'.join(sorted(TEXT_SUFFIXES))} files")
    else:
        raise CorpusError(f"corpus {spec!r}: no such file or folder (nor hf:<dataset>)")
    chunks = [c for f in files for c in chunk_text(f.read_text(encoding="utf-8", errors="replace"), chunk_chars)]
    if not chunks:
        raise CorpusError(f"corpus {spec!r} has no non-blank text")
    return chunks


def _hf_corpus(name: str, chunk_chars: int, max_chars: int = 4_000_000) -> list[str]:
    try:
        import datasets
    except ImportError:
        raise CorpusError("hf: corpora need the optional `datasets` package (pip install datasets)") from None
    try:
        rows = datasets.load_dataset(name, split="train", streaming=True)
        texts, size = [], 0
        for row in rows:
            text = row.get("text") or ""
            texts.append(text)
            size += len(text)
            if size >= max_chars:
                break
    except Exception as e:  # offline, unknown dataset, no "train" split: all mean "not available"
        raise CorpusError(f"hf:{name}: could not stream the dataset ({type(e).__name__}: {e})") from e
    chunks = chunk_text("\n".join(texts), chunk_chars)
    if not chunks:
        raise CorpusError(f"hf:{name}: no 'text' column with content in its train split")
    return chunks


def describe(spec: str | None) -> str:
    """How a corpus spec reads in a lens's provenance."""
    return NAMED.get(spec or "general", spec or "")


def fortunes_text() -> str:
    """Debian's fortunes (the English, prose-like files), one fortune per line: their hard wraps joined."""
    files = [FORTUNES_DIR / name for name in FORTUNE_FILES if (FORTUNES_DIR / name).is_file()]
    if not files:
        raise CorpusError(f"the fortunes corpus needs Debian's fortunes package ({FORTUNES_DIR} has none of its files)")
    out = []
    for f in files:
        for fortune in f.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            text = " ".join(fortune.split())
            if text and text != "%":
                out.append(text)
    return "\n".join(out)


def shard(chunks: list, spec: str) -> list:
    """Every N-th chunk from the I-th (`I/N`), for fitting on several machines."""
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise CorpusError(f"--shard {spec!r}: expected I/N, e.g. 0/2") from None
    if not 0 <= i < n:
        raise CorpusError(f"--shard {spec!r}: need 0 <= I < N")
    return chunks[i::n]


def split_holdout(chunks: Sequence) -> tuple[list, list]:
    """(fit, held_out): every HOLDOUT_EVERY-th chunk is held out, deterministically."""
    fit_part = [c for i, c in enumerate(chunks) if i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1]
    return fit_part, list(chunks[HOLDOUT_EVERY - 1::HOLDOUT_EVERY])


def token_windows(chunks: Sequence[str], tokenizer, tokens: int, min_tokens: int = 1) -> list[list[int]]:
    """Each chunk's token ids cut into consecutive windows of `tokens` (a shorter tail is kept if it
    has at least `min_tokens`). Only a chunk's first window starts where the text does: a fit skips
    every window's first positions anyway (attention sinks)."""
    out = []
    for chunk in chunks:
        ids = tokenizer(chunk, add_special_tokens=True)["input_ids"]
        windows = (ids[i:i + tokens] for i in range(0, len(ids), tokens))
        out += [w for w in windows if len(w) >= min_tokens]
    return out
