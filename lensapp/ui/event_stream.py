"""Gradio's page, mended where it loses an answer: its event stream closed just as another event joined.

Gradio's page (6.x) reads every answer of a session on one event stream (`/gradio_api/queue/data`), opened when an
event joins and none is open, and the server closes it (`close_stream`) as soon as the last event it knows of has
completed. An event that joins at that moment (the page's two load events are sent at once, `landing.py`) can be
registered on the server just after that check while its join's answer reaches the page before the close: the
page sees a stream open and opens none, then closes the one it had. The event's answer then waits on the server
until some other event of that page joins, which on a page that has loaded may be never. In CI one of twenty visits
to the front page drew no chart in 90 s, no error anywhere (tests/test_event_stream.py makes that order happen).

The mend is one line in the page's own client, its entry module (`index-*.js`), served mended by `install`: on
`close_stream`, a page still waiting for an answer (the client's `unclosed_events`) opens its stream again, and
the server sends what it holds for the session. Where a Gradio has no such line (another build), the page is
served as Gradio sends it, and the check at start (`mend_problem`, asked by `ui/mends.py`) says so in `/health`'s
`mends` and in the log, as an error. Gradio is pinned where the app is deployed (pyproject's `cpu` and `gpu`
extras); docs/upstream/gradio-reopen-stream.md is the change for Gradio itself.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from .first_view import gradio_assets

# The client's stream reader, minified: `let{event_callbacks:e,unclosed_events:t,...}=this,o=this;` ... then, in its
# message handler, `if(s.msg===`close_stream`){wt(r,o.abort_controller);return}`. The names are the build's.
_UNCLOSED = re.compile(r"unclosed_events:(\w+)[^;]*?\}=this,(\w+)=this;")
_CLOSE = re.compile(r"if\((\w+)\.msg===`close_stream`\)\{(\w+)\((\w+),(\w+)\.abort_controller\);return\}")


def mended(source: str) -> str | None:
    """The client module's text with the stream opened again on `close_stream` while an answer is awaited; None
    where the module has no reader of that shape (or more than one)."""
    readers = list(_UNCLOSED.finditer(source))
    closes = list(_CLOSE.finditer(source))
    if len(readers) != 1 or len(closes) != 1 or closes[0].start() < readers[0].end():
        return None
    unclosed, client = readers[0].groups()
    close = closes[0]
    msg, shut, status, owner = close.groups()
    if owner != client:
        return None
    fixed = (f"if({msg}.msg===`close_stream`){{{shut}({status},{owner}.abort_controller);"
             f"{unclosed}.size>0&&{owner}.open_stream();return}}")
    return source[:close.start()] + fixed + source[close.end():]


def entry_module(assets: Path) -> Path | None:
    """Gradio's entry module (the one its page's HTML loads), the client's home."""
    html = (assets.parent / "index.html").read_text(encoding="utf-8", errors="replace")
    found = re.search(r'src="\./assets/(index-[\w-]+\.js)"', html)
    return assets / found.group(1) if found else None


def mend_problem(assets: Path | None = None) -> str | None:
    """None where this Gradio's page takes the mend; else why not, in one line (the page is then served as it is)."""
    return _mended_entry(assets or gradio_assets())[1]


def _mended_entry(assets: Path) -> tuple[tuple[Path, str] | None, str | None]:
    """((Gradio's entry module, its text mended), None), or (None, why it cannot be mended)."""
    try:
        module = entry_module(assets)
    except OSError as e:
        return None, f"Gradio's page cannot be read ({e})"
    if module is None or not module.is_file():
        return None, "Gradio's page names no entry module (index-*.js)"
    text = mended(module.read_text(encoding="utf-8"))
    if text is None:
        return None, f"{module.name} has no event stream reader of the shape mended (its close_stream line)"
    return (module, text), None


def install(gradio_app, assets: Path | None = None) -> bool:
    """Serve Gradio's entry module mended (`mended`) on the mounted Gradio app, ahead of its own route for it (so
    it goes out compressed as every other script does). False, and the page as Gradio sends it, where the module
    has no line to mend (`mend_problem` says why)."""
    from fastapi.responses import Response
    from starlette.routing import Route

    found, _ = _mended_entry(assets or gradio_assets())
    if found is None:
        return False
    module, text = found
    body = text.encode("utf-8")
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'

    async def served(request):
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"etag": etag})
        return Response(body, media_type="application/javascript", headers={"etag": etag})

    gradio_app.router.routes.insert(0, Route(f"/assets/{module.name}", served, methods=["GET", "HEAD"]))
    return True
