"""Functional semantics of GEMM/LOAD/STORE on byte state equal the golden numerics."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hw.config import AcceleratorConfig, MemoryModel
from hw.format import WeightFormat, pack, random_quantized
from hw.isa import EpilogueMode, Gemm, Load, Spad, Store, bias_row_bytes
from hw.numerics import gemm_acc, requantize_int8, wrap
from sim.functional import MachineState, exec_gemm, exec_load, exec_store

CFG = AcceleratorConfig(rows=2, cols=8, memory=MemoryModel(size_bytes=1 << 16))


@st.composite
def gemm_cases(draw):
    p = draw(st.sampled_from(CFG.pattern_table))
    bits = 8 if p.dense and draw(st.booleans()) else 4
    group = draw(st.sampled_from([0, 32, 64]))
    if group and group % p.block:
        group = 0
    fmt = WeightFormat(p, bits, group, symmetric=draw(st.booleans()))
    return fmt, draw(st.integers(1, 96)), draw(st.integers(1, CFG.max_tokens)), \
        draw(st.sampled_from(list(EpilogueMode))), draw(st.integers(0, 2**32 - 1))


@given(gemm_cases())
def test_gemm_matches_golden(case):
    fmt, k, T, epi, seed = case
    rng = np.random.default_rng(seed)
    lanes = CFG.lanes
    if epi == EpilogueMode.WIDE_BIAS:  # as many bias rows as PARAM holds
        T = min(T, CFG.param_spad_bytes // bias_row_bytes(CFG))
    w = random_quantized(fmt, (lanes, k), rng)
    stream = pack(w, lanes)
    kp = w.k_padded
    st_ = MachineState(CFG)
    st_.spads[Spad.WGT][:stream.size] = stream
    stride = -(-kp // CFG.beat_bytes)
    a = rng.integers(-127, 128, size=(T, kp)).astype(np.int8)
    for t in range(T):
        st_.spads[Spad.ACT][t * stride * 16:t * stride * 16 + kp] = a[t].view(np.uint8)
    mult = rng.integers(0, 2**16, size=lanes).astype("<u2")
    res = rng.integers(-128, 128, size=(T, lanes)).astype(np.int8)
    st_.spads[Spad.PARAM][:2 * lanes] = mult.view(np.uint8)
    st_.spads[Spad.PARAM][2 * lanes:2 * lanes + T * lanes] = res.view(np.uint8).reshape(-1)
    bias = rng.integers(-2**31, 2**31, size=(T, lanes)).astype("<i4")
    if epi == EpilogueMode.WIDE_BIAS:
        st_.spads[Spad.PARAM][:bias.nbytes] = bias.view(np.uint8).reshape(-1)
    shift = int(rng.integers(0, 32))
    ins = Gemm(k_steps=fmt.steps(kp), group_steps=fmt.steps_per_group(kp), tokens=T,
               act_stride=stride, pattern=CFG.pattern_index(fmt.pattern), int8=fmt.bits == 8,
               asym=not fmt.symmetric, epilogue=epi, shift=shift)
    exec_gemm(st_, ins)
    ref = gemm_acc(a, w.int_weight())
    assert np.array_equal(st_.acc[:T], ref)
    out = st_.spads[Spad.OUT]
    if epi == EpilogueMode.WIDE:
        assert np.array_equal(out[:T * lanes * 4].view("<i4").reshape(T, lanes), ref)
    elif epi == EpilogueMode.WIDE_BIAS:  # int32 wraps: the sum modulo 2**32
        got = out[:T * lanes * 4].view("<i4").reshape(T, lanes).astype(np.int64)
        assert np.array_equal(got, wrap(ref + bias, 32))
    elif epi != EpilogueMode.NONE:
        expect = requantize_int8(ref, mult, shift,
                                 res if epi == EpilogueMode.INT8_RESIDUAL else None)
        assert np.array_equal(out[:T * lanes].view(np.int8).reshape(T, lanes), expect)
    else:
        assert not out.any()


def test_accumulate_across_k_chunks():
    rng = np.random.default_rng(1)
    fmt = WeightFormat("2:4", 4, 32)
    lanes = CFG.lanes
    w = random_quantized(fmt, (lanes, 64), rng)
    a = rng.integers(-127, 128, size=(3, 64)).astype(np.int8)
    stream = pack(w, lanes)
    st_ = MachineState(CFG)
    st_.spads[Spad.WGT][:stream.size] = stream
    for t in range(3):
        st_.spads[Spad.ACT][t * 64:(t + 1) * 64] = a[t].view(np.uint8)
    half = stream.size // 2  # two groups of 32 dense positions = two K chunks
    exec_gemm(st_, Gemm(k_steps=16, group_steps=16, tokens=3, act_stride=4, pattern=2,
                        epilogue=EpilogueMode.NONE))
    exec_gemm(st_, Gemm(wgt_addr=half // 16, act_addr=2, k_steps=16, group_steps=16, tokens=3,
                        act_stride=4, pattern=2, accumulate=True, epilogue=EpilogueMode.WIDE))
    ref = gemm_acc(a, w.int_weight())
    assert np.array_equal(st_.spads[Spad.OUT][:3 * lanes * 4].view("<i4").reshape(3, lanes), ref)


def test_load_store_strided():
    st_ = MachineState(CFG)
    st_.dram[:] = np.arange(st_.dram.size) % 251
    exec_load(st_, Load(spad=Spad.ACT, dram_addr=3, spad_addr=1, rows=3, row_beats=2,
                        dram_stride=5))
    act = st_.spads[Spad.ACT]
    for r in range(3):
        src = st_.dram[(3 + 5 * r) * 16:(3 + 5 * r) * 16 + 32]
        assert np.array_equal(act[16 + 32 * r:16 + 32 * (r + 1)], src)
    st_.spads[Spad.OUT][:64] = np.arange(64)
    exec_store(st_, Store(dram_addr=100, spad_addr=0, rows=2, row_beats=2, dram_stride=10))
    assert np.array_equal(st_.dram[1600:1632], np.arange(32))
    assert np.array_equal(st_.dram[1760:1792], np.arange(32, 64))


def test_accumulators_wrap_exactly_where_products_can_overflow():
    """With 24-bit accumulators, a short GEMM (its bound below 2**23: no wrap needed) and a
    long one whose first lane's sum is driven past 2**23 (wrapped) both equal the wrapping
    golden GEMM."""
    cfg = AcceleratorConfig(rows=2, cols=8, acc_bits=24, memory=MemoryModel(size_bytes=1 << 16))
    fmt = WeightFormat(cfg.pattern_table[0], 8, 0)
    rng = np.random.default_rng(7)
    for k, saturate in ((96, False), (2048, True)):
        w = random_quantized(fmt, (cfg.lanes, k), rng)
        w_int = w.int_weight()
        if saturate:  # lane 0: every product positive and large
            a = np.where(w_int[0] >= 0, 127, -127)[None, :].repeat(2, axis=0).astype(np.int8)
        else:
            a = rng.integers(-127, 128, size=(2, k)).astype(np.int8)
        st_ = MachineState(cfg)
        stream = pack(w, cfg.lanes)
        st_.spads[Spad.WGT][:stream.size] = stream
        stride = k // cfg.beat_bytes
        for t in range(2):
            st_.spads[Spad.ACT][t * k:(t + 1) * k] = a[t].view(np.uint8)
        exec_gemm(st_, Gemm(k_steps=fmt.steps(k), group_steps=fmt.steps_per_group(k),
                            tokens=2, act_stride=stride, int8=True, asym=not fmt.symmetric,
                            pattern=cfg.pattern_index(fmt.pattern)))
        ref = gemm_acc(a, w_int, acc_bits=24)
        assert np.array_equal(st_.acc[:2], ref)
        exact = a.astype(np.int64) @ w_int.astype(np.int64).T
        assert saturate == (exact[0, 0] >= 1 << 23)  # the long GEMM does wrap
