"""The harness's own tools: a real timing bug is detected, shrunk and saved for replay.

The "buggy backend" is the fast model with the epilogue one cycle longer (hw/timing.py's
EPILOGUE_FILL + 1), the kind of off-by-one the harness exists to catch.
"""

import json

import numpy as np
import pytest

import hw.timing
from hw.isa import EpilogueMode, Gemm, decode
from sim.equivalence import compare_results, minimize, write_reproducer
from sim.model import FastModel
from sim.random_programs import EQUIVALENCE_CONFIGS, random_program


@pytest.fixture
def setup():
    cfg = EQUIVALENCE_CONFIGS[sorted(EQUIVALENCE_CONFIGS)[0]]
    return cfg, FastModel(cfg)


def _buggy_run(model, program, dram):
    saved = hw.timing.EPILOGUE_FILL
    hw.timing.EPILOGUE_FILL = saved + 1
    try:
        return model.run(program, dram)
    finally:
        hw.timing.EPILOGUE_FILL = saved


def _epilogue_program(cfg, seed=0):
    rng = np.random.default_rng(seed)
    while True:
        rp = random_program(cfg, rng)
        if any(isinstance(i, Gemm) and i.epilogue != EpilogueMode.NONE for i in rp.program):
            return rp


def test_off_by_one_is_caught_and_shrunk(setup, tmp_path):
    cfg, model = setup
    rp = _epilogue_program(cfg)

    def mismatch(prog):
        return compare_results(model.run(prog, rp.dram), _buggy_run(model, prog, rp.dram))

    found = mismatch(rp.program)
    assert found is not None and any(f.startswith("cycles") for f in found.fields)
    small = minimize(rp.program, lambda p: mismatch(p) is not None)
    assert len(small) < len(rp.program)
    assert mismatch(small) is not None
    # 1-minimal: dropping any single instruction makes the disagreement disappear
    for i in range(len(small)):
        cand = small[:i] + small[i + 1:]
        assert not cand or mismatch(cand) is None
    assert any(isinstance(i, Gemm) and i.epilogue != EpilogueMode.NONE for i in small)

    d = write_reproducer(tmp_path, cfg, small, rp.dram, mismatch(small))
    meta = json.loads((d / "program.json").read_text())
    replay = [decode(int(w, 16)) for w in meta["words_hex"]]
    assert replay == small
    assert np.array_equal(np.fromfile(d / "dram.bin", dtype=np.uint8), rp.dram)
    assert type(cfg).from_json((d / "config.json").read_text()) == cfg
    assert mismatch(replay) is not None


def test_identical_backends_agree(setup):
    cfg, model = setup
    rp = _epilogue_program(cfg, seed=1)
    assert compare_results(model.run(rp.program, rp.dram), model.run(rp.program, rp.dram)) is None
