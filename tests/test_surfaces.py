"""Every published surface answers as it did when it was frozen (tests/data/published_surfaces.json, written
from the code before the request declarations were made the one source of every surface): each API
endpoint's parameters, their order and defaults; each tab's link keys; each command's flags and positional
arguments. Surfaces only ever grow: a parameter is added at the end of an endpoint, a key or a flag is
added, never renamed, moved or dropped (an intended change is listed in docs/using.md and here).

Intended changes since the freeze:
- /intervene `alphas`: default '' (was '0,0.1,0.2,0.4,0.8'). Empty is the default sweep, 0, 0.1, 0.2, 0.4 and
  0.8, or for a fitted vector 0, 1/2, 1 and 2 times its own length: a caller who names no alphas gets what
  they got before, and one who names 0,0.1,0.2,0.4,0.8 now gets exactly those, fitted vector or not (before,
  that text was taken for "the default" and swapped for the fitted sweep).
- Links say v=2 (a link's keys are unchanged): positions count the tokens the app reads, BOS first where it reads
  so; a v=1 link's positions are moved as it opens to name what they named (tests/test_link_versions.py)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from lensapp import cli
from lensapp.ui import permalinks
from lensapp.ui.api import api_form, endpoints

FROZEN = json.loads((Path(__file__).parent / "data" / "published_surfaces.json").read_text())


def api_params(endpoint) -> list[list[str]]:
    return [[f.name, "required" if api_form(f)[1] is inspect.Parameter.empty else repr(api_form(f)[1])]
            for f in endpoint.fields()]


@pytest.mark.parametrize("name", sorted(FROZEN["api"]))
def test_an_endpoint_keeps_its_parameters_in_their_order(name):
    endpoint = {e.name: e for e in endpoints()}[name]
    params = api_params(endpoint)
    assert params[:len(FROZEN["api"][name])] == FROZEN["api"][name]


def test_no_endpoint_is_dropped():
    assert set(FROZEN["api"]) <= {e.name for e in endpoints()}


@pytest.mark.parametrize("tab", sorted(k for k in FROZEN["links"] if not k.startswith("_")))
def test_a_tabs_link_keeps_its_keys(tab):
    view = permalinks.View(tab=tab)
    keys = set(permalinks.encode(view)) | set(permalinks.tab_fields(tab))
    assert set(FROZEN["links"][tab]) <= keys
    assert set(FROZEN["links"]["_always"]) - {"title", "note"} <= keys


@pytest.mark.parametrize("command", sorted(FROZEN["cli"]))
def test_a_command_keeps_its_flags_and_arguments(command):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    p = sub.choices[command]
    flags = {o for a in p._actions for o in a.option_strings}
    positional = [a.dest for a in p._actions if not a.option_strings]
    assert set(FROZEN["cli"][command]["flags"]) <= flags
    assert positional == FROZEN["cli"][command]["positional"]


def test_every_endpoint_is_served_under_its_own_name(tiny_service):
    """Gradio names a UI event after its handler and suffixes a taken name: a page handler named `describe`,
    made before the API, once moved the API's /describe to /describe_1 (CI: `Cannot find ... /describe`)."""
    from lensapp import config, ui

    demo = ui.build_app(tiny_service, config.WebSettings(), config.LimitSettings(rate_limit=0))
    served = {fn.api_name for fn in demo.fns.values() if fn.api_visibility != "private"}
    assert served == {e.name for e in endpoints()}, served
