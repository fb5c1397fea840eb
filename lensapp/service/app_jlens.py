"""The app's Jacobian lens: the one the settings name, checked against the model it reads (its unembedding's
fingerprint, the library releases it was fitted under), and the stack the engine holds (its layers, then the
last layer reading J = I). The service and `lensapp engine` load it the same way.
"""

from __future__ import annotations

import hashlib
import logging

import torch

from .. import jlens as jlens_files
from .. import provenance
from ..config import EngineSettings, resolve_cache_dir, resolve_jlens
from ..engine.run.protocol import JStack
from ..engine.start.backend_kinds import kind_of
from ..engine.start.loading import ResolvedModel

log = logging.getLogger(__name__)


def load_configured_jlens(engine: EngineSettings,
                          model: ResolvedModel) -> tuple[jlens_files.JacobianLens | None, str | None]:
    """The lens the settings ask for, checked against the model. A lens asked for by name that does not
    load is an error (LensFileError); the model's default lens that does not load (a hub lens while
    offline) leaves the app on the logit lens, with the reason."""
    spec = resolve_jlens(engine)
    if not spec:
        return None, None
    try:
        return load_jlens(spec, model, engine), None
    except jlens_files.LensFileError as e:
        if engine.jlens != "default":
            raise
        log.warning("serving without a Jacobian lens: %s", e)
        return None, str(e)


def load_jlens(spec: str, model: ResolvedModel, engine: EngineSettings) -> jlens_files.JacobianLens:
    info = model.info
    fingerprint = provenance.model_unembedding_fingerprint(model.path, model.family.weights)
    # The releases this process reads the lens under: those its backend kind runs on.
    libraries = list(kind_of(info).libraries)
    lens = jlens_files.load(spec, d_model=info.d_model, n_layers=info.n_layers, layers=engine.jlens_layer_list,
                            dtype=torch.bfloat16, cache_dir=resolve_cache_dir(engine) / "hub", model_name=info.name,
                            unembedding=fingerprint, versions=provenance.library_versions(libraries),
                            revision=getattr(model.hf_config, "_commit_hash", None))
    for warning in lens.warnings:
        log.warning("lens %s: %s", spec, warning)
    return lens


def engine_stack(lens: jlens_files.JacobianLens | None, model: ResolvedModel) -> JStack | None:
    """The lens as the engine holds it: its layers, then the last layer reading J = I."""
    if lens is None:
        return None
    d, last = model.info.d_model, model.info.n_layers - 1
    J = torch.stack([lens.J[layer] for layer in lens.layers] + [torch.eye(d, dtype=torch.bfloat16)])
    for i, layer in enumerate(lens.layers):       # one copy in this process: the lens reads the stack's rows
        lens.J[layer] = J[i]
    return JStack(layers=tuple(lens.layers + [last]), J=J)


def lens_key(lens: jlens_files.JacobianLens | None) -> str:
    """What identifies the lens in the result cache's keys: its layers and values (empty without one)."""
    if lens is None:
        return ""
    h = hashlib.sha256()
    for layer in lens.layers:
        h.update(layer.to_bytes(4, "little"))
        h.update(lens.J[layer].to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
    return h.hexdigest()[:16]
