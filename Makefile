# Two commands do all set-up on a fresh machine:
#   make demo   — virtual environment, install, a tuning run on the embedded defaults
#   make test   — the test suite (installs the test extras: torch CPU, megatron-core, ray, postgres driver)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0 is the CPU build this workplace keeps on local disk; any newer torch pulls CUDA wheels.
TORCH ?= torch==2.13.0

.PHONY: demo test install install-test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev,megatron,ray,postgres]"
	# optico bench's independent landscapes: llm-analysis without its optional transformers pin
	$(BIN)/pip install -q --no-deps "llm-analysis==0.2.2" && $(BIN)/pip install -q "fire>=0.5,<0.6"
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(BIN)/optico tune examples/llama3-8b-a100.yaml --json runs/demo.json

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs
