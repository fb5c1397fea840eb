"""How good is a lens (issue 40): the intermediate's rank per layer against an independent transformers reference,
the item reader (the published form, hostile files), the best band, `lensapp evaluate`, the API's bound, the chart
and the Jacobian tab's panel, on tiny random models built here (seconds; the embedded model on vLLM:
test_evaluation_vllm.py)."""

from __future__ import annotations

import dataclasses
import json

import gradio as gr
import numpy as np
import pytest
import torch
from conftest import random_jacobians
from hostile import assert_one_line

from lensapp import config, jlens
from lensapp.results.evaluation import EvaluationResult, best_band
from lensapp.service.evaluation_items import SHIPPED, item_set, parse
from lensapp.service.field import RequestError
from lensapp.service.requests import EvaluateRequest

LAYERS_WITH_J = [0, 1]                 # the tiny model's 3 layers: J on the first two, I on the last


# -- an independent reference: plain transformers, eager attention, forward hooks ----------------------------

def reference_ranks(folder, ids: list[int], words: list[int], J: dict[int, torch.Tensor] | None) -> np.ndarray:
    """[layers, words]: each word's rank (1 = top; ties in its favour) at the last position, read through the final
    norm and the head from each block's output (transported by J[layer] first, where given)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    blocks, kept = model.model.layers, {}
    hooks = [block.register_forward_hook(lambda m, i, out, layer=layer: kept.__setitem__(
        layer, (out[0] if isinstance(out, tuple) else out)[0, -1].detach())) for layer, block in enumerate(blocks)]
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
            rows = []
            for layer in range(len(blocks)):
                h = kept[layer]
                if J is not None and layer in J:
                    h = h @ J[layer].float().T
                logits = model.lm_head(model.model.norm(h))
                rows.append([1 + int((logits > logits[w]).sum()) for w in words])
    finally:
        for hook in hooks:
            hook.remove()
    return np.array(rows)


@pytest.fixture(scope="module")
def tiny_llama(make_tiny_model):
    return make_tiny_model("llama")


@pytest.fixture(scope="module")
def lens_file(tmp_path_factory, tiny_llama):
    d = json.loads((tiny_llama / "config.json").read_text())["hidden_size"]
    return jlens.save(tmp_path_factory.mktemp("lens") / "random.pt", random_jacobians(d, LAYERS_WITH_J), n_prompts=0,
                      provenance={"model": "a tiny random llama", "corpus": "none: a random test lens"})


@pytest.fixture(scope="module")
def service(tiny_llama, lens_file):
    from lensapp.service import LensService

    s = LensService.start(config.Config.of(model=str(tiny_llama), backend="transformers", jlens=str(lens_file),
                                        cache_entries=8, request_timeout=60))
    s.wait_ready(300)
    yield s
    s.close()


def spaced_tokens(tokenizer, ids, n: int) -> list[str]:
    """Up to n words among `ids` that a leading space makes one token again (so an item can name them)."""
    out = []
    for i in ids:
        text = tokenizer.decode([int(i)])
        if text.startswith(" ") and text.strip().isalpha() and \
                tokenizer(" " + text.strip(), add_special_tokens=False)["input_ids"] == [int(i)]:
            out.append(text.strip())
        if len(out) == n:
            break
    return out


@pytest.fixture(scope="module")
def items_file(tmp_path_factory, service, tiny_llama, lens_file):
    """Items whose intermediates are words the reference reads near the top at some layer (so items hit, at
    different layers and ranks), beside two that name words read nowhere near it and share one (so the first one's
    control must be found further on)."""
    tok = service.prompts.tokenizer
    J = jlens.read(lens_file).J
    prompts = ["The capital of the country where the Eiffel Tower stands is", "Water boils at a temperature of",
               "The ocean on the coast of the country where Carnival is celebrated is the", "Once upon a time there"]
    items = []
    for i, prompt in enumerate(prompts):
        ids = service.prompts.ids(prompt)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
        with torch.no_grad():
            hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[1 + i % 2][0, -1]
            lens = hidden @ J[i % 2].float().T if i % 2 else hidden      # what some layer reads near the top
            top = model.lm_head(model.model.norm(lens)).topk(400).indices
        words = spaced_tokens(tok, top[3 * i:], 2)
        items.append({"name": f"item-{i}", "prompt": prompt, "target": "Paris", "intermediates": words,
                      "split": "dev" if i % 2 else "heldout"})
    items.append({"name": "nowhere", "prompt": "Hello there", "target": "friend", "intermediates": ["Zanzibar"]})
    items.append({"name": "nowhere-again", "prompt": "Good morning", "target": "friend",   # shares Zanzibar: the
                  "intermediates": ["Zanzibar", "Oslo"]})                # item before takes its control further on
    path = tmp_path_factory.mktemp("items") / "items.json"
    path.write_text(json.dumps({"items": items}))
    return path


def test_ranks_and_hits_match_a_hooked_transformers_reference(service, items_file, tiny_llama, lens_file):
    result = service.evaluate(EvaluateRequest(items=str(items_file), split="all"), files=True)
    assert list(result.lenses) == ["logit", "jacobian"] and result.n_items == 6
    J = jlens.read(lens_file).J
    doc = json.loads(items_file.read_text())["items"]
    first = [[t.token_ids[0] for t in service.prompts.words(item["intermediates"], service.prompts.ids(item["prompt"]))]
             for item in doc]
    for name, transport in (("logit", None), ("jacobian", J)):
        s = result.lenses[name]
        assert s.layers.tolist() == [0, 1, 2]
        inter, control, target = [], [], []
        for i, item in enumerate(doc):
            mine = first[i] + [service.prompts.word(item["target"], service.prompts.ids(item["prompt"])).token_ids[0]]
            others = [first[j % len(doc)] for j in range(i + 1, i + len(doc))]
            other = next(o for o in others if not set(o) & set(mine))         # the next item naming none of them
            ranks = reference_ranks(tiny_llama, service.prompts.ids(item["prompt"]), mine + other, transport)
            inter.append(ranks[:, :len(first[i])].min(1))
            target.append(ranks[:, len(first[i])])
            control.append(ranks[:, len(mine):].min(1))
        np.testing.assert_array_equal(s.intermediate_rank, np.array(inter), err_msg=name)
        np.testing.assert_array_equal(s.target_rank, np.array(target), err_msg=name)
        np.testing.assert_array_equal(s.control_rank, np.array(control), err_msg=name)
        for k in (1, 10):
            hits = np.array(inter) <= k
            np.testing.assert_allclose(s.hit_rate(k), hits.mean(0))
            assert s.some_layer(k) == pytest.approx(hits.any(1).mean())
    assert (result.lenses["logit"].intermediate_rank[:4] <= 10).any(), "no item hits: the test would prove little"
    assert (result.lenses["logit"].intermediate_rank != result.lenses["jacobian"].intermediate_rank).any()
    last = [result.lenses[name].target_rank[:, -1] for name in ("logit", "jacobian")]
    np.testing.assert_array_equal(*last)                                 # J = I at the last layer


def test_the_last_position_alone_is_what_a_whole_readout_reads_there_on_transformers(service):
    """`read_from` on run_lens (the transformers backend): the last position's readout, and only it, equal to the
    last column of the readout of every position."""
    from lensapp.service import planning

    ids = service.prompts.ids("The capital of the country where the Eiffel Tower stands is")
    n = service.info.n_layers
    spec = planning.lens_spec(ids, list(range(n)), 5, ("logit", "jacobian"), n, service.jlens_layers,
                              target_ids=[[service.prompts.word("France", ids).token_ids[0]]])
    import dataclasses

    whole, last = service.engine.lens([spec, dataclasses.replace(spec, read_from=len(ids) - 1)])
    for name in ("logit", "jacobian"):
        for key, value in last.readouts[name].items():
            assert value.shape[1] == 1, key
            torch.testing.assert_close(value[:, 0], whole.readouts[name][key][:, -1], msg=key)
    assert last.model_next_id == whole.model_next_id


def test_the_best_band_is_the_peak_and_its_neighbours_within_a_standard_error():
    layers = list(range(8))
    # 40 items: the peak 0.5 at layer 4; one standard error sqrt(.25 / 40) = 0.079, so the floor is 0.421
    rate = np.array([0.0, 0.1, 0.3, 0.45, 0.5, 0.43, 0.2, 0.5])
    band = best_band(layers, rate, 40)
    assert (band.first, band.last, band.best, band.rate) == (3, 5, 4, 0.5)
    assert band.floor == pytest.approx(0.5 - (0.25 / 40) ** 0.5)
    assert best_band(layers, np.zeros(8), 40) is None
    # few items: never less than one item's worth (1/4 here, above the standard error at a peak of 1)
    assert (b := best_band([10, 11, 12], np.array([0.75, 1.0, 0.5]), 4)) and (b.first, b.last) == (10, 11)
    with pytest.raises(ValueError):
        best_band(layers, rate[:3], 40)


# -- the items: the shipped set and the published form ------------------------------------------------------

def test_the_shipped_set_is_two_hop_items_with_a_held_out_half():
    shipped = item_set("two_hop")
    items = shipped.items
    assert len(items) >= 60 and shipped.shipped
    held, dev = shipped.split("heldout"), shipped.split("dev")
    assert len(held) + len(dev) == len(items) and abs(len(held) - len(dev)) <= 2
    for x in items:
        assert not any(w.lower() in x.prompt.lower() for w in x.intermediates), x.name     # unspoken
        assert x.target not in x.intermediates
    assert (SHIPPED["two_hop"].parent / "README.md").read_text().count("heldout") >= 1


HOSTILE = [
    (b"not json", "not JSON"),
    (b"\xff\xfe\x00", "not JSON"),
    (b"[1, 2]", "an object with a list under \"items\""),
    (b'{"items": {}}', "an object with a list under \"items\""),
    (b'{"items": []}', "\"items\" is empty"),
    (b'{"items": [7]}', "item 0 is not an object"),
    (b'{"items": [{"name": "a", "prompt": "", "target": "x", "intermediates": ["y"]}]}', "\"prompt\" must be"),
    (b'{"items": [{"name": "a", "prompt": "p", "target": 3, "intermediates": ["y"]}]}', "\"target\" must be"),
    (b'{"items": [{"name": "a", "prompt": "p", "target": "t"}]}', "\"intermediates\" must be a list"),
    (b'{"items": [{"name": "a", "prompt": "p", "target": "t", "intermediates": []}]}', "\"intermediates\" must be"),
    (b'{"items": [{"name": "a", "prompt": "p", "target": "t", "intermediates": [null]}]}', "\"intermediates\""),
    (b'{"items": [{"name": "a", "prompt": "p\\u0000", "target": "t", "intermediates": ["y"]}]}', "control"),
    (b'{"items": [{"name": "a", "prompt": "\\ud800", "target": "t", "intermediates": ["y"]}]}', "lone surrogate"),
    (b'{"items": [{"name": "a", "prompt": "p", "target": "t", "intermediates": ["y"], "split": "test"}]}',
     "\"split\" must be dev or heldout"),
    (('{"items": [' + ",".join(['{"name": "a", "prompt": "p", "target": "t", "intermediates": ["y"]}'] * 2)
      + "]}").encode(), "two items are named 'a'"),
    (json.dumps({"items": [{"name": "a", "prompt": "x" * 30000, "target": "t", "intermediates": ["y"]}]}).encode(),
     "the limit is"),
    (b"[" * 100000 + b"]" * 100000, "not JSON"),
]


@pytest.mark.parametrize("data, message", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_items_file_is_refused_in_one_clear_line(data, message):
    with pytest.raises(RequestError) as e:
        parse(data, "bad.json")
    assert message in str(e.value) and str(e.value).startswith("items file bad.json")
    assert_one_line(str(e.value))


def test_the_published_form_is_read_and_a_missing_split_is_held_out(tmp_path):
    path = tmp_path / "published.json"
    path.write_text(json.dumps({"items": [{"name": "carnival", "prompt": "The ocean ... is the", "target": "Atlantic",
                                           "intermediates": ["Brazil"], "extra": 1}]}))
    (item,) = item_set(str(path), files=True).split("heldout")
    assert (item.intermediates, item.split) == (("Brazil",), "heldout")
    with pytest.raises(RequestError, match="no dev items"):
        item_set(str(path), files=True).split("dev")
    for source in (str(path), "/etc/passwd", "../two_hop.json"):         # only the shipped sets, but for the CLI
        with pytest.raises(RequestError, match="shipped sets") as e:
            item_set(source)
        assert_one_line(str(e.value))
    with pytest.raises(RequestError, match="cannot be read"):
        item_set(str(tmp_path / "missing.json"), files=True)


# -- the command line, the API ------------------------------------------------------------------------------

def test_the_cli_evaluates_a_file_and_the_shipped_set(capsys, tiny_llama, lens_file, items_file, service):
    from lensapp import cli

    model = ["--model", str(tiny_llama), "--backend", "transformers", "--jlens", str(lens_file)]
    code = cli.main(["evaluate", "--items", str(items_file), "--split", "all", *model, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    r = json.loads(out)
    expected = service.evaluate(EvaluateRequest(items=str(items_file), split="all"), files=True).to_json()
    assert r == json.loads(json.dumps(expected))
    assert r["n_items"] == 6 and set(r["lenses"]) == {"logit", "jacobian"} and r["hit_at"] == [1, 10]
    assert len(r["lenses"]["jacobian"]["hit_rate"]["10"]) == 3

    code = cli.main(["evaluate", "--split", "dev", *model])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"{len(item_set('two_hop').split('dev'))} dev items of two_hop" in out and "some layer hit@10" in out

    bad = items_file.parent / "bad.json"
    bad.write_text('{"items": [7]}')
    assert cli.main(["evaluate", "--items", str(bad), *model]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "error: items file bad.json: item 0 is not an object\n"


def test_the_api_evaluates_only_the_shipped_sets(service, items_file):
    from lensapp.service.kinds import KINDS
    from lensapp.service.limits import RateLimiter
    from lensapp.ui.api import endpoint_function
    from lensapp.ui.guard import Guard

    call = endpoint_function(KINDS["evaluate"], service, Guard(RateLimiter(0)))
    for items in (str(items_file), "/etc/passwd"):
        with pytest.raises(gr.Error) as e:
            call(items=items)
        assert "shipped sets" in e.value.message and "\n" not in e.value.message
    with pytest.raises(gr.Error, match="split must be heldout, dev or all"):
        call(split="test")
    answer = call(split="dev")
    assert answer["items"] == "two_hop" and answer["split"] == "dev" and set(answer["lenses"]) == {"logit", "jacobian"}


def test_a_shipped_evaluation_is_computed_once_and_pinned(service):
    before = service.cache.stats()
    first = service.evaluate(EvaluateRequest(split="heldout"))
    again = service.evaluate(EvaluateRequest(split="heldout"))
    after = service.cache.stats()
    assert again is first
    assert after["pinned"] == before["pinned"] + 1 and after["misses"] == before["misses"] + 1
    assert first.n_items == len(item_set("two_hop").split("heldout"))


def test_a_shipped_evaluation_runs_in_the_hosts_turn_and_a_files_in_the_visitors(service, items_file, monkeypatch):
    """The shipped set's evaluation is everyone's (bounded, pinned): its forwards run in the host's turn, all in
    flight together; a file's (the command line's) is whoever asked."""
    from lensapp.service.asks import Ask, asking

    seen, real = [], service.engine.lens

    def lens(specs, timeout=None, client=None):
        seen.append(client)
        return real(specs, timeout, client)
    monkeypatch.setattr(service.engine, "lens", lens)
    visitor = Ask("203.0.113.7")
    service.evaluate(EvaluateRequest(split="all"), ask=visitor)
    assert seen == [None]
    with asking(client=visitor.client):                         # as a handler's guard names it
        service.evaluate(EvaluateRequest(items=str(items_file), split="dev"), files=True)
    assert seen == [None, "203.0.113.7"]


def test_a_large_file_runs_in_batches_within_the_budget_and_reads_the_same(service, items_file, monkeypatch):
    from lensapp.config import replace
    from lensapp.service import evaluating

    req = EvaluateRequest(items=str(items_file), split="all")
    whole = service.evaluate(req, files=True)
    item = evaluating.plan(service, req, files=True).batch_costs[0].units(service.token_weight) // 6
    monkeypatch.setattr(service, "cfg", replace(service.cfg, max_work=2 * item + item // 2, cache_entries=0))
    monkeypatch.setattr(service, "cache", type(service.cache)(0, 0))
    p = evaluating.plan(service, req, files=True)
    assert len(p.batches) >= 3 and p.batches[0][0] == 0 and p.batches[-1][1] == 6
    assert all(c.units(service.token_weight) <= service.cfg.limits.max_work for c in p.batch_costs)
    again = service.evaluate(req, files=True)
    assert again is not whole and json.dumps(again.to_json()) == json.dumps(whole.to_json())
    monkeypatch.setattr(service, "cfg", replace(service.cfg, max_work=10))
    with pytest.raises(RequestError, match="item 0 of this evaluation costs") as e:
        evaluating.plan(service, req, files=True)
    assert_one_line(str(e.value))


def test_the_cost_is_one_forward_and_one_cell_per_lens_and_layer_per_item(service):
    from lensapp.service import evaluating

    p = evaluating.plan(service, EvaluateRequest(split="heldout"))
    n_items, n = len(p.items), service.info.n_layers
    assert [len(g.layers) for g in p.groups] == [n] and p.groups[0].lenses == ("logit", "jacobian")
    assert p.cost.forwards == n_items and p.cost.cells == n_items * n * 2
    assert p.cost.tokens == sum(len(service.prompts.ids(x.prompt)) for x in p.items)
    assert all(spec.read_from == len(spec.input_ids) - 1 for specs in p.specs for spec in specs)


# -- the chart and the panel ----------------------------------------------------------------------------------

def constructed_result():
    """Four items, three layers; logit: the intermediate first read at layer 1 by items a-b; jacobian: at 0-1."""

    def ranks(inter):            # inter [items][layers] -> [layers, 3] per item (intermediate, control, target)
        return [np.stack([np.array(row), np.array([7, 700, 20]), np.array([50, 9, 1])], 1) for row in inter]
    logit = ranks([[900, 1, 30], [400, 7, 12], [600, 80, 500], [2000, 300, 11]])
    jacobian = ranks([[2, 1, 30], [9, 4, 12], [60, 3, 500], [200, 300, 11]])
    return EvaluationResult.from_ranks({"logit": logit, "jacobian": jacobian}, {"logit": [0, 1, 2],
                                       "jacobian": [0, 1, 2]}, [1] * 4, [1] * 4, model="m", items="set", split="all",
                                       names=list("abcd"), prompts=list("abcd"), targets=list("abcd"),
                                       intermediates=[["x"]] * 4)


def test_the_chart_draws_each_lens_hit_rates_and_its_best_band(service):
    from lensapp.charts.evaluation import evaluation_curves

    result = constructed_result()
    assert result.lenses["logit"].hit_rate(10).tolist() == [0, 0.5, 0] and result.lenses["logit"].some_layer(1) == 0.25
    assert result.lenses["jacobian"].hit_rate(10).tolist() == [0.5, 0.75, 0]
    spec = evaluation_curves(result).to_dict()
    left, right = spec["hconcat"]
    assert [layer["mark"]["type"] for layer in left["layer"]] == ["rect", "line", "line"]
    assert right["mark"]["type"] == "line" and left["layer"][1]["mark"]["strokeDash"] == [2, 2]
    control = left["layer"][1]["data"]["values"]
    assert [r["rate"] for r in control if r["lens"] == "logit lens"] == [1.0, 0.0, 0.0]        # ranks 7, 700, 20
    rows = left["layer"][2]["data"]["values"]
    assert {r["lens"] for r in rows} == {"logit lens", "Jacobian lens"} and {r["hit"] for r in rows} == {"hit@1",
                                                                                                         "hit@10"}
    got = [r["rate"] for r in rows if r["lens"] == "Jacobian lens" and r["hit"] == "hit@10"]
    assert got == [0.5, 0.75, 0.0] and left["layer"][2]["encoding"]["y"]["scale"]["domain"] == [0, 1]
    assert {r["rate"] for r in right["data"]["values"] if r["hit"] == "hit@1"} == {0.0, 1.0}       # the target
    bands = {r["lens"]: (r["from"], r["to"], r["best"]) for r in left["layer"][0]["data"]["values"]}
    # 4 items: one item (0.25) is the tolerance; jacobian's peak 0.75 at 1 takes in layer 0 (0.5), not 2 (0)
    assert bands == {"logit lens": (0.5, 1.5, 1), "Jacobian lens": (-0.5, 1.5, 1)}
    assert left["layer"][0]["encoding"]["color"]["scale"]["domain"] == ["logit lens", "Jacobian lens"]

    live = evaluation_curves(service.evaluate(EvaluateRequest(split="heldout"))).to_dict()    # a real one draws
    assert live["hconcat"][1]["mark"]["type"] == "line"


def test_the_result_as_json_and_frames():
    result = constructed_result()
    j = json.loads(json.dumps(result.to_json()))
    assert j["lenses"]["jacobian"]["best_band"]["10"] == {"first": 0, "last": 1, "best": 1, "rate": 0.75,
                                                          "floor": 0.5}
    assert j["lenses"]["logit"]["some_layer"] == {"1": 0.25, "10": 0.5} and j["lenses"]["logit"]["best_band"]["1"][
        "best"] == 1
    assert j["lenses"]["logit"]["target_rank_last"] == [1, 1, 1, 1]
    assert j["lenses"]["logit"]["control_some_layer"] == {"1": 0.0, "10": 1.0}
    assert j["lenses"]["logit"]["control_rate"]["10"] == [1.0, 0.0, 0.0]
    # No item's intermediate is in the model's top 10 at its last layer (ranks 30, 12, 500, 11 under the logit
    # lens at layer 2): all four are unspoken; before layer 2 the logit lens has two, the Jacobian lens three.
    assert j["unspoken"] == {"k": 10, "last_layer": 2, "items": 4, "read": {"logit": 0.5, "jacobian": 0.75}}
    said = EvaluationResult(**{**vars(result), "lenses": {name: dataclasses.replace(
        s, intermediate_rank=np.minimum(s.intermediate_rank, 10)) for name, s in result.lenses.items()}})
    assert said.unspoken()["items"] == 0 and said.unspoken()["read"] == {"logit": None, "jacobian": None}
    assert result.summary().iloc[1, 5:7].tolist() == [4, 0.75]
    frame = result.frame()
    assert len(frame) == 6 and list(frame.columns[:4]) == ["lens", "layer", "hit@1", "hit@10"]
    summary = result.summary().set_index("lens")
    assert summary.loc["jacobian", "best band hit@10"] == "0-1 (best 1: 75%)"
    assert result.item_frame("jacobian")["at layer"].tolist() == [1, 1, 1, 2]
    with pytest.raises(ValueError):
        type(result)(model="m", items="s", split="all", names=["a"], prompts=[], targets=[], intermediates=[])
    with pytest.raises(ValueError, match="2 ranks for 1 intermediates, 1 controls and a target"):
        type(result).from_ranks({"logit": [np.ones((3, 2))]}, {"logit": [0, 1, 2]}, [1], [1], model="m", items="s",
                                split="all", names=["a"], prompts=["a"], targets=["a"], intermediates=[["x"]])


def test_the_panel_answers_as_the_page_calls_it_and_refuses_a_forged_split(service):
    from lensapp.service.limits import RateLimiter
    from lensapp.ui import evaluation
    from lensapp.ui.guard import Guard

    guard = Guard(RateLimiter(0))
    with gr.Blocks():
        parts = evaluation.build_evaluation_panel("jacobian", service, guard)
    assert parts["eval_split"].value == "heldout"
    out = evaluation.evaluate(service, guard, {"eval_split": "heldout"})
    assert set(out) == {"eval_summary", "eval_plot", "eval_items"}
    assert list(out["eval_summary"]["lens"]) == ["logit lens", "Jacobian lens"]
    assert len(out["eval_items"]) == len(item_set("two_hop").split("heldout"))
    assert out["eval_plot"] is not None
    for forged in ("test", "/etc/passwd", 3, ["heldout"], "x" * 10000):
        with pytest.raises(gr.Error) as e:
            evaluation.evaluate(service, guard, {"eval_split": forged})
        assert_one_line(e.value.message)


def test_the_jacobian_tab_places_the_panel(tiny_service):
    from lensapp import ui

    built = ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings(rate_limit=0))
    ids = {getattr(block, "elem_id", None) for block in built.demo.blocks.values()}
    assert {"jacobian-evaluation-box", "jacobian-evaluation-run", "jacobian-evaluation-plot"} <= ids
    assert "logit-evaluation-box" not in ids
