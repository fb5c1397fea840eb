"""Score a Jacobian lens against the logit lens on held-out text: top-1 agreement and KL, per layer.

Examples:
    python bench/lens_quality.py                                       # shipped lens, embedded model
    python bench/lens_quality.py --lens my_lens.pt --model HuggingFaceTB/SmolLM2-360M --chunks 50
    python bench/lens_quality.py --corpus notes/ --tokens 128

The chunks are `corpus.split_holdout`'s held-out part of the corpus, which no fit ever sees. At every
position p >= skip of each chunk (first T tokens), layer l's lens reads its block output (J-lens:
transported by J_l; the last layer uses I) through the model's final norm and lm_head. Each chunk is read as
the app reads it beside this lens: with the tokenizer's BOS first when the lens was fitted so (`--bos` says
otherwise), which changes both lenses' readings, the logit lens's too. Reported per
layer: top-1 = how often the lens's argmax is the model's own next-token argmax; top-5 = how often
that argmax is among the lens's top 5; KL = mean KL(final || lens) in nats. Prints a markdown
table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
DEFAULT_CORPORA = ("general", "fortunes")

from residuals import read_residuals  # noqa: E402

from lensapp import config, corpus, fitting, jlens  # noqa: E402
from lensapp.engine.run.families import Layout, find, hf_logits  # noqa: E402
from lensapp.engine.start.loading import ModelError, load_hf_model  # noqa: E402
from lensapp.lenses import FinalDistribution, layer_readouts  # noqa: E402


def block_outputs(model, layout: Layout, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [n] -> (h [n_layers, n, d_model] block outputs, final logits [n, vocab]), read as the engine reads them."""
    import nnsight

    hf = model._module
    n_layers, d_model = len(fitting.decoder_layers(hf, layout)), hf.config.hidden_size
    with torch.no_grad(), model.trace(ids[None], use_cache=False):
        h = nnsight.save(read_residuals(model, layout, range(n_layers), d_model))
        logits = nnsight.save(find(model, layout.head).output[0])
    return h, hf_logits(hf.config, logits)


def score(model, layout: Layout, lens: jlens.JacobianLens, chunks: list[str], tokenizer, tokens: int,
          skip: int, bos_id: int | None = None) -> dict:
    """Per-layer sums over held-out positions -> {"logit": {...}, "jlens": {...}} of per-layer lists; each
    chunk's first `tokens` ids with `bos_id` first when it is given."""
    hf = model._module                      # the torch model under nnsight's TransformersModel
    n_layers, d_model = len(fitting.decoder_layers(hf, layout)), hf.config.hidden_size
    head = find(hf, layout.head)

    def unembed(x):                         # the engine's HF head, with the family's logit arithmetic
        return hf_logits(hf.config, head(x))

    norm = find(hf, layout.norm)
    # The last block's output is the target itself: its J is I (and both lenses equal the model).
    J = torch.stack([lens.J[i].float() if i in lens.J else torch.eye(d_model) for i in range(n_layers)])
    sums = {name: {metric: torch.zeros(n_layers) for metric in ("top1", "top5", "kl")} for name in ("logit", "jlens")}
    positions = 0
    for chunk in chunks:
        ids = fitting.prompt_ids(chunk, tokenizer, tokens, bos_id)
        if ids.shape[0] <= skip:
            continue
        h, logits = block_outputs(model, layout, ids)
        h, logits = h[:, skip:], logits[skip:]
        final = FinalDistribution.from_logits(logits)
        want = logits.argmax(-1)
        with torch.no_grad():
            for name, lens_J in (("logit", None), ("jlens", J)):
                r = layer_readouts(h, norm, unembed, 5, final=final, J=lens_J)
                hits = r["top_ids"] == want[:, None]                      # [layer, position, 5]
                sums[name]["top1"] += hits[..., 0].float().sum(-1)
                sums[name]["top5"] += hits.any(-1).float().sum(-1)
                sums[name]["kl"] += r["kl_to_final"].sum(-1)
        positions += h.shape[1]
    if positions == 0:
        raise fitting.FitError(f"no held-out chunk has more than skip={skip} tokens")
    return {"positions": positions,
            **{name: {k: (v / positions).tolist() for k, v in s.items()} for name, s in sums.items()}}


def main(argv: list[str] | None = None) -> int:
    config.prepare_process_environment()       # before nnsight is imported
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lens", default=str(config.SHIPPED_JLENS), help="lens file or HUB_REPO:FILE")
    parser.add_argument("--model", default=None, help="'embedded' (default), a hub id or a local folder")
    parser.add_argument("--corpus", action="append", default=None,
                        help="as for fitting; repeatable: each is scored on its own held-out part "
                             "(default: general and fortunes)")
    parser.add_argument("--chunks", type=int, default=20, help="held-out chunks to score")
    parser.add_argument("--tokens", type=int, default=64, help="T: tokens per chunk")
    parser.add_argument("--skip", type=int, default=16, help="leading positions not scored")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--bos", choices=("fitted", "yes", "no"), default="fitted",
                        help="BOS first in every chunk: as the lens was fitted (default; none when it does not "
                             "say), always, or never")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        engine = config.replace(config.from_args(None), model=args.model or config.EMBEDDED).engine
        model, resolved = load_hf_model(engine, device="cpu")
        layout, tokenizer = resolved.family.hf, model.tokenizer
        n_layers = resolved.info.n_layers
        lens = jlens.load(args.lens, d_model=resolved.info.d_model, n_layers=n_layers, dtype=torch.float32)
        held = {name: corpus.split_holdout(corpus.load_corpus(name))[1] for name in (args.corpus or DEFAULT_CORPORA)}
    except (fitting.FitError, corpus.CorpusError, jlens.LensFileError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, held_out in held.items():
        report(model, layout, lens, resolved.name, name, held_out[:args.chunks], tokenizer, args, n_layers)
    return 0


def report(model, layout, lens, model_name, corpus_name, chunks, tokenizer, args, n_layers) -> None:
    t0 = time.perf_counter()
    bos = args.bos == "yes" or (args.bos == "fitted" and jlens.fitted_with_bos(lens) is True)
    s = score(model, layout, lens, chunks, tokenizer, args.tokens, args.skip,
              tokenizer.bos_token_id if bos else None)
    print(f"\n{model_name}, lens {Path(args.lens).name} ({lens.n_prompts} prompts), corpus {corpus_name}: "
          f"{len(chunks)} held-out chunks, T={args.tokens}{', BOS first' if bos else ''}, "
          f"{s['positions']} positions\n")
    print("| layer | logit top-1 | J-lens top-1 | logit top-5 | J-lens top-5 | logit KL | J-lens KL |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for i in range(n_layers):
        print(f"| {i} | {s['logit']['top1'][i]:.3f} | {s['jlens']['top1'][i]:.3f} "
              f"| {s['logit']['top5'][i]:.3f} | {s['jlens']['top5'][i]:.3f} "
              f"| {s['logit']['kl'][i]:.2f} | {s['jlens']['kl'][i]:.2f} |")
    mean = {f"mean_{k}_{name}": round(sum(v[:-1]) / (n_layers - 1), 4)
            for name in ("logit", "jlens") for k, v in s[name].items()}
    upper = range(2 * n_layers // 3, n_layers - 1)
    mean.update({f"upper_top1_{name}": round(sum(s[name]["top1"][i] for i in upper) / len(upper), 4)
                 for name in ("logit", "jlens")})
    print(json.dumps({"bench": "lens_quality", "model": model_name, "lens": str(args.lens), "corpus": corpus_name,
                      "n_prompts": lens.n_prompts, "chunks": len(chunks), "T": args.tokens, "bos": bos,
                      "skip": args.skip, "positions": s["positions"], **mean,
                      "seconds": round(time.perf_counter() - t0, 1),
                      "per_layer": {name: {k: [round(x, 4) for x in v] for k, v in s[name].items()}
                                    for name in ("logit", "jlens")}}))


if __name__ == "__main__":
    sys.exit(main())
