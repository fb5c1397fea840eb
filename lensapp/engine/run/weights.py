"""A model's unembedding rows and final norm weight, read straight from its safetensors files.

The service builds steering directions (`lensapp.interventions`) from a few rows of W_U and the final
norm's weight. The loaded weights live in the backend (on vLLM, in its worker process), so they are
read here from the checkpoint instead, a row at a time (safetensors' `get_slice`), without loading
the model: a folder, or a hub id already in the local cache (nothing is downloaded).

Where the tensors are: the unembedding under the family's key suffixes (`Family.weights`, first
found wins: the head, then the input embedding a model with tied embeddings stores instead); the final
norm under the HF layout's norm path (e.g. "model.norm.weight"), matched whole, as a suffix (a model
wrapped in another's namespace), or with its leading parts dropped ("ln_f.weight" in GPT-2's own
files). Everything comes back float32 on the CPU, in the checkpoint's values (no logit arithmetic).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from ...interventions import norm_scale
from .families import Family


class WeightsNotFound(LookupError):
    """The checkpoint has no such tensor (or no safetensors files); the message names what was looked for."""


def checkpoint_folder(model: str | Path) -> Path:
    """A local folder, or a hub id's snapshot in the local cache (safetensors only; never downloads)."""
    folder = Path(model).expanduser()
    if folder.is_dir():
        return folder
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(str(model), allow_patterns=["*.safetensors", "*.json"], local_files_only=True))
    except Exception as e:  # noqa: BLE001 - not cached, or not a hub id: the same answer
        raise WeightsNotFound(f"{model}: not a folder, and not in the local hub cache ({type(e).__name__})") from e


class CheckpointWeights:
    """One model's checkpoint, indexed once (which file holds which key); rows are read on demand."""

    def __init__(self, model: str | Path, family: Family):
        from safetensors import safe_open

        self.folder = checkpoint_folder(model)
        self.family = family
        self._file_of: dict[str, Path] = {}
        for file in sorted(self.folder.glob("*.safetensors")):
            with safe_open(file, "pt") as st:
                for key in st.keys():
                    self._file_of.setdefault(key, file)
        if not self._file_of:
            raise WeightsNotFound(f"{self.folder} holds no safetensors files")
        self.unembedding_key = self._find_suffix(family.weights)
        self.norm_key = self._find_norm(family.hf.norm + ".weight")

    def unembedding_rows(self, token_ids: Sequence[int]) -> torch.Tensor:
        """W_U[token_ids] -> [n, d_model] float32 (rows of the head, or of the tied input embedding)."""
        from safetensors import safe_open

        with safe_open(self._file_of[self.unembedding_key], "pt") as st:
            part = st.get_slice(self.unembedding_key)
            vocab = part.get_shape()[0]
            bad = [t for t in token_ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"token ids {bad} are outside the unembedding's 0..{vocab - 1}")
            rows = [part[t:t + 1] for t in token_ids]
        return torch.cat(rows).float() if rows else torch.zeros(0, self.d_model)

    def final_norm_weight(self) -> torch.Tensor:
        """The final norm's stored weight [d_model] float32 (as stored: Gemma's is the offset from 1)."""
        from safetensors import safe_open

        with safe_open(self._file_of[self.norm_key], "pt") as st:
            return st.get_tensor(self.norm_key).float()

    def final_norm_scale(self) -> torch.Tensor:
        """What the final norm multiplies by [d_model]: its weight, or 1 + weight for Gemma's norms."""
        return norm_scale(self.final_norm_weight(), self.family.norm_plus_one)

    @property
    def d_model(self) -> int:
        from safetensors import safe_open

        with safe_open(self._file_of[self.unembedding_key], "pt") as st:
            return int(st.get_slice(self.unembedding_key).get_shape()[1])

    def _find_suffix(self, suffixes: Sequence[str]) -> str:
        for suffix in suffixes:
            key = next((k for k in self._file_of if k == suffix or k.endswith("." + suffix)), None)
            if key is not None:
                return key
        raise WeightsNotFound(f"{self.folder}: no tensor named like {' or '.join(suffixes)}")

    def _find_norm(self, path: str) -> str:
        parts = path.split(".")
        for k in self._file_of:
            if k == path or k.endswith("." + path):
                return k
        for i in range(1, len(parts) - 1):                 # leading parts dropped, the weight's name kept
            if ".".join(parts[i:]) in self._file_of:
                return ".".join(parts[i:])
        raise WeightsNotFound(f"{self.folder}: no final norm weight named like {path}")
