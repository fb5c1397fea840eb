"""Sample a general-English corpus from the model itself: the shipped lens's fit text, no download needed.

    python scripts/sample_corpus.py --out lensapp/assets/corpus/smollm2_samples.txt [--seeds 4] [--max-tokens 320]

Each request (a writing task from `TASKS`, across genres: stories, letters, explanations, lists,
recipes, news, dialogue, history, advice) is sent through the tokenizer's chat template and answered
by the model with seeded sampling (temperature 0.8, top-p 0.95), one sample per (task, seed). The
replies, separated by blank lines, are the corpus; `<out>.json` beside it records how it was made.
No readout is needed, so the requests go straight to the engine's vLLM, past nnsight.
Text the model writes is its own distribution of English: fitting a lens on it needs no hub and
no download can break it. The quality bench scores the lens on English written elsewhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lensapp import config  # noqa: E402

SUBJECTS = [
    "a lighthouse keeper", "a lost dog", "the first day of school", "a storm at sea", "a small bakery",
    "an old bridge", "a chess tournament", "a rainy afternoon", "a mountain village", "a broken clock",
    "a train journey", "a family dinner", "a garden in spring", "a library at night", "a fishing trip",
    "a new neighbour", "a forgotten letter", "a city market", "a winter festival", "a school play",
]
TOPICS = [
    "how rainbows form", "why the sky is blue", "how bread rises", "how vaccines work", "the water cycle",
    "how a bill becomes law", "why leaves change colour in autumn", "how bees make honey", "the history of the bicycle",
    "the Roman Empire", "the printing press", "the causes of the First World War", "how the heart pumps blood",
    "what inflation is", "how airplanes fly", "the life of Marie Curie", "the moon landing", "how volcanoes erupt",
    "the invention of the telephone", "why we sleep", "how glaciers move", "the Silk Road", "photosynthesis",
    "the history of tea", "how a compass works", "the Great Wall of China", "how money is printed",
    "the French Revolution", "how to read a map", "what an election is",
]
TASKS = (
    [f"Write a short story about {s}." for s in SUBJECTS]
    + [f"Explain {t} to a curious twelve-year-old." for t in TOPICS]
    + [f"Write a short encyclopedia entry on {t}." for t in TOPICS[:20]]
    + [f"Write a friendly letter to a friend about {s}." for s in SUBJECTS[:12]]
    + [f"Write a news report about {s}." for s in SUBJECTS[8:20]]
    + [
        "List ten tips for staying healthy in winter, with a sentence on each.",
        "Give a recipe for vegetable soup, with ingredients and steps.",
        "Describe your ideal weekend.", "Write a dialogue between a teacher and a student about homework.",
        "Describe the four seasons in a temperate country.", "Give advice to someone starting their first job.",
        "Write a product review of a pair of walking boots.", "Describe a busy railway station in the morning.",
        "Explain the rules of football.", "Write a speech for a school graduation.",
        "Describe how to plant a tree.", "Write a diary entry from a sailor in 1850.",
        "Compare cats and dogs as pets.", "Explain the difference between weather and climate.",
        "Write a poem about the sea, then explain what it means.", "Describe the city of Paris to a visitor.",
        "Give five common English idioms and explain each.", "Write a short biography of William Shakespeare.",
        "Explain how to make a cup of tea.", "Describe a traditional wedding.",
    ]
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="text file to write")
    parser.add_argument("--seeds", type=int, default=4, help="samples per task (seeds 0..N-1)")
    parser.add_argument("--max-tokens", type=int, default=320)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=0.95)
    config.add_arguments(parser, ("model", "device", "dtype", "cache_dir"))
    args = parser.parse_args(argv)
    config.prepare_process_environment()
    cfg = config.from_args(args).engine

    import vllm
    from vllm import SamplingParams

    from lensapp.engine import resolve_model

    path, name = resolve_model(cfg)
    # The engine's vLLM (on CPU: its worker adapter, whose seeded sampling survives batching), synchronous here.
    on_cpu = config.resolve_device(cfg) == "cpu"
    if on_cpu:
        from lensapp.engine.start.vllm_cpu import CPUVLLM as VLLM
    else:
        from nnsight.modeling.vllm import VLLM
    # On CPU an explicit KV cache (1 GB): a share of the node's memory can come to nothing (engine/start/memory.py).
    memory = {"kv_cache_memory_bytes": 1 << 30} if on_cpu else {"gpu_memory_utilization": 0.85}
    model = VLLM(path, dispatch=True, dtype=config.resolve_dtype(cfg), max_model_len=1024, enable_prefix_caching=False,
                 **memory)
    llm, tok = model.vllm_entrypoint, model.tokenizer
    prompts, params = [], []
    for seed in range(args.seeds):
        for task in TASKS:
            ids = tok.apply_chat_template([{"role": "user", "content": task}], add_generation_prompt=True,
                                          tokenize=True)
            prompts.append({"prompt_token_ids": list(ids["input_ids"] if hasattr(ids, "keys") else ids)})
            params.append(SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                                         seed=seed * 100_003 + len(prompts)))
    try:
        outs = llm.generate(prompts, params)
    finally:
        llm.llm_engine.engine_core.shutdown()
    texts = [o.outputs[0].text.strip() for o in outs]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n\n".join(t for t in texts if t) + "\n", encoding="utf-8")
    n_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    about = {"model": name, "made_by": "scripts/sample_corpus.py", "tasks": len(TASKS), "seeds": args.seeds,
             "template": "chat", "temperature": args.temperature, "top_p": args.top_p,
             "max_tokens": args.max_tokens, "replies": len(texts), "tokens": n_tokens,
             "vllm": vllm.__version__, "seed_rule": "seed * 100003 + request number (1-based)"}
    out.with_suffix(".json").write_text(json.dumps(about, indent=1) + "\n", encoding="utf-8")
    print(f"{out}: {len(texts)} replies, {n_tokens} tokens, {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
