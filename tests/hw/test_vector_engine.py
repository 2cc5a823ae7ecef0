# amaranth: UnusedElaboratable=no
"""The vector engine: its ISA (codec, presence, dispatch checks), its timing and its executor.

The executor (:class:`hw.vector.engine.VectorEngine`) runs in an Amaranth simulation with its
VIN and VOUT scratchpads: each VEC must end (``done``) exactly ``hw.timing.vec_cycles`` after
its command, and VOUT must hold the bytes :func:`sim.functional.exec_vec` computes with
:mod:`hw.numerics`, on random rows (saturating sums, ties and extreme values included).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from amaranth import Elaboratable, Module, ResetInserter, Signal
from amaranth.hdl import Fragment
from amaranth.lib.wiring import connect
from amaranth.sim import Simulator

from hw import timing
from hw.config import AcceleratorConfig, ConfigError
from hw.engines import ENGINE, engines_of, exec_cycles
from hw.isa import (
    RTL_VEC_FUNCS,
    VEC_FUNC_VALUES,
    Engine,
    ErrorCode,
    ISAError,
    Load,
    Opcode,
    Spad,
    Store,
    Sync,
    Vec,
    VecFunc,
    argmax_imm,
    check,
    decode,
    decode_fields,
    dequant_amax_addr,
    dequant_fold,
    dequant_imm,
    dispatch_error,
    dispatch_errors,
    dispatch_limits,
    encode,
    field_location,
    insert_geometry,
    insert_imm,
    insert_laned,
    kv4_imm,
    kv4_laned,
    laned_vec_funcs,
    legal_words,
    program_words,
    rope_heads_laned,
    rope_imm,
    rope_laned,
    vec_out_words,
)
from hw.numerics import (
    ACT_MAX,
    FOLD_AMAX_MANT_BITS,
    ROPE_FRAC,
    dequant_channels,
    fold_amax,
    fold_amax_fields,
    fold_amax_word,
    norm_eps,
    rope_pairs,
    rope_table,
    scores_channels_vector,
    scores_scale_word,
    vec_dequant,
    vec_fold,
    vec_rope,
)
from hw.spad import Scratchpad
from hw.vector.engine import VectorEngine, command_lanes
from sim.functional import MachineState, exec_vec
from sim.random_programs import (
    random_argmax_imm,
    random_channel_word,
    random_insert_imm,
    random_kv4_imm,
)

VCFG = AcceleratorConfig(rows=2, cols=4, vin_spad_bytes=512, vout_spad_bytes=256,
                         memory={"bytes_per_cycle": 16, "latency": 3, "size_bytes": 4096})
NOV = AcceleratorConfig(rows=2, cols=4, memory={"bytes_per_cycle": 16, "latency": 3,
                                                "size_bytes": 4096})
VIN = VCFG.vin_spad_bytes // 4
VOUT = VCFG.vout_spad_bytes // 4


async def _load_vin(ctx, dut, raw: bytes, beat: int) -> None:
    """Write ``raw`` into VIN through its DMA port, a beat per cycle."""
    for k in range(len(raw) // beat):
        ctx.set(dut.vin.dma_wr.addr, k)
        ctx.set(dut.vin.dma_wr.data, int.from_bytes(raw[k * beat:(k + 1) * beat], "little"))
        ctx.set(dut.vin.dma_wr.en, 1)
        await ctx.tick()
    ctx.set(dut.vin.dma_wr.en, 0)


async def _read_vout(ctx, dut, beat: int) -> bytes:
    """Every VOUT byte through its DMA read port, a beat per cycle."""
    vout = bytearray()
    for k in range(VCFG.vout_spad_bytes // beat):
        ctx.set(dut.vout.dma_rd.addr, k)
        ctx.set(dut.vout.dma_rd.en, 1)
        await ctx.tick()
        vout += ctx.get(dut.vout.dma_rd.data).to_bytes(beat, "little")
    return bytes(vout)


async def _issue(ctx, dut, v) -> None:
    """Offer VEC ``v`` to the engine (which must be ready) for one cycle: its grant cycle."""
    assert ctx.get(dut.vec.cmd.ready)
    fields = v._body_fields()
    for name, value in fields.items():
        ctx.set(getattr(dut.vec.cmd.payload, name), value)
    if hasattr(dut.vec, "cmd_lanes"):   # what the vector sequencer registers beside the body
        laned, writes_n = command_lanes(dut.vec._cfg, int(fields["func"]), fields["imm"])
        ctx.set(dut.vec.cmd_lanes, int(laned) | int(writes_n) << 1)
    ctx.set(dut.vec.cmd.valid, 1)
    await ctx.tick()
    ctx.set(dut.vec.cmd.valid, 0)


# ---------------------------------------------------------------------- configuration
def test_the_default_configuration_is_unchanged():
    """The default has no vector engine and no vector fields in its dict, so its fingerprint
    (which stamps every benchmark record) is the one it had before the engine existed."""
    d = AcceleratorConfig().to_dict()
    assert not {"vin_spad_bytes", "vout_spad_bytes"} & set(d)
    assert AcceleratorConfig().fingerprint == "06a9d8c4181c"
    assert not AcceleratorConfig().has_vector


def test_a_vector_configuration_round_trips_and_validates():
    assert AcceleratorConfig.from_json(VCFG.to_json()) == VCFG
    assert VCFG.to_dict()["vin_spad_bytes"] == 512 and VCFG.has_vector
    assert VCFG.fingerprint != NOV.fingerprint
    with pytest.raises(ConfigError, match="must both be 0"):
        AcceleratorConfig(vin_spad_bytes=256)
    with pytest.raises(ConfigError, match="vout_spad_bytes must be 0 .* multiple of 16"):
        AcceleratorConfig(vin_spad_bytes=256, vout_spad_bytes=100)


# ---------------------------------------------------------------------- ISA
def test_vec_round_trips_through_the_codec():
    rng = np.random.default_rng(0)
    for _ in range(200):
        v = Vec(func=VecFunc(int(rng.choice(VEC_FUNC_VALUES))),
                a_addr=int(rng.integers(1 << 16)), b_addr=int(rng.integers(1 << 16)),
                dst_addr=int(rng.integers(1 << 16)), length=int(rng.integers(1 << 16)),
                wait=int(rng.integers(31)), signal=None)
        assert decode(encode(v)) == v
        f = decode_fields(program_words([v]))
        assert {k: int(f[f"vec.{k}"][0]) for k in ("a_addr", "b_addr", "dst_addr", "length")} \
            == {"a_addr": v.a_addr, "b_addr": v.b_addr, "dst_addr": v.dst_addr,
                "length": v.length}


def test_an_undefined_sub_op_or_spad_is_an_illegal_word():
    off, width = field_location("vec.func")
    for func in (max(VEC_FUNC_VALUES) + 1,
                 *(v for v in range(max(VEC_FUNC_VALUES)) if v not in VEC_FUNC_VALUES)):
        word = encode(Vec(length=1)) | (func << off)
        with pytest.raises(ISAError, match=f"func {func}"):
            decode(word)
        f = decode_fields(program_words([word]))
        assert not legal_words(f, dispatch_limits(VCFG))[0], func
    off, width = field_location("dma.spad")
    # (6 is a move from OUT with a vector engine, hw.isa.OUT_MOVE_SPAD; 7 is undefined)
    bad_spad = encode(Load()) & ~(((1 << width) - 1) << off) | (7 << off)
    with pytest.raises(ISAError, match="spad 7"):
        decode(bad_spad)
    errs = dispatch_errors(decode_fields(program_words([word, bad_spad, encode(Vec())])), VCFG)
    assert errs.tolist() == [ErrorCode.ILLEGAL_OPCODE.value] * 2 + [ErrorCode.NONE.value]


def test_without_a_vector_engine_its_opcode_engine_and_scratchpads_are_refused():
    assert [e.engine for e in engines_of(NOV)] == [Engine.LOAD, Engine.COMPUTE, Engine.STORE]
    assert not ENGINE[Engine.VECTOR].present(NOV) and ENGINE[Engine.VECTOR].present(VCFG)
    cases = [(Vec(), ErrorCode.ILLEGAL_OPCODE), (Sync(engine=Engine.VECTOR),
             ErrorCode.ILLEGAL_OPCODE), (Load(spad=Spad.VIN), ErrorCode.BAD_ADDRESS),
             (Store(spad=Spad.VOUT), ErrorCode.BAD_ADDRESS)]
    f = decode_fields(program_words([ins for ins, _ in cases]))
    assert dispatch_errors(f, NOV).tolist() == [code.value for _, code in cases]
    for ins, code in cases:
        assert dispatch_error(ins, NOV) == code, ins
        assert dispatch_error(ins, VCFG) == ErrorCode.NONE, ins
        with pytest.raises(ISAError):
            check(ins, NOV)
    with pytest.raises(ISAError, match="no engine for VEC"):
        check(Vec(), NOV)


@pytest.mark.parametrize(("ins", "needle"), [
    (Vec(length=0), "length=0"),
    (Vec(a_addr=VIN - 1, length=2), "row .* exceeds VIN"),
    (Vec(b_addr=VIN, length=1), "operand .* exceeds VIN"),
    (Vec(func=VecFunc.ARGMAX, dst_addr=VOUT - 1, length=1), "results .* exceed VOUT"),
    (Vec(dst_addr=VOUT - 3, length=4), "results .* exceed VOUT"),
    (Vec(func=VecFunc.DEQUANT, imm=VIN, length=1), "amax word imm=.* outside VIN"),
    (Vec(func=VecFunc.DEQUANT, imm=dequant_imm(VIN, True), length=1), "amax word imm=.* outside"),
    (Vec(func=VecFunc.DEQUANT, imm=1 << 17, length=1), "amax word imm=.* outside VIN"),
    (Vec(func=VecFunc.FOLD, b_addr=VIN - 1, length=2), "operand .* exceeds VIN"),
    (Vec(func=VecFunc.FOLD, dst_addr=VOUT - 2, length=5), "results .* exceed VOUT"),
    (Vec(func=VecFunc.DEQUANT, b_addr=VIN - 1, length=2), "operand .* exceeds VIN"),
    (Load(spad=Spad.VOUT), "LOAD writes the .* only, got spad=VOUT"),
    # a move (a STORE naming VIN): VOUT beats from spad_addr into VIN rows from dram_addr
    (Store(spad=Spad.VIN, dram_addr=VCFG.spad_beats("vin")),
     "move's VIN range ends at beat 33, VIN has 32 beats"),
    (Store(spad=Spad.VIN, spad_addr=VCFG.spad_beats("vout") - 1, row_beats=2),
     r"spad range \[15, 17\) beats exceeds VOUT \(16 beats\)"),
])
def test_vec_and_dma_fields_out_of_range_are_bad_addresses(ins, needle):
    assert dispatch_error(ins, VCFG) == ErrorCode.BAD_ADDRESS
    with pytest.raises(ISAError, match=needle):
        check(ins, VCFG)


@pytest.mark.parametrize(("ins", "needle"), [
    (Vec(func=VecFunc.ROPE, length=6, imm=rope_imm(3, 2)), "head_dim=3: it must be even"),
    (Vec(func=VecFunc.ROPE, length=6, imm=rope_imm(0, 2)), "head_dim=0: it must be even"),
    (Vec(func=VecFunc.ROPE, length=6, imm=6), "0 heads x head_dim=6"),
    (Vec(func=VecFunc.ROPE, length=10, imm=rope_imm(4, 2)), "2 heads x head_dim=4 .* is not "
                                                             "its row of length=10"),
    (Vec(func=VecFunc.ROPE, length=2, imm=rope_imm(2, 1 << 15)), "32768 heads"),
    (Vec(func=VecFunc.ROPE, b_addr=VIN - 1, length=4, imm=rope_imm(4, 1)),
     rf"ROPE table \[{VIN - 1}, {VIN + 1}\) exceeds VIN"),
    (Vec(func=VecFunc.ROPE, a_addr=VIN - 3, length=4, imm=rope_imm(4, 1)), "row .* exceeds VIN"),
    (Vec(func=VecFunc.ROPE, dst_addr=VOUT - 3, length=4, imm=rope_imm(4, 1)),
     "results .* exceed VOUT"),
])
def test_a_rope_of_broken_heads_or_table_is_a_bad_address(ins, needle):
    """ROPE's own rules: head_dim even and >= 2, heads * head_dim = length, the table of
    head_dim / 2 words inside VIN (the row and the results as for every VEC)."""
    assert dispatch_error(ins, VCFG) == ErrorCode.BAD_ADDRESS
    assert dispatch_errors(decode_fields(program_words([ins])), VCFG).tolist() == \
        [ErrorCode.BAD_ADDRESS.value]
    with pytest.raises(ISAError, match=needle):
        check(ins, VCFG)


@pytest.mark.parametrize(("imm", "needle"), [
    (insert_imm(0, 8, 1, 0), "stride=0 .* must be 1 or >= 4"),
    (insert_imm(0, 8, 1, 2), "stride=2 .* must be 1 or >= 4"),
    (insert_imm(0, 8, 1, 3), "stride=3 .* must be 1 or >= 4"),
    (insert_imm(2, 8, 1, 1), "stride 1 writes whole words: .*base=2"),
    (insert_imm(0, 6, 1, 1), "stride 1 writes whole words: .*group=6"),
    (insert_imm(0, 8, 2, 1, 1), "stride 1 writes whole words: .*skip=1"),
])
def test_an_insert_the_engine_cannot_walk_is_a_bad_address(imm, needle):
    """INSERT's stride is 1 (whole code words: base, group and skip multiples of 4) or at
    least 4 (one code per word); anything else is refused, by the rule table for a word and
    for a program alike."""
    ins = Vec(func=VecFunc.INSERT, length=8, imm=imm)
    assert dispatch_error(ins, VCFG) == ErrorCode.BAD_ADDRESS
    assert dispatch_errors(decode_fields(program_words([ins])), VCFG).tolist() == \
        [ErrorCode.BAD_ADDRESS.value]
    with pytest.raises(ISAError, match=needle):
        check(ins, VCFG)


def test_insert_geometry_round_trips_and_its_fields_are_bounded():
    """insert_imm and insert_geometry are inverses on random fields in range (group and
    groups stored less one); a field past its width is refused by name; an INSERT's codes
    row is read from b_addr inside VIN and its results are its row."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        g = (int(rng.integers(0, 1024)), int(rng.integers(1, 513)), int(rng.integers(1, 33)),
             int(rng.integers(0, 256)), int(rng.integers(0, 256)))
        assert tuple(insert_geometry(insert_imm(*g))) == g
    assert insert_geometry(insert_imm(4, 32, 2, 1, 8)).span == 40
    assert insert_geometry(insert_imm(4, 32, 2, 1, 8)).codes == 64
    for args, name in [((1024, 1), "base=1024"), ((0, 513), "group=513"),
                       ((0, 0), "group=0"), ((0, 1, 33), "groups=33"),
                       ((0, 1, 1, 256), "stride=256"), ((0, 1, 1, 1, 256), "skip=256")]:
        with pytest.raises(ValueError, match=name):
            insert_imm(*args)
    ok = Vec(func=VecFunc.INSERT, length=4, b_addr=VIN - 4, imm=insert_imm(0, 4))
    assert dispatch_error(ok, VCFG) == ErrorCode.NONE
    assert vec_out_words(VecFunc.INSERT.value, 24) == 24
    with pytest.raises(ISAError, match="operand .* exceeds VIN"):
        check(Vec(func=VecFunc.INSERT, length=4, b_addr=VIN - 3, imm=insert_imm(0, 4)), VCFG)


def test_a_rope_reads_its_table_not_a_row_at_b():
    """The table is head_dim / 2 words whatever the row's length; a table at the end of VIN
    passes, and so does a ROPE over many heads (the table is the same for each)."""
    for ins in (Vec(func=VecFunc.ROPE, b_addr=VIN - 2, length=VOUT, imm=rope_imm(4, VOUT // 4)),
                Vec(func=VecFunc.ROPE, b_addr=VIN - 32, length=64, imm=rope_imm(64, 1)),
                Vec(func=VecFunc.ROPE, length=2, imm=rope_imm(2, 1))):
        assert dispatch_error(ins, VCFG) == ErrorCode.NONE, ins
        check(ins, VCFG)
    assert vec_out_words(VecFunc.ROPE.value, 24) == 24
    with pytest.raises(ValueError, match="head_dim=65536"):
        rope_imm(1 << 16, 1)


def test_a_dequant_names_its_amax_word_and_whether_it_is_folds():
    """DEQUANT's imm: the word's VIN address below bit 16 (dequant_imm), bit 16 FOLD's word;
    an address with the bit is as legal as without (the fetch unit and check agree)."""
    for addr, fold in [(0, False), (VIN - 1, True), (5, True)]:
        imm = dequant_imm(addr, fold)
        assert dequant_amax_addr(imm) == addr and dequant_fold(imm) == fold
        assert dispatch_error(Vec(func=VecFunc.DEQUANT, imm=imm), VCFG) == ErrorCode.NONE
    assert dequant_amax_addr((1 << 17) | 3) == (1 << 16) | 3     # past every VIN
    with pytest.raises(ValueError, match="amax word address 65536"):
        dequant_imm(1 << 16)


def test_argmax_over_pairs_of_an_odd_row_is_a_bad_address():
    """ARGMAX's PAIRS form (hw.isa.argmax_imm) needs whole pairs: an odd length is
    BAD_ADDRESS (the fetch unit's rule, hw.isa.argmax_bad), an even one and any base pass."""
    bad = Vec(func=VecFunc.ARGMAX, length=3, imm=argmax_imm(pairs=True))
    assert dispatch_error(bad, VCFG) == ErrorCode.BAD_ADDRESS
    for v in (dataclasses.replace(bad, length=4), dataclasses.replace(bad, imm=argmax_imm(9)),
              dataclasses.replace(bad, length=VIN, imm=argmax_imm((1 << 24) - 1, True))):
        assert dispatch_error(v, VCFG) == ErrorCode.NONE
    with pytest.raises(ValueError, match="ARGMAX index base"):
        argmax_imm(1 << 24)


@pytest.mark.parametrize("lanes", [1, 4])
def test_argmax_index_base_and_pairs(lanes):
    """ARGMAX's imm on the executor: the base added to the index word (wrapping to int32),
    and over (index, value) pairs the index word of the first pair of maximal value (ties
    across pairs to the first, tags at the int32 extremes), the ignored bits above; cycles
    and VOUT equal the timing contract's and the functional model's."""
    cfg = VCFG.replace(vector_lanes=lanes)
    vin = _random_vin(np.random.default_rng(7))
    vin[0:8] = [5, 7, 3, 9, -1, 9, 2, 9]     # pairs (5, 7) (3, 9) (-1, 9) (2, 9): tag 3
    vin[8:12] = [2**31 - 1, 4, -2**31, 4]    # a tie: the first tag, plus 5 wraps
    arg = VecFunc.ARGMAX
    vecs = [Vec(func=arg, a_addr=0, length=8, imm=argmax_imm(pairs=True), dst_addr=0),
            Vec(func=arg, a_addr=8, length=4, imm=argmax_imm(5, True), dst_addr=2),
            Vec(func=arg, a_addr=1, length=7, imm=argmax_imm((1 << 24) - 1), dst_addr=4),
            Vec(func=arg, a_addr=0, length=VIN, imm=argmax_imm(123, True), dst_addr=6),
            Vec(func=arg, a_addr=3, length=2, imm=argmax_imm(pairs=True) | 1 << 30,
                dst_addr=8)]
    st = _check_against_the_models(vin, vecs, [0, 1, 0, 5, 0], cfg)
    words = st.spads[Spad.VOUT][:40].view("<i4").tolist()
    assert words[:6] == [3, 9, -2**31 + 4, 4, (1 << 24) - 1 + 2, 9]
    assert words[8:10] == [int(vin[3]), int(vin[4])]


def test_argmax_ignores_b_and_its_result_is_two_words():
    """ARGMAX reads no second row (any b_addr passes) and writes an index and a maximum."""
    assert dispatch_error(Vec(func=VecFunc.ARGMAX, b_addr=VIN + 5, length=VIN), VCFG) \
        == ErrorCode.NONE
    assert vec_out_words(VecFunc.ARGMAX.value, 100) == 2
    assert vec_out_words(VecFunc.ADD.value, 100) == 100
    assert [vec_out_words(VecFunc.REQUANT.value, n) for n in (1, 4, 5, 8)] == [2, 2, 3, 3]
    assert Opcode.VEC.value == 6 and Engine.VECTOR.value == 3


# ---------------------------------------------------------------------- executor
class _Bench(Elaboratable):
    """The executor with its VIN (two core read ports) and VOUT scratchpads; ``rst`` resets
    the executor alone (as ``start`` does in hw/top.py)."""

    def __init__(self, cfg):
        self.vec = VectorEngine(cfg)
        self.rst = Signal()
        self.vin = Scratchpad(size_bytes=cfg.vin_spad_bytes, word_bytes=4,
                              beat_bytes=cfg.beat_bytes, core="read", core_reads=2,
                              core_lanes=cfg.vector_lanes)
        self.vout = Scratchpad(size_bytes=cfg.vout_spad_bytes, word_bytes=4,
                               beat_bytes=cfg.beat_bytes, core="write",
                               core_lanes=cfg.vector_lanes)

    def elaborate(self, platform):
        m = Module()
        m.submodules += [ResetInserter(self.rst)(self.vec), self.vin, self.vout]
        connect(m, self.vec.vin_a, self.vin.core_rd)
        connect(m, self.vec.vin_b, self.vin.core_rd1)
        connect(m, self.vec.vout_wr, self.vout.core_wr)
        return m


def _random_vin(rng: np.random.Generator) -> np.ndarray:
    """VIN as int32: random words, with extremes and repeated values (saturation, ties)."""
    x = rng.integers(-2**31, 2**31, size=VIN, dtype=np.int64)
    special = np.array([-2**31, -2**31 + 1, 2**31 - 1, 0, 1, -1])
    pick = rng.random(VIN) < 0.15
    x[pick] = rng.choice(special, size=int(pick.sum()))
    dup = rng.random(VIN) < 0.1
    x[dup] = x[rng.integers(0, VIN, size=int(dup.sum()))]
    return x.astype(np.int32)


def _random_rope(rng) -> Vec:
    """A ROPE of random heads (head_dim 2 to 32, even) inside VIN and VOUT."""
    head_dim = 2 * int(rng.choice([1, 2, 3, int(rng.integers(1, 17))]))
    heads = int(rng.integers(1, VOUT // head_dim + 1))
    length = heads * head_dim
    return Vec(func=VecFunc.ROPE, length=length, imm=rope_imm(head_dim, heads),
               a_addr=int(rng.integers(0, VIN - length + 1)),
               b_addr=int(rng.integers(0, VIN - head_dim // 2 + 1)),
               dst_addr=int(rng.integers(0, VOUT - length + 1)))


def _random_vecs(rng, n):
    out = []
    for _ in range(n):
        func = VecFunc(int(rng.choice([f.value for f in RTL_VEC_FUNCS])))
        if func == VecFunc.ROPE:
            out.append(_random_rope(rng))
            continue
        length = int(rng.choice([1, 2, 3, int(rng.integers(1, VOUT + 1))]))
        words = int(vec_out_words(func.value, length))
        imm = 0
        if func == VecFunc.SOFTMAX:   # valid positions: none, some, all
            imm = int(rng.choice([0, length, int(rng.integers(0, length + 1))]))
        elif func == VecFunc.RMSNORM:  # epsilon: none, a model's, a large one
            imm = int(rng.choice([0, norm_eps(1e-5, length), int(rng.integers(0, 1 << 40))]))
        elif func == VecFunc.DEQUANT:  # the amax word's address, REQUANT's or FOLD's word
            imm = dequant_imm(int(rng.integers(0, VIN)), bool(rng.random() < 0.5))
        elif func in (VecFunc.INSERT, VecFunc.INSERT4):
            imm = random_insert_imm(rng, length, func == VecFunc.INSERT4)
        elif func == VecFunc.CHANNEL:  # a channel word, normalised or any
            imm = random_channel_word(rng)
        elif func == VecFunc.KV4:      # a value row, or a key row's group dividing it
            imm = random_kv4_imm(rng, length)
        elif func == VecFunc.ARGMAX:   # an index base, over pairs where the row is even
            imm = random_argmax_imm(rng, length)
        out.append(Vec(func=func, length=length, imm=imm,
                       a_addr=int(rng.integers(0, VIN - length + 1)),
                       b_addr=int(rng.integers(0, VIN - length + 1)),
                       dst_addr=int(rng.integers(0, VOUT - words + 1))))
    return out


def _simulate(vin: np.ndarray, vecs: list[Vec], gaps: list[int], cfg=VCFG):
    """Run ``vecs`` one after the other (``gaps[k]`` idle cycles before each command) on
    ``cfg``'s engine; return each one's cycles from its command to ``done`` and the final VOUT
    bytes."""
    dut = _Bench(cfg)
    beat = cfg.beat_bytes
    raw = vin.astype("<i4").view(np.uint8)
    durations: list[int] = []
    vout = bytearray(VCFG.vout_spad_bytes)

    async def bench(ctx):
        await _load_vin(ctx, dut, raw, beat)
        for v, gap in zip(vecs, gaps, strict=True):
            for _ in range(gap):
                assert not ctx.get(dut.vec.done), f"done while idle, before {v}"
                await ctx.tick()
            await _issue(ctx, dut, v)              # the grant cycle g
            cycles = 1
            while not ctx.get(dut.vec.done):
                assert cycles < 10 * v.length + 50, f"{v} never ends"
                await ctx.tick()
                cycles += 1
            assert ctx.get(dut.vec.elements) == v.length
            durations.append(cycles)
            await ctx.tick()                       # e + 1: ready for the next command
        vout[:] = await _read_vout(ctx, dut, beat)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return durations, np.frombuffer(bytes(vout), dtype=np.uint8)


def _check_against_the_models(vin: np.ndarray, vecs: list[Vec], gaps: list[int],
                              cfg=VCFG) -> MachineState:
    """Run ``vecs`` through ``cfg``'s executor and through the functional model from VIN
    ``vin``: each instruction's cycles equal the timing contract's (on ``cfg``'s lanes), VOUT
    equals the functional model's byte for byte; returns the functional model's state."""
    durations, vout = _simulate(vin, vecs, gaps, cfg)
    st = MachineState(VCFG)
    st.spads[Spad.VIN][:] = vin.astype("<i4").view(np.uint8)
    for v in vecs:
        exec_vec(st, v)
    assert durations == [exec_cycles(v, cfg) for v in vecs]
    assert np.array_equal(vout, st.spads[Spad.VOUT])
    return st


@pytest.mark.parametrize("seed", range(3))
def test_the_executor_matches_numerics_and_the_timing_contract(seed):
    """Random VECs back to back and after gaps: each ends in exactly ``vec_cycles`` and the
    final VOUT is the functional model's (hw.numerics) byte for byte."""
    rng = np.random.default_rng(seed)
    vin = _random_vin(rng)
    vecs = _random_vecs(rng, 12)
    vecs += [Vec(func=VecFunc.ARGMAX, a_addr=0, length=VIN, dst_addr=0)]  # the longest row
    gaps = [int(rng.choice([0, 0, 1, 5])) for _ in vecs]
    _check_against_the_models(vin, vecs, gaps)


def _aligned(v: Vec, cfg: AcceleratorConfig) -> Vec:
    """``v`` with its rows moved down to multiples of ``cfg``'s lanes where it is a laned
    sub-op (the dispatch rule, :func:`hw.isa.vec_unaligned`)."""
    mask = ~(cfg.vector_lanes - 1)
    if v.func in (VecFunc.INSERT, VecFunc.INSERT4, VecFunc.KV4):   # (INSERT's code words
        # anywhere; KV4 reads no b)
        return dataclasses.replace(v, a_addr=v.a_addr & mask, dst_addr=v.dst_addr & mask)
    if v.func not in (*laned_vec_funcs(cfg), VecFunc.ROPE):   # ROPE: its table too
        return v
    return dataclasses.replace(v, a_addr=v.a_addr & mask, b_addr=v.b_addr & mask,
                               dst_addr=v.dst_addr & mask)


@pytest.mark.parametrize(("lanes", "seed"), [(2, 0), (2, 1), (4, 0), (4, 1)])
def test_a_laned_executor_matches_numerics_and_the_timing_contract(lanes, seed):
    """An engine of 2 and 4 lanes: random VECs of every sub-op (the laned ones' rows aligned,
    lengths any: a last group of 1 to ``lanes`` elements), back to back and after gaps, end
    in exactly ``vec_cycles`` of that configuration and leave the functional model's VOUT
    byte for byte (the lanes change when, never what); the rows where the laned sub-ops'
    scalars and packed codes are special lead. Seed 1 lanes SILU_GATE and the ROPEs over
    heads the lanes hold too (``vector_laned_silu``, ``vector_laned_rope_heads``)."""
    cfg = VCFG.replace(vector_lanes=lanes, vector_laned_silu=seed == 1,
                       vector_laned_rope_heads=seed == 1)
    rng = np.random.default_rng(100 * lanes + seed)
    vin = _random_vin(rng)
    vin[:8] = 0
    vin[8:16] = -2**31
    edges = [Vec(func=f, a_addr=a, b_addr=16, length=length, dst_addr=4 * k, imm=imm)
             for k, (f, a, length, imm) in enumerate(
                 [(VecFunc.REQUANT, 0, 5, 0), (VecFunc.REQUANT, 8, 7, 0),
                  (VecFunc.RMSNORM, 0, 8, 0), (VecFunc.RMSNORM, 8, 3, 999),
                  (VecFunc.FOLD, 8, 5, 0), (VecFunc.FOLD, 0, 1, 0),
                  (VecFunc.ADD, 8, 3, 0), (VecFunc.MUL, 8, 1, 0),
                  (VecFunc.DEQUANT, 16, 3, dequant_imm(3, False)),
                  (VecFunc.SOFTMAX, 8, 7, 7), (VecFunc.SOFTMAX, 0, 5, 2),
                  (VecFunc.SOFTMAX, 8, 3, 0), (VecFunc.SILU_GATE, 8, 5, 0),
                  (VecFunc.SILU_GATE, 0, 2, 0)])]
    vecs = edges + [_aligned(v, cfg) for v in _random_vecs(rng, 16)]
    vecs += [_aligned(_random_rope(rng), cfg),   # laned (a half head of lanes) or not
             Vec(func=VecFunc.ROPE, length=8 * lanes, imm=rope_imm(2 * lanes, 4), a_addr=0,
                 b_addr=VIN - lanes, dst_addr=0)]
    laned = [v for v in vecs if v.func in laned_vec_funcs(cfg)]
    assert len(laned) >= len(edges) and any(v.length % lanes for v in laned)
    gaps = [int(rng.choice([0, 0, 1, 5])) for _ in vecs]
    _check_against_the_models(vin, vecs, gaps, cfg)


def _wide_cfg(lanes: int) -> AcceleratorConfig:
    """:data:`VCFG` on ``lanes`` (past a 16-byte beat's 4: a beat of their elements)."""
    return VCFG.replace(vector_lanes=lanes) if lanes <= VCFG.vector_lanes_max else VCFG.replace(
        memory=dataclasses.replace(VCFG.memory, bytes_per_cycle=4 * lanes), vector_lanes=lanes)


@pytest.mark.parametrize("lanes", [2, 4, 8])
def test_a_laned_insert_and_the_one_lane_sub_ops_on_lanes(lanes):
    """INSERT and INSERT4 whose codes lie a group of lanes apart (:func:`hw.isa.insert_laned`:
    a key cache's append) stream ``lanes`` words a cycle, their code words read anywhere; those
    whose codes lie closer, and the sub-ops that stream one element a cycle (written one word
    a cycle wherever ``dst_addr`` lies, also past 4 lanes, where REQUANT's codes fill words
    ``lanes / 4`` a cycle), stream one: on rows of 1 to ``2 * lanes + 1`` words (every last
    group) and a long one, cycles and VOUT exact."""
    cfg = _wide_cfg(lanes)
    rng = np.random.default_rng(50 + lanes)
    vin = _random_vin(rng)
    vecs, laned = [], 0
    for func, per in ((VecFunc.INSERT, 4), (VecFunc.INSERT4, 8)):
        for length in [*range(1, 2 * lanes + 2), 48]:
            apart = per * lanes * int(rng.choice([1, 2]))   # a group of lanes or two
            for geometry in (
                    (int(rng.integers(0, per * length + 1)), int(rng.integers(2, 6)),
                     int(rng.integers(1, 4)), apart, int(rng.integers(0, 20))),
                    (int(rng.integers(0, per * lanes)), 1, int(rng.integers(2, 9)), per,
                     apart - per),                           # groups of one: stride + skip
                    (int(rng.integers(0, min(1023, per * length) + 1)), 1, 1, per, 0),
                    (int(rng.integers(0, per * length + 1)), 3, 2, per * lanes - 1, 0)):
                imm = insert_imm(*geometry)
                laned += bool(insert_laned(func.value, imm, lanes))
                vecs.append(Vec(func=func, length=length, imm=imm, a_addr=lanes * 3,
                                b_addr=int(rng.integers(0, VIN - length + 1)),
                                dst_addr=lanes * int(rng.integers(0, 16 // lanes))))
    assert laned == 3 * 2 * (2 * lanes + 2)   # the last geometry of each row: one lane
    for func, imm in ((VecFunc.ARGMAX, 0), (VecFunc.SILU_GATE, 0),
                      (VecFunc.CHANNEL, random_channel_word(rng))):
        for length in (1, lanes + 1, 24):
            out = int(vec_out_words(func.value, length, imm or 0))
            vecs.append(Vec(func=func, length=length, imm=imm,
                            a_addr=int(rng.integers(0, VIN - length + 1)),
                            b_addr=int(rng.integers(0, VIN - length + 1)),
                            dst_addr=int(rng.integers(0, VOUT - out + 1))))
    _check_against_the_models(vin, vecs, [0] * len(vecs), cfg)


@pytest.mark.parametrize("lanes", [2, 4, 8])
def test_every_laned_sub_op_on_lanes(lanes):
    """Each laned sub-op alone (SILU_GATE's lanes too: ``vector_laned_silu``), on rows of 1
    to ``2 * lanes + 1`` elements (every last group) and a long one: cycles and VOUT exact on
    an engine of ``lanes`` (8: a 32-byte beat, two words of REQUANT's and FOLD's codes a
    cycle)."""
    cfg = _wide_cfg(lanes).replace(vector_laned_silu=True)
    rng = np.random.default_rng(lanes)
    vin = _random_vin(rng)
    vecs = []
    assert VecFunc.SILU_GATE in laned_vec_funcs(cfg)
    for half in (lanes, 2 * lanes, 3 * lanes):   # ROPE: laned, a half head of lanes or more
        for heads in (1, 2, 3):
            if lanes * (heads - 1) + heads * 2 * half <= VOUT:
                vecs.append(Vec(func=VecFunc.ROPE, length=heads * 2 * half,
                                imm=rope_imm(2 * half, heads), a_addr=lanes * heads,
                                b_addr=VIN - 4 * half, dst_addr=lanes * (heads - 1)))
    assert all(rope_laned(v.func.value, v.imm, lanes) for v in vecs)
    for func in laned_vec_funcs(cfg):
        for length in [*range(1, 2 * lanes + 2), 48]:
            imm = {VecFunc.RMSNORM: norm_eps(1e-5, length),
                   VecFunc.DEQUANT: dequant_imm(int(rng.integers(0, VIN)),
                                                bool(rng.random() < 0.5)),
                   # every position valid (the last group's lanes past the row's end
                   # masked), or a prefix
                   VecFunc.SOFTMAX: int(rng.choice([length, rng.integers(0, length + 1)])),
                   }.get(func, 0)
            vecs.append(Vec(func=func, length=length, imm=imm, a_addr=lanes * 3,
                            b_addr=VIN - 48, dst_addr=lanes * int(rng.integers(0, 16 // lanes))))
    _check_against_the_models(vin, vecs, [0] * len(vecs), cfg)


@pytest.mark.parametrize("lanes", [2, 4, 8])
def test_a_rope_over_heads_the_lanes_hold_on_lanes(lanes):
    """With ``vector_laned_rope_heads``, ROPEs whose heads (``head_dim`` 2 to ``lanes``) the
    lanes hold whole stream ``lanes`` elements a cycle (:func:`hw.isa.rope_heads_laned`),
    on 1 to 5 heads (a last group of whole heads and lanes past the row's end) and random
    rows and table words, beside ROPEs over pairs (a half head of ``lanes``) and the other
    uses of the lanes' shared ``Mul`` (MUL, RMSNORM, FOLD) back to back and after gaps:
    cycles and VOUT exact on an engine of ``lanes``."""
    cfg = _wide_cfg(lanes).replace(vector_laned_rope_heads=True)
    rng = np.random.default_rng(70 + lanes)
    vin = _random_vin(rng)
    vecs, over_heads = [], []
    for half in [1 << j for j in range(lanes.bit_length() - 1)] + [lanes]:
        for heads in [h for h in (1, 2, 3, 5) if 2 * half * h <= VOUT]:
            length = 2 * half * heads
            v = Vec(func=VecFunc.ROPE, length=length, imm=rope_imm(2 * half, heads),
                    a_addr=lanes * int(rng.integers(0, (VIN - length) // lanes + 1)),
                    b_addr=lanes * int(rng.integers(0, (VIN - half) // lanes + 1)),
                    dst_addr=lanes * int(rng.integers(0, (VOUT - length) // lanes + 1)))
            assert rope_laned(v.func.value, v.imm, lanes, True)
            over_heads.append((bool(rope_heads_laned(v.func.value, v.imm, lanes)), half < lanes))
            vecs.append(v)
            func = (VecFunc.MUL, VecFunc.RMSNORM, VecFunc.FOLD)[len(vecs) % 3]
            vecs.append(Vec(func=func, length=int(rng.integers(1, 2 * lanes + 2)),
                            a_addr=lanes * 3, b_addr=VIN - 48, dst_addr=0))
    assert all(got == want for got, want in over_heads) and any(w for _, w in over_heads)
    gaps = [int(rng.choice([0, 0, 1, 5])) for _ in vecs]
    _check_against_the_models(vin, vecs, gaps, cfg)


@pytest.mark.parametrize("lanes", [2, pytest.param(16, marks=pytest.mark.slow)])
def test_kv4_on_lanes(lanes):
    """KV4 on an engine of ``lanes`` (16, slow: two words of nibbles a cycle, as DDR4-class's
    32 lanes write four): value rows of 1 to ``lanes + 1`` elements and a long one, key rows
    of groups of the lanes or more (:func:`hw.isa.kv4_laned`: a cycle's elements in one
    group) and of fewer (one element a cycle); rows of zeros and rows holding ``-2**31``
    (the row's shift ``s`` 1, the groups' maxima of ``|x >> 1|``), aligned: cycles and VOUT
    exact."""
    cfg = _wide_cfg(lanes)
    rng = np.random.default_rng(70 + lanes)
    vin = _random_vin(rng)
    vin[:2 * lanes] = 0
    vin[2 * lanes:4 * lanes:3] = -2**31
    shapes = [*((length, None) for length in (1, 2, lanes - 1, lanes + 1, 40)),
              (2 * lanes, lanes), (4 * lanes, 2 * lanes), (2 * lanes, lanes // 2), (48, 16),
              (32, 32), (24, 8)]
    vecs = []
    for length, group in shapes:
        imm = kv4_imm(group)
        words = int(vec_out_words(VecFunc.KV4.value, length, imm))
        for a in (2 * lanes * int(rng.integers(0, 2)),   # zeros, or -2**31 in the row
                  lanes * int(rng.integers(0, (VIN - length) // lanes + 1))):
            if a + length <= VIN:
                vecs.append(Vec(func=VecFunc.KV4, length=length, imm=imm, a_addr=a,
                                dst_addr=lanes * int(rng.integers(0, (VOUT - words) // lanes + 1))))
    assert all(dispatch_error(v, cfg) == ErrorCode.NONE for v in vecs)
    laned = [bool(kv4_laned(v.func.value, v.imm, lanes)) for v in vecs]
    assert any(laned) and not all(laned)
    _check_against_the_models(vin, vecs, [int(rng.choice([0, 0, 2])) for _ in vecs], cfg)


@pytest.mark.parametrize("lanes", [2, 4])
def test_the_silu_gates_muls_on_other_lanes_back_to_back(lanes):
    """Without ``vector_laned_silu`` the SiLU-gate's two ``Mul(30)`` are lanes 1 and 2's
    shared ``Mul`` (hw.vector.engine._SILU_ON_LANES): SILU_GATE back to back, no gap, with
    each other use of those units (MUL's, RMSNORM's, FOLD's and ROPE's lanes) before and
    after it, on rows of one to two groups and more: cycles and VOUT exact."""
    cfg = VCFG.replace(vector_lanes=lanes)
    assert VecFunc.SILU_GATE not in laned_vec_funcs(cfg)
    rng = np.random.default_rng(70 + lanes)
    vin = _random_vin(rng)
    others = [Vec(func=VecFunc.MUL, a_addr=0, b_addr=2 * lanes, length=3 * lanes + 1,
                  dst_addr=0),
              Vec(func=VecFunc.RMSNORM, a_addr=lanes, b_addr=0, length=2 * lanes,
                  dst_addr=lanes, imm=norm_eps(1e-5, 2 * lanes)),
              Vec(func=VecFunc.FOLD, a_addr=0, b_addr=lanes, length=lanes + 1, dst_addr=0),
              Vec(func=VecFunc.ROPE, length=8 * lanes, imm=rope_imm(2 * lanes, 4), a_addr=0,
                  b_addr=VIN - lanes, dst_addr=0)]
    vecs = []
    for other in others:
        length = int(rng.integers(1, 3 * lanes))
        vecs += [Vec(func=VecFunc.SILU_GATE, a_addr=int(rng.integers(0, VIN - length)),
                     b_addr=int(rng.integers(0, VIN - length)), length=length,
                     dst_addr=int(rng.integers(0, VOUT - length))), other]
    vecs.append(dataclasses.replace(vecs[0], dst_addr=VOUT - vecs[0].length))
    _check_against_the_models(vin, vecs, [0] * len(vecs), cfg)


def _sharing_back_to_back(lanes: int, seed: int, firsts, seconds) -> None:
    """Each sub-op of ``seconds`` right after and right before one of ``firsts`` (in turn),
    no gap, on rows of one element (a row's scalars and results soonest) and of two groups
    and one more element: cycles and VOUT exact on an engine of ``lanes``. Each is ``(func,
    imm of the row's length)``."""
    cfg = VCFG.replace(vector_lanes=lanes)
    rng = np.random.default_rng(seed)
    vin = _random_vin(rng)

    def vec(func_imm, length):
        func, imm = func_imm
        words = int(vec_out_words(func.value, length, imm(length)))
        return _aligned(Vec(func=func, length=length, imm=imm(length),
                            a_addr=int(rng.integers(0, VIN - length + 1)),
                            b_addr=int(rng.integers(0, VIN - length + 1)),
                            dst_addr=int(rng.integers(0, VOUT - words + 1))), cfg)
    vecs = []
    for k, second in enumerate(seconds):
        for length in (1, 2 * lanes + 1):
            vecs += [vec(firsts[k % len(firsts)], length), vec(second, length)]
    vecs.append(vec(firsts[0], 1))
    assert all(dispatch_error(v, cfg) == ErrorCode.NONE for v in vecs)
    _check_against_the_models(vin, vecs, [0] * len(vecs), cfg)


#: Sub-ops and their imm of a row's length: RMSNORM's (a model's epsilon), KV4's key row's
#: (the largest group dividing it) and SOFTMAX's (every position valid), the others' 0.
_RMSNORM = (VecFunc.RMSNORM, lambda n: norm_eps(1e-5, n))
_KV4_KEY = (VecFunc.KV4, lambda n: kv4_imm(n & -n))
_SOFTMAX = (VecFunc.SOFTMAX, lambda n: n)


def _no_imm(func: VecFunc) -> tuple:
    return (func, lambda n: 0)


@pytest.mark.parametrize("lanes", [1, 4])
def test_rmsnorm_and_the_reciprocals_back_to_back(lanes):
    """Lane 0's Recip is RMSNORM's Rsqrt too, on its port (hw.vector.engine._PORTS): RMSNORM
    right before and right after each sub-op that takes a reciprocal (REQUANT, SOFTMAX,
    FOLD, SILU_GATE, KV4's value and key rows)."""
    _sharing_back_to_back(lanes, 90 + lanes, [_RMSNORM], [
        _no_imm(VecFunc.REQUANT), _SOFTMAX, _no_imm(VecFunc.FOLD), _no_imm(VecFunc.SILU_GATE),
        _no_imm(VecFunc.KV4), _KV4_KEY])


@pytest.mark.parametrize("lanes", [1, 4])
def test_the_scales_and_the_requants_back_to_back(lanes):
    """Each lane's Scale is its Requant too, on its port, a stage behind a Scale element on
    its multipliers (hw.vector.engine._PORTS): each sub-op that takes the codes' Requant
    (REQUANT, FOLD, KV4's value and key rows) right after and right before one that takes
    Scale (SOFTMAX, RMSNORM, DEQUANT of a REQUANT's or a FOLD's amax word)."""
    _sharing_back_to_back(lanes, 95 + lanes, [
        _SOFTMAX, _RMSNORM, (VecFunc.DEQUANT, lambda n: dequant_imm(VIN - 1)),
        (VecFunc.DEQUANT, lambda n: dequant_imm(VIN - 2, True))],
        [_no_imm(VecFunc.REQUANT), _no_imm(VecFunc.FOLD), _no_imm(VecFunc.KV4), _KV4_KEY])


def test_requant_softmax_and_rmsnorm_edges_in_the_executor():
    """The rows the scalar steps treat specially: all zeros (REQUANT: amax 0; RMSNORM with
    eps 0: a sum of squares of 0), one holding -2**31 (REQUANT: amax 2**31, s = 1; RMSNORM:
    s = 15), constant rows, SOFTMAX with no valid position and with one, and lengths 1..5
    (REQUANT: partial last words)."""
    vin = np.zeros(VIN, dtype=np.int32)
    vin[8:16] = [5, -2**31, 7, 2**31 - 1, -3, 0, 1, -1]
    vin[16:24] = 2**31 - 1
    vin[24:32] = -77
    vin[32:40] = np.arange(8) * 65536
    vecs = [Vec(func=VecFunc.REQUANT, a_addr=0, length=8, dst_addr=0),
            Vec(func=VecFunc.REQUANT, a_addr=8, length=8, dst_addr=3),
            Vec(func=VecFunc.REQUANT, a_addr=16, length=8, dst_addr=6)]
    vecs += [Vec(func=VecFunc.REQUANT, a_addr=24 + k, length=n, dst_addr=9 + 3 * k)
             for k, n in enumerate(range(1, 6))]
    vecs += [Vec(func=VecFunc.REQUANT, a_addr=32, length=8, dst_addr=29)]
    vecs += [Vec(func=VecFunc.RMSNORM, a_addr=0, b_addr=32, length=8, dst_addr=32),
             Vec(func=VecFunc.RMSNORM, a_addr=8, b_addr=16, length=8, dst_addr=40, imm=999),
             Vec(func=VecFunc.SOFTMAX, a_addr=8, length=4, dst_addr=48, imm=0),
             Vec(func=VecFunc.SOFTMAX, a_addr=8, length=4, dst_addr=52, imm=2),
             Vec(func=VecFunc.SOFTMAX, a_addr=16, length=8, dst_addr=56, imm=8)]
    st = _check_against_the_models(vin, vecs, [0] * len(vecs))
    words = st.spads[Spad.VOUT].view("<u4")
    assert words[2] == 0 and words[5] == 2**31 and words[8] == 2**31 - 1   # amax words


@pytest.mark.parametrize("seed", range(2))
def test_rope_over_heads_matches_the_models(seed):
    """ROPE on random rows and random table words (any bit patterns: the halves
    sign-extended), several heads each, back to back with each other and with other sub-ops
    (its write addresses jump within a head: the next VEC must still start clean)."""
    rng = np.random.default_rng(100 + seed)
    vin = _random_vin(rng)
    vecs = []
    for _ in range(8):
        vecs.append(_random_rope(rng))
        if rng.random() < 0.4:
            vecs += _random_vecs(rng, 1)
    vecs.append(Vec(func=VecFunc.ROPE, length=VOUT, imm=rope_imm(VOUT, 1),
                    b_addr=VIN - VOUT // 2))   # the widest head, the table at VIN's end
    gaps = [int(rng.choice([0, 0, 1, 3])) for _ in vecs]
    _check_against_the_models(vin, vecs, gaps)


def test_rope_with_llama_tables_and_edge_values():
    """ROPE with a LLaMA table (``rope_pairs`` of ``rope_table``): heads of zeros, of
    +-ACT_MAX, of -2**31 (its negation needs 33 bits), of small values, and at angle 0
    (cos = 1) where x + x saturates with sin = 1; VOUT equals ``vec_rope`` on the full tables,
    as the model-level twin computes it."""
    d = 8
    theta = 10000.0 ** (-np.arange(0, d, 2) / d)
    one = 1 << ROPE_FRAC
    vin = np.zeros(VIN, dtype=np.int32)
    ang = np.concatenate([7 * theta] * 2)
    cos, sin = rope_table(np.cos(ang)), rope_table(np.sin(ang))
    vin[VIN - d // 2:] = rope_pairs(cos, sin)                       # the table
    vin[VIN - d:VIN - d // 2] = rope_pairs(np.full(d, one), np.full(d, one))   # cos = sin = 1
    x = np.zeros((6, d), dtype=np.int64)
    x[1] = ACT_MAX
    x[2] = -ACT_MAX
    x[3, ::2], x[3, 1::2] = -2**31, ACT_MAX
    x[4] = np.arange(d) * 3 - 11
    x[5] = [ACT_MAX, -ACT_MAX] * (d // 2)
    vin[:x.size] = x.ravel()
    heads = x.shape[0]
    vecs = [Vec(func=VecFunc.ROPE, a_addr=0, b_addr=VIN - d // 2, length=heads * d,
                imm=rope_imm(d, heads), dst_addr=0),
            Vec(func=VecFunc.ROPE, a_addr=d, b_addr=VIN - d, length=2 * d,
                imm=rope_imm(d, 2), dst_addr=heads * d)]
    st = _check_against_the_models(vin, vecs, [0, 0])
    got = st.spads[Spad.VOUT].view("<i4").astype(np.int64)
    assert np.array_equal(got[:heads * d], vec_rope(x, cos, sin).ravel())
    sat = got[heads * d:(heads + 2) * d].reshape(2, d)
    assert np.array_equal(sat, vec_rope(x[1:3], np.full(d, one), np.full(d, one)))
    assert (np.abs(sat) == ACT_MAX).any()                           # saturated


def test_dequant_in_the_executor():
    """DEQUANT with real channel words (dequant_channels) and the amax regimes: 0 (the
    all-zero row's 127 * 2**16), 1, an activation's, 2**31 and the word's end, the amax word
    inside the row it scales and beside it, lengths 1..3 and a long row; random words too
    (unnormalised mantissas, bits above 23 set)."""
    rng = np.random.default_rng(11)
    vin = _random_vin(rng)
    vin[126:128] = fold_amax_word(np.array([(1 << 53) - 1, 3 << 40]))   # FOLD words
    n = 40
    scale = np.exp2(rng.uniform(-30, 5, n)).astype(np.float32)
    vin[64:64 + n] = dequant_channels(scale)
    vin[120:125] = np.array([0, 1, 3 << 20, 2**31, 2**32 - 1], np.uint32).view(np.int32)
    vecs = [Vec(func=VecFunc.DEQUANT, a_addr=0, b_addr=64, length=n, dst_addr=0, imm=120 + k)
            for k in range(5)]
    vecs += [Vec(func=VecFunc.DEQUANT, a_addr=8, b_addr=64, length=k, dst_addr=n + 3 * k,
                 imm=122) for k in (1, 2, 3)]
    vecs += [Vec(func=VecFunc.DEQUANT, a_addr=0, b_addr=64, length=n, dst_addr=0,
                 imm=dequant_imm(a, True)) for a in (120, 126, 127)]
    vecs += [Vec(func=VecFunc.DEQUANT, a_addr=120, b_addr=64, length=4, dst_addr=50, imm=121),
             Vec(func=VecFunc.DEQUANT, a_addr=0, b_addr=1, length=VOUT, dst_addr=0,
                 imm=VIN - 1)]
    st = MachineState(VCFG)
    st.spads[Spad.VIN][:] = vin.astype("<i4").view(np.uint8)
    exec_vec(st, vecs[2])
    got = st.spads[Spad.VOUT].view("<i4")[:n]
    assert np.array_equal(got, vec_dequant(vin[:n], dequant_channels(scale), 3 << 20))
    exec_vec(st, vecs[-3])   # a FOLD word: its mantissa and its shift
    m, x = fold_amax_fields(fold_amax_word(3 << 40))
    assert np.array_equal(got, vec_dequant(vin[:n], dequant_channels(scale), m, x))
    assert x == 42 - FOLD_AMAX_MANT_BITS and m == 3 << 25
    _check_against_the_models(vin, vecs, [0, 1, 0, 0, 5, 0, 0, 1, 1, 0, 2, 0, 0])


def test_fold_in_the_executor():
    """FOLD on attention-like rows (probabilities in [0, 2**16], value codes below 2**31: the
    products' amax below and above 2**27 and 2**31, so the amax word's shift and Requant's
    ``s`` take several values), on an all-zero row, on rows whose products saturate at 54
    bits, and on random words; lengths 1..5 (partial code words) and a long row. VOUT equals
    the functional model's (vec_fold, fold_amax_word) and each FOLD ends in vec_cycles."""
    rng = np.random.default_rng(21)
    vin = _random_vin(rng)
    n = 24
    vin[:n] = rng.integers(0, (1 << 16) + 1, n)                     # probabilities
    vin[32:32 + n] = rng.integers(0, 1 << 31, n)                    # value codes
    vin[56:64] = rng.integers(0, 1 << 10, 8)                        # small codes
    vin[64:72] = 0
    vin[72:76] = [2**31 - 1, -2**31, -2**31, 2**31 - 1]             # saturating products
    vecs = [Vec(func=VecFunc.FOLD, a_addr=0, b_addr=32, length=n, dst_addr=0),
            Vec(func=VecFunc.FOLD, a_addr=0, b_addr=56, length=8, dst_addr=7),
            Vec(func=VecFunc.FOLD, a_addr=0, b_addr=64, length=8, dst_addr=10),
            Vec(func=VecFunc.FOLD, a_addr=72, b_addr=72, length=4, dst_addr=13)]
    vecs += [Vec(func=VecFunc.FOLD, a_addr=k, b_addr=32 + k, length=k + 1,
                 dst_addr=15 + 3 * k) for k in range(5)]
    vecs += [Vec(func=VecFunc.FOLD, a_addr=76, b_addr=0, length=VIN - 76, dst_addr=31)]
    st = _check_against_the_models(vin, vecs, [0, 1, 0, 3, 0, 0, 1, 0, 0, 2])
    words = st.spads[Spad.VOUT].view("<u4").astype(np.int64)
    codes, amax = vec_fold(vin[:n], vin[32:32 + n])
    assert np.array_equal(st.spads[Spad.VOUT][:n].view(np.int8), codes)
    assert words[6] == fold_amax_word(amax) and amax >= 1 << 31      # a shifted amax word
    assert fold_amax(words[6]) <= amax < fold_amax(words[6]) * (1 + 2.0 ** -26)
    assert words[9] == fold_amax_word(vec_fold(vin[:8], vin[56:64])[1])
    assert words[12] == 0 and words[14] == fold_amax_word((1 << 53) - 1)


def test_channel_in_the_executor():
    """CHANNEL over key rows' amax words (REQUANT's: the regimes 0, 1, activations', the word's
    ends) with the scores' constant word, a small-exponent word (saturating), a zero-mantissa
    one and an imm with bits above 23 set; lengths 1..3 and a long row, back to back with a
    DEQUANT (the factor unit shared). VOUT equals the functional model's (vec_channel) and
    each ends in vec_cycles."""
    rng = np.random.default_rng(31)
    vin = _random_vin(rng)
    n = 24
    amax = rng.integers(1 << 12, 1 << 24, n)
    amax[:5] = [0, 1, 2**31 - 1, 2**31, 2**32 - 1]
    vin[:n] = amax.astype(np.uint32).view(np.int32)
    word = scores_scale_word(0.125)
    vecs = [Vec(func=VecFunc.CHANNEL, a_addr=0, length=n, dst_addr=0, imm=word),
            Vec(func=VecFunc.CHANNEL, a_addr=0, length=n, dst_addr=n,
                imm=(1 << 16) | (3 << 17)),
            Vec(func=VecFunc.CHANNEL, a_addr=0, length=8, dst_addr=2 * n, imm=9 << 17),
            Vec(func=VecFunc.DEQUANT, a_addr=0, b_addr=n, length=8, dst_addr=56, imm=3),
            Vec(func=VecFunc.CHANNEL, a_addr=3, length=8, dst_addr=0,
                imm=word | (0xABCDE << 24))]
    vecs += [Vec(func=VecFunc.CHANNEL, a_addr=k, length=k, dst_addr=8 + 3 * k, imm=word)
             for k in (1, 2, 3)]
    vecs += [Vec(func=VecFunc.CHANNEL, a_addr=0, length=VOUT, dst_addr=0, imm=word)]
    st = MachineState(VCFG)
    st.spads[Spad.VIN][:] = vin.astype("<i4").view(np.uint8)
    exec_vec(st, vecs[0])
    got = st.spads[Spad.VOUT].view("<i4")[:n]
    assert np.array_equal(got, scores_channels_vector(amax, 0.125))
    exec_vec(st, vecs[1])   # 2**13 * A: every A from 16 on saturates (0 stands for 127 << 16)
    sat = st.spads[Spad.VOUT].view("<i4")[n:2 * n] == (1 << 17) - 1
    assert np.array_equal(sat, (amax >= 16) | (amax == 0))
    _check_against_the_models(vin, vecs, [0, 1, 0, 0, 2, 0, 1, 0, 0])


def test_the_timing_formula_and_its_array_twin_agree():
    rng = np.random.default_rng(1)
    vecs = _random_vecs(rng, 50)
    f = decode_fields(program_words(vecs))
    assert timing.vec_cycles_fields(f, VCFG).tolist() == [timing.vec_cycles(v, VCFG)
                                                          for v in vecs]
    # a unit's result comes its feed register and its own latency after it is fed
    lat = {k: timing.VEC_FEED_LATENCY + v for k, v in timing.VECTOR_LATENCY.items()}
    assert timing.vec_cycles(Vec(length=10), VCFG) == 10 + timing.VEC_READ_LATENCY + lat["add"]
    assert timing.vec_cycles(Vec(func=VecFunc.ARGMAX, length=10), VCFG) == \
        10 + timing.VEC_READ_LATENCY + lat["argmax"] + 1
    assert timing.vec_cycles(Vec(func=VecFunc.MUL, length=10), VCFG) == \
        10 + timing.VEC_READ_LATENCY + lat["mul"]
    # two reads per pair; the pair's second element enters Rope a cycle after the table word
    assert timing.vec_cycles(Vec(func=VecFunc.ROPE, length=12, imm=rope_imm(4, 3)), VCFG) == \
        12 + timing.VEC_READ_LATENCY + 1 + lat["rope"]
    assert timing.vec_cycles(Vec(func=VecFunc.SILU_GATE, length=10), VCFG) == \
        10 + timing.VEC_READ_LATENCY + lat["exp"] + lat["recip"] + lat["scale"] + 3 * lat["mul"]
    # two passes; Recip between them; the amax word after the last code word
    assert timing.vec_cycles(Vec(func=VecFunc.REQUANT, length=10), VCFG) == \
        2 * (10 + timing.VEC_READ_LATENCY) + lat["absmax"] + lat["recip"] + lat["requant"] + 1
    # the amax word's read, then one pass through DequantFactor and Scale
    assert timing.vec_cycles(Vec(func=VecFunc.DEQUANT, length=10), VCFG) == \
        1 + 10 + timing.VEC_READ_LATENCY + lat["dequant_factor"] + lat["scale"]
    # REQUANT's two passes, each through Mul first; amax registered before Recip's feed
    assert timing.vec_cycles(Vec(func=VecFunc.FOLD, length=10), VCFG) == \
        2 * (10 + timing.VEC_READ_LATENCY + lat["mul"]) + lat["absmax"] + 1 + lat["recip"] \
        + lat["requant"] + 1


def _reset_after_abort(vin: np.ndarray, first: Vec, abort: int, second: Vec):
    """Start ``first``, reset the executor ``abort`` cycles after its grant (a run stopped
    mid-instruction), then issue ``second`` in the next cycle; return ``second``'s cycles from
    its command to ``done`` and VOUT's bytes."""
    dut = _Bench(VCFG)
    beat = VCFG.beat_bytes
    raw = vin.astype("<i4").view(np.uint8)
    out: dict = {}

    async def bench(ctx):
        await _load_vin(ctx, dut, raw, beat)
        for v in (first, second):
            await _issue(ctx, dut, v)              # the grant cycle g
            if v is first:
                for _ in range(abort):
                    await ctx.tick()
                ctx.set(dut.rst, 1)
                await ctx.tick()
                ctx.set(dut.rst, 0)
                continue
            cycles = 1
            while not ctx.get(dut.vec.done):
                assert cycles < 10 * v.length + 50, f"{v} never ends"
                await ctx.tick()
                cycles += 1
            out["cycles"] = cycles
            await ctx.tick()
        out["vout"] = np.frombuffer(await _read_vout(ctx, dut, beat), dtype=np.uint8)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return out["cycles"], out["vout"]


@pytest.mark.parametrize("seed", range(4))
def test_an_instruction_after_a_reset_mid_instruction_is_exact(seed):
    """The executor's operand delay lines and instruction registers are not reset (only its
    control and valid bits are): a VEC issued in the cycle after a reset that aborted another
    mid-flight (random sub-ops, random abort cycle) ends in exactly ``vec_cycles`` and writes
    exactly the functional model's words."""
    rng = np.random.default_rng(100 + seed)
    vin = _random_vin(rng)
    first, second = _random_vecs(rng, 2)
    abort = int(rng.integers(0, exec_cycles(first, VCFG)))
    cycles, vout = _reset_after_abort(vin, first, abort, second)
    st = MachineState(VCFG)
    st.spads[Spad.VIN][:] = vin.astype("<i4").view(np.uint8)
    exec_vec(st, second)
    assert cycles == exec_cycles(second, VCFG)
    words = slice(4 * second.dst_addr,
                  4 * (second.dst_addr + int(vec_out_words(second.func.value, second.length))))
    assert np.array_equal(vout[words], st.spads[Spad.VOUT][words])


def _resets_before_each_pass(vin: np.ndarray, first: Vec, second: Vec):
    """Run ``first`` alone, noting the cycles after its grant in which a later pass starts
    reading (``vin_a.en`` rising); then, for each such start ``k``, issue ``first`` again,
    reset the executor in cycle ``k - 2`` (the pass decided, a cycle before the decision's
    copies load the counters) or ``k - 1`` (the copies loading them), and issue ``second``
    in the next cycle. Returns the starts and, per reset, ``second``'s cycles from its
    command to ``done`` and its VOUT words."""
    dut = _Bench(VCFG)
    beat = VCFG.beat_bytes
    words = slice(second.dst_addr,
                  second.dst_addr + int(vec_out_words(second.func.value, second.length)))
    out: dict = {"starts": [], "runs": []}

    async def until_done(ctx, v) -> int:
        cycles = 1
        while not ctx.get(dut.vec.done):
            assert cycles < 10 * v.length + 50, f"{v} never ends"
            await ctx.tick()
            cycles += 1
        await ctx.tick()
        return cycles

    async def bench(ctx):
        await _load_vin(ctx, dut, vin.astype("<i4").view(np.uint8), beat)
        await _issue(ctx, dut, first)
        en, k = 1, 0
        while not ctx.get(dut.vec.done):
            now = ctx.get(dut.vec.vin_a.en)
            if now and not en:
                out["starts"].append(k)
            en, k = now, k + 1
            await ctx.tick()
        await ctx.tick()
        for abort in sorted({k - d for k in out["starts"] for d in (2, 1)}):
            await _issue(ctx, dut, first)
            for _ in range(abort):
                await ctx.tick()
            ctx.set(dut.rst, 1)
            await ctx.tick()
            ctx.set(dut.rst, 0)
            await _issue(ctx, dut, second)
            cycles = await until_done(ctx, second)
            vout = []
            for a in range(words.start, words.stop):
                ctx.set(dut.vout.dma_rd.addr, a * 4 // beat)
                ctx.set(dut.vout.dma_rd.en, 1)
                await ctx.tick()
                vout.append((ctx.get(dut.vout.dma_rd.data) >> (8 * (a * 4 % beat))) % 2**32)
            ctx.set(dut.vout.dma_rd.en, 0)
            out["runs"].append((cycles, vout))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return out["starts"], out["runs"]


@pytest.mark.parametrize("func", [VecFunc.REQUANT, VecFunc.SOFTMAX, VecFunc.RMSNORM,
                                  VecFunc.FOLD])
def test_a_reset_as_a_pass_is_decided_starts_no_pass(func):
    """A later pass is decided a cycle before the registers that start it load (the decision
    is registered, then copied per group of registers): a reset in either cycle leaves no
    pass to start after it, so the VEC issued next ends in exactly ``vec_cycles`` and writes
    the functional model's words."""
    rng = np.random.default_rng(200 + func.value)
    vin = _random_vin(rng)
    first = Vec(func=func, length=5, imm=3 if func == VecFunc.SOFTMAX else 0, a_addr=8,
                b_addr=40, dst_addr=0)
    second = Vec(func=VecFunc.ADD, length=6, a_addr=16, b_addr=24, dst_addr=10)
    starts, runs = _resets_before_each_pass(vin, first, second)
    assert len(starts) == (2 if func in (VecFunc.SOFTMAX, VecFunc.RMSNORM) else 1)
    st = MachineState(VCFG)
    st.spads[Spad.VIN][:] = vin.astype("<i4").view(np.uint8)
    exec_vec(st, second)
    want = st.spads[Spad.VOUT].view("<u4")[10:16].tolist()
    assert runs and all(r == (exec_cycles(second, VCFG), want) for r in runs)


def _reset_bits(elaboratable) -> int:
    """Bits of the sync registers of ``elaboratable`` (and below) that a reset reaches."""
    regs: dict[int, Signal] = {}

    def walk(frag):
        for domain, statements in frag.statements.items():
            if domain != "comb":
                for st in statements:
                    regs.update((id(sig), sig) for sig in st._lhs_signals())
        for sub, *_ in frag.subfragments:
            if isinstance(sub, Fragment):
                walk(sub)

    walk(Fragment.get(elaboratable, None))
    return sum(len(sig) for sig in regs.values() if not sig.reset_less)


def test_the_reset_reaches_only_the_executors_control_bits():
    """A reset of every operand register is a net of thousands of loads across the die (3,511
    bits of the two-lane engine's, the SiLU-gate's operand delay lines most of them); the valid
    and ``last`` bits of the pipelines (with their copies one cycle ahead), the state bits,
    ``done`` (two copies), the VOUT sources' enables (registered a cycle ahead) and
    ``elements`` are 300 bits with one lane, 346 with two (a valid bit a lane copy's stage),
    369 with SILU_GATE laned too (its chain's), 424 with the preset's four (a lane's shared
    units' mode fields are operands, not reset). The bounds leave room for a few more control
    bits, not for an operand line (32 bits a stage)."""
    from hw.config import preset
    two = preset("vector").replace(vector_lanes=2)
    for cfg, bound in ((preset("vector").replace(vector_lanes=1), 365),
                       (two, 430),
                       (two.replace(vector_laned_silu=True), 465),
                       (preset("vector").replace(vector_lanes=4), 440)):
        assert _reset_bits(VectorEngine(cfg)) <= bound


def test_the_executor_refuses_a_configuration_without_the_engine():
    with pytest.raises(ValueError, match="no vector engine"):
        VectorEngine(NOV)


@pytest.mark.parametrize("seed", range(3))
def test_insert_matches_the_models(seed):
    """INSERT of random valid geometries (whole code words at stride 1, one code per word
    at larger strides, several groups, codes running past the row) on random rows and code
    words, back to back and after gaps with other sub-ops: VOUT is the functional model's
    byte for byte and each ends in ``vec_cycles``."""
    rng = np.random.default_rng(200 + seed)
    vin = _random_vin(rng)
    vecs = []
    for _ in range(10):
        length = int(rng.choice([1, 2, 5, int(rng.integers(1, VOUT + 1))]))
        vecs.append(Vec(func=VecFunc.INSERT, length=length,
                        imm=random_insert_imm(rng, length),
                        a_addr=int(rng.integers(0, VIN - length + 1)),
                        b_addr=int(rng.integers(0, VIN - length + 1)),
                        dst_addr=int(rng.integers(0, VOUT - length + 1))))
        assert dispatch_error(vecs[-1], VCFG) == ErrorCode.NONE
        if rng.random() < 0.4:
            vecs += _random_vecs(rng, 1)
    gaps = [int(rng.choice([0, 0, 1, 3])) for _ in vecs]
    _check_against_the_models(vin, vecs, gaps)


@pytest.mark.parametrize("seed", range(3))
def test_insert4_matches_the_models(seed):
    """INSERT4 (nibbles) of random valid geometries, as test_insert_matches_the_models, among
    INSERTs and other sub-ops: VOUT is the functional model's (vec_insert4) byte for byte and
    each ends in ``vec_cycles``."""
    rng = np.random.default_rng(300 + seed)
    vin = _random_vin(rng)
    vecs = []
    for _ in range(10):
        length = int(rng.choice([1, 2, 5, int(rng.integers(1, VOUT + 1))]))
        func = VecFunc.INSERT4 if rng.random() < 0.7 else VecFunc.INSERT
        vecs.append(Vec(func=func, length=length,
                        imm=random_insert_imm(rng, length, func == VecFunc.INSERT4),
                        a_addr=int(rng.integers(0, VIN - length + 1)),
                        b_addr=int(rng.integers(0, VIN - length + 1)),
                        dst_addr=int(rng.integers(0, VOUT - length + 1))))
        assert dispatch_error(vecs[-1], VCFG) == ErrorCode.NONE
        if rng.random() < 0.4:
            vecs += _random_vecs(rng, 1)
    gaps = [int(rng.choice([0, 0, 1, 3])) for _ in vecs]
    _check_against_the_models(vin, vecs, gaps)


@pytest.mark.parametrize("seed", range(3))
def test_kv4_matches_the_models(seed):
    """KV4 of random rows (value rows, key rows of every group that divides them, the
    special values and all-zero rows), among other sub-ops: VOUT is the functional model's
    (vec_kv4: nibbles, group codes, amax) byte for byte and each ends in ``vec_cycles``."""
    rng = np.random.default_rng(400 + seed)
    vin = _random_vin(rng)
    vin[rng.integers(0, VIN - 8):][:8] = 0     # an all-zero stretch: zero rows and groups
    vecs = []
    for _ in range(8):
        length = int(rng.choice([1, 8, 64, int(rng.integers(1, VOUT // 2))]))
        imm = random_kv4_imm(rng, length)
        words = int(vec_out_words(VecFunc.KV4.value, length, imm))
        vecs.append(Vec(func=VecFunc.KV4, length=length, imm=imm,
                        a_addr=int(rng.integers(0, VIN - length + 1)),
                        dst_addr=int(rng.integers(0, VOUT - words + 1))))
        assert dispatch_error(vecs[-1], VCFG) == ErrorCode.NONE
        if rng.random() < 0.4:
            vecs += _random_vecs(rng, 1)
    gaps = [int(rng.choice([0, 0, 1, 3])) for _ in vecs]
    _check_against_the_models(vin, vecs, gaps)


@pytest.mark.parametrize("lanes", [1, 4])
def test_kv4_key_rows_of_one_two_and_many_groups_back_to_back(lanes):
    """KV4 reads a key row's group maxima two cycles before it feeds them to Mul (their block
    RAM's word registered: hw.vector.engine, ``kv_gq``), counting from Recip's valid two
    cycles ahead: key rows of one group, two and many (groups of one element a cycle and of
    lanes), back to back with no gap with each other and with the sub-ops whose reciprocal
    comes out of the same Recip (REQUANT, SOFTMAX, RMSNORM, a value row). A read a cycle
    early or late gives a group its neighbour's maximum (the first group the row before's
    last): cycles and VOUT exact."""
    cfg = VCFG.replace(vector_lanes=lanes)
    rng = np.random.default_rng(130 + lanes)
    vin = _random_vin(rng)
    keys = [(8, 8), (16, 8), (32, 4), (24, 1), (lanes, lanes), (2 * lanes, lanes)]
    others = [(VecFunc.REQUANT, 0), (VecFunc.SOFTMAX, None), (VecFunc.RMSNORM, None),
              (VecFunc.KV4, kv4_imm(None))]
    vecs = []
    for k, (length, group) in enumerate(keys * 2):
        func, imm = others[k % len(others)]
        olen = int(rng.integers(1, 3 * lanes + 2))
        imm = {VecFunc.SOFTMAX: olen, VecFunc.RMSNORM: norm_eps(1e-5, olen)}.get(func, imm)
        for f, n, i in ((VecFunc.KV4, length, kv4_imm(group)), (func, olen, imm)):
            words = int(vec_out_words(f.value, n, i))
            vecs.append(_aligned(Vec(func=f, length=n, imm=i,
                                     a_addr=int(rng.integers(0, VIN - n + 1)),
                                     b_addr=int(rng.integers(0, VIN - n + 1)),
                                     dst_addr=int(rng.integers(0, VOUT - words + 1))), cfg))
    assert all(dispatch_error(v, cfg) == ErrorCode.NONE for v in vecs)
    _check_against_the_models(vin, vecs, [0] * len(vecs), cfg)


@pytest.mark.parametrize("width", [1, 5, 17, 32, 33])
def test_the_bit_length_tree_is_int_bit_length(width):
    """``_bitlen`` (a multiplexer tree, no adder) is ``int.bit_length`` on 0, every power of
    two, its neighbours, the top value and random values of ``width`` bits (exact: integers)."""
    from hw.vector.engine import _bitlen

    rng = np.random.default_rng(width)
    top = (1 << width) - 1
    values = {0, top} | {v for k in range(width) for v in (1 << k, (1 << k) - 1, (2 << k) - 1)}
    values |= {int(rng.integers(0, top, endpoint=True)) for _ in range(64)}
    y = Signal(width)
    n = Signal(8)
    m = Module()
    m.d.comb += n.eq(_bitlen(y))
    sim = Simulator(m)
    got = {}

    async def tb(ctx):
        for v in sorted(values):
            ctx.set(y, v)
            got[v] = ctx.get(n)

    sim.add_testbench(tb)
    sim.run()
    assert got == {v: v.bit_length() for v in values}
