"""Every reach into Gradio's internals, asked at start whether the installed Gradio still takes it.

Where a measured gain needed a reach inside Gradio (CONTRIBUTING's "A library through its API"), its module keeps it:

- `event_stream`: the page's entry module served with one line added, so a page never loses an answer to its event
  stream's close (`ui/event_stream.py`);
- `sessions`: Gradio's session store replaced by a bounded one whose sessions copy no block's config
  (`ui/sessions.py`);
- `first_view.*`, a link's first view (`ui/first_view.py`): `hold`, Gradio's start held at its `<gradio-app>`
  element's definition; `start_preloads`, the modules that start imports, read from its entry module's preload map;
  `vega`, Gradio's vega-embed module, found by its shape; `chart_preloads`, its Altair plot module, found by name.

A reach that no longer takes leaves Gradio as it is (the page served unmended, Gradio's own sessions, a link opened
without its picture), which nobody sees until it matters: `check` says so at start, one line each, as an error in
the log and in `/health`'s `mends` (the host's). Gradio is pinned where the app is deployed (pyproject.toml's `cpu`
and `gpu` extras), and tests/test_mends.py fails when the installed Gradio no longer takes one; docs/upstream holds
the change to Gradio each would need instead.
"""

from __future__ import annotations

import logging
import re
from importlib import metadata
from pathlib import Path
from typing import Callable

from . import event_stream, first_view, sessions

log = logging.getLogger(__name__)

# How Gradio's entry module starts the page (the first view's script holds this call until its picture is drawn).
_DEFINES_APP = re.compile(r"customElements\.define\(\s*[`'\"]gradio-app[`'\"]")


def check(gradio_app, assets: Path | None = None) -> dict:
    """Ask each mend whether it applies to the installed Gradio (its built page in `assets`, by default the installed
    one's; the sessions' on the mounted `gradio_app`), log an error for each that does not, and return what
    `/health` shows: {"gradio": its version, "applied": [names], "not_applied": {name: why}}."""
    assets = assets or first_view.gradio_assets()
    version = gradio_version()
    problems = {name: _asked(ask) for name, ask in questions(gradio_app, assets).items()}
    for name, why in problems.items():
        if why is not None:
            log.error("Gradio %s does not take the mend %s: %s (it is left as Gradio has it)", version, name, why)
    return {"gradio": version, "applied": [name for name, why in problems.items() if why is None],
            "not_applied": {name: why for name, why in problems.items() if why is not None}}


def questions(gradio_app, assets: Path) -> dict[str, Callable[[], str | None]]:
    """Each mend by name, and its question: None where it applies, else why not."""
    return {
        "event_stream": lambda: event_stream.mend_problem(assets),
        "sessions": lambda: sessions.mend_problem(gradio_app),
        "first_view.hold": lambda: _holds_start(assets),
        "first_view.start_preloads": lambda: None if first_view.start_preloads(assets) else
        "Gradio's entry module has no preload map (m.f=[...]) to read the start's modules from",
        "first_view.vega": lambda: None if first_view.embed_module(assets) else
        "no embed-*.js exports vega-embed: links open without their picture",
        "first_view.chart_preloads": lambda: None if first_view.preload_links(assets) else
        "no AltairPlot-*.js module to preload",
    }


def gradio_version() -> str:
    try:
        return metadata.version("gradio")
    except metadata.PackageNotFoundError:
        return "unknown"


def _holds_start(assets: Path) -> str | None:
    module = event_stream.entry_module(assets)
    if module is None or not module.is_file():
        return "Gradio's page names no entry module (index-*.js)"
    if len(_DEFINES_APP.findall(module.read_text(encoding="utf-8", errors="replace"))) != 1:
        return f"{module.name} does not define <gradio-app> once by customElements.define: its start is not held"
    return None


def _asked(ask: Callable[[], str | None]) -> str | None:
    try:
        return ask()
    except Exception as e:  # noqa: BLE001 - a question that fails is a mend this Gradio does not take
        return f"the check failed: {type(e).__name__}: {e}"
