"""A process whose app has one more lens, declared once before the app is imported: the negated logit lens
(norm(-h) unembedded). Run by tests/test_lens_kinds.py as `python declared_lens.py TINY_MODEL_DIR`; it prints
one JSON line of what each surface showed and read of that lens, and the same readout computed apart with
transformers' own model and forward hooks, for the test to compare.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from lensapp.lens_kinds import Lens, declare

NEGATED = declare(Lens("negated", "negated logit lens", "negated lens", transform=lambda h: -h))

PROMPT = "The capital of France is"
K = 3


def command_line(model: list[str]) -> dict:
    """`lensapp lens --help`, the lens read by `lensapp lens --lens negated --json`, and the logit lens's."""
    from lensapp import cli

    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), contextlib.suppress(SystemExit):
        cli.main(["lens", "--help"])
    read = io.StringIO()
    with contextlib.redirect_stdout(read):
        code = cli.main(["lens", PROMPT, "--lens", NEGATED.name, "--k", str(K), "--json", *model])
    logit = io.StringIO()
    with contextlib.redirect_stdout(logit):
        cli.main(["lens", PROMPT, "--lens", "logit", "--k", str(K), "--json", *model])
    return {"help": shown.getvalue(), "code": code, "answer": json.loads(read.getvalue()),
            "logit": json.loads(logit.getvalue())["lenses"]["logit"]}


def api(service) -> dict:
    """The /lens endpoint: its docstring (each parameter's help), and the served app's answer through
    gradio_client."""
    from gradio_client import Client
    from tiny_app import served

    from lensapp import config
    from lensapp.server import make_app
    from lensapp.service.kinds import KINDS
    from lensapp.ui.api import endpoint_function

    with served(make_app(service, config.Config.of(rate_limit=0))) as url:
        client = Client(url, verbose=False)
        endpoint = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/lens"]
        parameters = [p["parameter_name"] for p in endpoint["parameters"]]
        answer = client.predict(prompt=PROMPT, lens=NEGATED.name, k=K, api_name="/lens")
    return {"doc": endpoint_function(KINDS["lens"], service, guard=None).__doc__, "parameters": parameters,
            "answer": answer}


def tab(service) -> dict:
    """The generate tab's lens radio, and its run with the negated lens chosen."""
    import gradio as gr

    from lensapp.service.limits import RateLimiter
    from lensapp.ui import generate_tab, kept, views
    from lensapp.ui.downloads import Downloads
    from lensapp.ui.guard import Guard
    from lensapp.ui.kept import value_of

    guard = Guard(RateLimiter(0))
    view = views.TAB_VIEWS["generate"]
    with gr.Blocks() as page:
        parts = generate_tab.build_generate_tab(service, guard, Downloads(guard), view)
    kept.keep_in(page, kept.KeptResults(1 << 20))
    values = view.values_of(views.View(tab="generate", prompt=PROMPT, lens=NEGATED.name, max_tokens=1))
    generation = value_of(parts.run(values)["state"])
    return {"choices": [list(c) for c in parts.inputs["lens"].choices],
            "read": sorted(generation.steps[0].readout.lenses)}


def apart(model_dir: str, ids: list[int]) -> dict:
    """The negated lens by hand: each block's output hooked in transformers' own model, then the head of the
    final norm of -h, softmaxed: {"top_probs": [L][P][K], "probs": [L] tensors [P, vocab]}."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    streams = []
    hooks = [block.register_forward_hook(lambda _m, _i, out: streams.append(out[0] if isinstance(out, tuple)
                                                                            else out))
             for block in model.model.layers]
    with torch.no_grad():
        model(torch.tensor([ids]))
        probs = [model.lm_head(model.model.norm(-h[0])).float().softmax(-1) for h in streams]
    for hook in hooks:
        hook.remove()
    return {"top_probs": [p.topk(K).values.tolist() for p in probs], "probs": probs}


def main(model_dir: str) -> None:
    from lensapp import config
    from lensapp.service import LensService

    model = ["--model", model_dir, "--backend", "transformers", "--jlens", "none"]
    service = LensService.start(config.Config.of(model=model_dir, backend="transformers", jlens="none",
                                                 cache_entries=0, request_timeout=60))
    service.wait_ready(300)
    try:
        facts = {"cli": command_line(model), "api": api(service), "tab": tab(service)}
    finally:
        service.close()
    read = facts["cli"]["answer"]["lenses"][NEGATED.name]
    by_hand = apart(model_dir, facts["cli"]["answer"]["input_ids"])
    # The hand-made probability of each token the app put in its top-k (ties among near-uniform tokens may
    # order differently; the probabilities they carry may not).
    facts["apart"] = {"top_probs": by_hand["top_probs"],
                      "at_app_ids": [[[float(p[pos, i]) for i in ids] for pos, ids in enumerate(layer_ids)]
                                     for p, layer_ids in zip(by_hand["probs"], read["top_ids"])]}
    print(json.dumps(facts))


if __name__ == "__main__":
    main(sys.argv[1])
