# Two commands do everything on a fresh machine:
#   make demo   -- run the main job on the built-in default
#   make test   -- run the default test suite
# Every target depends on `setup`, which creates .venv and installs the project.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-all lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(PY) -m sw.compress --demo

test: setup
	$(PY) -m pytest -q -n 2

test-all: setup
	$(PY) -m pytest -q -n 2 -m ""

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf build sim_build .hypothesis
