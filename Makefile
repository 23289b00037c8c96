# iepm: `make demo` runs the main job, `make test` runs the tests. Both install what they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Parallel workers for the tests that are not lab tests: they mostly wait on processes and
# sockets, so more workers than the 2 cores pay. A file stays on one worker: its module-scoped
# servers and labs are built once.
WORKERS ?= 4
REPORTS := var/test-reports

.PHONY: deps test test-fast test-unit test-lab test-timing lint demo bench clean

deps: $(STAMP)

$(STAMP): pyproject.toml scripts/install-system-deps.sh
	scripts/install-system-deps.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

lint: deps
	$(BIN)/ruff check iepm testkit tests benchmarks
	$(BIN)/ruff format --check iepm testkit tests benchmarks

# Everything but the timing tests in parallel (lab tests too: each lab has its own namespaces
# and names), then the lab tests that measure the delay line's timing one at a time on a host
# nothing else loads, with the few that xdist cannot run (serial). The report at the end: the
# 15 slowest tests, the time per directory and tier, and one closing line over both runs.
test: deps lint
	@rm -rf $(REPORTS) && mkdir -p $(REPORTS)
	@status=0; \
	$(BIN)/pytest -m "not timing and not serial" -n $(WORKERS) --dist loadfile \
		--junitxml=$(REPORTS)/parallel.xml || status=$$?; \
	$(BIN)/pytest -m "timing or serial" --junitxml=$(REPORTS)/timing.xml || status=$$?; \
	$(BIN)/python -m testkit.report $(REPORTS)/parallel.xml $(REPORTS)/timing.xml || status=1; \
	exit $$status

# The fast tier: pure Python, no server, no namespace, no browser (under a minute).
test-fast: deps
	$(BIN)/pytest -m "not lab and not servers and not browser and not serial" -n 2 -q

test-unit: deps
	$(BIN)/pytest -m "not lab and not serial" -n $(WORKERS) --dist loadfile
	$(BIN)/pytest -m "serial and not lab"

test-timing: deps
	$(BIN)/pytest -m timing

test-lab: deps
	$(BIN)/pytest -m lab

demo: deps
	$(BIN)/python -m iepm.cli demo

bench: deps
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) var build *.egg-info .pytest_cache .ruff_cache .hypothesis
