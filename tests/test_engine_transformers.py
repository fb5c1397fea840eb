"""The engine and service on the TransformersModel backend, with a tiny random model built here (fast)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from lensapp import config, jlens
from lensapp.service import GenerateRequest, LensRequest, LensService, RequestError


@pytest.fixture(scope="module")
def tiny_engine(tiny_service):
    return tiny_service


def test_last_layer_lens_is_the_models_own_prediction_everywhere(tiny_engine, tiny_model_dir):
    prompt = "The capital of France is"
    r = tiny_engine.lens(LensRequest(prompts=(prompt,), k=3))[0]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = hf(torch.tensor([r.input_ids])).logits[0]
    ro = r.lenses["logit"]
    assert ro.top_ids[-1, :, 0].tolist() == logits.argmax(-1).tolist()
    torch.testing.assert_close(torch.tensor(ro.top_probs[-1, :, 0]), logits.softmax(-1).max(-1).values)
    assert abs(ro.kl_to_final[-1]).max() < 1e-4
    assert r.model_next_id == int(logits[-1].argmax())


def test_identity_jacobian_lens_equals_logit_lens(tiny_engine):
    assert tiny_engine.jlens_layers == list(range(tiny_engine.info.n_layers))       # J = I on every layer
    r = tiny_engine.lens(LensRequest(prompts=("Water boils at",), lens="both", k=4, targets=("hot",)))[0]
    a, b = r.lenses["logit"], r.lenses["jacobian"]
    assert (a.top_ids == b.top_ids).all()
    assert (a.top_probs == b.top_probs).all() and (a.entropy == b.entropy).all()
    assert (a.targets[0].probs == b.targets[0].probs).all()


def test_generation_rows_then_one_per_step(tiny_engine):
    g = tiny_engine.generate(GenerateRequest(prompt="Hello there", max_tokens=4, layers="0,-1"))
    assert len(g.steps) == len(g.token_ids) >= 1
    assert [len(s.readout.input_ids) for s in g.steps] == [len(g.steps[0].readout.input_ids)] + [1] * (len(g.steps) - 1)
    # greedy: each step's last-layer top-1 at the newest position is the token generated there
    assert [s.readout.lenses["logit"].top_ids[-1, -1, 0] for s in g.steps] == g.token_ids


def test_bad_requests_get_clear_errors(tiny_engine):
    with pytest.raises(RequestError, match="outside"):
        tiny_engine.lens(LensRequest(prompts=("x",), layers="9"))
    with pytest.raises(RequestError, match="limit"):
        tiny_engine.lens(LensRequest(prompts=("word " * 600,)))
    # the engine still serves after bad input
    assert tiny_engine.lens(LensRequest(prompts=("x",), layers="0"))[0].layers == [0]


def test_requests_are_served_in_arrival_order(tiny_engine, monkeypatch):
    """The transformers backend runs one request at a time: a generation queued between two lens
    requests runs between them (a busy workshop must not starve /generate)."""
    import threading
    import time

    backend, ran = tiny_engine.engine._backend, []
    for name in ("run_lens", "run_generate"):
        real = getattr(backend, name)

        async def recorded(*args, _real=real, _name=name):
            ran.append(_name)
            return await _real(*args)
        monkeypatch.setattr(backend, name, recorded)
    gate = threading.Event()

    async def hold(backend):
        gate.wait(30)                                          # blocks the engine's thread until the gate opens

    blocker = threading.Thread(target=lambda: tiny_engine.engine.call("hold", hold))
    blocker.start()
    while tiny_engine.engine.health()["in_flight"] == 0:
        time.sleep(0.01)

    def enqueue(fn):
        before = tiny_engine.engine.health()["queue_depth"]
        t = threading.Thread(target=fn)
        t.start()
        while tiny_engine.engine.health()["queue_depth"] == before:      # queued in this order
            time.sleep(0.01)
        return t

    def lens(prompt):
        return lambda: tiny_engine.lens(LensRequest(prompts=(prompt,), layers="0"))

    threads = [enqueue(lens("Water boils at")), enqueue(lambda: tiny_engine.generate(GenerateRequest(prompt="Hi",
                                                                                                       max_tokens=2))),
               enqueue(lens("Ice melts at"))]
    gate.set()
    for t in [blocker, *threads]:
        t.join(60)
    assert ran == ["run_lens", "run_generate", "run_lens"]


def test_a_long_target_is_scored_by_its_first_token_and_says_so(tiny_engine):
    long = "the city of Paris and capital of France on the river Seine in western Europe with its art and food"
    r = tiny_engine.lens(LensRequest(prompts=("Water boils at",), targets=("Paris", long), k=2))[0]
    short, whole = r.lenses["logit"].targets
    assert len(whole.token_ids) > config.MAX_CONTINUATION_TOKENS and whole.continuation_logprob is None
    assert whole.scored_as.startswith("first token only") and whole.probs.shape == short.probs.shape


def test_a_default_lens_that_fails_to_load_leaves_the_logit_lens_serving(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(config.KNOWN_JLENSES, str(tiny_model_dir), "/no/such/lens.pt")
    service = LensService.start(config.Config.of(model=str(tiny_model_dir), backend="transformers"))
    try:
        assert service.jlens is None and "no such file" in service.jlens_error
        assert service.lens(LensRequest(prompts=("x",), layers="0"))[0].layers == [0]
    finally:
        service.close()
    with pytest.raises(jlens.LensFileError, match="no such file"):     # asked for by name: an error
        LensService.start(config.Config.of(model=str(tiny_model_dir), backend="transformers", jlens="/no/such/lens.pt"))


def test_a_failing_request_fails_alone(tiny_engine, monkeypatch):
    """A request that breaks the backend fails with its own error; one running beside it is answered."""
    import threading

    real = tiny_engine.engine._backend.run_lens

    async def run_lens(spec):                  # a backend that chokes on one prompt, whatever runs beside it
        if len(spec.input_ids) > 20:
            raise ValueError("this prompt breaks the backend")
        return await real(spec)

    monkeypatch.setattr(tiny_engine.engine._backend, "run_lens", run_lens)
    results = {}

    def ask(name, prompt):
        try:
            results[name] = tiny_engine.lens(LensRequest(prompts=(prompt,), layers="0"))[0].layers
        except ValueError as e:
            results[name] = str(e)

    threads = [threading.Thread(target=ask, args=("short", "Water boils at")),
               threading.Thread(target=ask, args=("long", "word " * 40))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {"short": [0], "long": "this prompt breaks the backend"}
    assert tiny_engine.engine.state == "ready"                # a request's own failure restarts nothing
