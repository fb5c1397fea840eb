"""Jacobian-lens files: locate (hub or local), load safely, validate against a model, save.

The published format (neuronpedia/jacobian-lens, Anthropic's reference `jlens`)
is a `torch.save` dict:

    J             {source_layer: Tensor [d_model, d_model]}, J[i, j] = d h_final_i / d h_l_j
    source_layers [int]  (the last layer is the target: it has no J, the readout uses I)
    n_prompts     int
    d_model       int
    provenance    optional dict (model, corpus, T, skip, dtype, convergence, unembedding, ...)

A lens fitted here records in its provenance the model it was fitted on, a hash of the model's
unembedding (`unembedding`), the library releases (`versions`) and the model's hub revision
(`revision`): `provenance.py` reads and compares them, and `load` warns where the serving side differs
(never an error: a renamed or re-saved copy of the same model is common, and the shapes are checked).

Readout: `h_l @ J_l.T`, then the model's own final norm and unembedding.

BOS. Anthropic's reference `jlens` fits and reads with a BOS token first (`from_hf(force_bos=True)`,
its default), and Neuronpedia's server prepends one too (`prepend_bos`): its published lenses were fitted
so. `provenance["bos"]` records it for lenses fitted here; a hub lens without the key is taken to follow
the reference; a local file without it is unknown and read as tokenized. `fitted_with_bos` says which,
`with_bos` prepends, and `bos_warning` says when a readout's prompt does not start as the lens's did.
Files are always read with `weights_only=True`: a lens file is data, never code.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from . import redact
from .provenance import same_model, str_dict, version_warnings

log = logging.getLogger(__name__)

KNOWN_KEYS = {"J", "source_layers", "n_prompts", "d_model", "provenance"}


class LensFileError(ValueError):
    """A lens file that cannot be used with this model; the message names both sides."""


@dataclass
class JacobianLens:
    """A loaded lens: only the selected layers, in the dtype it will be kept in."""

    J: dict[int, torch.Tensor]
    n_prompts: int
    d_model: int
    source: str = ""
    provenance: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)   # shown to the user, e.g. a lens fitted on another model

    @property
    def layers(self) -> list[int]:
        return sorted(self.J)

    def describe(self) -> dict:
        """Small JSON-able summary for the UI and results (no tensors)."""
        # A local path is shown by its file name: the server's folders are nobody's business (redact.py).
        source = Path(self.source).name if Path(self.source).exists() else redact.paths(self.source)
        return {
            "source": source,
            "n_prompts": self.n_prompts,
            "d_model": self.d_model,
            "layers": self.layers,
            "provenance": {k: redact.paths(v) for k, v in self.provenance.items()
                           if isinstance(v, (str, int, float, bool, list)) or str_dict(v)},
        } | ({"warnings": [redact.paths(w) for w in self.warnings]} if self.warnings else {})


def resolve(spec: str, cache_dir: str | Path | None = None) -> Path:
    """A local path, or `HUB_REPO:FILE` (e.g. `neuronpedia/jacobian-lens:qwen3-8b/jlens/.../x.pt`), to a local file."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    repo, sep, filename = spec.partition(":")
    if not sep or not repo or not filename or repo.count("/") != 1:
        raise LensFileError(f"lens {spec!r}: no such file, and not of the form HUB_REPO:PATH_IN_REPO")
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo, filename, cache_dir=cache_dir))
    except Exception as e:  # network, 404, auth: all mean "this lens is not available"
        raise LensFileError(f"lens {spec!r}: could not download from the hub ({type(e).__name__}: {e})") from e


@dataclass
class LensFile:
    """A lens file's contents, checked for its own consistency only (no model needed)."""

    J: dict[int, torch.Tensor]
    n_prompts: int
    d_model: int
    provenance: dict
    path: Path

    @property
    def layers(self) -> list[int]:
        return sorted(self.J)


def read(spec: str | Path, cache_dir: str | Path | None = None) -> LensFile:
    """Resolve and read a lens file (weights_only): LensFileError when it is not one."""
    path = resolve(str(spec), cache_dir)
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        # torch's own message suggests weights_only=False, which a lens file never needs: name the type only.
        raise LensFileError(f"lens {path}: not a torch.save file of tensors ({type(e).__name__})") from e
    if not isinstance(raw, dict) or not isinstance(raw.get("J"), dict):
        raise LensFileError(f"lens {path}: expected a dict with a 'J' dict of matrices")
    unknown = set(raw) - KNOWN_KEYS
    if unknown:
        log.warning("lens %s: ignoring unknown keys %s", path, sorted(unknown))
    try:
        J = {int(k): v for k, v in raw["J"].items()}
        d_model = int(raw.get("d_model") or next(iter(J.values())).shape[-1])
        n_prompts = int(raw.get("n_prompts", 0))
    except (TypeError, ValueError, AttributeError, StopIteration):
        raise LensFileError(f"lens {path}: 'J' must map layer numbers to matrices, and hold at least one") from None
    if not J:
        raise LensFileError(f"lens {path}: 'J' holds no matrices")
    for layer, m in J.items():
        if not isinstance(m, torch.Tensor) or tuple(m.shape) != (d_model, d_model):
            shape = tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
            raise LensFileError(f"lens {path}: J[{layer}] is {shape}, expected ({d_model}, {d_model})")
    provenance = raw.get("provenance") if isinstance(raw.get("provenance"), dict) else {}
    return LensFile(J=J, n_prompts=n_prompts, d_model=d_model, provenance=provenance, path=path)


def load(
    spec: str | Path,
    *,
    d_model: int,
    n_layers: int,
    layers: list[int] | None = None,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    cache_dir: str | Path | None = None,
    model_name: str | None = None,
    unembedding: str | None = None,
    versions: dict[str, str] | None = None,
    revision: str | None = None,
) -> JacobianLens:
    """Read, validate against the model (d_model, n_layers) and keep `layers` (default: all in the file).

    Kept in bf16 by default: fp16 can overflow on large-norm residual directions. A lens whose
    provenance names another model than `model_name`, another `unembedding` fingerprint, other library
    releases than `versions` (`provenance.library_versions()` of the serving process) or another model
    `revision`, loads with a warning (see `provenance.py`).
    """
    f = read(spec, cache_dir)
    path = f.path
    if f.d_model != d_model:
        raise LensFileError(f"lens {path} has d_model {f.d_model}, but the model has d_model {d_model}")
    bad = [layer for layer in f.J if not 0 <= layer < n_layers - 1]
    if bad:
        raise LensFileError(f"lens {path} has source layers {bad} outside 0..{n_layers - 2} "
                            f"of this {n_layers}-layer model")
    wanted = f.layers if layers is None else sorted(set(layers))
    missing = [layer for layer in wanted if layer not in f.J]
    if missing:
        raise LensFileError(f"lens {path} has no J for layers {missing}; it has {f.layers}")
    J = {}
    for layer in wanted:
        if not torch.isfinite(f.J[layer]).all():
            raise LensFileError(f"lens {path}: J[{layer}] has non-finite values")
        J[layer] = f.J[layer].to(device=device, dtype=dtype)
    warnings = []
    fitted_on = f.provenance.get("model")
    if model_name and isinstance(fitted_on, str) and fitted_on and not same_model(fitted_on, model_name):
        warnings.append(f"this lens was fitted on {redact.paths(fitted_on)!r}, but the model is "
                        f"{redact.paths(model_name)!r}: "
                        "its readouts may not mean what they seem")
    fitted_against = f.provenance.get("unembedding")
    if unembedding and isinstance(fitted_against, str) and fitted_against != unembedding:
        warnings.append(f"this lens was fitted against another unembedding (fingerprint {fitted_against}, "
                        f"this model's is {unembedding}): its readouts may not mean what they seem")
    warnings += version_warnings(f.provenance, versions or {}, revision)
    return JacobianLens(J=J, n_prompts=f.n_prompts, d_model=d_model, source=str(spec), provenance=f.provenance,
                        warnings=warnings)


def fitted_with_bos(lens: JacobianLens, tokenizer_has_bos: bool = True) -> bool | None:
    """Whether the lens was fitted with a BOS token first: its provenance's "bos", else, for a hub lens, whether
    the tokenizer has one (the reference's default: BOS first where the tokenizer has one, as Qwen's has not),
    else None (not known)."""
    bos = lens.provenance.get("bos")
    if isinstance(bos, bool):
        return bos
    return tokenizer_has_bos if ":" in lens.source and not Path(lens.source).exists() else None


def with_bos(ids: Sequence[int], bos_id: int | None) -> list[int]:
    """ids with bos_id first, unless it already is (a chat template's own) or the tokenizer has none."""
    ids = list(ids)
    return ids if bos_id is None or ids[:1] == [bos_id] else [bos_id] + ids


def bos_warning(fitted: bool | None, ids: Sequence[int], bos_id: int | None) -> str | None:
    """Why a readout of `ids` differs from how the lens was fitted (BOS first or not), or None."""
    starts = bos_id is not None and list(ids[:1]) == [bos_id]
    if fitted is True and not starts:
        return ("this lens was fitted with a BOS token before every prompt, and this model's tokenizer has "
                "none: its readouts may differ from the fitted ones")
    if fitted is False and starts:
        return ("this lens was fitted without a BOS token, and this prompt starts with one: "
                "its readouts may differ from the fitted ones")
    return None


def save(path: str | Path, J: dict[int, torch.Tensor], *, n_prompts: int, provenance: dict | None = None,
         dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the published format. `provenance` should say model, corpus, T, skip, dtype, convergence."""
    if not J:
        raise ValueError("no matrices to save")
    d_model = next(iter(J.values())).shape[-1]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({
        "J": {int(layer): m.detach().to("cpu", dtype).contiguous() for layer, m in sorted(J.items())},
        "source_layers": sorted(int(layer) for layer in J),
        "n_prompts": int(n_prompts),
        "d_model": int(d_model),
        "provenance": dict(provenance or {}),
    }, path)
    return path


def identity(d_model: int, layers: list[int]) -> dict[int, torch.Tensor]:
    """J = I for each layer: a lens that must read exactly like the logit lens (used in tests)."""
    return {layer: torch.eye(d_model) for layer in layers}
