"""Command line: the same engine and result objects as the app.

Examples:
    python -m lensapp lens "The capital of France is" --lens both --layers 20-29 --k 5 --target Paris
    python -m lensapp lens "The capital of France is" --json > paris.json
    python -m lensapp generate "The capital of France is" --max-tokens 8 --layers 24,26,28 --json
    python -m lensapp lens "Hello" --jlens neuronpedia/jacobian-lens:qwen3-8b/jlens/Salesforce-wikitext/Qwen3-8B_jacobian_lens.pt \
        --model Qwen/Qwen3-8B
    python -m lensapp fit --corpus my_texts/ --out my_lens.pt

Bad input (unknown layers, k outside 1..100, an empty or too long prompt, a lens file that does
not fit the model) prints one line to stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys

from . import config
from .config import MAX_K, ConfigError

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lensapp", description="Read what a language model "
                                     "predicts at every layer (logit lens, Jacobian lens).")
    sub = parser.add_subparsers(dest="command", required=True)

    lens = sub.add_parser("lens", help="every layer's readout for a prompt, in one forward")
    lens.add_argument("prompt", nargs="+", help="one or more prompts (batched in one forward)")
    lens.add_argument("--lens", default="logit", choices=["logit", "jacobian", "both"], help="which lens(es)")
    lens.add_argument("--target", action="append", default=[], metavar="WORD",
                      help="score this word's probability and rank at every cell (repeatable)")
    lens.add_argument("--raw", action="store_true", help="norm(h) @ W_U.T, skipping the family's logit arithmetic")
    _common(lens)

    gen = sub.add_parser("generate", help="generate, with a readout of the newest position at every step")
    gen.add_argument("prompt", help="the prompt")
    gen.add_argument("--max-tokens", type=int, default=8, help="tokens to generate (1..64)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--seed", type=int, default=None, help="sampling seed")
    gen.add_argument("--lens", default="logit", choices=["logit", "jacobian", "both"], help="which lens(es)")
    _common(gen)

    fit = sub.add_parser("fit", help="fit a Jacobian lens on the transformers backend")
    from .fitting import add_fit_arguments

    add_fit_arguments(fit)
    return parser


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", default="all", help="all | L,L,... | A-B (negative counts from the end)")
    p.add_argument("--k", type=int, default=5, help=f"top-k per cell (1..{MAX_K})")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--json", action="store_true", help="print the result as JSON (the app's API schema)")
    config.add_arguments(p)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "fit":
        from .fitting import run_fit

        return run_fit(args)
    config.prepare_process_environment()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = config.from_args(args)
        return _run(args, cfg)
    except (ConfigError, ValueError) as e:     # RequestError and LensFileError are ValueErrors
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _run(args, cfg: config.Config) -> int:
    from .engine import Engine, GenerateRequest, LensRequest
    from .engine.requests import validate_common, validate_generate
    from .results import dumps

    # Cheap checks first, so a typo does not wait for the engine to start.
    if args.command == "lens":
        validate_common(args.prompt, args.lens, args.k, args.target)
        request = LensRequest(prompts=tuple(args.prompt), lens=args.lens, layers=args.layers, k=args.k,
                              targets=tuple(args.target), raw=args.raw, chat=args.chat)
    else:
        request = GenerateRequest(prompt=args.prompt, max_tokens=args.max_tokens, lens=args.lens, layers=args.layers,
                                  k=args.k, temperature=args.temperature, seed=args.seed, chat=args.chat)
        validate_generate(request)
    if args.lens != "logit" and cfg.resolved_jlens is None:
        raise ValueError("no Jacobian lens is configured for this model: pass --jlens PATH or HUB_REPO:FILE")
    preflight(cfg, args)

    engine = Engine.from_config(cfg)
    try:
        if args.command == "lens":
            results = engine.lens(request)
            if args.json:
                print(dumps(results[0] if len(results) == 1 else results))
            else:
                for r in results:
                    print(format_lens(r))
        else:
            result = engine.generate(request)
            print(dumps(result) if args.json else format_generation(result))
    finally:
        engine.close()
    return 0


def preflight(cfg: config.Config, args) -> None:
    """Check layers, prompt length and the lens file against the model's config and tokenizer,
    which load in a second, before vLLM spends a minute starting. Skipped where they cannot be read."""
    from transformers import AutoConfig, AutoTokenizer

    from . import jlens
    from .engine import resolve_model
    from .engine.requests import parse_layers

    path, _ = resolve_model(cfg)
    try:
        hf = AutoConfig.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
    except Exception:  # a hub id while offline: the engine will say what is wrong
        return
    n_layers = hf.num_hidden_layers
    allowed = None
    if args.lens != "logit":
        lens = jlens.load(cfg.resolved_jlens, d_model=hf.hidden_size, n_layers=n_layers, layers=cfg.jlens_layer_list,
                          cache_dir=cfg.resolved_cache_dir / "hub")
        allowed = lens.layers + [n_layers - 1]
    parse_layers(args.layers, n_layers, allowed)
    prompts = args.prompt if isinstance(args.prompt, list) else [args.prompt]
    for p in prompts:
        n = len(tok(p)["input_ids"])
        if n > cfg.max_prompt_tokens:
            raise ValueError(f"the prompt has {n} tokens; the limit is {cfg.max_prompt_tokens}")


def format_lens(r) -> str:
    """A readable summary: top-1 per layer x position, then the last position's top-k."""
    out = [f"{r.model}: {r.prompt!r} -> model's next token {r.model_next_token!r}"]
    for name in r.lenses:
        grid = r.top1_grid(name).map(repr)
        grid.columns = [repr(t) for t in r.input_tokens]
        out += [f"\n[{name} lens] top-1 per layer (rows) and input position (columns)", grid.to_string(),
                f"\n[{name} lens] top-{r.lenses[name].top_ids.shape[-1]} at the last position",
                r.top_k_table(name).to_string(index=False)]
        for t in r.lenses[name].targets:
            out.append(f"target {t.text!r} ({t.scored_as}): p at last position by layer "
                       + " ".join(f"{p:.3g}" for p in t.probs[:, -1]))
    return "\n".join(out)


def format_generation(g) -> str:
    out = [f"{g.model}: {g.prompt!r} -> {g.text!r}"]
    for name in g.steps[0].readout.lenses if g.steps else []:
        grid = g.step_grid(name).map(repr)
        grid.columns = [repr(s.token) for s in g.steps]
        out += [f"\n[{name} lens] top-1 at the newest position, per layer (rows) and step (columns)", grid.to_string()]
    return "\n".join(out)
