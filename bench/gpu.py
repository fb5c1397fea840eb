"""The engine's lens on a GPU-sized model: the same code as the app's transformers backend, timed.

No vLLM can be installed on the GPU machine this project is lent, so this drives the engine's
TransformersModel backend (`engine/run/hf_backend.py`: the trace bodies and lens math the app runs) on a
model of Qwen3-8B's shape with random weights (the hub cannot be reached): 36 layers, d_model 4096,
vocab 151936, bf16. It measures, at 16 and 256 tokens: a plain forward; the all-layer logit lens with
top-k, entropy and KL taken on the device; the Jacobian lens on 3 layers; then 32 users' 16-token
prompts read in one batched forward against one after another; and peak device memory. With
`--shape tiny` it runs the same code on CPU in seconds (CI does, to keep it working).

    python bench/gpu.py                   # on a GPU: Qwen3-8B shape, bf16
    python bench/gpu.py --shape tiny      # anywhere
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lensapp import config  # noqa: E402

SHAPES = {
    "qwen3-8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1000},
}


def random_model(shape: str, device: str, dtype):
    """A Qwen3 of `shape` with random weights, as nnsight's TransformersModel, and a word-level tokenizer."""
    import torch
    from nnsight import TransformersModel
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    dims = SHAPES[shape]
    cfg = Qwen3Config(**dims, max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        module = Qwen3ForCausalLM(cfg).to(dtype).eval()
    words = {f"w{i}": i for i in range(dims["vocab_size"])}
    tok = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return TransformersModel(module, tokenizer=PreTrainedTokenizerFast(tokenizer_object=tok)), dims


def timed(fn, repeats: int, sync) -> tuple[float, object]:
    out = fn()                                   # warm-up
    sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    parser.add_argument("--device", default=None, help="default: cuda when there is one")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--users", type=int, default=32)
    args = parser.parse_args(argv)
    config.prepare_process_environment()
    import torch
    from residuals import read_residuals

    from lensapp.engine.run.families import FAMILIES, find
    from lensapp.engine.run.hf_backend import TransformersBackend
    from lensapp.engine.run.protocol import JStack, ModelInfo
    from lensapp.lenses import FinalDistribution, layer_readouts
    from lensapp.service import planning

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model, dims = random_model(args.shape, device, dtype)
    n, d = dims["num_hidden_layers"], dims["hidden_size"]
    info = ModelInfo(name=f"random {args.shape}", n_layers=n, d_model=d, vocab_size=dims["vocab_size"],
                     backend="transformers", device=device, dtype=str(dtype).removeprefix("torch."))
    family = next(f for f in FAMILIES if "qwen3" in f.model_types)
    backend = TransformersBackend("", info, family, model=model)
    loop = asyncio.new_event_loop()
    j_layers = [n // 3, n // 2, 2 * n // 3]
    g = torch.Generator().manual_seed(0)
    stack = torch.stack([torch.randn(d, d, generator=g) / d ** 0.5 for _ in j_layers] + [torch.eye(d)]).bfloat16()
    loop.run_until_complete(backend.install_jlens(JStack(tuple(j_layers + [n - 1]), stack)))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    results = {"shape": args.shape, "device": torch.cuda.get_device_name() if cuda else "cpu", "dtype": info.dtype}
    def forward(ids):
        with torch.no_grad():
            return model._module(torch.tensor([ids], device=device)).logits[:, -1].argmax()

    def lens(spec):
        return loop.run_until_complete(backend.run_lens(spec))

    for tokens in (16, 256):
        ids = torch.randint(0, dims["vocab_size"], (tokens,), generator=g).tolist()
        everything = planning.lens_spec(ids, list(range(n)), 5, ("logit",), n, [])
        jspec = planning.lens_spec(ids, j_layers, 5, ("jacobian",), n, j_layers + [n - 1])
        plain, _ = timed(lambda ids=ids: forward(ids), args.repeats, sync)
        lens_s, out = timed(lambda spec=everything: lens(spec), args.repeats, sync)
        jlens_s, _ = timed(lambda spec=jspec: lens(spec), args.repeats, sync)
        assert out.readouts["logit"]["top_ids"].shape == (n, tokens, 5)
        results[f"T{tokens}"] = {"plain_s": round(plain, 4), "lens_s": round(lens_s, 4),
                                 "jlens_3_layers_s": round(jlens_s, 4)}

    # Users at once: equal-length prompts in one batched forward (no padding), the same lens math on every row.
    prompts = torch.randint(0, dims["vocab_size"], (args.users, 16), generator=g, device=device)
    layout, head = backend.layout, backend.head

    def batched():
        import nnsight

        with torch.no_grad(), model.trace(prompts):
            h = read_residuals(model, layout, range(n), d)                       # [L, users * 16, d]
            norm = find(model, layout.norm)
            final = FinalDistribution.from_logits(head(model, norm(h[-1])).float())
            out = nnsight.save(layer_readouts(h, norm, lambda x: head(model, x), 5, final=final))
        return out

    def one_by_one():
        return [lens(planning.lens_spec(p.tolist(), list(range(n)), 5, ("logit",), n, [])) for p in prompts]

    together, out = timed(batched, max(1, args.repeats // 2), sync)
    assert out["top_ids"].shape == (n, args.users * 16, 5)
    alone, _ = timed(one_by_one, 1, sync)
    results["users"] = {"n": args.users, "tokens_each": 16, "batched_s": round(together, 3),
                        "one_by_one_s": round(alone, 3), "speedup": round(alone / together, 2)}
    results["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None
    print(f"{results['device']} ({results['dtype']}), {args.shape}: {n} layers, d_model {d}, "
          f"vocab {dims['vocab_size']}")
    for tokens in (16, 256):
        r = results[f"T{tokens}"]
        print(f"  T={tokens:>3}: plain {r['plain_s'] * 1e3:8.1f} ms   all-layer lens {r['lens_s'] * 1e3:8.1f} ms   "
              f"J-lens (3 layers) {r['jlens_3_layers_s'] * 1e3:8.1f} ms")
    u = results["users"]
    print(f"  {u['n']} users x 16 tokens: batched {u['batched_s']:.3f} s, one by one {u['one_by_one_s']:.3f} s "
          f"({u['speedup']}x); peak memory {results['peak_memory_gb']} GB")
    print(json.dumps({"bench": "gpu", **results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
