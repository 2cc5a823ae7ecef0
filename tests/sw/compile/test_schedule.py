"""The scheduler: scratchpad buffers that do not fit are refused, loads overlap compute, and
decode layers keep a ring of weight chunks in flight."""

import numpy as np
import pytest

from hw.config import AcceleratorConfig, MemoryModel
from hw.format import WeightFormat, random_quantized
from hw.isa import Gemm, Load, Spad
from hw.numerics import gemm_acc
from hw.timing import gemm_cycles, load_completion_delay, load_cycles
from sim.model import FastModel
from sw.compile import schedule
from sw.compile.errors import LoweringError
from sw.compile.layers import LayerSpec, build_layers, build_linear
from sw.compile.schedule import (
    MAX_RING_SLOTS,
    SHORT_SET_DELAYS,
    PlacedLayer,
    ahead_slots,
    half_slots,
    plan_spads,
    ring_slots,
    schedule_layers,
)
from sw.compile.tiling import plan_linear

#: The default array's shape with a DRAM for the data of a few decode layers.
RING = AcceleratorConfig(rows=4, cols=8, memory=MemoryModel(size_bytes=1 << 22))


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


def _wgt_slots(program) -> set[int]:
    return {ins.spad_addr for ins in program if isinstance(ins, Load) and ins.spad == Spad.WGT}


@pytest.mark.parametrize("seed", range(3))
def test_decode_layers_keep_a_ring_of_weight_chunks(monkeypatch, seed):
    """Resident, unbiased decode layers (q/k/v-like, random shapes and data) stream their
    weights through a ring of ``ring_slots`` WGT slots (fewer where ``ahead_slots`` keep
    the loads ahead of the array and fill at most ``half_slots``): every layer computes its
    golden
    result on the fast model, in no more cycles than with the double buffers (the LOAD
    engine only runs further ahead), and the program still runs when the DRAM is slow."""
    rng = np.random.default_rng(seed)
    fmt = WeightFormat("2:4", 4, 128)
    specs = []
    for _ in range(int(rng.integers(1, 4))):
        n, k = int(rng.integers(1, 9)) * 32, int(rng.integers(1, 5)) * 128
        specs.append(LayerSpec(fmt, n, k, 1, random_quantized(fmt, (n, k), rng),
                               rng.integers(-127, 128, size=(1, k)).astype(np.int8)))
    runs = {}
    for slots in (MAX_RING_SLOTS, 2):
        monkeypatch.setattr(schedule, "MAX_RING_SLOTS", slots)
        for cfg in (RING, RING.replace(memory=MemoryModel(latency=200, size_bytes=1 << 22))):
            lp = build_layers(cfg, specs, ring=True)
            r = FastModel(cfg).run(lp.program, lp.dram)
            assert r.ok, r.detail
            for L, sp in enumerate(specs):
                a = np.pad(sp.acts, ((0, 0), (0, sp.weight.k_padded - sp.k)))
                assert np.array_equal(lp.read_output(r.dram, L),
                                      gemm_acc(a, sp.weight.int_weight()))
            runs[slots, cfg.memory.latency] = (r.cycles, _wgt_slots(lp.program), max(
                ahead_slots(cfg, lp.program), half_slots(cfg, lp.program)))
    steps = sum(sp.n // RING.lanes for sp in specs)
    want = min(MAX_RING_SLOTS, 1 << (steps.bit_length() - 1))
    for lat in (RING.memory.latency, 200):
        assert len(runs[MAX_RING_SLOTS, lat][1]) == max(2, min(want, runs[MAX_RING_SLOTS,
                                                                           lat][2]))
        assert len(runs[2, lat][1]) == min(2, steps)
        assert runs[MAX_RING_SLOTS, lat][0] <= runs[2, lat][0]


def test_only_resident_unbiased_layers_get_a_ring():
    """A biased layer, or activations chunked along K with the weights, keep the double
    buffers (their ACT and PARAM halves pair with the WGT halves); so does ring=False."""
    fmt = WeightFormat("2:4", 4, 128)
    plain = PlacedLayer(plan_linear(RING, fmt, 256, 256, 1))
    spads = plan_spads(RING, 1)
    assert ring_slots(RING, [plain], spads) == MAX_RING_SLOTS
    biased = PlacedLayer(plan_linear(RING, fmt, 256, 256, 1, bias=True))
    assert ring_slots(RING, [plain, biased], plan_spads(RING, 1, 1)) == 2
    small = RING.replace(act_spad_bytes=256)
    chunked = PlacedLayer(plan_linear(small, fmt, 256, 1024, 1))
    assert not chunked.plan.resident_acts
    assert ring_slots(small, [chunked], plan_spads(small, 1)) == 2
    sched = schedule_layers(RING, [plain], ring=False)
    assert len(_wgt_slots(sched.instructions)) == 2


def test_ring_alternates_activation_sets_between_act_halves(monkeypatch):
    """Layers with inputs of their own (attention heads' query rows) load their activation
    sets into the two ACT halves in turn, so a set's LOAD waits for the GEMMs of the set two
    before, not the one just before: golden results, and no more cycles than one buffer."""
    rng = np.random.default_rng(0)
    fmt = WeightFormat("2:4", 4, 128)
    n, k = RING.lanes, 128
    specs = [LayerSpec(fmt, n, k, 1, random_quantized(fmt, (n, k), rng),
                       rng.integers(-127, 128, size=(1, k)).astype(np.int8)) for _ in range(4)]
    cycles = {}
    for buffers in (2, 1):
        monkeypatch.setattr(schedule, "act_buffers", lambda *a, b=buffers: b)
        lp = build_layers(RING, specs, ring=True)
        r = FastModel(RING).run(lp.program, lp.dram)
        assert r.ok, r.detail
        for L, sp in enumerate(specs):
            assert np.array_equal(lp.read_output(r.dram, L),
                                  gemm_acc(sp.acts, sp.weight.int_weight()))
        acts = [ins.spad_addr for ins in lp.program
                if isinstance(ins, Load) and ins.spad == Spad.ACT]
        half = plan_spads(RING, 1).act_half_beats
        assert acts == [0, half] * 2 if buffers == 2 else [0] * 4
        cycles[buffers] = r.cycles
    assert cycles[2] <= cycles[1]


def test_memory_bound_or_short_set_rings_alternate_act_halves():
    """Two ACT buffers where the ring's weights LOADs outlast its GEMMs (hw.timing's
    cycles: 200 beats against a 64-step GEMM) or its activation sets are short (several,
    each a GEMM of at most SHORT_SET_DELAYS times a LOAD completion delay and its first
    weights LOAD); one where the array is the bound and its sets are long (512-step GEMMs)
    or one."""
    fmt = WeightFormat("2:4", 4, 128)
    layers = [PlacedLayer(plan_linear(RING, fmt, RING.lanes, 128, 1))] * 2
    spads, act = plan_spads(RING, 1), Load(spad=Spad.ACT, rows=1, row_beats=1)
    for steps, beats, sets, buffers in ((64, 200, 2, 2), (512, 8, 2, 1), (64, 8, 2, 2),
                                        (64, 8, 1, 1)):
        gemm = Gemm(k_steps=steps, tokens=1)
        load = Load(spad=Spad.WGT, rows=1, row_beats=beats)
        short = SHORT_SET_DELAYS * (load_completion_delay(RING) + load_cycles(load, RING))
        assert (gemm_cycles(gemm, RING) <= short) == (steps == 64)
        program = [act, load, gemm] * sets
        assert schedule.act_buffers(RING, layers, spads, program) == buffers


def test_short_activation_sets_run_back_to_back():
    """Attention scores of several heads (a head's query row a set of its own, one short
    GEMM each: an array-bound ring): the ring alternates the sets between the ACT halves,
    so the array does not idle a LOAD completion delay between heads (with one buffer it
    idled that and more at each set, its LOAD waiting for the STORE of the head before): its
    GEMMs span less than their cycles plus a delay per set after the first, and the results
    are golden."""
    rng = np.random.default_rng(1)
    cfg = AcceleratorConfig(rows=4, cols=8, memory=MemoryModel(
        bytes_per_cycle=128, size_bytes=1 << 22))  # a head's keys stream in 16 beats
    fmt = WeightFormat("dense", 8, 0, raw=True)
    n, k, heads = cfg.lanes, 64, 6
    specs = [LayerSpec(fmt, n, k, 1, random_quantized(fmt, (n, k), rng),
                       rng.integers(-127, 128, size=(1, k)).astype(np.int8))
             for _ in range(heads)]
    lp = build_layers(cfg, specs, ring=True)
    r = FastModel(cfg).run(lp.program, lp.dram, trace=True)
    assert r.ok, r.detail
    for L, sp in enumerate(specs):
        assert np.array_equal(lp.read_output(r.dram, L),
                              gemm_acc(sp.acts, sp.weight.int_weight()))
    gemms = [t for t in r.trace if isinstance(lp.program[t.index], Gemm)]
    assert len(gemms) == heads
    busy = sum(gemm_cycles(lp.program[t.index], cfg) for t in gemms)
    assert gemms[-1].end - gemms[0].grant < busy + (heads - 1) * load_completion_delay(cfg)
