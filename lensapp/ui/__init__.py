"""The Gradio app: logit lens, Jacobian lens and generation tabs over one `LensService`.

`build_app(service, cfg)` builds the Blocks (nothing is built at import); the server mounts it with
`CSS` and `HEAD`. Each tab lives in its own module and hands back `TabParts`; this module wires what
spans tabs: the share-this-view link (kept in the URL as inputs change), restoring a view from a link
on page load (or, without one, drawing every tab's example: `front.py`), the engine status line, and
the API endpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import gradio as gr

from ..service.limits import RateLimiter
from ..service.usage import Usage, not_counted
from ..workshop import Workshop
from . import notes, permalinks, status
from .api import register_api
from .compare_tab import build_compare_tab
from .downloads import Downloads
from .exercises import build_exercise_panel, check_links, question_outputs
from .front import FRONT, FrontPage
from .generate_tab import build_generate_tab
from .guard import Guard
from .intervene_tab import build_intervene_tab
from .lens_tab import JACOBIAN_TAB, LOGIT_TAB, build_lens_tab
from .prefetch import LinkPrefetch
from .tabs import PRIVATE, TabParts, md_text

CSS = """
.lens-plot .altair { overflow-x: auto; justify-content: flex-start !important; align-items: flex-start !important; }
.lens-plot .altair > div { flex: none; }
#link-notice, .lens-warning, #engine-status { border-left: 4px solid #e69f00; padding-left: 0.75em; }
#link-note { border-left: 4px solid #0072b2; padding-left: 0.75em; }
.grid-table table { border-collapse: collapse; font-size: 0.85em; }
.grid-table th, .grid-table td { border: 1px solid var(--border-color-primary); padding: 2px 6px; white-space: nowrap; }
#permalink textarea, #permalink input { font-family: var(--font-mono); font-size: 0.85em; }
.lens-readout { display: flex; flex-wrap: wrap; gap: 4px; }
.lens-tok { display: inline-block; border: 1px solid var(--border-color-primary); border-radius: 4px;
            padding: 0 4px; }
.lens-tok summary { list-style: none; cursor: pointer; display: flex; flex-direction: column; align-items: center; }
.lens-tok summary::-webkit-details-marker { display: none; }
.lens-tok .gen { font-family: var(--font-mono); }
.lens-tok .top1 { font-size: 0.75em; opacity: 0.75; }
.lens-tok .topk { font-size: 0.75em; display: block; }
#exercise-question { border-left: 4px solid #56b4e9; padding-left: 0.75em; }
/* A phone (390 px): rows and Gradio's groups of form fields wrap to the width (tests/test_first_visit.py
   checks that no control lies outside it); nothing scrolls sideways but a chart inside its own box. */
@media (max-width: 640px) {
  .gradio-container { padding-left: 4px !important; padding-right: 4px !important; }
  .gradio-container .row, .gradio-container .form { flex-wrap: wrap !important; }
  .gradio-container .row > *, .gradio-container .form > .block { flex: 1 1 100% !important; min-width: 0 !important; }
  .lens-plot, .lens-plot .altair { max-width: 100%; }
}
"""

# history.replaceState keeps the address bar equal to the view; returns the full link for the link box.
JS_SET_URL = """(q) => {
  if (!q) { return ""; }
  const url = location.origin + location.pathname + "?" + q;
  history.replaceState(history.state, "", url);
  return url;
}"""
JS_COPY_LINK = """() => { if (navigator.clipboard) { navigator.clipboard.writeText(location.href); } }"""
# The link the page was opened with, kept before any component mounts: Gradio sends each event with
# the address bar as it is *then*, and a change event fired on mount may already have rewritten it
# (JS_SET_URL) by the time the load event asks for the link to restore.
HEAD = "<script>window.lensOpenedWith = window.location.search;</script>"
JS_OPENED_WITH = "() => (window.lensOpenedWith ?? window.location.search)"


@dataclass
class UI:
    """What `build_ui` made: the Blocks, each tab's parts by its link name, and the page-load restore (the
    handlers the app's events call, so tests can drive them as the page does)."""

    demo: gr.Blocks
    tabs: dict[str, TabParts]
    restore: Callable
    front: FrontPage


def build_app(service, cfg, workshop: Workshop | None = None) -> gr.Blocks:
    return build_ui(service, cfg, workshop).demo


def build_ui(service, cfg, workshop: Workshop | None = None, usage: Usage | None = None) -> UI:
    """The app; with a workshop, its title, only its tabs and its Exercises panel (openings counted in `usage`)."""
    info = service.info
    guard = Guard(RateLimiter(cfg.rate_limit), cfg.resolved_trusted_proxies)
    downloads = Downloads(guard)
    shown = workshop.tabs if workshop is not None else permalinks.TABS
    page_title = f"{workshop.title} · Lens Explorer" if workshop is not None else "Lens Explorer"
    with gr.Blocks(title=page_title, delete_cache=(Downloads.KEEP_SECONDS, Downloads.KEEP_SECONDS)) as demo:
        heading = f"# {md_text(workshop.title)}\nLens Explorer · " if workshop is not None else "# Lens Explorer\n"
        gr.Markdown(heading + _header(service), elem_id="header")
        health = service.health()
        banner = gr.Markdown(status.status_line(health), visible=bool(status.status_line(health)),
                             elem_id="engine-status")
        panel = build_exercise_panel(workshop) if workshop is not None else None
        notice = gr.Markdown(visible=False, elem_id="link-notice")
        note_view = gr.Markdown(visible=False, elem_id="link-note")
        title, note = notes.note_boxes()            # placed by the link below; the lens tabs read the note
        with gr.Tabs(selected=shown[0], elem_id="tabs") as tabs:
            parts = [build_lens_tab(LOGIT_TAB, service, guard, downloads, note),
                     build_lens_tab(JACOBIAN_TAB, service, guard, downloads, note),
                     build_generate_tab(service, guard, downloads),
                     build_compare_tab(service, guard, downloads),
                     build_intervene_tab(service, guard, downloads)]
        for p, tab in zip(parts, tabs.children):
            tab.visible = p.name in shown
        with gr.Row():
            link = gr.Textbox(label="Link to this view (inputs are kept in the address bar)", interactive=False,
                              scale=6, elem_id="permalink",
                              placeholder="Run or edit an input: the link that reproduces it appears here")
            copy = gr.Button("Copy link", scale=1, min_width=120, size="sm", elem_id="copy-link")
        with gr.Row():
            title.render()
            note.render()
        query = gr.Textbox(visible=False, elem_id="permalink-query")
        pending = gr.State("")
        register_api(service, guard)

        buttons = [p.run_button for p in parts if p.run_button is not None]

        def poll():
            h = service.health()
            line = status.status_line(h)
            return [gr.Markdown(line, visible=bool(line))] + [gr.Button(interactive=status.is_ready(h))] * len(buttons)

        gr.Timer(status.POLL_SECONDS).tick(poll, None, [banner] + buttons, queue=False, **PRIVATE)

        by_name = {p.name: p for p in parts}
        for p in parts:
            if not p.fields:
                continue
            comps = list(p.fields.values()) + [title, note]
            triggers = [c.change for c in comps] + [p.run_button.click]
            gr.on(triggers, _query_fn(p), comps, query, queue=False, trigger_mode="always_last", **PRIVATE)
        for p, tab in zip(parts, tabs.children):
            if p.fields:
                tab.select(_query_fn(p), list(p.fields.values()) + [title, note], query, queue=False, **PRIVATE)
        query.change(None, query, link, js=JS_SET_URL, **PRIVATE)
        gr.on([title.change, note.change], notes.shown, [title, note], note_view, queue=False, **PRIVATE)
        copy.click(None, None, None, js=JS_COPY_LINK, **PRIVATE).then(
            lambda: gr.Info("Link copied to the clipboard."), None, None, queue=False, **PRIVATE)

        def restore(opened_with: str | None):
            if not (opened_with or "").lstrip("?"):
                return {pending: FRONT}
            view, notices = permalinks.decode(opened_with, n_layers=info.n_layers, jlens_layers=service.jlens_layers)
            if view.tab not in shown:
                notices.append(f"This workshop does not show the {view.tab} tab; showing its first one instead.")
                view = permalinks.View(tab=shown[0])
            target = by_name[view.tab]
            if not target.fields:                      # a Jacobian link on an app without a J lens
                notices.append("This app has no Jacobian lens loaded; showing the logit lens instead.")
                view = replace(view, tab="logit", layers="all")
                target = by_name["logit"]
            if service.jlens is None and view.lens != "logit":   # a generation link reading the J-lens
                notices.append("This app has no Jacobian lens loaded; reading the logit lens instead.")
                view = replace(view, lens="logit")
            out = {tabs: gr.Tabs(selected=view.tab), pending: view.tab}
            out.update(dict(zip(target.fields.values(), target.values(view))))
            out[notice] = gr.Markdown("\n".join(f"- {md_text(n)}" for n in notices), visible=bool(notices))
            out.update({title: view.title, note: view.note, note_view: notes.shown(view.title, view.note)})
            return out

        all_fields = [c for p in parts for c in p.fields.values()]
        runnable = [p for p in parts if p.run is not None and p.name in shown]

        def then_run(event):
            for p in runnable:
                event = event.then(_run_if(p, service), [pending] + p.run_inputs, p.outputs, **PRIVATE)

        restored = [tabs, pending, notice, title, note, note_view] + all_fields
        then_run(demo.load(restore, query, restored, js=JS_OPENED_WITH, **PRIVATE))
        for i, button in enumerate(panel.buttons if panel is not None else []):
            then_run(button.click(_open_exercise(workshop, panel, i, restore, usage), None,
                                  restored + panel.outputs, **PRIVATE))
    return UI(demo, by_name, restore, FrontPage(service, runnable))


def _open_exercise(workshop: Workshop, panel, index: int, restore: Callable, usage: Usage | None):
    """Exercise `index`: its link restored as the page restores one, its question shown, the opening counted."""
    def open_exercise():
        if usage is not None:
            usage.exercise(index)
        return {**restore(workshop.exercises[index].query), **question_outputs(panel, workshop, index)}
    return open_exercise


def _query_fn(p: TabParts):
    """The link of the tab's inputs, then the link's title and note."""
    def make_query(*values):
        return permalinks.query_string(notes.with_notes(p.to_view(*values[:-2]), *values[-2:]))
    return make_query


def _run_if(p: TabParts, service):
    """The tab's readout, when the link being restored is for this tab or the page opened without one. The
    front page's examples leave the tab's inputs as they are: an input set by a tab the visitor is not on
    would rewrite the address bar to that tab's link (a generation's seed)."""
    inputs = {id(c) for c in p.fields.values()}
    is_input = [id(c) in inputs for c in p.outputs]

    def run(pending, *values, request: gr.Request = None):
        if pending not in (p.name, FRONT):
            return tuple(gr.skip() for _ in p.outputs)
        if pending != FRONT:
            return p.run(*values, request=request)
        if service.health().get("state") == "down":   # the status line says so once, not a failure per tab
            return tuple(gr.skip() for _ in p.outputs)
        with not_counted():                      # the example every visit draws: nobody's choice, not counted
            out = p.run(*values, request=request)
        return tuple(gr.skip() if skip else o for o, skip in zip(out, is_input))
    return run


def _header(service) -> str:
    info = service.info
    lens = "no Jacobian lens"
    if service.jlens is not None:
        lens = f"Jacobian lens on {len(service.jlens.layers)} layers ({md_text(service.jlens.describe()['source'])})"
    return (f"Model **{md_text(info.name)}** · {info.n_layers} layers · d_model {info.d_model} · "
            f"{md_text(info.backend)} ({info.dtype}) · {lens}")


__all__ = ["CSS", "HEAD", "UI", "LinkPrefetch", "build_app", "build_ui", "check_links"]
