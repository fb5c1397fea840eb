"""How close the all-layer lens runs to the work no lens can skip.

Measured side by side in one run, on the configured model (default: the embedded one, vLLM):
  plain   a trace that reads only the model's own logits (the forward and nnsight's round trip),
          next to a bare transformers forward and the same request through vLLM without nnsight
  lens    engine.lens: every layer, top-k + entropy + KL taken in the worker, results decoded
  jlens   the same through a Jacobian-lens transport (a random J per layer if none is configured)
  floor   a trace that also sends [layers x positions, d_model] through the head with its top-k: the
          work no lens can skip (unembed = floor - plain), in the worker like the lens
  naive   a peer that ships every layer's full-vocab probabilities to the host and takes top-k there
for a short (~16 token) and a long (~256 token) prompt.
The goal is lens <= 1.3 x floor. The last line is one JSON object for comparing runs over time.

    python bench/lens_speed.py [--repeats 5] [--model ...] [--backend vllm|transformers]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lensapp import config  # noqa: E402

SHORT = "The Eiffel Tower is located in the city of Paris, which is the capital of"
LONG_PARAGRAPH = ("The history of science is the study of the development of science and scientific knowledge, "
                  "including both the natural and social sciences. Science is a body of empirical, theoretical, "
                  "and practical knowledge about the natural world, produced by scientists who emphasize the "
                  "observation, explanation, and prediction of real-world phenomena. ")


def median_time(fn, repeats: int) -> float:
    fn()                                   # warm-up (allocations, caches)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def plain_trace(backend, ids):
    import nnsight

    model = backend.model
    if hasattr(model, "vllm_entrypoint"):
        with model.trace(list(ids), temperature=0.0, max_tokens=1):
            out = nnsight.save(model.logits.argmax(-1))
    else:
        import torch

        with torch.no_grad(), model.trace(torch.tensor([ids])):
            out = nnsight.save(model.lm_head.output[0, -1].argmax(-1))
    return out


def bare_vllm(backend, ids):
    """The same request through vLLM alone, with no nnsight trace: what the engine itself costs."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = backend.model.vllm_entrypoint
    return llm.generate(TokensPrompt(prompt_token_ids=list(ids)), SamplingParams(temperature=0.0, max_tokens=1),
                        use_tqdm=False)


def naive_trace(backend, ids, n_layers, k):
    """Full-vocab probabilities of every layer shipped to the host; top-k on the host."""
    import nnsight
    import torch

    model = backend.model
    is_vllm = hasattr(model, "vllm_entrypoint")
    kwargs = {"temperature": 0.0, "max_tokens": 1} if is_vllm else {}
    inputs = list(ids) if is_vllm else torch.tensor([ids])
    with torch.no_grad(), model.trace(inputs, **kwargs):
        probs = nnsight.save([])
        for layer in model.model.layers[:n_layers]:
            h = sum(layer.output) if is_vllm else layer.output[0]
            logits = model.logits_processor(model.lm_head, model.model.norm(h)) if is_vllm else model.lm_head(model.model.norm(h))
            probs.append(logits.float().softmax(-1))
    return [p.topk(k, dim=-1) for p in probs]


def floor_trace(backend, ids, n_layers, k):
    """plain + the unembedding floor, in the worker (same process and threads as the lens): the last
    layer's residual repeated for every layer, through the model's head in ROW_CHUNK rows, with top-k."""
    import nnsight
    import torch

    from lensapp.lenses import ROW_CHUNK

    model = backend.model
    is_vllm = hasattr(model, "vllm_entrypoint")
    kwargs = {"temperature": 0.0, "max_tokens": 1} if is_vllm else {}
    inputs = list(ids) if is_vllm else torch.tensor([ids])
    with torch.no_grad(), model.trace(inputs, **kwargs):
        last = model.model.layers[n_layers - 1]
        h = sum(last.output) if is_vllm else last.output[0]
        x = model.model.norm(h).repeat(n_layers, 1)
        tops = []
        for i in range(0, x.shape[0], ROW_CHUNK):
            logits = model.logits_processor(model.lm_head, x[i:i + ROW_CHUNK]) if is_vllm else model.lm_head(x[i:i + ROW_CHUNK])
            tops.append(logits.topk(k, dim=-1).indices)
        out = nnsight.save(len(tops))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--k", type=int, default=5)
    config.add_arguments(parser)
    args = parser.parse_args(argv)
    config.prepare_process_environment()

    import torch

    from lensapp import jlens
    from lensapp.engine import Engine, LensRequest, resolve_model

    cfg = config.from_args(args)
    cfg = config.replace(cfg, jlens="none")
    model_path, _ = resolve_model(cfg)
    # The bare transformers forward is timed before the engine starts: vLLM's CPU worker keeps its
    # OpenMP threads spinning, which would slow anything else in this process.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, cfg.resolved_dtype))
    hf_model.eval()
    hf_tok = AutoTokenizer.from_pretrained(model_path)
    long_ids = hf_tok(LONG_PARAGRAPH * 8)["input_ids"][:256]
    prompts = {"short": SHORT, "long": hf_tok.decode(long_ids, skip_special_tokens=True)}
    # The faster of torch's default thread count and one thread: on small VMs two OpenMP threads
    # can be 20x slower than one for a model this small.
    hf_times = {}
    with torch.no_grad():
        for threads in sorted({torch.get_num_threads(), 1}, reverse=True):
            torch.set_num_threads(threads)
            for name, p in prompts.items():
                t = median_time(lambda: hf_model(torch.tensor([hf_tok(p)["input_ids"]])), args.repeats)
                hf_times[name] = min(t, hf_times.get(name, t))
    hf_model = None                   # free it before the engine starts
    t0 = time.perf_counter()
    engine = Engine.from_config(cfg)
    startup = time.perf_counter() - t0
    info = engine.info
    n, d = info.n_layers, info.d_model
    # A random J per layer (scaled like a transport that keeps norms): the cost, not the meaning, is measured.
    g = torch.Generator().manual_seed(0)
    J = {layer: torch.randn(d, d, generator=g) / d ** 0.5 for layer in range(n - 1)}
    engine.install_jlens(jlens.JacobianLens(J={k_: v.bfloat16() for k_, v in J.items()}, n_prompts=0, d_model=d,
                                            source="random (bench)"))

    rows, rows_where, med = [], [], {}
    for name, prompt in prompts.items():
        ids = engine.tokenize(prompt)
        T = len(ids)
        reps = args.repeats if name == "short" else max(2, args.repeats // 2)
        plain = median_time(lambda: engine.call(lambda b: plain_trace(b, ids)), reps)
        bare = median_time(lambda: engine.call(lambda b: bare_vllm(b, ids)), reps) if info.backend.startswith("vllm") else None
        hf_fwd = hf_times[name]
        lens = median_time(lambda: engine.lens(LensRequest(prompts=(prompt,), k=args.k)), reps)
        jl = median_time(lambda: engine.lens(LensRequest(prompts=(prompt,), lens="jacobian", k=args.k)), reps)
        floor = median_time(lambda: engine.call(lambda b: floor_trace(b, ids, n, args.k)), reps)
        unemb = floor - plain
        naive = median_time(lambda: engine.call(lambda b: naive_trace(b, ids, n, args.k)), reps) if name == "short" else None
        med[name] = {"tokens": T, "hf_forward_s": hf_fwd, "bare_vllm_s": bare, "plain_s": plain, "lens_s": lens, "jlens_s": jl, "unembed_s": unemb,
                     "floor_s": floor, "naive_s": naive}
        rows.append((name, T, plain, unemb, floor, lens, jl, naive))
        rows_where.append((name, T, hf_fwd, bare, plain))
    engine.close()

    print(f"\n{info.name} on {info.backend} ({info.dtype}), {n} layers, vocab {info.vocab_size}; "
          f"engine start {startup:.1f} s; medians in seconds")
    print(f"{'prompt':>6} {'tokens':>6} {'plain':>7} {'unembed':>8} {'floor':>7} {'lens':>7} {'jlens':>7} "
          f"{'naive':>7} {'lens/floor':>10} {'jlens/floor':>11}")
    for name, T, plain, unemb, floor, lens, jl, naive in rows:
        naive_s = f"{naive:7.3f}" if naive is not None else f"{'-':>7}"
        print(f"{name:>6} {T:>6} {plain:7.3f} {unemb:8.3f} {floor:7.3f} {lens:7.3f} {jl:7.3f} {naive_s} "
              f"{lens / floor:10.2f} {jl / floor:11.2f}")
    print("\nwhere a plain trace's time goes: a bare transformers forward, the same request through vLLM alone, "
          "and through an nnsight trace")
    print(f"{'prompt':>6} {'tokens':>6} {'hf fwd':>8} {'vllm':>8} {'trace':>8}")
    for name, T, hf_fwd, bare, plain in rows_where:
        bare_s = f"{bare:8.3f}" if bare is not None else f"{'-':>8}"
        print(f"{name:>6} {T:>6} {hf_fwd:8.3f} {bare_s} {plain:8.3f}")
    summary = {
        "model": info.name, "backend": info.backend, "dtype": info.dtype,
        "lens_over_floor_short": round(med["short"]["lens_s"] / med["short"]["floor_s"], 3),
        "lens_over_floor_long": round(med["long"]["lens_s"] / med["long"]["floor_s"], 3),
        "jlens_over_floor_long": round(med["long"]["jlens_s"] / med["long"]["floor_s"], 3),
        "naive_over_lens_short": round(med["short"]["naive_s"] / med["short"]["lens_s"], 3),
        "medians": {name: {k_: (round(v, 4) if isinstance(v, float) else v) for k_, v in m.items()}
                    for name, m in med.items()},
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
