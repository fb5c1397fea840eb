"""Every architecture family on the transformers backend, each on a tiny random model built here.

Per model type: (a) the logit lens at every layer is the model's own hidden states read through its
final norm, head and logit arithmetic, and the last layer is the model's own logits; (b) the
Jacobian lens reads norm(h @ J.T) for a random, non-symmetric J; (c) the fitter's Jacobian equals a
brute-force one; (d) the unembedding fingerprint read from the files is the loaded model's. Then: a
model of an unknown layout fails at start with one line.

And an oracle, in the spirit of NDIF nnbench's, for what a user reads off a cell: (e) a target word's rank and
probability at every cell, and a multi-token word's whole continuation, (f) a steered readout, (g) the
components of a logit (the families whose blocks the readout knows; the others refused in one line), each
against an independent reference (plain transformers in fp32, forward hooks, eager attention: nothing of the
app's but its layout table), the words resolved by the tokenizer itself (the tokens `prompt + " " + word` has
after the prompt's). A silently wrong cell fails. The word on other tokenizers: test_words.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from components_reference import PARTS, assert_parts_match, load_eager
from components_reference import reference as components_reference
from conftest import random_jacobians
from transformers import AutoModelForCausalLM, AutoTokenizer

from lensapp import cli, config, fitting, jlens, provenance
from lensapp.engine.run.families import FAMILIES, detect, find
from lensapp.service import ComponentsRequest, InterveneRequest, LensRequest, LensService, RequestError
from lensapp.service.intervening.norms import REFERENCE_TEXT

# Each family's own settings: grouped-query attention (one KV head) where it has it, and its logit arithmetic
# on, hard enough that leaving it out shows.
GQA = {"num_key_value_heads": 1}
FAMILY_SETTINGS = {
    "llama": GQA, "mistral": GQA, "qwen2": GQA, "qwen3": GQA | {"head_dim": 16}, "phi3": GQA, "smollm3": GQA,
    "gemma": GQA | {"head_dim": 16}, "gemma2": GQA | {"head_dim": 16, "final_logit_softcapping": 20.0},
    "gemma3_text": GQA | {"head_dim": 16, "final_logit_softcapping": 20.0}, "olmo2": GQA,
    "granite": GQA | {"logits_scaling": 4.0}, "cohere": GQA | {"logit_scale": 0.25},
    "cohere2": GQA | {"logit_scale": 0.25}, "gpt2": {}, "gpt_neox": {},
}
MODEL_TYPES = sorted(FAMILY_SETTINGS)
PROMPT = "The capital of France is a city on the river"
TIE = 1e-5          # top-1s closer than this (in probability) are a near-tie: either order is right


def test_every_model_type_of_the_table_is_tested_here():
    assert sorted(t for f in FAMILIES for t in f.model_types) == MODEL_TYPES


def family_logits(cfg, logits: torch.Tensor) -> torch.Tensor:
    """Each family's arithmetic after the head, as its HF code writes it (checked at the last layer below)."""
    if getattr(cfg, "final_logit_softcapping", None):
        logits = torch.tanh(logits / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
    if cfg.model_type == "granite":
        logits = logits / cfg.logits_scaling
    if cfg.model_type.startswith("cohere"):
        logits = logits * cfg.logit_scale
    return logits


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Every test here on one torch thread (conftest's `one_thread`)."""


@pytest.fixture(scope="module", params=MODEL_TYPES)
def family(request, make_tiny_model):
    """(model type, folder, the HF model in fp32) for one family."""
    folder = make_tiny_model(request.param, **FAMILY_SETTINGS[request.param])
    return request.param, folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def service(family):
    _, folder, _ = family
    service = LensService.start(config.Config.of(model=str(folder), backend="transformers", jlens="none",
                                              cache_entries=0))
    service.wait_ready(300)
    yield service
    service.close()


def references(hf, ids: list[int], J: dict[int, torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Per layer, the readout's logits [P, vocab] from HF's own hidden states (hidden_states[l + 1] is block
    l's output): norm(h @ J.T) with J where given, else norm(h); the last layer is the model's own logits."""
    layout = detect(hf.config).hf
    norm, head = find(hf, layout.norm), hf.get_output_embeddings()
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_hidden_states=True)
        refs = []
        for layer, h in enumerate(out.hidden_states[1:-1]):
            h = h[0] @ J[layer].float().T if J and layer in J else h[0]
            refs.append(family_logits(hf.config, head(norm(h))))
    return refs + [out.logits[0]]


def assert_readout_matches(ro, refs: list[torch.Tensor], what: str):
    """top_ids / top_probs [L, P, k] against reference logits, near-ties aside."""
    for layer, logits in enumerate(refs):
        top = logits.softmax(-1).topk(ro.top_ids.shape[-1], dim=-1)
        clear = (top.values[:, 0] - top.values[:, 1]) > TIE
        got = torch.from_numpy(ro.top_ids[layer, :, 0])
        assert (got[clear] == top.indices[clear, 0]).all(), f"{what}, layer {layer}: top-1 differs"
        torch.testing.assert_close(torch.from_numpy(ro.top_probs[layer]), top.values, rtol=1e-4, atol=1e-5,
                                   msg=lambda m, layer=layer: f"{what}, layer {layer}: {m}")


def test_logit_lens_reads_the_models_own_hidden_states(family, service):
    model_type, _, hf = family
    assert service.info.family == detect(hf.config).name
    r = service.lens(LensRequest(prompts=(PROMPT,), k=5))[0]
    refs = references(hf, r.input_ids)
    # The test's own arithmetic is the model's: norm and head on the last block's output give its logits.
    layout = detect(hf.config).hf
    with torch.no_grad():
        last = []
        find(hf, layout.blocks)[-1].register_forward_hook(lambda m, a, o: last.append(o))
        hf(torch.tensor([r.input_ids]))
        again = family_logits(hf.config, hf.get_output_embeddings()(find(hf, layout.norm)(last[0][0])))
    torch.testing.assert_close(again, refs[-1], rtol=1e-4, atol=1e-4)
    assert_readout_matches(r.lenses["logit"], refs, model_type)
    assert r.model_next_id == int(refs[-1][-1].argmax())


def test_jacobian_lens_reads_norm_of_h_times_J_transposed(family, service):
    model_type, _, hf = family
    d, n = service.info.d_model, service.info.n_layers
    J = random_jacobians(d, range(n - 1))
    service.install_jlens(jlens.JacobianLens(J=J, n_prompts=0, d_model=d))
    try:
        r = service.lens(LensRequest(prompts=(PROMPT,), lens="jacobian", k=5))[0]
    finally:
        service.install_jlens(None)
    got = r.lenses["jacobian"]
    assert_readout_matches(got, references(hf, r.input_ids, J), f"{model_type} J-lens")
    wrong = references(hf, r.input_ids, {layer: m.T for layer, m in J.items()})       # J instead of J.T
    assert any((torch.from_numpy(got.top_ids[layer, :, 0]) != wrong[layer].argmax(-1)).any() for layer in J)


def test_unembedding_fingerprint_from_the_files_is_the_models(family):
    _, folder, hf = family
    family_ = detect(hf.config)
    assert provenance.model_unembedding_fingerprint(folder, family_.weights) == \
        provenance.unembedding_fingerprint(hf.get_output_embeddings().weight)


# -- the oracle: what a user reads off a cell ------------------------------------------------------------

WORDS = ("Paris", "river bank")             # one token and two, as this tokenizer writes them after PROMPT
PLUS_ONE = {"gemma", "gemma2", "gemma3_text"}        # their final norm multiplies by (1 + weight)


def writes(folder, context: str, word: str) -> list[int]:
    """The tokens the model writes for `word` after `context`, by its tokenizer alone."""
    tok = AutoTokenizer.from_pretrained(folder)
    before, after = tok(context)["input_ids"], tok(context + " " + word)["input_ids"]
    assert after[:len(before)] == before
    return after[len(before):]


def assert_ranks_match(ranks: np.ndarray, probs: np.ndarray, logits: torch.Tensor, token: int, what: str):
    """ranks, probs [P] of `token` against the reference logits [P, vocab]: rank 1 + the tokens above it, give or
    take the tokens whose logit is within float error of its own (deep in a random model's tail there are many)."""
    p = logits.softmax(-1)
    mine = logits[:, token:token + 1]
    want = (logits > mine).sum(-1) + 1
    near = ((logits - mine).abs() <= 1e-4 * mine.abs().clamp(min=1)).sum(-1) - 1
    got = torch.from_numpy(ranks)
    assert ((got - want).abs() <= near).all(), f"{what}: ranks {got.tolist()} != {want.tolist()}"
    torch.testing.assert_close(torch.from_numpy(probs), p[:, token], rtol=1e-4, atol=1e-7, msg=what)


def test_a_targets_ranks_and_continuation_are_the_models_own(family, service):
    model_type, folder, hf = family
    r = service.lens(LensRequest(prompts=(PROMPT,), targets=WORDS, k=1))[0]
    refs = references(hf, r.input_ids)
    for j, word in enumerate(WORDS):
        ids = writes(folder, PROMPT, word)
        score = r.lenses["logit"].targets[j]
        assert score.token_ids == ids, f"{model_type}: {word!r}"
        for layer, logits in enumerate(refs):
            assert_ranks_match(score.ranks[layer], score.probs[layer], logits, ids[0], f"{model_type} {word} {layer}")
    ids = writes(folder, PROMPT, WORDS[1])
    assert len(ids) == 2
    with torch.no_grad():
        logp = hf(torch.tensor([r.input_ids + ids[:-1]])).logits[0, -len(ids):].log_softmax(-1)
    want = float(sum(logp[i, t] for i, t in enumerate(ids)))
    assert r.lenses["logit"].targets[1].continuation_logprob[-1] == pytest.approx(want, rel=1e-4, abs=1e-5)


def steered(hf, ids: list[int], layer: int, v: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the readout's logits [P, vocab] with v added to block `layer`'s output at every position (a
    hook), each block's output read through the final norm and head; the last layer is the model's logits."""
    layout = detect(hf.config).hf
    blocks, norm, head = find(hf, layout.blocks), find(hf, layout.norm), hf.get_output_embeddings()
    seen = {}

    def hook(i):
        def run(module, args, out):
            h = out[0] if isinstance(out, tuple) else out
            if i == layer:
                h = h + v
            seen[i] = h[0]
            return (h, *out[1:]) if isinstance(out, tuple) else h
        return run

    handles = [block.register_forward_hook(hook(i)) for i, block in enumerate(blocks)]
    try:
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0]
            return [family_logits(hf.config, head(norm(seen[i]))) for i in range(len(blocks) - 1)] + [logits]
    finally:
        for h in handles:
            h.remove()


def test_a_steered_readout_is_the_hooked_models(family, service):
    """Steering toward the word the model writes: alpha times the layer's typical norm (the median ||h|| over the
    reference paragraph's positions but the first) along scale * W_U[word], added to the block's output."""
    model_type, folder, hf = family
    layer, alpha = 1, 4.0
    res = service.intervene(InterveneRequest(prompt=PROMPT, intervention="steer", word="Paris", layer=str(layer),
                                             alphas=(alpha,), layers="all", k=5))
    paris = writes(folder, PROMPT, "Paris")[0]
    assert res.intervention.word == "Paris"
    layout = detect(hf.config).hf
    norm = find(hf, layout.norm)
    scale = norm.weight.detach() + (1 if model_type in PLUS_ONE else 0)
    w = scale * hf.get_output_embeddings().weight.detach()[paris]
    with torch.no_grad():
        reference_ids = AutoTokenizer.from_pretrained(folder)(REFERENCE_TEXT)["input_ids"]
        kept = {}

        def keep(module, args, out):          # returns None: the block's output stays as it is
            kept["h"] = (out[0] if isinstance(out, tuple) else out)[0]

        handle = find(hf, layout.blocks)[layer].register_forward_hook(keep)
        try:
            hf(torch.tensor([reference_ids]))
        finally:
            handle.remove()
    typical = float(np.median(kept["h"][1:].norm(dim=-1).numpy()))
    v = w / w.norm() * alpha * typical
    refs = steered(hf, res.before.input_ids, layer, v)
    assert_readout_matches(res.after[0].lenses["logit"], refs, f"{model_type} steered")
    assert not np.array_equal(res.after[0].lenses["logit"].top_ids, res.before.lenses["logit"].top_ids)


def test_a_logits_components_are_the_references(family, service):
    model_type, folder, _ = family
    req = ComponentsRequest(prompt=PROMPT, target="Paris", foil="London")
    if model_type not in PARTS:
        with pytest.raises(RequestError, match="not read for") as e:
            service.components(req)
        assert "\n" not in str(e.value)
        return
    got = service.components(req)
    paris, london = writes(folder, PROMPT, "Paris")[0], writes(folder, PROMPT, "London")[0]
    want = components_reference(load_eager(folder), got.input_ids, got.position, paris, london)
    assert_parts_match({"logit": got.logit, "embed": got.embed, "bias": got.bias, "attn": got.attn, "mlp": got.mlp,
                        "heads": got.heads, "attn_bias": got.attn_bias}, want, model_type)


# -- the fitter ------------------------------------------------------------------------------------------

T, SKIP = 10, 2


def brute_force(hf, layout, ids: list[int], layer: int) -> torch.Tensor:
    """mean over valid source positions, sum over valid target positions, of d h_final / d h_layer,
    one output dimension at a time (plain autograd, no nnsight)."""
    blocks = find(hf, layout.blocks)
    valid = slice(SKIP, len(ids) - 1)
    seen = {}

    def replace(module, args, out):
        h = out[0] if isinstance(out, tuple) else out
        seen["x"] = x = h.detach().requires_grad_(True)
        return (x, *out[1:]) if isinstance(out, tuple) else x

    hooks = [blocks[layer].register_forward_hook(replace),
             blocks[-1].register_forward_hook(lambda m, a, o: seen.setdefault("final", o[0] if isinstance(o, tuple)
                                                                                 else o))]
    try:
        with torch.enable_grad():
            hf(input_ids=torch.tensor([ids]), use_cache=False)
            target = seen["final"][0, valid].sum(0)                         # [d_model]
            rows = [torch.autograd.grad(target[i], seen["x"], retain_graph=True)[0][0, valid].mean(0)
                    for i in range(target.shape[0])]
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(rows)


def test_fit_matches_brute_force_jacobian(family, tmp_path):
    from nnsight import TransformersModel
    from transformers import AutoTokenizer

    model_type, folder, hf = family
    model = TransformersModel(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval(),
                              tokenizer=AutoTokenizer.from_pretrained(folder))
    layout = detect(hf.config).hf
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 1000, (T,), generator=g).tolist() for _ in range(2)]
    cfg = fitting.FitConfig(tokens=T, skip=SKIP, dim_batch=16, min_prompts=1, max_prompts=2, threshold=0.0,
                            window=1, checkpoint_every=2, checkpoint_dir=tmp_path / "ckpt", save_dtype="float32")
    lens = jlens.load(fitting.fit(model, layout, prompts, cfg, tmp_path / "lens.pt", progress=False),
                      d_model=hf.config.hidden_size, n_layers=hf.config.num_hidden_layers, dtype=torch.float64)
    assert lens.layers == list(range(hf.config.num_hidden_layers - 1))
    for layer in lens.layers:
        want = torch.stack([brute_force(model._module, layout, p, layer) for p in prompts]).mean(0)
        assert (want - torch.eye(want.shape[0])).norm() > 0.5, f"{model_type}: too near identity to tell"
        torch.testing.assert_close(lens.J[layer], want, rtol=1e-4, atol=1e-6)


# -- unknown layouts ------------------------------------------------------------------------------------

def opt(folder):
    """A tiny OPT: a causal LM whose layout the app does not know, saved with its weights."""
    from transformers import OPTConfig, OPTForCausalLM

    OPTForCausalLM(OPTConfig(vocab_size=1000, hidden_size=16, ffn_dim=32, num_hidden_layers=2, num_attention_heads=2,
                             word_embed_proj_dim=16, max_position_embeddings=64)).save_pretrained(folder)


def gemma3_multimodal(folder):
    """Gemma 3's image-text wrapper (model_type gemma3): its text config is gemma3_text, but its text model
    lives under model.language_model, so it is not the gemma family's layout. Its config is all start reads."""
    from transformers import Gemma3Config

    Gemma3Config(text_config={"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 16},
                 vision_config={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2},
                 architectures=["Gemma3ForConditionalGeneration"]).save_pretrained(folder)


@pytest.mark.parametrize("make, arch", [(opt, "OPTForCausalLM"), (gemma3_multimodal, "Gemma3ForConditionalGeneration")])
@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_an_unknown_layout_fails_at_start_with_one_line(make, arch, backend, embedded_dir, tmp_path, capsys):
    from transformers import AutoTokenizer

    make(tmp_path)
    AutoTokenizer.from_pretrained(embedded_dir).save_pretrained(tmp_path)
    capsys.readouterr()                                        # the save's progress bar
    assert cli.main(["lens", "x", "--model", str(tmp_path), "--backend", backend]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: ")
    assert arch in err and "llama" in err and "gpt_neox" in err, err


def test_a_missing_model_folder_fails_with_one_line(capsys):
    assert cli.main(["lens", "x", "--model", "/no/such/folder", "--backend", "transformers"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "cannot read its config" in err, err
