"""bench.beats: a decode step's DRAM beats and LOAD-engine idle, broken down, add up to the
fast model's own counters (on the reference model's persistent step, timing-only)."""

from __future__ import annotations

import doctest

import pytest

from bench import beats
from bench.board import stream_bytes
from hw.board.ecpix5 import ECPIX5
from hw.config import preset
from sw.compile.plan import Region

CONTEXT = 16  # a short cache: seconds to compile and run; the step's structure is the same


def test_docstring_examples():
    assert doctest.testmod(beats).failed == 0


def test_region_labels_take_the_smallest_region():
    regions = {"arena": Region(0, 64, "arena"), "y:a": Region(16, 32, "arena"),
               "y:a+16": Region(32, 16, "arena"), "w:l": Region(64, 16, "weight")}
    labels, names = beats.region_labels(regions, 16)
    assert [names[j] for j in labels] == ["arena", "y:a", "y:a+16", "arena", "w:l"]


def test_event_names_follow_the_renaming():
    from sw.compile.fusion import BESIDE_EVENTS, VECTOR_EVENTS
    from sw.compile.schedule import EVENTS
    assert beats.event_name(EVENTS["STORED0"]) == "STORED0"
    assert beats.event_name(VECTOR_EVENTS[EVENTS["FULL1"]]) == "vec:FULL1"
    assert beats.event_name(BESIDE_EVENTS[EVENTS["STORED1"]]) == "beside:STORED1"


def _step(block_loop: bool | None = None):
    import torch

    from sim.backends import make_backend
    from sw.compile import CompileOptions, compile_model
    from sw.compress.model import selected_linears
    from sw.models.recipes import recipe_for
    from sw.models.source import open_model
    from sw.runtime import Runtime

    cfg = ECPIX5.accelerator_config(preset("vector"), paced=True)  # as bench.beats runs it
    lm = open_model("reference").model
    formats = recipe_for("reference").formats(selected_linears(lm))
    opts = CompileOptions(prompt_tokens=CONTEXT - 1, max_context=CONTEXT,
                          decode_contexts=(CONTEXT,), phases=("decode",),
                          block_loop=block_loop)
    exe = compile_model(lm, cfg, opts, formats=formats)
    rec = beats.Recorder(make_backend("model-timing", cfg))
    rt = Runtime(exe, rec, vector=True)
    rt.seek(CONTEXT - 1)
    _, stats = rt.step(torch.zeros((1, 1), dtype=torch.long))
    return cfg, exe, stats, rec.runs


@pytest.fixture(scope="module")
def step():
    cfg, exe, stats, runs = _step()
    return cfg, exe, stats, beats.breakdown(runs, cfg, exe.symbols)


def test_breakdown_adds_up_to_the_counters(step):
    cfg, exe, stats, b = step
    assert len(stats.programs) == 1  # the persistent step: one program per token
    assert b.cycles == stats.cycles
    assert b.dram_beats == stats.counter("dram_read_beats") + stats.counter("dram_write_beats")
    assert sum(b.beats.values()) == b.dram_beats
    assert "?" not in {k[-1] for k in b.beats}  # every DMA word addresses a region
    # every cycle is one the LOAD engine streams or one charged to a reason
    assert b.streamed + sum(b.idle.values()) == b.cycles
    assert b.idle and all(v > 0 for v in b.idle.values())
    assert b.computed + sum(b.compute_idle.values()) == b.cycles
    assert stats.counter("compute_exec") <= b.computed < b.cycles
    # every GEMM follows some weights or cache: none is charged to an unknown symbol
    assert "?" not in {k[-1] for k in b.compute_idle}


def test_weights_and_cache_are_read_once(step):
    cfg, exe, _, b = step
    weight_bytes, kv_bytes = stream_bytes(exe)
    assert b.beats[("LOAD", "WGT", "weights")] * cfg.beat_bytes == weight_bytes
    assert b.beats[("LOAD", "WGT", "kv")] * cfg.beat_bytes <= kv_bytes
    # what else crosses DRAM is what the tool is for: activations, constants, accumulators
    other = b.dram_beats - b.beats[("LOAD", "WGT", "weights")] - b.beats[("LOAD", "WGT", "kv")]
    assert other > 0 and beats.coarse(b.beats)[("LOAD", "VIN", "dq")] > 0


def test_command_prints_the_tables(capsys):
    assert beats.main(["--context", str(CONTEXT), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "DRAM beats by (direction, scratchpad, symbol kind)" in out
    assert "LOAD WGT weights" in out and "LOAD engine idle cycles" in out
    assert "a beat every 2 cycles" in out   # the persistent prediction's paced port


def test_a_block_loop_reads_every_layers_weights_once():
    """A rolled step (SmolLM2's form) repeats one block's words: each iteration's DMA words
    must be charged at their advanced addresses, every weight beat read once."""
    from hw.isa import Load, relative_words
    from sim.model import program_words, schedule

    cfg, exe, stats, runs = _step(block_loop=True)
    assert "block_loop" in exe.report
    words = relative_words(program_words(runs[0].program), runs[0].regs)
    sched = schedule(words, cfg)
    read = []
    for _, ins in beats._rows(sched, words):
        if isinstance(ins, Load) and ins.spad.name == "WGT":
            read += range(ins.dram_addr, ins.dram_addr + ins.rows * ins.row_beats)
    want = [b for n, r in exe.symbols.items() if n.startswith("w:") and "@" not in n
            for b in range(r.addr // cfg.beat_bytes, r.end // cfg.beat_bytes)]
    wanted = set(want)
    weights = [b for b in read if b in wanted]
    assert sorted(weights) == sorted(want)  # each once, none left out
    b = beats.breakdown(runs, cfg, exe.symbols)
    assert b.cycles == stats.cycles and sum(b.beats.values()) == b.dram_beats
    assert b.streamed + sum(b.idle.values()) == b.cycles
