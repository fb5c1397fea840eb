"""The download buttons: a readout's CSV or JSON, built when the visitor asks for it, bounded, then removed.

Every run used to write both files, for cached readouts too: at k=100 and the full work budget ~1.5
million rows built in Python per run, kept on disk an hour. Now a tab keeps its result (`kept.py`)
and its buttons are plain ones: a click builds the one file asked for from that result, through the
guard (the rate limit; a failure is one line), then the page saves it (`JS_SAVE`). The bounds:

- at most `MAX_EXPORT_ROWS` rows (`config.py`): a lens x layer x position x top-k entry is a CSV row,
  and the JSON holds the same entries (~3 s and ~18 MB of CSV at the bound on a small CPU); a bigger
  readout is refused with what to lower;
- two files built at once, app-wide (a Gradio concurrency group); the rest wait in Gradio's queue;
- the files live in one folder inside Gradio's own cache folder (so Gradio serves them without a
  second copy), and are removed after `KEEP_SECONDS`, the oldest first once the folder holds more
  than `MAX_DISK_BYTES`, and all of them when the app exits.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
import threading
import time
from pathlib import Path

import gradio as gr
from gradio.utils import get_upload_folder

from ..config import MAX_EXPORT_ROWS
from ..results import Comparison, ComponentsResult, GenerationResult, InterventionResult, LensResult
from ..service.field import RequestError
from . import kept
from .tabs import PRIVATE

# The built file's address arrives as the hidden DownloadButton's value; the browser saves it from there.
JS_SAVE = """(file) => {
  if (file && file.url) {
    const a = document.createElement("a");
    a.href = file.url;
    a.download = file.orig_name || "";
    document.body.appendChild(a);
    a.click();
    a.remove();
  }
  return [];
}"""
KINDS = {"csv": "Download CSV", "json": "Download JSON"}


def readouts(result) -> list[LensResult]:
    """Every prompt readout a result's downloads carry."""
    if isinstance(result, LensResult):
        return [result]
    if isinstance(result, GenerationResult):
        return [step.readout for step in result.steps]
    if isinstance(result, Comparison):
        return list(result.results)
    if isinstance(result, InterventionResult):
        return [result.before, *result.after, *([result.source] if result.source is not None else [])]
    raise RequestError("nothing to download yet: run a readout first")


def export_rows(result) -> int:
    """Rows of the result's CSV: one per lens x layer x position x top-k entry (what its JSON holds too); a
    components readout's: one per part and head."""
    if isinstance(result, ComponentsResult):
        return int(result.heads.size + 3 * len(result.attn) + 4)
    return sum(r.top_ids.size for readout in readouts(result) for r in readout.lenses.values())


class Downloads:
    KEEP_SECONDS = 600
    MAX_DISK_BYTES = 512 << 20

    def __init__(self, guard):
        self.guard = guard
        root = Path(get_upload_folder())
        root.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="lensapp-exports-", dir=root))
        self._lock = threading.Lock()
        atexit.register(shutil.rmtree, self.dir, ignore_errors=True)

    def buttons(self, stem: str, state: gr.JSON) -> dict[str, gr.Button]:
        """The Download CSV and JSON buttons by kind (hidden until a run shows them: `shown()`) for the result kept
        in `state`; call inside the tab's layout. Files are named `<stem>-<random>.csv`."""
        with gr.Row():
            buttons = {kind: gr.Button(label, visible=False, size="sm") for kind, label in KINDS.items()}
            carrier = gr.DownloadButton(visible="hidden")
        for kind, button in buttons.items():
            button.click(self._handler(stem, kind, state), state, carrier, concurrency_limit=2,
                         concurrency_id="downloads", **PRIVATE).success(None, carrier, None, js=JS_SAVE, **PRIVATE)
        return buttons

    @staticmethod
    def shown() -> dict[str, gr.Button]:
        """The buttons' updates once a run has a result: shown (a file is built from it only when asked for)."""
        return {kind: gr.Button(visible=True) for kind in KINDS}

    @staticmethod
    def hidden() -> dict[str, gr.Button]:
        """The buttons' updates while a result is not whole yet (a long prompt's first look)."""
        return {kind: gr.Button(visible=False) for kind in KINDS}

    def _handler(self, stem: str, kind: str, state: gr.JSON):
        def build(page_value, request: gr.Request = None):
            result = kept.read(state, page_value, request)      # made again (and charged) if the store let it go
            return self.guard.ui(request, lambda: self.write(stem, kind, result))
        return build

    def write(self, stem: str, kind: str, result) -> str:
        """The file of `result` (`kind`: csv or json), built now; its path."""
        rows = export_rows(result)
        if rows > MAX_EXPORT_ROWS:
            raise RequestError(f"this readout is {rows:,} rows (lens x layer x position x top-k); a download holds "
                               f"at most {MAX_EXPORT_ROWS:,}: lower top-k or read fewer layers")
        text = result.to_csv() if kind == "csv" else result.dumps()
        fd, path = tempfile.mkstemp(prefix=f"{stem}-", suffix=f".{kind}", dir=self.dir)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
        self.prune()                        # the new file is the newest: it stays
        return path

    def prune(self) -> None:
        """Remove files older than KEEP_SECONDS, then the oldest while the folder holds over MAX_DISK_BYTES."""
        with self._lock:
            now, files = time.time(), []
            for path in self.dir.iterdir():
                with contextlib.suppress(FileNotFoundError):     # Gradio's own cache cleaning may remove it first
                    stat = path.stat()
                    if now - stat.st_mtime > self.KEEP_SECONDS:
                        path.unlink(missing_ok=True)
                    else:
                        files.append((stat.st_mtime, stat.st_size, path))
            total = sum(size for _, size, _ in files)
            for _, size, path in sorted(files):
                if total <= self.MAX_DISK_BYTES:
                    break
                path.unlink(missing_ok=True)
                total -= size
