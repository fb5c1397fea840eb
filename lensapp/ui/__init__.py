"""The Gradio app: logit lens, Jacobian lens, generation, comparison and intervention tabs over one `LensService`.

`build_app(service, web, limits)` builds the Blocks (nothing is built at import); the server mounts it with
`CSS` and `HEAD`. Each tab lives in its own module and hands back `TabParts` (its inputs and outputs by
name); this module wires what spans tabs, by those names: the share-this-view link (kept in the URL as
inputs change), restoring a view from a link on page load (or, without one, drawing every tab's example:
`front.py`), the engine status line, and the API endpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import gradio as gr

from ..config import LimitSettings, WebSettings, resolve_trusted_proxies
from ..lens_kinds import LOGIT
from ..service.limits import RateLimiter
from ..service.usage import Usage
from ..workshop import Workshop
from . import event_stream, first_view, kept, notes, permalinks, sessions, status
from .api import register_api
from .compare_tab import build_compare_tab
from .components_tab import build_components_tab
from .downloads import Downloads
from .exercises import build_exercise_panel, check_links, check_words, question_outputs
from .form import has_lens
from .front import FRONT, FrontPage
from .generate_tab import build_generate_tab
from .guard import Guard
from .intervene_tab import build_intervene_tab
from .kept import KeptResults
from .landing import load_page, run_pending
from .lens_tab import JACOBIAN_TAB, LOGIT_TAB, build_lens_tab
from .prefetch import LinkPrefetch
from .tabs import PRIVATE, Components, TabParts, md_text, on, show_progress_on_pictures
from .views import View

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
.model-line p { font-size: 0.85em; opacity: 0.8; margin: 0; }
#exercise-question { border-left: 4px solid #56b4e9; padding-left: 0.75em; }
/* A failed run (a bad input: its one line is the toast) leaves Gradio's "Error" pill on the picture, whose veil was
   opaque and hid the picture it had: the veil is clear, so the last picture stays in view, and its cells answer. */
[data-testid="status-tracker"]:has(> .clear-status) { background: transparent !important; pointer-events: none; }
[data-testid="status-tracker"] > .clear-status { pointer-events: auto; }
/* A phone (390 px): every field of a row, or of Gradio's group of form fields, takes the whole width, one under
   another (tests/test_first_minute.py checks that none is squeezed); nothing scrolls sideways but a chart inside
   its own box. Gradio prefixes these rules with its container's classes, so they name only what lies inside. */
@media (max-width: 640px) {
  .row, .form { flex-wrap: wrap !important; }
  .row > *, .form > .block { flex: 1 1 100% !important; min-width: 0 !important; }
  .lens-plot, .lens-plot .altair { max-width: 100%; }
}
""" + first_view.CSS

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
HEAD = "<script>window.lensOpenedWith = window.location.search;</script>" + first_view.head()
JS_OPENED_WITH = "() => (window.lensOpenedWith ?? window.location.search)"


@dataclass
class UI:
    """What `build_ui` made: the Blocks, each tab's parts by its link name, the page-load restore, the front
    page's examples, the guard every handler goes through (tests call the handlers as the page does) and the
    store the pages keep their results in."""

    demo: gr.Blocks
    tabs: dict[str, TabParts]
    restore: Callable
    front: FrontPage
    guard: Guard
    kept: KeptResults


def build_app(service, web: WebSettings, limits: LimitSettings, workshop: Workshop | None = None) -> gr.Blocks:
    return build_ui(service, web, limits, workshop).demo


def build_ui(service, web: WebSettings, limits: LimitSettings, workshop: Workshop | None = None,
             usage: Usage | None = None) -> UI:
    """The app; with a workshop, its title, only its tabs and its Exercises panel (openings counted in `usage`).
    `web`: what the pages keep and who their visitors are; `limits`: the guard's rate limits."""
    guard = Guard(RateLimiter.of(limits), resolve_trusted_proxies(web))
    downloads = Downloads(guard)
    kept_results = KeptResults(web.session_mb << 20)
    shown = workshop.tabs if workshop is not None else permalinks.TABS
    page_title = f"{workshop.title} · Lens Explorer" if workshop is not None else "Lens Explorer"
    with gr.Blocks(title=page_title, delete_cache=(Downloads.KEEP_SECONDS, Downloads.KEEP_SECONDS)) as demo:
        page = _top(service, workshop)
        panel = build_exercise_panel(workshop) if workshop is not None else None
        page["notice"] = gr.Markdown(visible=False, elem_id="link-notice")
        page["note_view"] = gr.Markdown(visible=False, elem_id="link-note")
        page["title"], page["note"] = notes.note_boxes()   # placed by the link below; the lens tabs read the note
        with gr.Tabs(selected=landing_tab(service, shown, workshop), elem_id="tabs") as page["tabs"]:
            parts = {p.name: p for p in (build_lens_tab(LOGIT_TAB, service, guard, downloads, page["note"]),
                                         build_lens_tab(JACOBIAN_TAB, service, guard, downloads, page["note"]),
                                         build_generate_tab(service, guard, downloads),
                                         build_compare_tab(service, guard, downloads),
                                         build_intervene_tab(service, guard, downloads),
                                         build_components_tab(service, guard, downloads))}
        for tab in page["tabs"].children:
            tab.visible = tab.id in shown
        page.update(_link_row(page["title"], page["note"]))
        register_api(service, guard, web)
        status.wire(service, page["banner"], parts)
        _wire_links(parts, page)

        def restore(opened_with: str | None):
            return restored(page, parts, service, shown, opened_with)

        # The tab the page lands on draws its example first (front.py).
        runnable = sorted((p for p in parts.values() if p.run is not None and p.name in shown),
                          key=lambda p: p.name != landing_tab(service, shown, workshop))
        restores = ["banner", "tabs", "pending", "notice", "title", "note", "note_view"]
        load_page(demo, page["query"], restore, [page[name] for name in restores] + _all_inputs(parts),
                  page["pending"], runnable, service, JS_OPENED_WITH)
        for i, button in enumerate(panel.buttons if panel is not None else []):
            opened = button.click(_open_exercise(workshop, panel, i, restore, usage), None,
                                  [page[name] for name in restores] + _all_inputs(parts) + panel.outputs, **PRIVATE)
            _then_run(opened, page["pending"], runnable, service)
    kept.keep_in(demo, kept_results, kept.remaker(service, guard))
    show_progress_on_pictures(demo)
    return UI(demo, parts, restore, FrontPage(service, runnable), guard, kept_results)


def landing_tab(service, shown, workshop: Workshop | None) -> str:
    """The tab a page without a link opens on: the two lenses side by side when a Jacobian lens is loaded (the
    most telling picture: the logit lens reads punctuation in most middle-layer cells of the default model, the
    Jacobian lens the words it is working toward), else the logit lens; a workshop's first tab."""
    if workshop is None and service.jlens is not None and JACOBIAN_TAB.name in shown:
        return JACOBIAN_TAB.name
    return shown[0]


# The first lines a newcomer reads: what the page is, and where to look first.
LEDE_BOTH = ("See what a language model is thinking at every layer, before it speaks. Below, two *lenses* read "
             "the same prompt layer by layer: **look at the middle layers, where they differ**. The Jacobian lens "
             "often reads the words the model is working toward long before the plain logit lens does. Change "
             "the prompt and press *Run*; every tab has a *How to read this*.")
LEDE_LOGIT = ("See what a language model is thinking at every layer, before it speaks. Below, the *logit lens* "
              "reads a prompt layer by layer: **read a column from the bottom up** to watch the answer form. "
              "Change the prompt and press *Run*; every tab has a *How to read this*.")


def _top(service, workshop: Workshop | None) -> Components:
    """The heading, the lede (without a workshop: its own text leads), the model line and the status line."""
    if workshop is not None:
        gr.Markdown(f"# {md_text(workshop.title)}\nLens Explorer · " + _header(service), elem_id="header")
    else:
        lede = LEDE_BOTH if landing_tab(service, permalinks.TABS, None) == JACOBIAN_TAB.name else LEDE_LOGIT
        gr.Markdown(f"# Lens Explorer\n{lede}", elem_id="header")
        gr.Markdown(_header(service), elem_id="model-line", elem_classes=["model-line"])
    # Empty in the page's config: the page's first answer says how the engine is then (`restored`).
    return {"banner": gr.Markdown("", visible=False, elem_id="engine-status"), "pending": gr.State("")}


def _link_row(title: gr.Textbox, note: gr.Textbox) -> Components:
    """The link to this view, its copy button, and the title and note it carries."""
    with gr.Row():
        link = gr.Textbox(label="Link to this view (inputs are kept in the address bar)", interactive=False,
                          scale=6, elem_id="permalink",
                          placeholder="Run or edit an input: the link that reproduces it appears here")
        copy = gr.Button("Copy link", scale=1, min_width=120, size="sm", elem_id="copy-link")
    with gr.Row():
        title.render()
        note.render()
    copy.click(None, None, None, js=JS_COPY_LINK, **PRIVATE).then(
        lambda: gr.Info("Link copied to the clipboard."), None, None, queue=False, **PRIVATE)
    return {"link": link, "query": gr.Textbox(visible=False, elem_id="permalink-query")}


def _wire_links(parts: dict[str, TabParts], page: Components) -> None:
    """The link box follows every input of the tab in view, and the title and note under it."""
    words = {"title": page["title"], "note": page["note"]}
    tab_of = {tab.id: tab for tab in page["tabs"].children}
    for p in parts.values():
        if not p.inputs:
            continue
        named = {**p.inputs, **words, "query": page["query"]}
        triggers = [c.change for c in (*p.inputs.values(), *words.values())] + [p.run_button.click]
        on(triggers, partial(link_of, p), named, named.keys() - {"query"}, ["query"], queue=False,
           trigger_mode="always_last")
        on(tab_of[p.name].select, partial(link_of, p), named, named.keys() - {"query"}, ["query"], queue=False)
    page["query"].change(None, page["query"], page["link"], js=JS_SET_URL, **PRIVATE)
    gr.on([page["title"].change, page["note"].change], notes.shown, [page["title"], page["note"]], page["note_view"],
          queue=False, **PRIVATE)


def link_of(p: TabParts, values: dict, request: gr.Request = None) -> dict:
    """The link of the tab's inputs, and the title and note under it."""
    view = notes.with_notes(p.view.view_of(values), values["title"], values["note"])
    return {"query": permalinks.query_string(view)}


def restored(page: Components, parts: dict[str, TabParts], service, shown, opened_with: str | None) -> dict:
    """The page as the link it was opened with shows it (without one: every tab's example, `front.py`), and the
    engine's status line as it is now."""
    now = {page["banner"]: status.banner(service)}
    if not (opened_with or "").lstrip("?"):
        return {**now, page["pending"]: FRONT}
    view, notices = permalinks.decode(opened_with, **permalinks.as_read_by(service))
    if view.tab not in shown:
        notices.append(f"This workshop does not show the {view.tab} tab; showing its first one instead.")
        view = View(tab=shown[0])
    if not parts[view.tab].inputs:                      # a Jacobian link on an app without a J lens
        notices.append("This app has no Jacobian lens loaded; showing the logit lens instead.")
        view = view.replace(tab="logit", layers="all")
    if not has_lens(service, view.lens):                # a generation link reading the J-lens
        notices.append("This app has no Jacobian lens loaded; reading the logit lens instead.")
        view = view.replace(lens=LOGIT.name)
    return {**now, page["tabs"]: gr.Tabs(selected=view.tab), page["pending"]: view.tab, **parts[view.tab].values(view),
            page["notice"]: gr.Markdown("\n".join(f"- {md_text(n)}" for n in notices), visible=bool(notices)),
            page["title"]: view.title, page["note"]: view.note, page["note_view"]: notes.shown(view.title, view.note)}


def _all_inputs(parts: dict[str, TabParts]) -> list:
    return [c for p in parts.values() for c in p.inputs.values()]


def _then_run(event, pending: gr.State, runnable: list[TabParts], service) -> None:
    """After an exercise's restore, the readout of the tab it names (a page's load: `landing.py`)."""
    for p in runnable:
        named = {"pending": pending, **p.inputs, **p.reads, **p.outputs}
        event = on(event.then, partial(run_pending, p, service), named, ["pending", *p.inputs, *p.reads], p.outputs)


def _open_exercise(workshop: Workshop, panel, index: int, restore: Callable, usage: Usage | None):
    """Exercise `index`: its link restored as the page restores one, its question shown, the opening counted."""
    def open_exercise():
        if usage is not None:
            usage.exercise(index)
        return {**restore(workshop.exercises[index].query), **question_outputs(panel, workshop, index)}
    return open_exercise


def _header(service) -> str:
    info = service.info
    lens = "no Jacobian lens"
    if service.jlens is not None:
        lens = f"Jacobian lens on {len(service.jlens.layers)} layers ({md_text(service.jlens.describe()['source'])})"
    return (f"Model **{md_text(info.name)}** · {info.n_layers} layers · d_model {info.d_model} · "
            f"{md_text(info.backend)} ({info.dtype}) · {lens}")


__all__ = ["CSS", "HEAD", "UI", "LinkPrefetch", "build_app", "build_ui", "check_links", "check_words", "event_stream",
           "sessions"]
