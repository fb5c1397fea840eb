"""`engine.run.weights`: unembedding rows and the final norm read off disk, against the loaded model's own weights
(the embedded model, and tiny models of the families whose files differ: untied heads, GPT-2's and GPT-NeoX's
names, Gemma's (1 + weight) norm, Cohere's LayerNorm)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from lensapp.engine.run.families import detect, find
from lensapp.engine.run.weights import CheckpointWeights, WeightsNotFound


def check_weights(folder, ids=(0, 1, 17, 1000)):
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    family = detect(hf.config)
    w = CheckpointWeights(folder, family)
    assert torch.equal(w.unembedding_rows(list(ids)), hf.get_output_embeddings().weight[list(ids)].detach())
    norm = find(hf, family.hf.norm)
    assert torch.equal(w.final_norm_weight(), norm.weight.detach())
    want = norm.weight.detach() + (1 if family.norm_plus_one else 0)
    assert torch.equal(w.final_norm_scale(), want)
    return w


def test_weights_of_the_embedded_model_are_the_loaded_models(embedded_dir):
    w = check_weights(embedded_dir, ids=(0, 12, 7042, 49151))
    assert w.unembedding_key.endswith("embed_tokens.weight")          # tied: only the embedding is stored
    with pytest.raises(ValueError, match="outside"):
        w.unembedding_rows([49152])


@pytest.mark.parametrize("model_type, settings, key", [
    ("llama", {"tie_word_embeddings": False}, "lm_head.weight"),
    ("gemma", {"head_dim": 16, "num_key_value_heads": 1}, "embed_tokens.weight"),
    ("gpt2", {}, "wte.weight"),
    ("gpt_neox", {"tie_word_embeddings": False}, "embed_out.weight"),
    ("cohere", {"num_key_value_heads": 1}, "embed_tokens.weight"),
])
def test_weights_of_tiny_family_models_are_the_loaded_models(make_tiny_model, model_type, settings, key):
    w = check_weights(make_tiny_model(model_type, **settings))
    assert w.unembedding_key.endswith(key)
    assert w.family.norm_plus_one == (model_type == "gemma")


def test_a_model_with_no_files_is_named(tmp_path):
    with pytest.raises(WeightsNotFound, match="no safetensors"):
        CheckpointWeights(tmp_path, detect(type("C", (), {"model_type": "llama"})()))
    with pytest.raises(WeightsNotFound, match="not a folder"):
        CheckpointWeights("nobody/no-such-model-here", detect(type("C", (), {"model_type": "llama"})()))
