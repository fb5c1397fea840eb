"""Every reach into Gradio is asked at start whether the installed Gradio takes it (`ui/mends.py`): each does on
the Gradio the app is pinned to, a changed Gradio is reported "not applied" (in /health and in the log as an
error), and the upstream write-ups name the Gradio they were checked against."""

from __future__ import annotations

import json
import logging
import re
import shutil
import urllib.request
from pathlib import Path

import pytest
from gradio.state_holder import SessionState
from tiny_app import served

from lensapp import config
from lensapp.ui import event_stream, first_view, mends, sessions

ROOT = Path(__file__).resolve().parents[1]
MENDS = {"event_stream", "sessions", "first_view.hold", "first_view.start_preloads", "first_view.vega",
         "first_view.chart_preloads"}


@pytest.fixture(scope="module")
def tiny_app(tiny_service):
    from lensapp.server import make_app

    return make_app(tiny_service, config.Config.of(rate_limit=0))


@pytest.fixture
def gradio_app(tiny_app):
    return sessions.mounted(tiny_app)


def test_every_mend_applies_to_the_installed_gradio_and_health_lists_them(tiny_app):
    """Fails when the installed Gradio no longer takes one of the app's reaches into it: the pin was moved (or the
    venv has another Gradio) without the mend following."""
    with served(tiny_app) as url, urllib.request.urlopen(f"{url}health", timeout=30) as answer:
        health = json.load(answer)                          # asked from this machine: the host's /health
    from importlib import metadata

    assert health["mends"]["gradio"] == metadata.version("gradio")
    assert health["mends"]["not_applied"] == {} and set(health["mends"]["applied"]) == MENDS


def bundle(tmp_path: Path, edit=None) -> Path:
    """A copy of the installed Gradio's built page, the parts the mends read (its entry module edited by `edit`)."""
    src = first_view.gradio_assets()
    assets = tmp_path / "frontend" / "assets"
    assets.mkdir(parents=True)
    shutil.copy(src.parent / "index.html", assets.parent / "index.html")
    entry = event_stream.entry_module(src)
    names = {entry.name, first_view.embed_module(src), *re.findall(r'href="\./assets/([\w.-]+)"',
                                                                   first_view.preload_links(src))}
    for name in names:
        shutil.copy(src / name, assets / name)
    if edit is not None:
        text = (assets / entry.name).read_text(encoding="utf-8")
        changed = edit(text)
        assert changed != text
        (assets / entry.name).write_text(changed, encoding="utf-8")
    return assets


def test_a_copy_of_the_installed_bundle_takes_every_mend(tmp_path, gradio_app):
    assert mends.check(gradio_app, bundle(tmp_path))["not_applied"] == {}


def test_a_changed_bundle_is_reported_not_applied_in_the_log_as_an_error(tmp_path, gradio_app, caplog):
    """A Gradio whose client closes its stream by another line (as another build could): the page would be served
    unmended, and the check says so; likewise a Gradio that starts its page by another element's definition."""
    def other_close(text: str) -> str:
        return text.replace(".msg===`close_stream`){", ".msg===`close_stream`){void 0;", 1)

    with caplog.at_level(logging.ERROR, logger="lensapp.ui.mends"):
        found = mends.check(gradio_app, bundle(tmp_path / "a", other_close))
    assert set(found["not_applied"]) == {"event_stream"} and "close_stream" in found["not_applied"]["event_stream"]
    assert set(found["applied"]) == MENDS - {"event_stream"}
    (line,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "event_stream" in line.getMessage() and found["gradio"] in line.getMessage()
    assert not event_stream.install(gradio_app, bundle(tmp_path / "b", other_close))    # served as Gradio has it

    def other_element(text: str) -> str:
        return text.replace("define(`gradio-app`", "define(`gradio-page`")

    renamed = mends.check(gradio_app, bundle(tmp_path / "c", other_element))
    assert set(renamed["not_applied"]) == {"first_view.hold"}


def test_a_gradio_whose_sessions_copy_the_config_another_way_is_reported(monkeypatch, gradio_app):
    """`LeanSession` runs Gradio's own `SessionState.__init__`, handed a page that lists no blocks: a Gradio that
    found the blocks elsewhere would copy every block's config again, and one without the methods it overrides
    would copy it later. Either is "not applied"."""
    assert sessions.mend_problem(gradio_app) is None
    gradios = SessionState.__init__

    def copies_from_its_config(self, blocks):
        gradios(self, blocks)
        self.config_values = {k: self.blocks_config.config_for_block(k, [], v)
                              for k, v in self.blocks_config.blocks.items()}

    monkeypatch.setattr(SessionState, "__init__", copies_from_its_config)
    assert "copied" in mends.check(gradio_app)["not_applied"]["sessions"]
    monkeypatch.setattr(SessionState, "__init__", gradios)
    monkeypatch.delattr(SessionState, "_update_config")
    assert "_update_config" in mends.check(gradio_app)["not_applied"]["sessions"]


def test_a_lean_session_is_made_by_gradios_own_init(monkeypatch, gradio_app):
    """No copy of Gradio's code: what Gradio's `__init__` sets (here, one more attribute), a lean session has."""
    gradios = SessionState.__init__

    def with_more(self, blocks):
        gradios(self, blocks)
        self.added_by_a_later_gradio = True

    monkeypatch.setattr(SessionState, "__init__", with_more)
    lean = sessions.LeanSession(gradio_app.get_blocks())
    assert lean.added_by_a_later_gradio and lean.config_values == {}
    assert lean.STATE_TTL_WHEN_CLOSED == sessions.CLOSED_STATE_SECONDS


def test_the_upstream_write_ups_name_the_gradio_they_were_checked_against():
    """docs/upstream's Gradio write-ups stay current: each names the Gradio release the app is pinned to (moving the
    pin means reading them again), and the event stream's change is the line the mend adds."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pin,) = {r.split("==")[1] for extra in ("cpu", "gpu") for r in extras[extra] if r.startswith("gradio==")}
    write_ups = sorted((ROOT / "docs" / "upstream").glob("gradio-*.md"))
    assert {p.name for p in write_ups} >= {"gradio-reopen-stream.md", "gradio-session-config-copy.md"}
    for path in write_ups:
        assert f"Gradio {pin}" in path.read_text(), f"{path.name} does not say it was checked against Gradio {pin}"
    stream = (ROOT / "docs" / "upstream" / "gradio-reopen-stream.md").read_text()
    assert "if (unclosed_events.size > 0) void that.open_stream();" in stream
    assert ".size>0&&" in event_stream.mended(event_stream.entry_module(first_view.gradio_assets()).read_text())
