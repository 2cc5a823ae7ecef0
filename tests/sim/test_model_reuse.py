"""What the fast model reuses between runs never changes a result: runs in place on the
caller's DRAM, decoded weight streams (keyed by their bytes: a rewritten weight region gives the
new values), cached schedules, and the int64 fallback of the exact float64 products."""

import numpy as np
import pytest

import sim.functional
from hw.config import AcceleratorConfig, MemoryModel
from hw.format import WeightFormat, random_quantized
from hw.isa import End, Engine, ErrorCode, Gemm, Sync, program_words
from hw.numerics import gemm_acc
from sim.backends import make_backend, runs_in_place
from sim.model import FastModel
from sw.compile.layers import build_linear

CFG = AcceleratorConfig(rows=2, cols=8, memory=MemoryModel(size_bytes=1 << 20))
FMT = WeightFormat("2:4", 4, 64)
N, K, T = 40, 512, 3


def _layer(seed: int, acts: np.ndarray | None = None):
    rng = np.random.default_rng(seed)
    w = random_quantized(FMT, (N, K), rng)
    if acts is None:
        acts = rng.integers(-127, 128, size=(T, K)).astype(np.int8)
    return build_linear(CFG, FMT, N, K, T, w, acts), w, acts


def _golden(w, acts):
    return gemm_acc(np.pad(acts, ((0, 0), (0, w.k_padded - K))), w.int_weight())


def test_in_place_runs_on_the_callers_array_and_copies_do_not():
    lp, w, a = _layer(0)
    model = FastModel(CFG)
    before = lp.dram.copy()
    copied = model.run(lp.words, lp.dram)
    assert np.array_equal(lp.dram, before)  # the default leaves the image alone
    dram = lp.dram.copy()
    r = model.run(lp.words, dram, in_place=True)
    assert r.dram is dram
    assert np.array_equal(r.dram, copied.dram)
    assert (r.cycles, r.counters) == (copied.cycles, copied.counters)
    assert np.array_equal(lp.read_output(dram), _golden(w, a))


def test_a_faulting_program_in_place_holds_what_it_completed():
    """A SYNC before END waits on an event nobody signals: the machine deadlocks after the
    layer's STOREs; in place, the image is what the copying run returns."""
    lp, _, _ = _layer(1)
    used = {e for i in lp.program for e in (i.wait, i.signal) if e is not None}
    free = max(set(range(CFG.num_events)) - used)
    words = program_words(lp.program[:-1] + [Sync(engine=Engine.LOAD, wait=free), End()])
    model = FastModel(CFG)
    copied = model.run(words, lp.dram)
    assert not copied.ok
    dram = lp.dram.copy()
    r = model.run(words, dram, in_place=True)
    assert r.error == copied.error == ErrorCode.DEADLOCK and r.dram is dram
    assert np.array_equal(dram, copied.dram) and not np.array_equal(dram, lp.dram)


def test_rewritten_weights_give_the_new_values():
    """The host rewrites a weight region between two runs on the same model (its cache warm
    with the old streams): the second run computes with the new weights."""
    lp1, w1, a = _layer(2)
    lp2, w2, _ = _layer(3, a)
    assert np.array_equal(lp1.words, lp2.words)  # same layout, other weights
    region = lp1.symbols["w:0"]
    lo, hi = region.addr, region.end
    assert not np.array_equal(lp1.dram[lo:hi], lp2.dram[lo:hi])
    model = FastModel(CFG)
    dram = lp1.dram.copy()
    model.run(lp1.words, dram, in_place=True)
    assert np.array_equal(lp1.read_output(dram), _golden(w1, a))
    misses = model.weights.misses
    model.run(lp1.words, dram, in_place=True)  # the same streams again: all hits
    assert model.weights.misses == misses and model.weights.hits >= misses
    dram[lo:hi] = lp2.dram[lo:hi]  # the host writes new weights
    model.run(lp1.words, dram, in_place=True)
    assert model.weights.misses > misses
    assert np.array_equal(lp1.read_output(dram), _golden(w2, a))
    # one changed byte of one stream is enough
    dram[lo + 100] ^= 0x11
    fresh = FastModel(CFG, weight_cache_bytes=0).run(lp1.words, dram)
    assert np.array_equal(model.run(lp1.words, dram).dram, fresh.dram)


def test_the_cache_is_bounded():
    lp, _, _ = _layer(4)
    unbounded = FastModel(CFG)
    unbounded.run(lp.words, lp.dram)
    bound = unbounded.weights.nbytes // 2
    model = FastModel(CFG, weight_cache_bytes=bound)
    r = model.run(lp.words, lp.dram)
    assert 0 < model.weights.nbytes <= bound and len(model.weights) < len(unbounded.weights)
    assert np.array_equal(r.dram, FastModel(CFG, weight_cache_bytes=0).run(lp.words,
                                                                             lp.dram).dram)


def test_int64_fallback_is_bit_identical(monkeypatch):
    lp, w, a = _layer(5)
    fast = FastModel(CFG).run(lp.words, lp.dram)
    monkeypatch.setattr(sim.functional, "F64_EXACT", 0)  # every product takes the int64 path
    slow = FastModel(CFG).run(lp.words, lp.dram)
    assert np.array_equal(fast.dram, slow.dram)
    assert np.array_equal(lp.read_output(slow.dram), _golden(w, a))


def test_exactness_bound_is_checked_per_gemm(monkeypatch):
    """The float64 path is taken only below the bound (here: weights of 2**50 would not be)."""
    seen = []
    real = sim.functional._dense

    def big(ins, cfg, stream):
        w, span, w_max = real(ins, cfg, stream)
        seen.append(span * 128 * w_max < sim.functional.F64_EXACT)
        return w, span, w_max

    monkeypatch.setattr(sim.functional, "_dense", big)
    lp, _, _ = _layer(6)
    FastModel(CFG, weight_cache_bytes=0).run(lp.words, lp.dram)
    assert seen and all(seen)


def test_schedules_are_reused_but_follow_the_contract(monkeypatch):
    lp, _, _ = _layer(7)
    model = FastModel(CFG)
    first = model.run(lp.words, timing_only=True)
    again = model.run(lp.words, timing_only=True)
    assert (again.cycles, again.counters) == (first.cycles, first.counters)
    again.counters["instructions"] = -1  # a caller's edit does not reach the cache
    assert model.run(lp.words, timing_only=True).counters == first.counters
    import hw.timing
    monkeypatch.setattr(hw.timing, "LOAD_OVERHEAD", hw.timing.LOAD_OVERHEAD + 3)
    assert model.run(lp.words, timing_only=True).cycles > first.cycles


@pytest.mark.parametrize("name", ["model", "model-timing", "rtl", "netlist"])
def test_which_backends_run_in_place(name):
    assert runs_in_place(make_backend(name, CFG)) == (name in ("model", "model-timing"))


def test_instruction_objects_and_words_agree():
    lp, _, _ = _layer(8)
    model = FastModel(CFG)
    by_words = model.run(lp.words, lp.dram)
    by_objects = model.run(lp.program, lp.dram)
    assert any(isinstance(i, Gemm) for i in lp.program)
    assert np.array_equal(by_words.dram, by_objects.dram)
