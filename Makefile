# Two commands do all set-up on a fresh machine (see README):
#   make demo   - install into .venv, generate the synthetic data set, train, evaluate
#   make test   - install into .venv with the test extras, run the static checks (make lint), then the test suite
#   make docs-check - every figure of README.md and docs/*.md dated, then run their command blocks
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv demo lint test test-all docs-check bench clean

$(VENV)/.installed: pyproject.toml requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-test.txt
	$(PY) -m pip install -q -e .
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/gru4rec demo

# Static checks: ruff (pycodestyle, pyflakes, import order, bugbear, pyupgrade) on the whole
# repository and mypy on the package, both configured in pyproject.toml.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Tests run on the CPU with 1 thread per process, in one worker process per CPU (pytest-xdist; at
# most 4: each worker holds its own torch, ~1 GB): much of the suite waits on subprocesses and
# servers, so two workers on 2 cores take 3.2 minutes where one took 5.6 (docs/install.md; quiet);
# beside other work (2026-12-06, 2,191 tests) `make test` took 10 minutes.
# TEST_WORKERS=0 runs the suite in one process. Real-data checks marked slow are skipped here.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; n = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count(); print(min(4, n or 1))" 2>/dev/null || echo 1)

test: venv lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS)

test-all: venv
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS)

# Every figure of the README and docs/ dated (--figures), then every command block run on small data,
# its output compared with the page.
docs-check: venv
	$(PY) tools/docs_check.py --figures README.md docs/*.md
	$(PY) tools/docs_check.py README.md docs/*.md

# One speed figure without real data: the rsc15 configuration's training on synthetic sessions, as
# JSON (mini-batches/s, events/s, the products' share of the step). Every other measurement and its
# command: benchmarks/README.md; the scripts run from the root as python -m benchmarks.<subject>.<name>.
bench: venv
	$(PY) -m benchmarks.train.train_speed --config rsc15

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
