# amaranth: UnusedElaboratable=no
"""Dequant unit: code * (q - zero) as sim.functional.decode_gemm_weights computes it."""

import numpy as np
import pytest
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from hw.config import AcceleratorConfig, MemoryModel
from hw.dequant import Dequant, dequant_reference, field_value
from hw.isa import Gemm
from hw.pe import MULT_BITS, hi_slice_bits
from sim.functional import decode_gemm_weights

DEFAULT = AcceleratorConfig()
NARROW = AcceleratorConfig(rows=2, cols=4, weight_bits=(4,), scale_code_bits=6,
                           memory=MemoryModel(size_bytes=1 << 16))


def run_vectors(cfg, vectors):
    """Drive one vector per cycle; return the outputs, ``Dequant.LATENCY`` cycles later."""
    dut = Dequant(cfg)
    got = []

    async def testbench(ctx):
        for n in range(len(vectors) + Dequant.LATENCY):
            if n < len(vectors):
                v = vectors[n]
                for name in ("code", "zero", "int8", "asym", "raw"):
                    ctx.set(getattr(dut, name), v[name])
                ctx.set(dut.q, field_value(v["value"], 8 if v["int8"] else 4, v["asym"]))
            if n >= Dequant.LATENCY:
                got.append(ctx.get(dut.w))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    return got


def random_vectors(cfg, rng, n):
    vmax = (1 << max(cfg.weight_bits)) - 1
    out = []
    for _ in range(n):
        raw = bool(rng.random() < 0.2)
        out.append({"value": int(rng.integers(0, vmax + 1)),
                    "code": int(rng.integers(0, 1 << cfg.scale_code_bits)),
                    "zero": int(rng.integers(0, vmax + 1)),
                    "int8": bool(8 in cfg.weight_bits and rng.random() < 0.5),
                    "asym": bool(not raw and rng.random() < 0.5), "raw": raw})
    return out


@pytest.mark.parametrize("cfg", [DEFAULT, NARROW], ids=["default", "narrow"])
def test_random_vectors_match_reference(cfg):
    rng = np.random.default_rng(3)
    vectors = random_vectors(cfg, rng, 400)
    # Extremes: the widest asymmetric products and the most negative symmetric value.
    top = (1 << cfg.scale_code_bits) - 1
    for int8 in {False, 8 in cfg.weight_bits}:
        vmax = 255 if int8 else 15
        vectors += [
            {"value": 0, "code": top, "zero": vmax, "int8": int8, "asym": True, "raw": False},
            {"value": vmax, "code": top, "zero": 0, "int8": int8, "asym": True, "raw": False},
            {"value": (vmax + 1) // 2, "code": top, "zero": 0, "int8": int8, "asym": False,
             "raw": False},
        ]
    got = run_vectors(cfg, vectors)
    for v, w in zip(vectors, got, strict=True):
        args = {k: v[k] for k in ("int8", "asym", "raw")}
        assert w == dequant_reference(v["value"], v["code"], v["zero"], cfg=cfg, **args), v


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), int8=st.booleans(), asym=st.booleans(),
       raw=st.booleans())
def test_reference_is_the_functional_decoder(seed, int8, asym, raw):
    """dequant_reference agrees with decode_gemm_weights on one-group streams of any bytes."""
    cfg = NARROW if seed % 2 else DEFAULT
    int8 = int8 and 8 in cfg.weight_bits
    asym = asym and not raw
    rng = np.random.default_rng(seed)
    lanes = cfg.lanes
    wgt = rng.integers(0, 256, size=cfg.wgt_spad_bytes, dtype=np.uint8)
    ins = Gemm(k_steps=1, group_steps=0 if raw else 1, int8=int8, asym=asym)
    w, _ = decode_gemm_weights(ins, cfg, wgt)
    hdr = 0 if raw else 1 + asym
    body = wgt[hdr * lanes:]
    for l in range(lanes):
        value = int(body[l]) if int8 else int(body[l // 2] >> (4 * (l % 2))) & 0xF
        code = 0 if raw else int(wgt[l])
        zero = int(wgt[lanes + l]) if asym else 0
        assert w[l, 0] == dequant_reference(value, code, zero, int8=int8, asym=asym, raw=raw,
                                            cfg=cfg)


def test_output_fits_the_operand_width():
    for cfg in (DEFAULT, NARROW):
        lim = 1 << (cfg.weight_operand_bits - 1)
        top = (1 << cfg.scale_code_bits) - 1
        for int8 in {False, 8 in cfg.weight_bits}:
            vmax = 255 if int8 else 15
            for value, zero, asym in [(0, vmax, True), (vmax, 0, True), (vmax // 2 + 1, 0, False)]:
                w = dequant_reference(value, top, zero, int8=int8, asym=asym, raw=False, cfg=cfg)
                assert -lim <= w < lim


def test_rejects_non_config():
    with pytest.raises(TypeError, match="got 'cfg'"):
        Dequant("cfg")


def test_epilogue_borrows_the_multiplier():
    """With ext high in cycle e, prod in e + 2 is ext_a * ext_b (both of e): signed high slice
    times the unsigned multiplier; the next dequantisation is unaffected."""
    cfg = DEFAULT
    dut = Dequant(cfg)
    rng = np.random.default_rng(8)
    half = 1 << (hi_slice_bits(cfg) - 1)
    pairs = [(int(a), int(b)) for a, b in zip(rng.integers(-half, half, size=50),
                                              rng.integers(0, 1 << MULT_BITS, size=50),
                                              strict=True)]
    pairs += [(-half, (1 << MULT_BITS) - 1), (half - 1, (1 << MULT_BITS) - 1)]
    got = []

    async def testbench(ctx):
        # A new pair every cycle (the epilogue's multiplier is constant; this is stricter).
        for k in range(len(pairs) + 2):
            ctx.set(dut.ext, int(k < len(pairs)))
            if k < len(pairs):
                ctx.set(dut.ext_a, pairs[k][0])
                ctx.set(dut.ext_b, pairs[k][1])
            if k >= 2:
                got.append(ctx.get(dut.prod))
            await ctx.tick()
        for name, v in {"q": 9, "code": 200, "zero": 3, "asym": 1}.items():
            ctx.set(getattr(dut, name), v)
        await ctx.tick().repeat(Dequant.LATENCY)
        got.append(ctx.get(dut.w))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    assert got == [a * b for a, b in pairs] + [200 * (9 - 3)]
