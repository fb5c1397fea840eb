"""The best case for fitting: a Jacobian lens fitted on exactly the held-out chunks it is then scored on.

`bench/lens_quality.py` scores a lens on text no fit has seen. This fits one on those same chunks and
positions (the first T tokens of each of the first --chunks held-out chunks), then scores it there
with the same code. No corpus and no number of prompts can do better on these positions than the
average Jacobian of these positions themselves, so where this lens falls short of a goal, fitting
more cannot reach it. About --chunks x 45 s of fitting on two CPU threads for SmolLM2-135M.

    python bench/lens_in_sample.py                       # embedded model, `general`, 20 chunks
    python bench/lens_in_sample.py --corpus fortunes --threads 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lens_quality import report  # noqa: E402

from lensapp import config, corpus, fitting, jlens  # noqa: E402
from lensapp.engine.start.loading import ModelError, load_hf_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    config.prepare_process_environment()       # before nnsight is imported
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="'embedded' (default), a hub id or a local folder")
    parser.add_argument("--corpus", default="general", help="as for fitting; its held-out part is used")
    parser.add_argument("--chunks", type=int, default=20, help="held-out chunks to fit on and score")
    parser.add_argument("--tokens", type=int, default=64, help="T: tokens per chunk")
    parser.add_argument("--skip", type=int, default=16, help="leading positions neither fitted nor scored")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--out", default=None, help="where to keep the lens (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.chunks < 1 or args.threads < 1:
        parser.error("--chunks and --threads must be at least 1")
    torch.set_num_threads(args.threads)
    try:
        return in_sample(args)
    except (fitting.FitError, corpus.CorpusError, jlens.LensFileError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def in_sample(args) -> int:
    chunks = corpus.split_holdout(corpus.load_corpus(args.corpus))[1][:args.chunks]     # before the model's load
    if not chunks:
        raise corpus.CorpusError(f"corpus {args.corpus!r} has no held-out chunk")
    model, resolved = load_hf_model(config.replace(config.from_args(None), model=args.model or config.EMBEDDED).engine,
                                    device="cpu")
    layout, tokenizer = resolved.family.hf, model.tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or Path(tmp) / "in_sample_jlens.pt")
        cfg = fitting.FitConfig(tokens=args.tokens, skip=args.skip, min_prompts=len(chunks), max_prompts=len(chunks),
                                checkpoint_dir=Path(tmp))
        where = f"{args.corpus} held-out[:{len(chunks)}] (in-sample)"
        fitting.fit(model, layout, chunks, cfg, out, tokenizer=tokenizer,
                    provenance={"model": resolved.name, "corpus": where})
        lens = jlens.load(str(out), d_model=resolved.info.d_model, n_layers=resolved.info.n_layers,
                          dtype=torch.float32)
        args.lens = str(out)
        report(model, layout, lens, resolved.name, args.corpus, chunks, tokenizer, args, resolved.info.n_layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
