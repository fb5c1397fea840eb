"""The CPU worker adapter: seeded sampling survives partial prefills (vLLM rewinds a Philox offset there,
which a CPU generator does not have: without the adapter's mend the EngineCore dies)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine


@pytest.mark.extended
def test_seeded_samples_are_the_same_when_prompts_are_prefilled_in_chunks(embedded_dir):
    from vllm import SamplingParams

    from lensapp.engine.start.vllm_cpu import CPUVLLM

    # A 32-token step budget with chunked prefill on: each ~40-token prompt is prefilled over two steps,
    # and the token sampled after the first chunk is thrown away (vLLM's "discard" path).
    model = CPUVLLM(str(embedded_dir), dispatch=True, dtype="float32", max_model_len=256, enable_prefix_caching=False,
                    kv_cache_memory_bytes=256 << 20, enable_chunked_prefill=True, max_num_batched_tokens=32,
                    max_num_seqs=4)
    llm = model.vllm_entrypoint
    try:
        prompts = [("Tell me about the weather in spring in a small town near the sea " * 3) + str(i)
                   for i in range(3)]
        params = [SamplingParams(temperature=0.9, max_tokens=8, seed=100 + i) for i in range(3)]
        together = [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
        alone = [llm.generate([p], [s], use_tqdm=False)[0].outputs[0].text for p, s in zip(prompts, params)]
    finally:
        llm.llm_engine.engine_core.shutdown()
    assert together == alone and all(together)
