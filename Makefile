# The two commands of the README: `make run` (default experiment) and `make test` (test suite);
# `make test-quick` leaves out the tests that start whole runs, Ray or other processes.
# Both create the virtual environment on first use, so a fresh clone needs nothing else.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTHON ?= python3

.PHONY: run test test-quick fuzz lint docs setup bench clean

$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,docs]'
	touch $(STAMP)

setup: $(STAMP)

# PYTHONDONTWRITEBYTECODE: dropped here as for the suite (below); else every process of a run
# compiles the project again (four for a Ray run: ~0.75 s of the reference Ray job's wall time,
# docs/studies/benchmarks.md)
run: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/hetsim run $(ARGS)

# test files spread over TEST_JOBS processes (pytest-xdist); a file's tests stay in one process, so a
# module's fixtures (one Ray, one dataset) are built once; the files go out in tests/conftest.py's
# order (slowest first), not xdist's (most tests first). TEST_JOBS=0 runs them in this process.
# PYTHONDONTWRITEBYTECODE (set in some shells and CI images) is dropped for the suite: every pytest
# process, Ray worker and `hetsim` subprocess would otherwise compile the project and rewrite the
# tests' asserts again, ~5 CPU-s per pytest process and ~0.2 s per Ray worker.
TEST_JOBS ?= 3
test: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder $(ARGS)

test-quick: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -m "not integration and not slow and not ray" $(ARGS)

# the property-based tests of the inputs a user types, thousands of random examples each (`make
# test` runs them on a few, derandomised; docs/validation.md)
fuzz: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE HYPOTHESIS_PROFILE=long $(PY) -m pytest -p no:cacheprovider \
		$(wildcard tests/*/test_*_properties.py) $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# the docs site, offline, into site/ (open site/index.html); --strict: a broken link, anchor or
# API reference fails the build. The config reference is generated from the schema as it builds.
docs: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE PYTHONPATH=$(CURDIR) NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

clean:
	rm -rf runs .pytest_cache site
