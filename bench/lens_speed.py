"""How close the all-layer lens runs to the work no lens can skip.

Measured side by side in one run, on one backend of the configured model (default: the embedded
one on vLLM), started here through the engine's own factory and driven on this script's event loop:
  plain   a trace that reads only the model's own logits (the forward and nnsight's round trip)
  lens    `Backend.run_lens` + the result assembled as the service does: every layer, top-k + entropy
          + KL taken in the worker, tokens decoded
  jlens   the same through a Jacobian-lens transport (a random J per layer)
  floor   a trace that also sends [layers x positions, d_model] through the head with its top-k: the
          work no lens can skip (unembed = floor - plain), in the worker like the lens
  naive   a peer that ships every layer's full-vocab probabilities to the host and takes top-k there
for a short (~16 token) and a long (~256 token) prompt. Like a notebook, the reference traces use
nnsight's model object (`backend.model`) directly. The goal is lens <= 1.2 x floor. The last line
is one JSON object for comparing runs over time.

    python bench/lens_speed.py [--repeats 7] [--model ...] [--backend vllm|transformers]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import median_time  # noqa: E402

from lensapp import config  # noqa: E402

SHORT = "The Eiffel Tower is located in the city of Paris, which is the capital of"
LONG_PARAGRAPH = ("The history of science is the study of the development of science and scientific knowledge, "
                  "including both the natural and social sciences. Science is a body of empirical, theoretical, "
                  "and practical knowledge about the natural world, produced by scientists who emphasize the "
                  "observation, explanation, and prediction of real-world phenomena. ")


class Runner:
    """Runs reference traces on a backend's nnsight model, on either backend, returning saved values."""

    def __init__(self, backend, loop):
        self.backend, self.loop = backend, loop
        self.vllm = hasattr(backend.model, "vllm_entrypoint")

    def trace(self, ids, body, *args):
        """body(model, *args) runs inside a trace of `ids` (on vLLM: in the worker, so body and args must
        pickle: module-level functions and plain values) and returns what to save."""
        import nnsight
        import torch

        model = self.backend.model
        if self.vllm:
            with model.trace(list(ids), temperature=0.0, max_tokens=1, edits=[]) as tracer:
                out = nnsight.save(body(model, *args))        # noqa: F841 - read back from the output's saves
            return self.loop.run_until_complete(_saves(tracer))["out"]
        with torch.no_grad(), model.trace(torch.tensor([ids])):
            out = nnsight.save(body(model, *args))
        return out


def plain_body(model, layout):
    """Only the model's own next token: the forward and nnsight's round trip."""
    from lensapp.engine.run.families import find

    return model.logits.argmax(-1) if hasattr(model, "logits_processor") else find(model, layout.head).output.argmax(-1)


def floor_body(model, layout, head, n, d, k):
    """The last layer's residual repeated for every layer, through the head in ROW_CHUNK rows, with top-k."""
    from residuals import read_residuals

    from lensapp.engine.run.families import final_norm
    from lensapp.lenses import ROW_CHUNK

    x = final_norm(model, layout)(read_residuals(model, layout, [n - 1], d)[0]).repeat(n, 1)
    return len([head(model, x[i:i + ROW_CHUNK]).topk(k, dim=-1).indices for i in range(0, len(x), ROW_CHUNK)])


def naive_body(model, layout, head, n, d):
    """Every layer's full-vocab probabilities, shipped to the host."""
    from residuals import read_residuals

    from lensapp.engine.run.families import final_norm

    h = read_residuals(model, layout, range(n), d)
    return [head(model, final_norm(model, layout)(h[i])).float().softmax(-1) for i in range(n)]


async def _saves(tracer):
    return (await tracer.backend).saves



def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--k", type=int, default=5)
    config.add_arguments(parser, ("model", "backend", "device", "dtype", "cache_dir"))
    args = parser.parse_args(argv)
    config.prepare_process_environment()

    import torch

    from lensapp.engine.run.protocol import JStack
    from lensapp.engine.start.backend_kinds import kind_of
    from lensapp.engine.start.loading import backend_factory, describe_model
    from lensapp.results import LensResult
    from lensapp.service import planning
    from lensapp.service.prompts import Prompts, load_tokenizer
    from lensapp.service.service import warm_up

    cfg = config.from_args(args)
    model = describe_model(cfg.engine, cfg.limits, cfg.remote)
    info, layout = model.info, kind_of(model.info).layout(model.family)
    prompts = Prompts(load_tokenizer(model.path), model.max_prompt_tokens)
    long_ids = prompts.tokenizer(LONG_PARAGRAPH * 8)["input_ids"][:256]
    texts = {"short": SHORT, "long": prompts.tokenizer.decode(long_ids, skip_special_tokens=True)}
    loop = asyncio.new_event_loop()
    t0 = time.perf_counter()
    backend = backend_factory(model, cfg.engine, cfg.limits, cfg.remote, cfg.secrets.engine_key)()
    loop.run_until_complete(warm_up(prompts, info, backend))
    startup = time.perf_counter() - t0
    n, d = info.n_layers, info.d_model
    # A random J per layer (scaled like a transport that keeps norms): the cost, not the meaning, is measured.
    g = torch.Generator().manual_seed(0)
    J = torch.stack([torch.randn(d, d, generator=g) / d ** 0.5 for _ in range(n)]).bfloat16()
    loop.run_until_complete(backend.install_jlens(JStack(tuple(range(n)), J)))
    runner = Runner(backend, loop)
    head = backend.head                  # the backend's unembedding, with the family's logit arithmetic

    def lens(ids, lenses):
        spec = planning.lens_spec(ids, list(range(n)), args.k, lenses, n, list(range(n)))
        out = loop.run_until_complete(backend.run_lens(spec))
        return LensResult.from_output(out, prompt="", ids=ids, layers=list(range(n)), decode=prompts.decode)

    def measure(ids, reps, naive) -> dict:
        m = {"tokens": len(ids),
             "plain_s": median_time(lambda: runner.trace(ids, plain_body, layout), reps),
             "lens_s": median_time(lambda: lens(ids, ("logit",)), reps),
             "jlens_s": median_time(lambda: lens(ids, ("jacobian",)), reps),
             "floor_s": median_time(lambda: runner.trace(ids, floor_body, layout, head, n, d, args.k), reps)}
        if naive:
            m["naive_s"] = median_time(lambda: [p.topk(args.k, dim=-1)
                                                for p in runner.trace(ids, naive_body, layout, head, n, d)], reps)
        m["unembed_s"] = m["floor_s"] - m["plain_s"]
        return m

    med, rows = {}, []
    for name, text in texts.items():
        med[name] = m = measure(prompts.ids(text), args.repeats if name == "short" else max(3, args.repeats // 2),
                                naive=name == "short")
        rows.append((name, m))
    backend.close()

    print(f"\n{info.name} on {info.backend} ({info.dtype}), {n} layers, vocab {info.vocab_size}; "
          f"backend start + warm-up {startup:.1f} s; medians in seconds")
    print(f"{'prompt':>6} {'tokens':>6} {'plain':>7} {'unembed':>8} {'floor':>7} {'lens':>7} {'jlens':>7} "
          f"{'naive':>7} {'lens/floor':>10} {'jlens/floor':>11}")
    for name, m in rows:
        naive_s = f"{m['naive_s']:7.3f}" if "naive_s" in m else f"{'-':>7}"
        print(f"{name:>6} {m['tokens']:>6} {m['plain_s']:7.3f} {m['unembed_s']:8.3f} {m['floor_s']:7.3f} "
              f"{m['lens_s']:7.3f} {m['jlens_s']:7.3f} {naive_s} {m['lens_s'] / m['floor_s']:10.2f} "
              f"{m['jlens_s'] / m['floor_s']:11.2f}")
    summary = {
        "bench": "lens_speed", "model": info.name, "backend": info.backend, "dtype": info.dtype,
        **{f"lens_over_floor_{k}": round(m["lens_s"] / m["floor_s"], 3) for k, m in med.items()},
        **{f"jlens_over_floor_{k}": round(m["jlens_s"] / m["floor_s"], 3) for k, m in med.items()},
        "naive_over_lens_short": round(med["short"]["naive_s"] / med["short"]["lens_s"], 3),
        "medians": {k: {f: (round(v, 4) if isinstance(v, float) else v) for f, v in m.items()} for k, m in med.items()},
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
