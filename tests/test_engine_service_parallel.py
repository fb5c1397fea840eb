"""An engine service split across workers (`lensapp engine --tensor-parallel-size 2` / `--pipeline-parallel-size 2`)
serves a page what one worker in the page's own process reads (test_parallel.py's model and tolerances).

Under pipeline parallelism a trace's saves come from the last stage (stages.StageRunner) and the request's
pickle names modules of other stages (stages.StandIns): both pass through nnsight-serve's collect unchanged.
One engine at a time (two cores): the in-process reference first, then each split as a service."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CACHE, _free_port, random_jacobians
from test_engine_service import KEY, gone_with, start_engine, until_ready
from test_parallel import SPLITS, TOL, assert_same_readout, assert_same_results

from lensapp import config, jlens
from lensapp.service import ChatRequest, GenerateRequest, LensRequest, LensService

pytestmark = [pytest.mark.engine, pytest.mark.extended]

PROMPTS = ("The capital of France is a city on the river", "Water boils at one hundred degrees")


@pytest.fixture(scope="module")
def llama(make_tiny_model):
    return make_tiny_model("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                           num_attention_heads=2, num_key_value_heads=2)


@pytest.fixture(scope="module")
def lens_file(llama, tmp_path_factory):
    return jlens.save(tmp_path_factory.mktemp("lens") / "tiny_jlens.pt", random_jacobians(64, range(3)), n_prompts=0,
                      provenance={"model": "tiny llama", "corpus": "none: random"})


def read_everything(service: LensService) -> dict:
    return {"lens": service.lens(LensRequest(prompts=PROMPTS, lens="both", k=3)),
            "generate": service.generate(GenerateRequest(prompt=PROMPTS[0], max_tokens=5, lens="both", k=3)),
            "chat": service.chat(ChatRequest(messages=({"role": "user", "content": PROMPTS[1]},), lens="jacobian",
                                             layer=1, max_tokens=5, k=3))}


def settings(llama, lens_file, **more) -> config.Config:
    return config.Config.of(model=str(llama), jlens=str(lens_file), cache_entries=0, cache_dir=str(CACHE),
                         request_timeout=300, **more)


@pytest.fixture(scope="module")
def one_worker(llama, lens_file) -> dict:
    service = LensService.start(settings(llama, lens_file))
    try:
        service.wait_ready(900)
        return read_everything(service)
    finally:
        service.close()


@pytest.mark.parametrize("split", SPLITS)
def test_a_split_engine_service_reads_as_one_worker_in_process(one_worker, llama, lens_file, split, tmp_path):
    tp, pp = SPLITS[split]
    port, log = _free_port(), tmp_path / "engine.log"
    proc = start_engine(port, lens_file, log, "--model", str(llama), "--tensor-parallel-size", str(tp),
                        "--pipeline-parallel-size", str(pp))
    try:
        until_ready(proc, log)
        page = LensService.start(settings(llama, lens_file, engine_url=f"http://127.0.0.1:{port}", engine_key=KEY))
        try:
            page.wait_ready(300)
            got = read_everything(page)
        finally:
            page.close()
    finally:
        gone_with(proc)
    want = one_worker
    assert_same_results(got["lens"], want["lens"], f"served {split}")
    assert got["generate"].token_ids == want["generate"].token_ids
    for i, (g, w) in enumerate(zip(got["generate"].steps, want["generate"].steps)):
        for name in ("logit", "jacobian"):
            assert_same_readout(g.readout.lenses[name], w.readout.lenses[name], f"served {split} step {i} {name}")
    assert got["chat"].token_ids == want["chat"].token_ids
    assert [[t for t, _ in s] for s in got["chat"].readout] == [[t for t, _ in s] for s in want["chat"].readout]
    np.testing.assert_allclose([[p for _, p in s] for s in got["chat"].readout],
                               [[p for _, p in s] for s in want["chat"].readout], rtol=0, atol=TOL)
