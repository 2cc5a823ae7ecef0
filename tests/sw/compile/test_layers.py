"""Layers compiled alone (tiling, scheduling, layout, relocation): programs are valid,
race-free and compute the golden result."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hw.config import AcceleratorConfig, MemoryModel
from hw.format import WeightFormat, random_quantized
from hw.isa import Gemm, check
from hw.numerics import gemm_acc
from sim.model import FastModel
from sw.compile.errors import LoweringError
from sw.compile.layers import LayerSpec, build_layers, build_linear

# Small scratchpads force K chunking, non-resident activations and several token tiles.
SMALL = AcceleratorConfig(rows=2, cols=8, max_tokens=4, act_spad_bytes=2048,
                          wgt_spad_bytes=4096, out_spad_bytes=1024, queue_depth=2,
                          memory=MemoryModel(latency=5, size_bytes=1 << 18))


@st.composite
def layers(draw):
    cfg = draw(st.sampled_from([SMALL, AcceleratorConfig(rows=2, cols=8,
                                                         memory=MemoryModel(size_bytes=1 << 18))]))
    p = draw(st.sampled_from(cfg.pattern_table))
    bits = 8 if p.dense and draw(st.booleans()) else 4
    group = draw(st.sampled_from([32, 64, 128]))
    fmt = WeightFormat(p, bits, group, symmetric=draw(st.booleans()))
    return cfg, fmt, draw(st.integers(1, 11)), draw(st.integers(1, 40)), \
        draw(st.integers(1, 300)), draw(st.integers(0, 2**32 - 1))


@given(layers())
def test_lowered_layer_computes_the_golden_result(case):
    _run_and_check(*case)


@pytest.mark.parametrize("pattern, bits, tokens, n, k, expect", [
    ("2:4", 4, 11, 40, 1000, dict(resident_acts=False, k_chunks=4, token_tiles=3, n_tiles=3)),
    ("dense", 8, 9, 20, 700, dict(resident_acts=False, token_tiles=3)),
    ("1:8", 4, 3, 33, 960, dict(resident_acts=False, k_chunks=3)),
    ("4:16", 4, 6, 16, 256, dict(resident_acts=True, token_tiles=2)),
])
def test_lowering_coverage(pattern, bits, tokens, n, k, expect):
    """Fixed cases that exercise every tiling path on the small configuration."""
    fmt = WeightFormat(pattern, bits, 64)
    plan = _run_and_check(SMALL, fmt, tokens, n, k, 7)
    for key, value in expect.items():
        assert getattr(plan, key) == value, key


def _run_and_check(cfg, fmt, tokens, n, k, seed):
    rng = np.random.default_rng(seed)
    w = random_quantized(fmt, (n, k), rng)
    a = rng.integers(-127, 128, size=(tokens, k)).astype(np.int8)
    try:
        lp = build_linear(cfg, fmt, n, k, tokens, w, a)
    except LoweringError:
        # Only legitimate refusals: the group does not fit the small WGT halves.
        assert cfg is SMALL
        return None
    for ins in lp.program:
        check(ins, cfg)
    model = FastModel(cfg)
    r = model.run(lp.program, lp.dram)
    assert r.ok, r.detail
    ref = gemm_acc(np.pad(a, ((0, 0), (0, w.k_padded - k))), w.int_weight())
    assert np.array_equal(lp.read_output(r.dram), ref)
    assert model.run(lp.program, timing_only=True).cycles == r.cycles
    macs = sum(g.k_steps * g.tokens for g in lp.program if isinstance(g, Gemm))
    assert r.counters["mac_cycles"] == macs
    return lp.plan


def test_lowering_errors():
    cfg = AcceleratorConfig(patterns=("2:4",))
    with pytest.raises(LoweringError, match="pattern 1:4 not supported"):
        build_linear(cfg, WeightFormat("1:4", 4, 128), 64, 128, 1)
    with pytest.raises(LoweringError, match="INT8 weights dense only"):
        build_linear(cfg, WeightFormat("2:4", 8, 128), 64, 128, 1)
    with pytest.raises(LoweringError, match="exceeds half the WGT spad"):
        build_linear(SMALL, WeightFormat("dense", 8, 0), 16, 4096, 1)
    with pytest.raises(LoweringError, match="int8"):
        build_linear(cfg, WeightFormat("2:4", 4, 128), 64, 128, 2,
                     random_quantized(WeightFormat("2:4", 4, 128), (64, 128),
                                      np.random.default_rng(0)), np.zeros((2, 128), np.int16))


def test_program_must_fit_the_instruction_memory():
    fmt = WeightFormat("2:4", 4, 128)
    n = 64 * 40  # 40 n-tiles of 64 lanes: three instructions each, plus END
    fits = build_linear(AcceleratorConfig(rows=4, cols=16, imem_depth=128), fmt, n, 128, 1)
    assert len(fits.program) <= 128
    with pytest.raises(LoweringError, match=r"needs \d+ instructions .* holds 64"):
        build_linear(AcceleratorConfig(rows=4, cols=16, imem_depth=64), fmt, n, 128, 1)


@st.composite
def layer_groups(draw):
    cfg = SMALL if draw(st.booleans()) else AcceleratorConfig(
        rows=2, cols=8, memory=MemoryModel(size_bytes=1 << 18))
    specs = []
    for _ in range(draw(st.integers(1, 4))):
        p = draw(st.sampled_from(cfg.pattern_table))
        bits = 8 if p.dense and draw(st.booleans()) else 4
        fmt = WeightFormat(p, bits, draw(st.sampled_from([32, 64])),
                           symmetric=draw(st.booleans()))
        specs.append((fmt, draw(st.integers(1, 24)), draw(st.integers(1, 200)),
                      draw(st.integers(1, 9))))
    return cfg, specs, draw(st.integers(0, 2**32 - 1))


@given(layer_groups())
def test_several_layers_in_one_program(case):
    """The pipeline runs across layer boundaries (mixed formats, residency and token counts)
    and every layer still computes its golden result."""
    cfg, shapes, seed = case
    rng = np.random.default_rng(seed)
    specs = []
    for fmt, n, k, tokens in shapes:
        specs.append(LayerSpec(fmt, n, k, tokens, random_quantized(fmt, (n, k), rng),
                               rng.integers(-127, 128, size=(tokens, k)).astype(np.int8)))
    try:
        lp = build_layers(cfg, specs)
    except LoweringError:
        assert cfg is SMALL
        return
    r = FastModel(cfg).run(lp.program, lp.dram)
    assert r.ok, r.detail
    for L, sp in enumerate(specs):
        a = np.pad(sp.acts, ((0, 0), (0, sp.weight.k_padded - sp.k)))
        assert np.array_equal(lp.read_output(r.dram, L), gemm_acc(a, sp.weight.int_weight()))
