# Two commands do everything on a fresh machine:
#   make demo   -- run the main job on the built-in default
#   make test   -- run the default test suite
# Every target depends on `setup`, which creates .venv and installs the project.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-all lint bench clean sim synth generate

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(PY) -m sw.deploy --out build/demo

test: setup
	$(PY) -m pytest -q -n 2

test-all: setup
	$(PY) -m pytest -q -n 2 -m ""

lint: setup
	$(VENV)/bin/ruff check .

# RTL: `make generate [CONFIG=x.json]` writes Verilog + config to build/generated;
# `make sim [WAVES=1]` builds the Verilator runner (cached per configuration under build/rtl)
# and runs the 2:4-vs-dense layer demo; `make synth` runs Yosys + nextpnr for the ECP5-85F.
generate: setup
	$(PY) -m hw.generate --out build/generated $(if $(CONFIG),--config $(CONFIG))

sim: setup
	$(PY) -m bench.rtl --demo

synth: setup
	$(PY) -m hw.synth $(if $(CONFIG),--config $(CONFIG))

clean:
	rm -rf build sim_build .hypothesis
