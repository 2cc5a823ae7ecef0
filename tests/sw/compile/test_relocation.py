"""Relocatable programs: a template relocated to its operands' addresses equals the same
layers scheduled at those addresses."""

import numpy as np

from hw.config import AcceleratorConfig
from hw.format import WeightFormat
from hw.isa import End, program_words
from sw.compile.lower import Member
from sw.compile.relocation import lower_template, relocate
from sw.compile.schedule import PlacedLayer, schedule_layers
from sw.compile.tiling import plan_linear


def test_relocated_template_equals_scheduling_at_final_addresses():
    cfg = AcceleratorConfig(rows=2, cols=8)
    fmts = [WeightFormat("2:4", 4, 32), WeightFormat("dense", 8, 64)]
    members = []
    for i, fmt in enumerate(fmts):
        plan = plan_linear(cfg, fmt, 20 + 8 * i, 96, 5)
        members.append(Member(plan, f"w{i}", "x", f"y{i}", None if i == 0 else 4096))
    bases = {"w0": 1 << 12, "w1": 1 << 16, "x": 80_000, "y0": 90_000, "y1": 120_000}
    t = lower_template(cfg, members)
    got = relocate(t, bases, members, cfg.beat_bytes)
    beat = cfg.beat_bytes
    placed = [PlacedLayer(m.plan, w_addr=bases[m.w] // beat, x_addr=bases[m.x] // beat,
                          y_addr=bases[m.y] // beat, w_tile_stride=m.w_tile_stride)
              for m in members]
    want = program_words(schedule_layers(cfg, placed, ring=cfg.has_vector).instructions
                         + [End()])
    assert np.array_equal(got, want)
