"""What a visitor may see of the server: text with its file paths reduced to names.

The server's folders are nobody's business (the model's cache dir, the repository, a home): every text a
visitor can read (an error, the engine's state on the page, a lens's provenance, a snippet) passes
through `paths`, which shows an absolute path (`/root/.cache/lensapp/models/x`, `~/lens.pt`) by its last
part (`x`, `lens.pt`), as `jlens.describe()` names a lens file. Hub ids (`Qwen/Qwen3-8B`), URLs and
`HUB_REPO:FILE` specs are not paths and are kept.
"""

from __future__ import annotations

import re

# A "/" or "~/" that starts a word (not inside a URL, a hub id or a number), then at least two parts
# (`/root/x`: a lone `/b` is more often markup or prose than a folder, and names nothing).
_PATH = re.compile(r"(?<![\w.:/~@+%-])(?:~/[\w.@+%~-]+|/[\w.@+%~-]+/[\w.@+%~-]*)(?:/[\w.@+%~-]*)*")


def paths(text: str) -> str:
    """`text` with every absolute path shown by its last part."""
    return _PATH.sub(_name, text) if isinstance(text, str) and "/" in text else text


def _name(match: re.Match) -> str:
    parts = [p for p in match[0].split("/") if p and p != "~"]
    return parts[-1] if parts else match[0]
