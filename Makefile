# iepm: `make demo` runs the main job, `make test` runs the tests. Both install what they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: deps test test-unit test-lab lint demo bench clean

deps: $(STAMP)

$(STAMP): pyproject.toml scripts/install-system-deps.sh
	scripts/install-system-deps.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

lint: deps
	$(BIN)/ruff check iepm testkit tests benchmarks
	$(BIN)/ruff format --check iepm testkit tests benchmarks

test: deps lint
	$(BIN)/pytest

test-unit: deps
	$(BIN)/pytest -m "not lab"

test-lab: deps
	$(BIN)/pytest -m lab

demo: deps
	$(BIN)/python -m iepm.cli demo

bench: deps
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) var build *.egg-info .pytest_cache .ruff_cache .hypothesis
