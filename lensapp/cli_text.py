"""The command line's text: each result as `lensapp lens | generate | intervene | components | describe |
evaluate` print it without `--json` (which prints the API's schema instead)."""

from __future__ import annotations


def format_evaluation(r) -> str:
    """Per lens: the "some layer" rates and the best bands, then hit@1 and hit@10 per layer."""
    out = [f"{r.model}: {r.n_items} {r.split} items of {r.items}; an item hits at a layer when its intermediate's "
           "first token is within the lens's top k at the prompt's last position",
           r.summary().to_string(index=False, float_format=lambda x: f"{x:.3f}"),
           "\nper layer (the intermediate's hit rate, the target's, the target's median rank):",
           r.frame().to_string(index=False, float_format=lambda x: f"{x:.3f}")]
    return "\n".join(out)


def format_lens(r) -> str:
    """A readable summary: top-1 per layer x position, then the last position's top-k."""
    out = [f"{r.model}: {r.prompt!r} -> model's next token {r.model_next_token!r}"]
    for name in r.lenses:
        grid = r.top1_grid(name).map(repr)
        grid.columns = [repr(t) for t in r.input_tokens]
        out += [f"\n[{name} lens] top-1 per layer (rows) and input position (columns)", grid.to_string(),
                *_display_grid(r, name),
                f"\n[{name} lens] top-{r.lenses[name].top_ids.shape[-1]} at the last position",
                r.top_k_table(name).to_string(index=False)]
        for t in r.lenses[name].targets:
            out.append(f"target {t.text!r} ({t.scored_as}): p at last position by layer "
                       + " ".join(f"{p:.3g}" for p in t.probs[:, -1]))
        strip = r.decided_json(name)
        out.append(f"[{name} lens] decided at (the first layer from which each position's final top-1 stays the "
                   "top-1): " + ", ".join(f"{tok!r}: {'never' if layer is None else layer}"
                                          for tok, layer in zip(strip["decided_tokens"], strip["decided_at"])))
    return "\n".join(out)


def _display_grid(r, name: str) -> list[str]:
    """With --skip-punctuation: the token each cell shows, and its rank where it is not the top-1."""
    readout = r.lenses[name]
    if readout.display_ranks is None:
        return []
    grid = r.display_grid(name)
    grid.columns = [repr(t) for t in r.input_tokens]
    return [f"\n[{name} lens] skipping punctuation: the best word per cell (#rank where it is not the top-1; "
            f"'(none)': no word in the top {readout.searched})", grid.to_string()]


def format_intervention(r) -> str:
    """What was done, the word's final probability before and after each change, and what was generated."""
    what = ", ".join(f"{k}={v}" for k, v in r.intervention.to_json().items() if v not in (None, "", []))
    out = [f"{r.before.model}: {r.before.prompt!r}", f"intervention: {what}",
           f"model's next token before: {r.before.model_next_token!r}; after: "
           + ", ".join(f"{label} {a.model_next_token!r}" for label, a in zip(r.labels, r.after))]
    if r.word is not None:
        out += [f"\nP({r.word!r}) at the last position, the model's output:", r.dose_response().to_string(index=False)]
    if r.generated_after:
        out += [f"\ngenerated before (seed {r.seed}): {r.generated_before!r}"]
        out += [f"generated with {label}: {text!r}" for label, text in zip(r.labels, r.generated_after)]
    return "\n".join(out)


def format_components(r) -> str:
    """The logit and its parts by layer, the heads that wrote most, and a pattern's row when asked."""
    where = f"after {r.input_tokens[r.position]!r} (position {r.position})"
    out = [f"{r.model}: {r.prompt!r}", f"{r.what} {where} = {r.logit:.4f}; the parts sum to {r.total:.4f} "
           f"(embedding {r.embed:.4f}, norm bias {r.bias:.4f})",
           "\ndirect effect on it by layer (attention, MLP, running total):",
           r.layer_frame().round(4).to_string(index=False)]
    heads = r.heads_frame().reindex(r.heads_frame()["value"].abs().sort_values(ascending=False).index).head(8)
    out += ["\nthe heads with the largest direct effect (and where they look from the position):",
            heads.round(4).to_string(index=False)]
    if r.pattern is not None:
        row = r.pattern_row()
        out += [f"\nlayer {r.patterns_layer}'s attention from position {r.position}, per head (key: weight):"]
        out += [f"head {h}: " + "  ".join(f"{k}:{r.input_tokens[k]!r} {w:.3f}" for k, w in enumerate(weights))
                for h, weights in enumerate(row)]
    return "\n".join(out)


def format_generation(g) -> str:
    out = [f"{g.model}: {g.prompt!r} -> {g.text!r}"]
    out += [f"forced at step {step}: {g.tokens[step]!r} (#{token})" for step, token in g.forced]
    for name in g.steps[0].readout.lenses if g.steps else []:
        grid = g.step_grid(name).map(repr)
        grid.columns = [repr(s.token) for s in g.steps]
        out += [f"\n[{name} lens] top-1 at the newest position, per layer (rows) and step (columns)", grid.to_string()]
        decided = ", ".join(f"{tok!r}: {'never' if layer is None else layer}"
                            for tok, layer in zip(g.tokens, g.decided_at(name)))
        out.append(f"[{name} lens] decided at (the first layer from which each token stays the top-1): {decided}")
    return "\n".join(out)


def format_descriptions(d) -> str:
    first = d.items[0]
    out = [f"{first.model}: {first.prompt!r}, position {first.position} ({first.source_token!r}), described through "
           f"{first.inspection_prompt!r}:"]
    out += [f"  layer {x.layer:>3} (into layer {x.inspect_layer}): {x.text!r}" for x in d.items]
    return "\n".join(out)
