"""Instruction set: encoder/decoder round trip, layouts as the single source, validation."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hw.config import AcceleratorConfig
from hw.isa import (
    INSTR_BITS,
    NO_EVENT,
    DmaBody,
    End,
    Engine,
    EpilogueMode,
    ErrorCode,
    Gemm,
    GemmBody,
    InstrLayout,
    ISAError,
    Load,
    RunReg,
    Spad,
    Store,
    Sync,
    check,
    decode,
    decode_program,
    dispatch_error,
    encode,
    encode_program,
    field_location,
)

CFG = AcceleratorConfig()
events = st.one_of(st.none(), st.integers(0, 30))


def _dma(cls):
    return st.builds(cls, wait=events, signal=events, spad=st.sampled_from(list(Spad)),
                     dram_addr=st.integers(0, 2**32 - 1), spad_addr=st.integers(0, 2**16 - 1),
                     rows=st.integers(0, 2**16 - 1), row_beats=st.integers(0, 2**16 - 1),
                     dram_stride=st.integers(0, 2**DmaBody["dram_stride"].width - 1),
                     reg=st.sampled_from(list(RunReg)))


instructions = st.one_of(
    _dma(Load), _dma(Store),
    st.builds(Gemm, wait=events, signal=events, wgt_addr=st.integers(0, 2**16 - 1),
              act_addr=st.integers(0, 2**16 - 1), act_stride=st.integers(0, 2**12 - 1),
              out_addr=st.integers(0, 2**16 - 1), param_addr=st.integers(0, 255),
              k_steps=st.integers(0, 2**14 - 1), group_steps=st.integers(0, 2**14 - 1),
              tokens=st.integers(1, 32), pattern=st.integers(0, 7), int8=st.booleans(),
              asym=st.booleans(), accumulate=st.booleans(),
              epilogue=st.sampled_from(list(EpilogueMode)), shift=st.integers(0, 31)),
    st.builds(Sync, wait=events, signal=events, engine=st.sampled_from(list(Engine))),
    st.builds(End, wait=events, signal=events))


@given(instructions)
def test_encode_decode_round_trip(ins):
    word = encode(ins)
    assert 0 <= word < 2**INSTR_BITS
    assert decode(word) == ins


@given(st.lists(instructions, max_size=8))
def test_program_round_trip(prog):
    blob = encode_program(prog)
    assert blob.dtype == np.uint8 and blob.size == 16 * len(prog)
    assert decode_program(blob) == prog


def test_fields_come_from_the_amaranth_layouts():
    """Setting one GEMM field moves exactly the bits the Amaranth layout assigns to it."""
    body = InstrLayout["body"].offset
    for name, f in GemmBody:
        value = (1 << f.width) - 1
        base = Gemm(tokens=1, k_steps=0, epilogue=EpilogueMode.NONE)
        kw = {"tokens": 32} if name == "tokens_m1" else {name: value}
        if name == "epilogue":  # the largest mode: the field's bits that any mode sets
            mode = max(EpilogueMode, key=lambda e: e.value)
            kw, value = {"epilogue": mode}, mode.value
        if name in ("int8", "asym", "accumulate"):
            kw = {name: True}
        diff = encode(Gemm(**{**base.__dict__, **kw})) ^ encode(base)
        assert diff == value << (body + f.offset), name


def test_opcode_zero_is_illegal_and_events_default_to_none():
    with pytest.raises(ISAError, match="illegal opcode 0"):
        decode(0)
    w = encode(End())
    assert (w >> 3) & 31 == NO_EVENT and (w >> 8) & 31 == NO_EVENT


@pytest.mark.parametrize("ins, needle", [
    (Load(spad=Spad.OUT, rows=1, row_beats=1), "LOAD writes the .* only, got spad=OUT"),
    (Store(spad=Spad.ACT, rows=1, row_beats=1), "STORE reads the .* only, got spad=ACT"),
    (Load(spad=Spad.ACT, rows=0, row_beats=1), "empty"),
    (Load(spad=Spad.ACT, spad_addr=CFG.spad_beats("act"), rows=1, row_beats=1),
     "exceeds ACT"),
    (Load(spad=Spad.WGT, dram_addr=CFG.dram_beats - 1, rows=1, row_beats=2), "DRAM range"),
    (Gemm(pattern=9), "pattern=9"),
    (Gemm(tokens=CFG.max_tokens + 1), "tokens=17"),
    (Gemm(k_steps=0), "k_steps=0"),
    (Gemm(pattern=2, int8=True), "dense only"),
    (Gemm(asym=True, group_steps=0), "group headers"),
    (Gemm(wgt_addr=1), "wgt_addr=1 must be a multiple of"),
    (Gemm(k_steps=4096, group_steps=0, int8=True), "WGT spad"),
    (Gemm(act_addr=CFG.spad_beats("act") - 1, k_steps=32), "ACT spad"),
    (Gemm(out_addr=CFG.spad_beats("out") - 1, tokens=2), "OUT spad"),
    (Gemm(epilogue=EpilogueMode.INT8_RESIDUAL, param_addr=60, tokens=8), "PARAM spad"),
    # A bias row per token, 4 bytes per lane: a 1 KiB PARAM holds four 64-lane rows.
    (Gemm(epilogue=EpilogueMode.WIDE_BIAS, tokens=CFG.param_spad_bytes // (4 * CFG.lanes) + 1),
     "PARAM spad"),
    (Sync(wait=16), "wait=16"),
    (End(signal=31), "signal=31"),
])
def test_check_rejects_with_field_names(ins, needle):
    with pytest.raises(ISAError, match=needle):
        check(ins, CFG)


def test_dispatch_error_codes():
    assert dispatch_error(Gemm(pattern=7), CFG) == ErrorCode.BAD_GEMM
    assert dispatch_error(Gemm(tokens=17), CFG) == ErrorCode.BAD_GEMM
    assert dispatch_error(Load(spad=Spad.OUT), CFG) == ErrorCode.BAD_ADDRESS
    assert dispatch_error(Sync(signal=20), CFG) == ErrorCode.BAD_EVENT
    assert dispatch_error(Gemm(act_addr=CFG.spad_beats("act")), CFG) == ErrorCode.BAD_ADDRESS
    assert dispatch_error(Load(spad=Spad.ACT, rows=2, row_beats=3), CFG) == ErrorCode.NONE
    # The hardware does not check GEMM stream extents (they wrap); check() does.
    big = Gemm(k_steps=4096, int8=True)
    assert dispatch_error(big, CFG) == ErrorCode.NONE
    with pytest.raises(ISAError):
        check(big, CFG)


def test_field_overflow_is_named():
    with pytest.raises(ISAError, match="k_steps=20000 does not fit in 14 bits"):
        encode(Gemm(k_steps=20000))


@given(st.lists(instructions, min_size=1, max_size=20))
def test_vectorised_decode_and_checks_equal_the_scalar_ones(prog):
    """decode_fields / dispatch_errors / exec_cycles_fields are the array twins of decode /
    dispatch_error / exec_cycles (the fast model uses the twins on whole programs)."""
    from hw.engines import exec_cycles, exec_cycles_fields
    from hw.isa import decode_fields, dispatch_errors, program_words

    for cfg in (CFG, AcceleratorConfig(rows=2, cols=4, weight_bits=(4,), num_events=8)):
        f = decode_fields(program_words(prog))
        errs = dispatch_errors(f, cfg)
        durs = exec_cycles_fields(f, cfg)
        for i, ins in enumerate(prog):
            assert errs[i] == dispatch_error(ins, cfg).value, ins
            if not isinstance(ins, End):
                assert durs[i] == exec_cycles(ins, cfg), ins
            back = decode(encode(ins))
            assert f["opcode"][i] == back.opcode.value


def test_vectorised_checks_flag_illegal_words():
    from hw.isa import decode_fields, dispatch_errors, program_words

    bad_sync = encode(Sync(engine=Engine.LOAD)) | (3 << 13)
    offset, _ = field_location("gemm.epilogue")
    bad_epilogue = encode(Gemm()) | (7 << offset)  # modes are 0..4
    with pytest.raises(ISAError, match="epilogue 7"):
        decode(bad_epilogue)
    f = decode_fields(program_words([0, 6 | (1 << 40), bad_sync, bad_epilogue, encode(End())]))
    assert list(dispatch_errors(f, CFG)) == [ErrorCode.ILLEGAL_OPCODE.value] * 4 + [0]
    ok = Gemm(epilogue=EpilogueMode.WIDE_BIAS, tokens=CFG.param_spad_bytes // (4 * CFG.lanes))
    check(ok, CFG)  # exactly fills PARAM


@given(st.lists(instructions, min_size=1, max_size=20))
def test_gemm_geometry_scalar_and_vectorised_agree(prog):
    """One stream geometry: gemm_geometry per instruction equals gemm_geometry_fields."""
    from hw.isa import decode_fields, gemm_geometry, gemm_geometry_fields, program_words

    geo = gemm_geometry_fields(decode_fields(program_words(prog)), CFG)
    for i, ins in enumerate(prog):
        if isinstance(ins, Gemm):
            one = gemm_geometry(ins, CFG)
            for name in ("header_words", "groups", "group_len", "record_bytes", "total_bytes"):
                assert getattr(geo, name)[i] == getattr(one, name), (name, ins)


@pytest.mark.parametrize("fmt", ["2:4 sym", "dense asym", "1:4 sym", "dense int8 raw"])
def test_gemm_geometry_is_the_packed_format(fmt):
    """A GEMM over one packed tile reads exactly the tile's bytes, group by group."""
    from hw.format import WeightFormat, stream_layout
    from hw.isa import gemm_geometry

    pattern, kind = fmt.split(" ", 1)
    int8, raw = "int8" in kind, "raw" in kind
    wf = WeightFormat(pattern, 8 if int8 else 4, 0 if raw else 64,
                      symmetric="asym" not in kind, raw=raw)
    lay = stream_layout(wf, CFG.lanes, 256, CFG.lanes)
    steps = wf.steps(lay.k_padded)
    g = Gemm(k_steps=steps, group_steps=0 if raw else lay.steps_per_group, int8=int8,
             asym=not wf.symmetric, pattern=CFG.pattern_index(wf.pattern))
    geo = gemm_geometry(g, CFG)
    for name in ("total_bytes", "groups", "group_bytes", "header_bytes", "record_bytes"):
        assert getattr(geo, name) == getattr(lay.geometry, name), name


_REGS = st.fixed_dictionaries({"pos": st.integers(0, 2**16 - 1), "tok": st.integers(0, 2**17 - 1)})


@given(st.lists(instructions, min_size=1, max_size=8), _REGS)
def test_relative_words_are_the_relative_instructions(prog, regs):
    """One semantics of the run-time registers: the vectorised words (what the fast model
    runs) decode to the scalar relative_instruction of each word, which moves a relative
    LOAD's or STORE's dram_addr by register x dram_stride (saturated) and nothing else."""
    from hw.isa import DRAM_ADDR_MAX, program_words, relative_instruction, relative_words

    words = relative_words(program_words(prog), regs)
    got = decode_program(words.astype("<u8").tobytes())
    assert got == [relative_instruction(ins, regs) for ins in prog]
    for ins, eff in zip(prog, got, strict=True):
        if isinstance(ins, (Load, Store)) and ins.reg != RunReg.NONE:
            value = regs["pos" if ins.reg == RunReg.POS else "tok"]
            assert eff.dram_addr == min(ins.dram_addr + value * ins.dram_stride, DRAM_ADDR_MAX)
            assert eff.reg == RunReg.NONE
        else:
            assert eff == ins


def test_registers_are_named_and_sized_by_the_layout():
    from hw.isa import RunRegs, reg_values

    assert list(reg_values({"pos": 3, "tok": 5})) == [0, 3, 5, 0]
    with pytest.raises(ISAError, match="no run-time register 'ctx'"):
        reg_values({"ctx": 1})
    with pytest.raises(ISAError, match=r"tok=131072 does not fit in 17 bits"):
        reg_values({"tok": 1 << RunRegs["tok"].width})
