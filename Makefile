# popviz: the two commands a fresh machine needs are `make serve` and `make test`.
# Both create .venv and install what they need; torch is pinned to the CPU wheel 2.13.0.

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(VENV)/bin/pip
HOST   ?= 127.0.0.1
PORT   ?= 8050
PYTEST_ARGS ?=
# the suite runs as TEST_SHARDS plain pytest processes side by side, each over its own files,
# balanced by tests/durations.json (scripts/shard_tests.py; not pytest-xdist, whose two
# workers once hung a CI run at 98% without saying where). TEST_SHARDS=1: one process
TEST_SHARDS ?= 2

.PHONY: serve test setup setup-test system-deps lint typecheck bench profiles clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# The exact pin matters: an unpinned torch pulls a multi-GB CUDA build.
	$(PIP) install --quiet torch==2.13.0

setup: $(PY)
	$(PIP) install --quiet -e .

setup-test: $(PY)
	$(PIP) install --quiet -e '.[test]'

system-deps:
	bash scripts/install-system-deps.sh

## serve the bundled example profiles at http://$(HOST):$(PORT)
serve: setup
	$(VENV)/bin/popviz serve profiles/ --host $(HOST) --port $(PORT)

## install everything the tests need and run the whole suite (browser tests included)
test: setup-test system-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) scripts/shard_tests.py --shards $(TEST_SHARDS) -- -q $(PYTEST_ARGS)

lint: setup-test
	$(VENV)/bin/ruff check .

## type-check popviz/ and app/ ([tool.mypy] in pyproject.toml; cached in .mypy_cache)
typecheck: setup-test
	$(VENV)/bin/mypy

bench: setup
	for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

## regenerate the example profiles in profiles/ (plan mode: quick and deterministic)
profiles: setup
	$(PY) scripts/make_profiles.py
	$(PY) -m popviz.measure --model tutorial --ranks 2 --microbatches 4 --schedule 1F1B --profile-dir "$$(mktemp -d)" --out profiles/tutorial_measured_2ranks --force

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache test-artifacts
