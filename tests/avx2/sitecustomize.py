"""An AVX2-only CPU, as far as vLLM and the app can tell: on PYTHONPATH, every Python process (vLLM's
EngineCore and worker included) believes torch that this CPU has no AVX-512, so vLLM loads its AVX2
kernels (`vllm._C_AVX2`) and the app's start-up checks read "avx2". The kernels run for real: AVX2 is a
subset of AVX-512. tests/test_avx2.py uses it. Not the whole suite: under it 51 tests fail (this patch reaches
every process, vLLM-free ones too) and the time is this machine's, not an AVX2 one's (bench/RESULTS.md, 2026-12-07)."""

import torch

torch.cpu._is_avx512_supported = lambda: False
torch.cpu._is_avx512_bf16_supported = lambda: False
