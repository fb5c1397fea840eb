"""A tab's inputs, made from its declaration's fields (`views.TabView`): one widget per field.

The tab's layout calls `form.add(name)` where it wants a field, with what only the layout knows (a row's
scale, a longer box, a label that names this model's layers); `form.rest()` then makes every field the
layout did not place, in its declared order, so a field added at the end of a request appears on the tab
with no edit to it. A widget's kind comes from its field: a choice is a radio (its choices the field's, a
lens only when this app has it), yes/no a checkbox, a whole number a number box, anything else a text box;
its label is the field's `label` (else its help) and its value the page's example or the field's default.
`SHOWN_AS` says where a field shows otherwise on every tab (a slider, a number's range, a dropdown).
"""

from __future__ import annotations

import typing

import gradio as gr

from ..charts import LENS_TITLES, METRICS
from ..config import MAX_GENERATE_TOKENS, MAX_K, MAX_SEED, MAX_TEMPERATURE, PUNCTUATION_WIDTH
from ..lens_kinds import LENSES, LOGIT, readings
from ..service.field import Field
from .tabs import Components, warn
from .views import SPREAD, TabView, spread_keys

# How a field shows wherever a tab has it, when not as its kind would have it: (component, its settings).
SHOWN_AS = {
    "k": (gr.Number, {"minimum": 1, "maximum": MAX_K}),
    "seed": (gr.Number, {"minimum": 0, "maximum": MAX_SEED}),
    "max_tokens": (gr.Slider, {"minimum": 1, "maximum": MAX_GENERATE_TOKENS, "step": 1}),
    "new_tokens": (gr.Slider, {"minimum": 0, "maximum": MAX_GENERATE_TOKENS, "step": 1}),
    "temperature": (gr.Slider, {"minimum": 0.0, "maximum": MAX_TEMPERATURE, "step": 0.05}),
    "metric": (gr.Dropdown, {}),
    "skip_punctuation": (gr.Checkbox, {"info": f"Each cell shows the best word among the top {PUNCTUATION_WIDTH} "
                                               "(² = its rank); hover still shows the true top-k."}),
    "raw": (gr.Checkbox, {"info": "h·W_U alone, without the model's own logit soft-capping or scaling"}),
}
# What a choice is called on a form, where its value is not a plain word.
CHOICE_TITLES = {"lens": LENS_TITLES, "metric": {key: m.title for key, m in METRICS.items()}}


class Form:
    """view: the tab's declaration; values: the inputs' first values by input name (default: `view.initial()`);
    elem ids are `<view name>-<input name>` (underscores as dashes) unless the layout gives one."""

    def __init__(self, view: TabView, service, values: dict | None = None):
        self.view, self.service = view, service
        self.fields = view.fields()
        self.values = view.initial() if values is None else values
        self.inputs: Components = {}

    def add(self, name: str, make: type | None = None, **props):
        """Make field `name`'s widget here: `make` the component (default: the field's kind), `props` its
        settings (a spread field: its numbered boxes, `label` a function of the number)."""
        if name in SPREAD:
            label = props.pop("label", lambda i: f"{self.fields[name].label} {i}")
            return [self._make(key, self.fields[name], make, label=label(i), **props)
                    for i, key in enumerate(spread_keys(name), 1)]
        return self._make(name, self.fields[name], make, **props)

    def rest(self) -> Components:
        """Make every field the layout has not placed, in declared order; what they are, by name."""
        made = {}
        for name in self.fields:
            if not any(key in self.inputs for key in spread_keys(name)):
                self.add(name)
                made.update({key: self.inputs[key] for key in spread_keys(name)})
        return made

    def _make(self, name: str, field: Field, make: type | None, **props) -> gr.components.Component:
        kind, shown = widget_kind(field)
        make, shown = (kind, shown) if make in (None, kind) else (make, {})
        settings = {"label": field.label or field.help, "value": self.values.get(name),
                    "elem_id": f"{self.view.name}-{name.replace('_', '-')}", **shown}
        if field.choices and "choices" not in props:
            settings["choices"] = choices_of(field, self.service)
            offered = [value for _, value in settings["choices"]]
            if settings["value"] not in offered:             # a lens this app does not have
                settings["value"] = offered[0]
        component = make(**{**settings, **props})
        self.inputs[name] = component
        return component


def widget_kind(field: Field) -> tuple[type, dict]:
    """The component a field shows as, and its settings: `SHOWN_AS`, else from its choices or its type."""
    if field.name in SHOWN_AS:
        make, shown = SHOWN_AS[field.name]
        return make, {**shown, **({"precision": 0} if make is gr.Number else {})}
    hint = field.api_form[0]
    kinds = set(typing.get_args(hint)) or {hint}
    if field.choices:
        return gr.Radio, {}
    if bool in kinds:
        return gr.Checkbox, {}
    if int in kinds:
        return gr.Number, {"precision": 0}
    if float in kinds:
        return gr.Number, {}
    return gr.Textbox, {}


def choices_of(field: Field, service) -> list[tuple[str, str]]:
    """A choice field's (title, value) pairs as a form offers them: a lens only when this app has it."""
    titles = CHOICE_TITLES.get(field.name, {})
    values = [v for v in field.choices if field.name != "lens" or has_lens(service, v)]
    return [(titles.get(v, v), v) for v in values]


def has_lens(service, lens) -> bool:
    """Whether this app can read `lens` (a Jacobian one only with a Jacobian lens loaded)."""
    return all(LENSES[name].available(service.jlens is not None) for name in readings().get(lens, ()))


def single_lenses(service) -> list[tuple[str, str]]:
    """(title, lens) of each lens read alone that this app has: a table's or a chart's choice of one."""
    return [(LENS_TITLES[lens], lens) for lens in LENSES if has_lens(service, lens)]


def available_lens(service, lens):
    """`lens`, or the logit lens with a warning where it needs the Jacobian lens this app has not loaded (a
    link or an old page may name it); anything else is the lens field's to refuse."""
    if isinstance(lens, str) and lens in readings() and not has_lens(service, lens):
        warn("No Jacobian lens is loaded; using the logit lens.")
        return LOGIT.name
    return lens


def asked(view: TabView, service, values: dict, **fixed):
    """The request a tab's inputs ask of this app (`TabView.request`), its lens one this app has."""
    if "lens" in view.request_fields() and "lens" not in fixed:
        values = {**values, "lens": available_lens(service, values.get("lens"))}
    return view.request(values, **fixed)


def add_reading(form: Form, **labels: str) -> None:
    """The lens, layers, top-k and target words of a reading, side by side (call inside the tab's row);
    `labels`: this tab's label for any of them."""
    for name in ("lens", "layers", "k", "targets"):
        if name in form.fields:
            form.add(name, **({"label": labels[name]} if name in labels else {}))
