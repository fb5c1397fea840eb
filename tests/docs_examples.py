"""What the docs' worked examples read on the embedded model as the app serves it (the shipped Jacobian lens, so
every prompt is read with the tokenizer's BOS first: position 0 is `<|im_start|>`), computed in one place so
tests/test_docs_examples.py can hold docs/using.md and docs/intervene.md to them. `python tests/docs_examples.py`
prints them (it starts vLLM: a minute or two on a small CPU)."""

from __future__ import annotations

import numpy as np

from lensapp.service import ComponentsRequest, DescribeRequest, GenerateRequest, InterveneRequest, LensRequest

FRANCE = "The capital of France is"
EIFFEL, COLOSSEUM = "The Eiffel Tower is in the city of", "The Colosseum is in the city of"


def tokens_of(service, prompt: str) -> list[str]:
    return service.prompts.decode.sequence(service.prompts.ids(prompt))


def branches(service) -> dict:
    """docs/using.md's branch: the generation, one branch and a branch of it (greedy, layers 20-29)."""
    def text(*force):
        g = service.generate(GenerateRequest.parse(prompt=FRANCE, max_tokens=8, layers="20-29", force=list(force)))
        return g.text, [(step, token, g.tokens[step]) for step, token in g.forced]
    plain, _ = text()
    rome, forced = text("1= Rome")
    famous, _ = text("1= Rome", "4= famous")
    return {"plain": plain, "rome": rome, "forced": forced, "famous": famous}


def decisions(service) -> dict:
    r = service.lens(LensRequest.parse(prompts=[FRANCE], lens="both", layers="20-29"))[0]
    return {"tokens": list(r.input_tokens), "logit": r.decided_at("logit"), "jacobian": r.decided_at("jacobian")}


def descriptions(service) -> dict:
    """docs/using.md's Patchscopes example: ␣Tower's position, and its state described at every layer."""
    position = tokens_of(service, EIFFEL).index(" Tower")
    every = service.describe(DescribeRequest.parse(prompt=EIFFEL, layer="all", position=position, max_tokens=4))
    return {"position": position, "texts": [d.text for d in every.items]}


def components(service) -> dict:
    """docs/using.md's worked example: Paris over Rome after "The capital of France is", and Paris alone."""
    r = service.components(ComponentsRequest.parse(prompt=FRANCE, target="Paris", foil="Rome", patterns=23))
    running = np.cumsum(r.attn + r.mlp) + r.embed
    layer, head = (int(x) for x in np.unravel_index(np.abs(r.heads).argmax(), r.heads.shape))
    looked = int(r.top_positions[layer, head, 0])
    alone = service.components(ComponentsRequest.parse(prompt=FRANCE, target="Paris"))
    inside = service.lens(LensRequest.parse(prompts=[FRANCE], layers="29", sublayers=True))[0]
    between, after = inside.after_attention["logit"], inside.lenses["logit"]
    return {"logit": r.logit, "sum": r.total, "gap": r.gap, "embed": r.embed,
            "running_before_23": float(np.abs(running[:23]).max()), "layer_23": float(r.attn[23] + r.mlp[23]),
            "attn_23": float(r.attn[23]), "head": (layer, head), "head_value": float(r.heads[layer, head]),
            "looked_at": r.input_tokens[looked], "weight": float(r.top_weights[layer, head, 0]),
            "mlp_24": float(r.mlp[24]), "mlp_26": float(r.mlp[26]), "attn_29": float(r.attn[29]),
            "mlp_29": float(r.mlp[29]), "alone": alone.logit, "alone_attn": float(alone.attn.sum()),
            "alone_mlp": float(alone.mlp.sum()),
            "after_attention": (between.top_tokens[0][-1][0], float(between.top_probs[0, -1, 0])),
            "after_mlp": (after.top_tokens[0][-1][0], float(after.top_probs[0, -1, 0]))}


def interventions(service) -> dict:
    """docs/intervene.md's worked example: steer toward Rome, ablate Paris, patch the subject's cells."""
    steer = service.intervene(InterveneRequest.parse(prompt=FRANCE, intervention="steer", word="Rome", layer="22",
                                                     alphas="0,0.1,0.2,0.4,0.8", new_tokens=6))
    paris = service.lens(LensRequest.parse(prompts=[FRANCE], targets="Paris"))[0].lenses["logit"].targets[0]
    ablate = service.intervene(InterveneRequest.parse(prompt=EIFFEL, intervention="ablate", word="Paris",
                                                      direction="jacobian", layer="20-28"))
    subject = [i for i, t in enumerate(tokens_of(service, EIFFEL)) if t in (" E", "iffel", " Tower")]
    patch = service.intervene(InterveneRequest.parse(
        prompt=COLOSSEUM, intervention="patch", source=EIFFEL, layer="6-12", targets="Paris",
        positions=f"{subject[0]}-{subject[-1]}", source_positions=f"{subject[0]}-{subject[-1]}"))
    return {"steer": [(float(p), int(k)) for p, k in steer.dose_response()[["prob", "rank"]].itertuples(index=False)],
            "paris": float(paris.probs[-1, -1]), "generated": steer.to_json()["generated"],
            "ablate": [float(p) for p in ablate.dose_response()["prob"]], "subject": subject,
            "colosseum_tokens": tokens_of(service, COLOSSEUM)[subject[0]:subject[-1] + 1],
            "patched": patch.dose_response()["prob"].tolist()}


def everything(service) -> dict:
    return {"branches": branches(service), "decisions": decisions(service), "descriptions": descriptions(service),
            "components": components(service), "interventions": interventions(service)}


if __name__ == "__main__":
    import pprint

    from conftest import start_service

    service = start_service()          # the app's defaults: the shipped lens, BOS first
    try:
        pprint.pprint(everything(service), width=120)
    finally:
        service.close()
