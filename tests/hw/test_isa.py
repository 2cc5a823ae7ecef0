"""Instruction set: encoder/decoder round trip, layouts as the single source, validation."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hw.config import AcceleratorConfig
from hw.isa import (
    INSTR_BITS,
    NO_EVENT,
    NUM_REGS,
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
VCFG = AcceleratorConfig(vin_spad_bytes=256, vout_spad_bytes=256)  # with a vector engine
events = st.one_of(st.none(), st.integers(0, 30))


def _dma(cls):
    return st.builds(cls, wait=events, signal=events, spad=st.sampled_from(list(Spad)),
                     dram_addr=st.integers(0, 2**32 - 1), spad_addr=st.integers(0, 2**16 - 1),
                     rows=st.integers(0, 2**16 - 1), row_beats=st.integers(0, 2**16 - 1),
                     dram_stride=st.integers(0, 2**DmaBody["dram_stride"].width - 1),
                     reg=st.integers(0, NUM_REGS))


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


def test_a_move_from_out_is_defined_with_a_vector_engine_only():
    """A STORE naming OUT_MOVE_SPAD (value 6) decodes, reads OUT (its range is OUT's) and
    writes VIN (its far range is VIN's) where there is a vector engine; without one it is
    ILLEGAL_OPCODE, as an undefined value (7) is everywhere; a LOAD naming it is a LOAD of
    no loadable scratchpad (BAD_ADDRESS)."""
    from hw.isa import OUT_MOVE_SPAD, decode_fields, dispatch_errors, program_words

    mv = Store(spad=OUT_MOVE_SPAD, spad_addr=1, dram_addr=2, rows=2, row_beats=3,
               dram_stride=4)
    assert decode(encode(mv)) == mv
    assert dispatch_error(mv, VCFG) == ErrorCode.NONE
    assert dispatch_error(mv, CFG) == ErrorCode.ILLEGAL_OPCODE
    assert dispatch_error(Load(spad=OUT_MOVE_SPAD), VCFG) == ErrorCode.BAD_ADDRESS
    out, vin = VCFG.spad_beats("out"), VCFG.spad_beats("vin")
    for bad in (Store(spad=OUT_MOVE_SPAD, spad_addr=out - 1, row_beats=2),
                Store(spad=OUT_MOVE_SPAD, dram_addr=vin - 1, row_beats=2)):
        assert dispatch_error(bad, VCFG) == ErrorCode.BAD_ADDRESS, bad
    assert dispatch_error(Store(spad=OUT_MOVE_SPAD, spad_addr=out - 2, dram_addr=vin - 2,
                                row_beats=2), VCFG) == ErrorCode.NONE
    seven = encode(mv) + ((7 - 6) << field_location("dma.spad")[0])
    for cfg in (CFG, VCFG):
        f = decode_fields(program_words([encode(mv), seven, encode(End())]))
        assert list(dispatch_errors(f, cfg)) == [dispatch_error(mv, cfg).value,
                                                 ErrorCode.ILLEGAL_OPCODE.value, 0]


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


@given(st.lists(instructions, min_size=1, max_size=8))
def test_decoded_fields_are_read_lazily_from_a_copy(prog):
    """decode_fields names every field of the layouts and decodes each on its first lookup,
    from the words as they were when it was called."""
    from hw.isa import decode_fields, program_words

    words = program_words(prog).copy()
    f = decode_fields(words)
    assert len(f) == len(list(f)) and "opcode" in f and "gemm.k_steps" in list(f)
    words[:] = 0
    assert f["opcode"].tolist() == [decode(encode(ins)).opcode.value for ins in prog]
    assert f["opcode"] is f["opcode"]
    with pytest.raises(KeyError):
        f["gemm.no_such_field"]


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


_REGS = st.dictionaries(st.integers(1, NUM_REGS), st.integers(0, 2**32 - 1))


@given(st.lists(instructions, min_size=1, max_size=8), _REGS)
def test_relative_words_are_the_relative_instructions(prog, regs):
    """One semantics of the run-time registers: the vectorised words (what the fast model
    runs) decode to the scalar relative_instruction of each word, which moves a relative
    LOAD's or STORE's dram_addr by the register's value (saturated), no product, and nothing
    else."""
    from hw.isa import DRAM_ADDR_MAX, program_words, relative_instruction, relative_words

    words = relative_words(program_words(prog), regs)
    got = decode_program(words.astype("<u8").tobytes())
    assert got == [relative_instruction(ins, regs) for ins in prog]
    for ins, eff in zip(prog, got, strict=True):
        if isinstance(ins, (Load, Store)) and ins.reg:
            value = regs.get(ins.reg, 0)
            assert eff.dram_addr == min(ins.dram_addr + value, DRAM_ADDR_MAX)
            assert eff.reg == 0
        else:
            assert eff == ins


@given(st.lists(st.integers(0, 2**16 - 1), min_size=1, max_size=4),
       st.integers(0, 2**16 - 1), st.integers(0, 2**17 - 1), st.integers(0, 2**31))
def test_relative_vec_imm_adds_its_register(imms, pos, tok, extra):
    """A SOFTMAX's, INSERT's or INSERT4's imm moves by its register (saturated at IMM_MAX);
    any other sub-op naming a register is no instruction (decode raises, legal_words
    rejects it)."""
    from hw.isa import (
        IMM_MAX,
        REG_VEC_FUNCS,
        Vec,
        VecFunc,
        decode_fields,
        dispatch_limits,
        legal_words,
        program_words,
        relative_instruction,
    )

    regs = {1: pos, 2: tok, 3: extra}
    for i, imm in enumerate(imms):
        for func in VecFunc:
            ins = Vec(func=func, imm=imm, reg=1 + i % 3)
            word = encode(ins)
            legal = legal_words(decode_fields(program_words([word])),
                                dispatch_limits(VCFG))[0]
            assert legal == (func.value in REG_VEC_FUNCS), func
            if func.value in REG_VEC_FUNCS:
                eff = relative_instruction(decode(word), regs)
                assert eff.imm == min(imm + regs[ins.reg], IMM_MAX) and eff.reg == 0
            else:
                with pytest.raises(ISAError, match="names run-time register"):
                    decode(word)


def test_register_table_evaluates_its_terms():
    """A register table's values: each register the sum of its terms at (pos, tok), checked
    against the formula written out; too many registers or a value past REG_BITS raise."""
    from hw.isa import REG_BITS, RegTerm, reg_table_values

    table = [(RegTerm("pos"),), (RegTerm("tok", mul=48),),
             (RegTerm("pos", div=8, scale=40), RegTerm("pos", mod=8, div=2, mul=3)),
             (RegTerm("pos", mul=3, div=2, mod=5, scale=7),)]
    rng = np.random.default_rng(7)
    for pos, tok in zip(rng.integers(0, 1 << 16, 50), rng.integers(0, 1 << 17, 50),
                        strict=True):
        pos, tok = int(pos), int(tok)
        assert reg_table_values(table, pos, tok) == {
            1: pos, 2: 48 * tok, 3: pos // 8 * 40 + (3 * pos // 2) % 8,
            4: (3 * pos // 2) % 5 * 7}
    with pytest.raises(ISAError, match="16 registers"):
        reg_table_values([(RegTerm("pos"),)] * 16, 0)
    with pytest.raises(ISAError, match="does not fit"):
        reg_table_values([(RegTerm("pos", mul=1 << REG_BITS),)], 1)
    with pytest.raises(ISAError, match="source 'ctx'"):
        RegTerm("ctx")


@pytest.mark.parametrize("seed", range(4))
def test_a_flattened_register_table_equals_its_terms_sums(seed):
    """RegTable (the terms flattened once, evaluated per step) gives every register of a
    random table (some registers without terms) the sum of its terms as reg_value evaluates
    them on arrays of positions and tokens; a value past REG_BITS names its register."""
    from hw.isa import NUM_REGS, REG_BITS, RegTable, RegTerm, reg_value

    rng = np.random.default_rng(seed)

    def term():
        return RegTerm(str(rng.choice(["pos", "tok"])), int(rng.integers(0, 64)),
                       int(rng.integers(1, 40)), int(rng.choice([0, 2, 16, 37])),
                       int(rng.integers(0, 200)))

    table = [tuple(term() for _ in range(rng.integers(0, 4)))
             for _ in range(rng.integers(1, NUM_REGS + 1))]
    pos, tok = rng.integers(0, 1 << 12, 40), rng.integers(0, 1 << 16, 40)
    want = [reg_value(terms, pos, tok) for terms in table]   # each an array (or 0)
    regs = RegTable(table)
    for k in range(pos.size):
        got = regs.values(int(pos[k]), int(tok[k]))
        assert got == {i + 1: int(np.broadcast_to(w, pos.shape)[k])
                       for i, w in enumerate(want)}, k
    big = RegTable([(RegTerm("pos"),), (RegTerm("tok", scale=1 << (REG_BITS - 4)),)])
    with pytest.raises(ISAError, match="register 2=.* does not fit"):
        big.values(1, 16)


def test_registers_are_numbered_and_sized_by_the_layout():
    from hw.isa import NUM_REGS, REG_BITS, RunRegs, reg_values

    assert RunRegs.length == NUM_REGS and RunRegs.elem_shape == REG_BITS
    assert 1 << DmaBody["reg"].width == NUM_REGS + 1
    assert list(reg_values({1: 3, 15: 5})) == [0, 3] + [0] * 13 + [5]
    with pytest.raises(ISAError, match="no run-time register 16"):
        reg_values({16: 1})
    with pytest.raises(ISAError, match=r"register 2=4294967296 does not fit in 32 bits"):
        reg_values({2: 1 << REG_BITS})
