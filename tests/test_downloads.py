"""Downloads on demand (ui/downloads.py): nothing is built by a run; a click builds the one file, bounded, then
it is removed. The files themselves through Chromium, on the real app over the tiny service (`tiny_app.py`)."""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
from tiny_app import served

from lensapp import config
from lensapp.service import LensRequest
from lensapp.service.limits import RateLimiter
from lensapp.ui.downloads import Downloads, export_rows
from lensapp.ui.guard import Guard

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:gradio.helpers")
RUN_TIMEOUT = 120_000        # ms


@pytest.fixture(scope="module")
def readout(tiny_service):
    return tiny_service.lens(LensRequest(prompts=("The capital of France is",), lens="both", k=7))[0]


def exported() -> set:
    """Every file in the app's export folders (`Downloads` makes one per app, in Gradio's cache folder)."""
    return {f for d in Path(gr.utils.get_upload_folder()).glob("lensapp-exports-*") for f in d.iterdir()}


def test_a_run_builds_no_file(tiny_service):
    from lensapp import ui

    built = ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings(rate_limit=0))
    before = exported()
    out = built.tabs["logit"].run({"prompt": "The capital of France is", "layers": "all", "k": 5, "targets": "",
                                   "metric": "top1_prob", "chat": False, "raw": False, "start": None, "punct": False,
                                   "note": ""})
    csv_button, json_button = out["csv"], out["json"]
    assert isinstance(csv_button, gr.Button) and csv_button.visible and json_button.visible    # shown, nothing built
    assert exported() == before


def test_a_click_builds_one_bounded_file(readout, monkeypatch):
    downloads = Downloads(Guard(RateLimiter(0)))
    rows = export_rows(readout)
    assert rows == 2 * len(readout.layers) * len(readout.input_ids) * 7          # lens x layer x position x k
    path = downloads.write("logit-lens", "csv", readout)
    with open(path, newline="", encoding="utf-8") as f:
        assert len(list(csv.reader(f))) == 1 + rows
    assert json.loads(open(downloads.write("logit-lens", "json", readout), encoding="utf-8").read()) == \
        json.loads(readout.dumps())
    monkeypatch.setattr("lensapp.ui.downloads.MAX_EXPORT_ROWS", rows - 1)
    with pytest.raises(Exception, match=f"this readout is {rows:,} rows.*at most {rows - 1:,}"):
        downloads.write("logit-lens", "csv", readout)
    with pytest.raises(Exception, match="nothing to download yet"):
        downloads.write("logit-lens", "csv", None)


def test_old_files_and_files_past_the_disk_bound_are_removed(readout, monkeypatch):
    downloads = Downloads(Guard(RateLimiter(0)))
    first = downloads.write("x", "json", readout)
    os.utime(first, (time.time() - downloads.KEEP_SECONDS - 1,) * 2)
    second = downloads.write("x", "json", readout)
    assert not os.path.exists(first) and os.path.exists(second)
    monkeypatch.setattr(Downloads, "MAX_DISK_BYTES", os.path.getsize(second) + 1)
    third = downloads.write("x", "json", readout)                     # two would pass the bound: the older goes
    assert not os.path.exists(second) and os.path.exists(third)


def test_a_download_is_rate_limited_and_refused_in_one_line(readout):
    from lensapp.ui import kept

    downloads = Downloads(Guard(RateLimiter(per_minute=6, clock=lambda: 0.0)))
    with gr.Blocks() as page:
        state = kept.kept_state()
    store = kept.keep_in(page, kept.KeptResults(1 << 30))
    build = downloads._handler("logit-lens", "csv", state)
    me = SimpleNamespace(client=SimpleNamespace(host="203.0.113.9"), headers={})
    handle = {"h": store.keep(readout), "r": None}                # what the page holds: a handle, not the readout
    for _ in range(5):
        build(handle, request=me)
    with pytest.raises(gr.Error, match="too many requests"):
        build(handle, request=me)
    with pytest.raises(gr.Error, match="nothing to download yet") as e:
        build(None)
    assert "\n" not in e.value.message
    store.drop(handle["h"])                                       # let go, and the page has no recipe
    with pytest.raises(gr.Error, match="no longer kept on the server.*run it again"):
        build(handle)


# -- in Chromium: the page's buttons save the files -------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_url(tiny_service):
    from lensapp.server import make_app

    with served(make_app(tiny_service, config.Config.of(rate_limit=0))) as url:
        yield url


def save(page, tab: str) -> dict:
    """The CSV and JSON the visible tab's buttons save: {"csv": rows, "json": parsed}."""
    got = {}
    for kind in ("CSV", "JSON"):
        with page.expect_download(timeout=RUN_TIMEOUT) as download:
            page.get_by_role("button", name=f"Download {kind}").click()
        assert download.value.suggested_filename.endswith(kind.lower())
        text = open(download.value.path(), encoding="utf-8").read()
        got[kind.lower()] = list(csv.reader(text.splitlines())) if kind == "CSV" else json.loads(text)
    return got


def test_every_tab_saves_its_csv_and_json_built_on_click(page, tiny_url, tiny_service):
    page.goto(tiny_url)
    n = tiny_service.info.n_layers
    page.get_by_role("tab", name="Logit lens").first.click()                      # it lands on both lenses
    page.wait_for_selector("#logit-heatmap svg.marks", timeout=RUN_TIMEOUT)      # the front page's example
    logit = save(page, "logit")
    assert logit["csv"][0][:3] == ["lens", "layer", "position"] and logit["json"]["layers"] == list(range(n))
    positions = len(logit["json"]["input_ids"])
    assert len(logit["csv"]) == 1 + n * positions * len(logit["json"]["lenses"]["logit"]["top_ids"][0][0])
    for tab, plot, check in (("Generation", "generate-heatmap", lambda j: "steps" in j),
                             ("Compare", "compare-heatmaps", lambda j: isinstance(j, list) and len(j) >= 2),
                             ("Intervene", "intervene-pair", lambda j: "before" in j and "after" in j)):
        page.get_by_role("tab", name=tab).first.click()
        if tab == "Intervene":                      # its example steers at layer -8: the tiny model has 4
            page.locator("#intervene-layer textarea, #intervene-layer input").first.fill("2")
            page.locator("#intervene-run").click()
        page.wait_for_selector(f"#{plot} svg.marks", timeout=RUN_TIMEOUT)
        files = save(page, tab)
        assert len(files["csv"]) > 1 and check(files["json"]), tab
    assert not page.errors
