# Two commands do all set-up on a fresh machine (see README):
#   make demo   - install into .venv, generate the synthetic data set, train, evaluate
#   make test   - install into .venv with the test extras, run the static checks (make lint), then the test suite
#   make docs-check - run the command blocks of README.md and docs/*.md
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

# Tests run on the CPU with 1 thread per process; real-data checks marked slow are skipped here.
test: venv lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow"

test-all: venv
	OMP_NUM_THREADS=1 $(PY) -m pytest -q

# Every command block of the README and docs/ run on small data, its output compared with the page.
docs-check: venv
	$(PY) tools/docs_check.py README.md docs/*.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
