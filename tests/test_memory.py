"""The memory plan (engine/start/memory.py) and what the host allows (engine/start/host.py), without starting
anything."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from lensapp.config import Config, ConfigError, EngineSettings, LimitSettings
from lensapp.engine.run.protocol import ModelInfo
from lensapp.engine.start import host, memory

SMOLLM2 = types.SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576,
                                intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)
INFO = ModelInfo(name="m", n_layers=30, d_model=576, vocab_size=49152, backend="vllm-cpu", device="cpu",
                 dtype="float32", max_model_len=2048)


def test_the_kv_cache_is_sized_from_the_settings_not_the_machine():
    per_token = memory.kv_bytes_per_token(SMOLLM2, "float32")
    assert per_token == 2 * 30 * 3 * 64 * 4
    cfg = Config()
    longest = cfg.limits.max_prompt_tokens + 64            # a prompt and a whole generation
    assert memory.kv_cache_bytes(cfg.engine, cfg.limits, SMOLLM2, INFO) == cfg.limits.max_batch * longest * per_token
    # one sequence must hold the whole context, or vLLM refuses to start
    engine = EngineSettings()
    assert memory.kv_cache_bytes(engine, LimitSettings(max_batch=1), SMOLLM2, INFO) == (2048 + 256) * per_token
    assert memory.kv_cache_bytes(EngineSettings(kv_cache_mb=300), cfg.limits, SMOLLM2, INFO) == 300 << 20  # the user's
    assert memory.kv_cache_bytes(engine, LimitSettings(max_batch=1024), SMOLLM2, INFO) <= memory.KV_CAP


def test_the_parameter_count_comes_from_the_safetensors_headers(embedded_dir):
    import torch
    from safetensors.torch import load_file

    count = memory.param_count(SMOLLM2, str(embedded_dir))
    assert count == sum(t.numel() for t in load_file(embedded_dir / "model.safetensors").values())
    assert abs(memory.param_count(SMOLLM2, "no/such/folder") - count) / count < 0.05   # the estimate is close
    del torch


def test_a_plan_that_does_not_fit_is_one_line_naming_each_part():
    limit = host.MemoryLimit(1 << 30, "cgroup memory.max (/)")
    budget = memory.plan(Config(), INFO, SMOLLM2, "no/such/folder", 29, limit)
    assert not budget.fits
    with pytest.raises(ConfigError) as e:
        memory.check(budget)
    message = str(e.value)
    assert "\n" not in message
    for part in ("weights", "KV cache", "Jacobian lens", "readout", "result cache", "processes", "1.00 GiB",
                 "cgroup memory.max", "--max-batch"):
        assert part in message
    assert budget.to_json()["limit_mb"] == 1024


def test_the_embedded_model_fits_a_4_gb_container():
    budget = memory.plan(Config.of(max_fit_steps=0), INFO, SMOLLM2, "no/such/folder", 29,
                         host.MemoryLimit(4 << 30, "cgroup"))
    assert budget.fits and not budget.fitter, budget.describe()


def test_the_fitter_is_counted_and_left_out_where_it_does_not_fit():
    """Fitting on (the default): its process and float32 copy are in the plan; a 4 GB container holds the app
    but not also the fitter, so the plan without it is what serves there (preflight turns fitting off)."""
    small = memory.plan(Config(), INFO, SMOLLM2, "no/such/folder", 29, host.MemoryLimit(4 << 30, "cgroup"))
    assert small.fitter >= 4 * memory.param_count(SMOLLM2, "no/such/folder") and "fitter" in small.describe()
    assert not small.fits and memory.without_fitter(small).fits
    roomy = memory.plan(Config(), INFO, SMOLLM2, "no/such/folder", 29, host.MemoryLimit(8 << 30, "cgroup"))
    assert roomy.fits and roomy.fitter
    assert not memory.plan(Config.of(fitting="off"), INFO, SMOLLM2, "x", 29, host.MemoryLimit(8 << 30, "cgroup")).fitter


def test_on_a_gpu_only_the_host_side_counts():
    gpu = ModelInfo(name="m", n_layers=36, d_model=4096, vocab_size=151936, backend="vllm", device="cuda",
                    dtype="bfloat16", max_model_len=2048)
    qwen = types.SimpleNamespace(num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096,
                                 head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False)
    budget = memory.plan(Config(), gpu, qwen, "Qwen/Qwen3-8B", 35, host.MemoryLimit(32 << 30, "available RAM"))
    assert budget.weights > 15e9 and "weights" not in budget.parts()
    assert budget.total == (budget.runtime + budget.jlens + budget.result_cache + budget.sessions   # fits run on
                            + budget.fitter)                                                   # the host


def fake_root(tmp_path: Path, *, cgroup: str, v1_limit: str | None = None, own: dict | None = None) -> Path:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text("MemTotal: 25000000 kB\nMemFree: 1000 kB\nMemAvailable: 20000000 kB\n")
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    mem = tmp_path / "sys/fs/cgroup/memory"
    mem.mkdir(parents=True)
    if v1_limit is not None:
        (mem / "memory.limit_in_bytes").write_text(v1_limit)
    for path, value in (own or {}).items():
        (mem / path).mkdir(parents=True)
        (mem / path / "memory.limit_in_bytes").write_text(value)
    return tmp_path


def test_the_limit_is_the_containers_else_the_smallest_on_the_way_else_available_ram(tmp_path):
    unlimited = str(9223372036854771712)
    root = fake_root(tmp_path / "a", cgroup="4:memory:/\n0::/\n", v1_limit=str(4 << 30))
    assert host.memory_limit(root) == host.MemoryLimit(4 << 30, "cgroup memory.limit_in_bytes (/)")
    root = fake_root(tmp_path / "b", cgroup="4:memory:/user/job\n0::/\n", v1_limit=unlimited,
                     own={"user": str(6 << 30), "user/job": unlimited})
    assert host.memory_limit(root).bytes == 6 << 30
    root = fake_root(tmp_path / "c", cgroup="4:memory:/\n0::/\n", v1_limit=unlimited)
    assert host.memory_limit(root) == host.MemoryLimit(20000000 * 1024, "available RAM")


def test_the_machine_reads():
    assert host.memory_limit().bytes > 0
    assert host.cpu_isa() in ("avx2", "avx512", "avx512_bf16") or host.cpu_isa()
    assert host.allowed_cores()
    now = host.memory_in_use()
    assert now["processes_rss_mb"] > 0


def test_every_backend_kind_is_chosen_by_the_settings_and_names_only_known_libraries():
    """The loader's kinds: `--backend` and the device choose one, and the releases a lens file is read under
    are libraries a lens file records (provenance.LIBRARIES); a transformers-only host is not asked for vLLM's."""
    from lensapp import provenance
    from lensapp.engine.start import backend_kinds as kinds

    chosen = {kinds.kind_for(backend, device) for backend in ("vllm", "transformers") for device in ("cpu", "cuda")}
    chosen.add(kinds.kind_for("vllm", "remote", engine_url="http://127.0.0.1:6677"))
    assert chosen == set(kinds.KINDS.values())
    assert not kinds.SERVED.holds_model and not kinds.SERVED.kv_cache and not kinds.SERVED.ranks
    with pytest.raises(ConfigError, match="choose one"):
        kinds.kind_for("transformers", "remote", engine_url="http://127.0.0.1:6677")
    assert all(set(kind.libraries) <= set(provenance.LIBRARIES) for kind in chosen)
    assert "vllm" not in kinds.FITTING.libraries and not kinds.FITTING.kv_cache and not kinds.FITTING.ranks
