"""The scheduler: scratchpad buffers that do not fit are refused, and loads overlap compute."""

import pytest

from hw.config import AcceleratorConfig, MemoryModel
from hw.format import WeightFormat
from sim.model import FastModel
from sw.compile.errors import LoweringError
from sw.compile.layers import build_linear
from sw.compile.schedule import plan_spads


def test_scratchpad_plan_refuses_tiles_that_do_not_fit():
    with pytest.raises(LoweringError, match="OUT spad"):
        plan_spads(AcceleratorConfig(rows=4, cols=16, out_spad_bytes=4096), 16)
    cfg = AcceleratorConfig()
    assert plan_spads(cfg, 16).out_buf_beats == 16 * 4 * cfg.lanes // cfg.beat_bytes


def test_loads_overlap_compute():
    """Double buffering: in a long decode layer the array waits only for the first chunk."""
    cfg = AcceleratorConfig(rows=4, cols=16, memory=MemoryModel(size_bytes=1 << 24))
    fmt = WeightFormat("dense", 4, 128)
    lp = build_linear(cfg, fmt, 256, 4096, 1)
    r = FastModel(cfg).run(lp.program, timing_only=True)
    assert lp.plan.k_chunks > 1 and r.ok
    # DRAM-bound: the load engine is busy nearly all the time.
    assert r.counters["load_exec"] / r.cycles > 0.95
