"""What every tab hands to `build_app`, and what every tab uses to show text and charts.

A tab is built by a function returning `TabParts`: its permalink fields (view field -> input
component), a function from those inputs' values to a `View`, and its readout handler with that
handler's inputs and outputs. `build_app` wires links, page load and the engine status from these
alone, so no tab knows another.
"""

from __future__ import annotations

import html
import random
import re
from dataclasses import dataclass, field
from typing import Callable

import altair as alt
import gradio as gr
from gradio.components.plot import PlotData

from .permalinks import View, as_text

PRIVATE = {"api_visibility": "private"}          # UI events are not API endpoints (api.py's are)


def plot(chart: alt.TopLevelMixin | None) -> PlotData | None:
    """A chart as `gr.Plot`'s own data, built and serialised without Altair's schema validation.

    Validation walks every cell of the inline data with jsonschema: for a 389-token prompt's page it
    took ~1 s of the server's 7 s (0.3 s while building, 0.65 s in `to_json`). The charts are the same
    code whatever the data, and `tests/test_charts.py` validates each kind with `to_dict()`.
    """
    if chart is None:
        return None
    return PlotData(type="altair", plot=chart.to_json(validate=False))


def build_chart(make: Callable, *args, **kwargs) -> PlotData | None:
    """`plot(make(*args, **kwargs))`, with Altair's validation at construction off while it builds."""
    with alt.utils.schemapi.debug_mode(False):
        return plot(make(*args, **kwargs))


@dataclass
class TabParts:
    name: str                                     # the permalink's tab id
    fields: dict[str, gr.components.Component]    # View field -> input component, in `to_view` order
    to_view: Callable[..., View]                  # values of `fields` -> View
    run: Callable | None = None                   # the readout handler (None: tab unavailable)
    run_inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    run_button: gr.Button | None = None
    from_view: Callable[[View], list] | None = None   # View -> input values, where they are not its fields 1:1
    handlers: dict[str, Callable] = field(default_factory=dict)    # the tab's other event handlers, by name

    def values(self, view: View) -> list:
        """Input values for `view`, in `fields` order (a word list as the text box shows it)."""
        if self.from_view is not None:
            return self.from_view(view)
        return [as_text(v) if isinstance(v, tuple) else v for v in (getattr(view, name) for name in self.fields)]


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")


def md_text(text: str) -> str:
    """Arbitrary text shown literally inside gr.Markdown (no markup, no HTML)."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))


def table_html(df, caption: str) -> str:
    """A DataFrame as a plain HTML table with headers a screen reader announces; every text escaped."""
    def esc(x) -> str:
        return html.escape(str(x))
    head = "".join(f'<th scope="col">{esc(c)}</th>' for c in [df.index.name or "", *df.columns])
    body = "".join("<tr>" + f'<th scope="row">{esc(i)}</th>' + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>"
                   for i, row in zip(df.index, df.itertuples(index=False)))
    return (f'<div style="overflow-x: auto"><table><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def int_or(value, default: int) -> int:
    """For building a View from inputs mid-edit (an emptied number box): never raises."""
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return n if abs(n) < 1 << 63 else default       # no link needs more (str() refuses past 4300 digits)


def new_seed() -> int:
    """A fresh seed to show in a seed box (the user sees it, so any sample can be had again)."""
    return random.randrange(0, 1_000_000)


def lens_choices(service) -> list[tuple[str, str]]:
    """The lens radio's choices: the Jacobian lens only when one is loaded."""
    if service.jlens is None:
        return [("logit lens", "logit")]
    return [("logit lens", "logit"), ("Jacobian lens", "jacobian"), ("both", "both")]


def warn(message: str) -> None:
    gr.Warning(html.escape(message))
