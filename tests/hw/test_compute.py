"""ComputeCore: random GEMM instructions against sim.functional.exec_gemm, bytes and cycles.

The core runs with behavioural scratchpads (lib.memory.Memory) in a small harness. Every GEMM
must leave exactly the OUT bytes of the functional model, raise ``done`` exactly in cycle
``c + hw.timing.gemm_cycles``, keep ``cmd.ready`` low meanwhile, accept the next command in
``c + D + 1`` and report exactly ``k_steps * tokens`` MAC cycles.
"""

import numpy as np
import pytest
from amaranth import Elaboratable, Module, Signal, unsigned
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import connect
from amaranth.sim import Simulator

from hw.compute import ComputeCore, header_words
from hw.config import AcceleratorConfig, MemoryModel
from hw.decoder import SPADS, spad_depth, spad_word_bits
from hw.fanout import registered_control
from hw.format import WeightFormat, pack, random_quantized
from hw.isa import (
    EpilogueMode,
    ErrorCode,
    Gemm,
    GemmBody,
    ISAError,
    Spad,
    check,
    dispatch_error,
    gemm_header_words,
    word_beats,
)
from hw.numerics import gemm_acc
from hw.timing import gemm_cycles
from sim.functional import MachineState, decode_gemm_weights, exec_gemm

#: 8 lanes; WGT/OUT words narrower than a beat.
SMALL = AcceleratorConfig(rows=2, cols=4, max_tokens=4, act_spad_bytes=1024,
                          wgt_spad_bytes=1024, out_spad_bytes=512, param_spad_bytes=256)
#: 16 lanes, 4-byte beats (ACT words span 4 beats), INT4 only, 6-bit codes, 24-bit accumulators,
#: an M=2 pattern (5-bit fields) and scratchpads whose depths are not powers of two.
ODD = AcceleratorConfig(rows=4, cols=4, max_tokens=8, patterns=("1:2", "2:4", "1:8", "4:16"),
                        weight_bits=(4,), scale_code_bits=6, acc_bits=24,
                        memory=MemoryModel(bytes_per_cycle=4, size_bytes=1 << 16),
                        act_spad_bytes=768, wgt_spad_bytes=1536, out_spad_bytes=640,
                        param_spad_bytes=320)
#: One row, 48-bit accumulators (three multiplier slices), beats wider than every word but PARAM.
WIDEACC = AcceleratorConfig(rows=1, cols=8, max_tokens=2, acc_bits=48, patterns=("2:8",),
                            memory=MemoryModel(bytes_per_cycle=32, size_bytes=1 << 16),
                            act_spad_bytes=512, wgt_spad_bytes=1024, out_spad_bytes=512,
                            param_spad_bytes=256)

#: SMALL with a vector engine: the core's ``done`` is a register set a cycle early.
SMALL_VEC = SMALL.replace(vin_spad_bytes=256, vout_spad_bytes=256)
assert registered_control(SMALL_VEC) and not registered_control(SMALL)


class Harness(Elaboratable):
    """The core with one behavioural Memory per scratchpad."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.core = ComputeCore(cfg)
        self.mems = {n: Memory(shape=unsigned(spad_word_bits(cfg, n)),
                               depth=spad_depth(cfg, n), init=[]) for n in SPADS}

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        for n, mem in self.mems.items():
            m.submodules[n] = mem
        connect(m, self.mems["act"].read_port(), core.act_rd)
        connect(m, self.mems["wgt"].read_port(), core.wgt_rd)
        connect(m, self.mems["param"].read_port(), core.param_rd)
        connect(m, self.mems["out"].write_port(), core.out_wr)
        return m


def body_bits(ins: Gemm) -> int:
    """The GEMM body as the integer the ``cmd.payload`` bits hold (from the ISA layout)."""
    return sum(int(v) << GemmBody[name].offset for name, v in ins._body_fields().items())


def random_gemm(rng, cfg, *, max_k=24, accumulate=None):
    """A random instruction that passes the hardware's dispatch checks (extents may wrap)."""
    pat = int(rng.integers(len(cfg.pattern_table)))
    int8 = pat == 0 and 8 in cfg.weight_bits and rng.random() < 0.4
    k = int(rng.integers(1, max_k + 1))
    gs = 0 if rng.random() < 0.3 else int(rng.integers(1, k + 3))
    asym = gs != 0 and rng.random() < 0.5
    if accumulate is None:
        accumulate = bool(rng.random() < 0.3)

    def addr(spad, word):
        wb = word_beats(word, cfg)
        return int(rng.integers(0, cfg.spad_beats(spad) // wb)) * wb

    ins = Gemm(wgt_addr=addr("wgt", cfg.wgt_word_bytes), act_addr=addr("act", cfg.act_word_bytes),
               act_stride=int(rng.integers(0, 9)) * word_beats(cfg.act_word_bytes, cfg),
               out_addr=addr("out", cfg.out_word_bytes),
               param_addr=addr("param", cfg.param_word_bytes), k_steps=k, group_steps=gs,
               tokens=int(rng.integers(1, cfg.max_tokens + 1)), pattern=pat, int8=bool(int8),
               asym=bool(asym), accumulate=accumulate,
               epilogue=EpilogueMode(int(rng.integers(len(EpilogueMode)))),
               shift=int(rng.integers(32)))
    assert dispatch_error(ins, cfg) == ErrorCode.NONE, ins
    return ins


def run_program(cfg, steps, *, seed=0):
    """Run ``steps``, a list of ``(ins, fill)`` where ``fill(state, rng)`` may rewrite the
    ACT/WGT/PARAM bytes of the model state first (None: random bytes), on the RTL and the
    functional model side by side. Returns the final model state."""
    rng = np.random.default_rng(seed)
    h = Harness(cfg)
    core = h.core
    st = MachineState(cfg)

    def write_spad(ctx, name):
        buf = st.spads[Spad[name.upper()]]
        wb = spad_word_bits(cfg, name) // 8
        for i in range(buf.size // wb):
            ctx.set(h.mems[name].data[i], int.from_bytes(buf[i * wb:(i + 1) * wb].tobytes(),
                                                         "little"))

    async def testbench(ctx):
        for n, (ins, fill) in enumerate(steps):
            for name in ("act", "wgt", "param"):
                sp = st.spads[Spad[name.upper()]]
                sp[:] = rng.integers(0, 256, size=sp.size, dtype=np.uint8)
            if fill is not None:
                fill(st, rng)
            for name in ("act", "wgt", "param"):
                write_spad(ctx, name)
            # Cycle c: the transfer.
            ctx.set(core.cmd.payload.as_value(), body_bits(ins))
            ctx.set(core.cmd.valid, 1)
            assert ctx.get(core.cmd.ready), f"GEMM {n}: core not ready in c + D + 1"
            await ctx.tick()
            expect = gemm_cycles(ins, cfg)
            cycle, macs = 1, 0
            while True:
                # valid stays high: a busy core must not take it again.
                assert not ctx.get(core.cmd.ready), f"GEMM {n}: ready in cycle c + {cycle}"
                macs += ctx.get(core.mac)
                if ctx.get(core.done):
                    break
                assert cycle < expect, f"GEMM {n}: no done by c + {expect}: {ins}"
                await ctx.tick()
                cycle += 1
            ctx.set(core.cmd.valid, 0)
            assert cycle == expect, f"GEMM {n}: done in c + {cycle}, expected {expect}: {ins}"
            assert macs == ins.k_steps * ins.tokens, f"GEMM {n}: {macs} MAC cycles"
            await ctx.tick()  # the last OUT write lands at the end of cycle c + D
            exec_gemm(st, ins)
            wb = spad_word_bits(cfg, "out") // 8
            out = b"".join(ctx.get(h.mems["out"].data[i]).to_bytes(wb, "little")
                           for i in range(spad_depth(cfg, "out")))
            got = np.frombuffer(out, dtype=np.uint8)
            bad = np.flatnonzero(got != st.spads[Spad.OUT])
            assert bad.size == 0, (f"GEMM {n}: OUT bytes {bad[:8]} differ: "
                                   f"{got[bad[:8]]} != {st.spads[Spad.OUT][bad[:8]]}: {ins}")

    sim = Simulator(h)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    return st


@pytest.mark.parametrize("cfg, seed, count", [(SMALL, 1, 40), (ODD, 2, 30), (WIDEACC, 3, 20),
                                              (SMALL_VEC, 1, 40)],
                         ids=["small", "odd", "wideacc", "small-registered-done"])
def test_random_gemms_match_functional_model(cfg, seed, count):
    rng = np.random.default_rng(seed)
    run_program(cfg, [(random_gemm(rng, cfg), None) for _ in range(count)], seed=seed)


def test_every_mode_is_covered():
    """The random programs above reach every pattern, width, header mode and epilogue."""
    seen = set()
    for cfg, seed, count in [(SMALL, 1, 40), (ODD, 2, 30), (WIDEACC, 3, 20)]:
        rng = np.random.default_rng(seed)
        for _ in range(count):
            g = random_gemm(rng, cfg)
            seen |= {("pattern", cfg.pattern_table[g.pattern].m), ("int8", g.int8),
                     ("mode", "raw" if g.group_steps == 0 else "asym" if g.asym else "sym"),
                     ("epilogue", g.epilogue), ("accumulate", g.accumulate),
                     ("tokens", g.tokens == cfg.max_tokens)}
    for want in [("pattern", m) for m in (1, 2, 4, 8, 16)] + \
            [("int8", True), ("mode", "raw"), ("mode", "sym"), ("mode", "asym"),
             ("accumulate", True), ("tokens", True)] + [("epilogue", e) for e in EpilogueMode]:
        assert want in seen, want


def _tile(cfg, fmt, k, T, rng):
    """A packed weight tile and activations for ``T`` tokens."""
    w = random_quantized(fmt, (cfg.lanes, k), rng)
    a = rng.integers(-127, 128, size=(T, w.k_padded)).astype(np.int8)
    return w, pack(w, cfg.lanes), a


@pytest.mark.parametrize("cfg", [SMALL, ODD], ids=["small", "odd"])
def test_packed_weights_in_k_chunks_with_accumulate(cfg):
    """Packed tiles split into K chunks at group boundaries: NONE, accumulate..., INT8; then a
    zero-weight accumulate with WIDE. The accumulators equal the golden integer GEMM."""
    rng = np.random.default_rng(7)
    beat, lanes = cfg.beat_bytes, cfg.lanes
    act_words = word_beats(cfg.act_word_bytes, cfg)
    code_bits = cfg.scale_code_bits
    cases = [(WeightFormat("2:4", 4, 32, symmetric=False, code_bits=code_bits), 128, 3),
             (WeightFormat("dense", 4, 32, code_bits=code_bits),
              min(128, cfg.act_spad_bytes // cfg.max_tokens // 32 * 32), cfg.max_tokens),
             (WeightFormat("4:16", 4, 64, code_bits=code_bits), 192, 2)]
    program = []
    for fmt, k, T in cases:
        w, stream, a = _tile(cfg, fmt, k, T, rng)
        kp = w.k_padded
        groups, spg = kp // fmt.group, fmt.steps_per_group(kp)
        gbytes = stream.size // groups
        # K chunks may start at a group whose stream and activation offsets are word aligned.
        wunit = max(beat, cfg.wgt_word_bytes)
        aunit = beat * act_words
        cuts = [g for g in range(1, groups) if (g * gbytes) % wunit == 0
                and (g * fmt.group) % aunit == 0]
        bounds = [0] + cuts[:2] + [groups]
        assert len(bounds) >= 3, (fmt, cuts)  # at least two chunks
        stride = -(-kp // aunit) * act_words
        mult = rng.integers(0, 1 << 12, size=lanes).astype("<u2")
        golden = gemm_acc(a, w.int_weight(), cfg.acc_bits)

        def fill(st, rng, stream=stream, a=a, mult=mult, stride=stride, kp=kp, T=T):
            st.spads[Spad.WGT][:stream.size] = stream
            for t in range(T):
                st.spads[Spad.ACT][t * stride * beat:t * stride * beat + kp] = a[t].view(np.uint8)
            st.spads[Spad.PARAM][:2 * lanes] = mult.view(np.uint8)

        for n in range(len(bounds) - 1):
            g0, g1 = bounds[n], bounds[n + 1]
            last = g1 == groups
            ins = Gemm(wgt_addr=g0 * gbytes // beat, act_addr=g0 * fmt.group // beat,
                       act_stride=stride, k_steps=(g1 - g0) * spg, group_steps=spg, tokens=T,
                       pattern=cfg.pattern_index(fmt.pattern), asym=not fmt.symmetric,
                       accumulate=n > 0, shift=9,
                       epilogue=EpilogueMode.INT8 if last else EpilogueMode.NONE)
            check(ins, cfg)
            program.append((ins, fill))
        # One more K chunk of zero weights (raw, dense) that writes the accumulators as int32.
        zero = Gemm(wgt_addr=(cfg.wgt_spad_bytes - cfg.wgt_word_bytes) // beat, k_steps=1,
                    tokens=T, accumulate=True, epilogue=EpilogueMode.WIDE)
        check(zero, cfg)

        def fill_zero(st, rng, fill=fill, golden=golden, T=T):
            # The model has run the INT8 chunk: its accumulators are the golden GEMM.
            assert np.array_equal(st.acc[:T], golden)
            fill(st, rng)
            st.spads[Spad.WGT][-cfg.wgt_word_bytes:] = 0

        program.append((zero, fill_zero))
    st = run_program(cfg, program, seed=11)
    T = cases[-1][2]
    out = st.spads[Spad.OUT][:T * 4 * lanes].view("<i4").reshape(T, lanes)
    assert np.array_equal(out, st.acc[:T])


def test_default_config_random_gemms():
    """The default geometry (scratchpads shrunk to keep the simulation small)."""
    cfg = AcceleratorConfig(act_spad_bytes=2048, wgt_spad_bytes=4096, out_spad_bytes=2048,
                            param_spad_bytes=1024)
    rng = np.random.default_rng(5)
    run_program(cfg, [(random_gemm(rng, cfg, max_k=12), None) for _ in range(8)], seed=5)


# ---------------------------------------------------------------------- contract refinements
def test_alignment_rules_at_dispatch():
    """GEMM addresses must start on a scratchpad word (the core reads/writes whole words)."""
    cfg = AcceleratorConfig(rows=4, cols=16)  # OUT words are 4 beats, PARAM words 8
    assert dispatch_error(Gemm(out_addr=2), cfg) == ErrorCode.BAD_ADDRESS
    assert dispatch_error(Gemm(out_addr=2, epilogue=EpilogueMode.NONE), cfg) == ErrorCode.NONE
    assert dispatch_error(Gemm(out_addr=4), cfg) == ErrorCode.NONE
    assert dispatch_error(Gemm(param_addr=4, epilogue=EpilogueMode.INT8), cfg) == \
        ErrorCode.BAD_ADDRESS
    assert dispatch_error(Gemm(param_addr=4, epilogue=EpilogueMode.WIDE), cfg) == ErrorCode.NONE
    with pytest.raises(ISAError, match="out_addr=2 must be a multiple of 4 beats"):
        check(Gemm(out_addr=2), cfg)
    # Narrow beats: ACT rows must start on an ACT word too.
    assert dispatch_error(Gemm(act_addr=2), ODD) == ErrorCode.BAD_ADDRESS
    assert dispatch_error(Gemm(act_stride=6, epilogue=EpilogueMode.NONE), ODD) == \
        ErrorCode.BAD_ADDRESS
    with pytest.raises(ISAError, match="act_stride=6 must be a multiple of 4 beats"):
        check(Gemm(act_stride=6, epilogue=EpilogueMode.NONE), ODD)
    assert dispatch_error(Gemm(act_addr=4, act_stride=8, epilogue=EpilogueMode.NONE), ODD) == \
        ErrorCode.NONE


def test_decode_keeps_code_and_zero_bits_only():
    """Header bytes beyond scale_code_bits (codes) or the value width (zeros) are ignored."""
    cfg = ODD
    wgt = np.zeros(cfg.wgt_spad_bytes, dtype=np.uint8)
    lanes = cfg.lanes
    wgt[:lanes] = 0xC0 | 5          # code 5 with bits above the 6 code bits
    wgt[lanes:2 * lanes] = 0xF0 | 3  # zero point 3 with bits above the 4 value bits
    wgt[2 * lanes:2 * lanes + lanes // 2] = 0x99  # values 9 in every lane
    w, _ = decode_gemm_weights(Gemm(k_steps=1, group_steps=1, asym=True), cfg, wgt)
    assert (w == 5 * (9 - 3)).all()


def test_header_words_logic_is_the_isa_rule():
    """The core's per-instruction header-word count is hw.isa.gemm_header_words."""
    body = Signal(GemmBody)
    hdr = Signal(2)
    m = Module()
    m.d.comb += hdr.eq(header_words(body))
    cases = [(gs, asym) for gs in (0, 1, 2, 3, (1 << 14) - 1) for asym in (0, 1)]
    sim = Simulator(m)

    async def tb(ctx):
        for gs, asym in cases:
            ctx.set(body.group_steps, gs)
            ctx.set(body.asym, asym)
            assert ctx.get(hdr) == gemm_header_words(gs, asym), (gs, asym)

    sim.add_testbench(tb)
    sim.run()
