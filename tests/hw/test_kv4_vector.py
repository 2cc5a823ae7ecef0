"""The vector unit's INT4 KV functions: KV4 (hw.numerics.vec_kv4: vec_kv4_rows' integers
packed into words) and INSERT4 (hw.numerics.vec_insert4: INSERT in nibbles), their ISA
fields, legality and cycle contract, and the fast model's VEC of them."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hw.config import preset
from hw.isa import (
    ErrorCode,
    Spad,
    Vec,
    VecFunc,
    decode_fields,
    dispatch_errors,
    insert_imm,
    kv4_group,
    kv4_groups,
    kv4_imm,
    program_words,
    vec_out_words,
    vec_reads_b,
)
from hw.numerics import (
    KV4_QMAX,
    insert_offsets,
    kv4_words,
    vec_insert4,
    vec_kv4,
    vec_kv4_rows,
)
from hw.timing import vec_cycles, vec_cycles_fields
from sim.functional import MachineState, exec_vec

#: The vector preset's engine with one lane (KV4 and INSERT4 stream one element a cycle;
#: REQUANT, compared with them, as many as the lanes).
VCFG = preset("vector").replace(vector_lanes=1)


def _unpack(words: np.ndarray, d: int, groups: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The nibbles (sign-extended), codes and amax of KV4's words, read back bit by bit."""
    words = np.asarray(words, np.int64) & 0xFFFFFFFF
    n8 = -(-d // 8)
    nib = np.array([(int(words[i // 8]) >> (4 * (i % 8))) & 0xF for i in range(d)])
    q = np.where(nib >= 8, nib - 16, nib)
    codes = np.array([(int(words[n8 + j // 4]) >> (8 * (j % 4))) & 0xFF
                      for j in range(groups)])
    return q, codes, int(words[-1])


def _row(rng: np.random.Generator, d: int) -> np.ndarray:
    """A Q15.16 row: small, wide, with an outlier channel, all zero, or at the word's ends."""
    kind = int(rng.integers(5))
    if kind == 0:
        return np.zeros(d, np.int64)
    if kind == 1:
        return rng.choice([-2**31, 2**31 - 1, 0, 5], size=d).astype(np.int64)
    x = rng.integers(-2**int(rng.integers(1, 31)), 2**int(rng.integers(1, 31)), d)
    if kind == 2:
        x[int(rng.integers(d))] = int(rng.integers(-2**31 + 1, 2**31))
    return x.astype(np.int64)


@given(st.integers(0, 2**32 - 1), st.sampled_from([(16, 16), (32, 32), (64, 32), (128, 32),
                                                   (64, None), (24, None), (16, 8)]))
@settings(max_examples=80, deadline=None)
def test_kv4_words_hold_vec_kv4_rows(seed, shape):
    """KV4's words, read back field by field, are vec_kv4_rows' nibbles and codes, and its
    amax word the row's max |x| (a << s: REQUANT's amax, what CHANNEL and FOLD take)."""
    d, group = shape
    x = _row(np.random.default_rng(seed), d)
    words = vec_kv4(x, group)
    groups = 0 if group is None else d // group
    assert words.size == vec_out_words(VecFunc.KV4.value, d, kv4_imm(group))
    q, c, a, s = vec_kv4_rows(x, group)
    got_q, got_c, amax = _unpack(words, d, groups)
    assert np.array_equal(got_q, q) and np.abs(got_q).max() <= KV4_QMAX
    if group is not None:
        assert np.array_equal(got_c, c)
    assert amax == int(a) << int(s) == int(np.abs(x).max())
    assert np.all((words >= 0) & (words < 2**32))


@given(st.integers(0, 2**32 - 1), st.integers(1, 40))
@settings(max_examples=60, deadline=None)
def test_vec_insert4_is_the_nibble_scatter_of_its_geometry(seed, length):
    """vec_insert4 against the nibble loop it states (code j, nibble j % 8 of word j // 8 of
    b, to nibble base + (j // group) * (group * stride + skip) + (j % group) * stride of the
    row when inside it); the nibbles no code names keep the row's."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-2**31, 2**31, length)
    b = rng.integers(-2**31, 2**31, length)
    geom = (int(rng.integers(0, 8 * length + 8)), int(rng.integers(1, 40)),
            int(rng.integers(1, 5)), int(rng.integers(1, 17)), int(rng.integers(0, 17)))
    base, group, groups, stride, skip = geom
    row = [(int(w) >> (4 * k)) & 0xF for w in a for k in range(8)]
    codes = [(int(w) >> (4 * k)) & 0xF for w in b for k in range(8)]
    for j in range(group * groups):
        at = base + (j // group) * (group * stride + skip) + (j % group) * stride
        if at < len(row):
            row[at] = codes[j]
    want = [sum(row[8 * i + k] << (4 * k) for k in range(8)) for i in range(length)]
    got = vec_insert4(a, b, *geom)
    assert [int(w) & 0xFFFFFFFF for w in got] == want
    assert np.all(got >= -2**31) and np.all(got < 2**31)
    assert np.all(np.diff(insert_offsets(*geom)) > 0)


def test_kv4_words_pack_as_stated():
    """Nibble i in bits 4 (i % 8) of word i // 8, codes four to a word, zeros above, amax."""
    q = np.array([1, -1, 7, -7, 0, 2, 3, 4, -8])
    w = kv4_words(q, np.array([255, 1]), 2**31)
    assert [hex(int(v)) for v in w] == ["0x432097f1", "0x8", "0x1ff", "0x80000000"]
    assert [hex(int(v)) for v in kv4_words(q[:8], None, 5)] == ["0x432097f1", "0x5"]


def test_kv4_imm_round_trips_and_names_a_bad_group():
    assert kv4_imm(None) == 0 and kv4_group(0) is None
    for g in (1, 8, 32, 2**15):
        assert kv4_group(kv4_imm(g)) == g
        assert kv4_groups(4 * g, kv4_imm(g)) == 4
    assert kv4_groups(64, 0) == 0
    for bad in (0, 24, 2**16):
        with pytest.raises(ValueError, match=f"got {bad}"):
            kv4_imm(bad)


@pytest.mark.parametrize("ins, error", [
    (Vec(func=VecFunc.KV4, length=48, imm=kv4_imm(32)), ErrorCode.BAD_ADDRESS),
    (Vec(func=VecFunc.KV4, length=64, imm=kv4_imm(32)), ErrorCode.NONE),
    (Vec(func=VecFunc.KV4, length=24, imm=0), ErrorCode.NONE),
    (Vec(func=VecFunc.INSERT4, length=8, imm=insert_imm(0, 8, stride=3)),
     ErrorCode.BAD_ADDRESS),
    (Vec(func=VecFunc.INSERT4, length=8, imm=insert_imm(4, 8, stride=1)),
     ErrorCode.BAD_ADDRESS),
    (Vec(func=VecFunc.INSERT4, length=8, imm=insert_imm(8, 16, stride=1)), ErrorCode.NONE),
    (Vec(func=VecFunc.INSERT4, length=8, imm=insert_imm(5, 16, stride=8)), ErrorCode.NONE),
    (Vec(func=VecFunc.KV4, length=64, imm=kv4_imm(32),
         dst_addr=VCFG.vout_spad_bytes // 4 - 9), ErrorCode.BAD_ADDRESS),
])
def test_kv4_and_insert4_legality(ins, error):
    """A KV4 group that does not divide the row; INSERT4's stride 2..7, or at stride 1
    nibbles that are not whole words; KV4's results (nibbles, codes, amax) past VOUT."""
    f = decode_fields(program_words([ins]))
    assert ErrorCode(int(dispatch_errors(f, VCFG)[0])) == error
    assert vec_reads_b(VecFunc.INSERT4.value) and not vec_reads_b(VecFunc.KV4.value)


def test_kv4_cycles_are_requants_plus_the_group_codes():
    """The contract: a value row costs REQUANT's two passes (less one amax word), a key row
    a Mul, the code's four stages and a Recip more and a cycle per further group and code
    word; INSERT4 INSERT's;
    the fields form agrees."""
    req = vec_cycles(Vec(func=VecFunc.REQUANT, length=64), VCFG)
    val = vec_cycles(Vec(func=VecFunc.KV4, length=64), VCFG)
    key = vec_cycles(Vec(func=VecFunc.KV4, length=64, imm=kv4_imm(32)), VCFG)
    assert val == req
    assert key - val == 5 + 4 + 9 + 1 + 1
    ins = [Vec(func=VecFunc.KV4, length=64, imm=kv4_imm(32)),
           Vec(func=VecFunc.INSERT4, length=8, imm=insert_imm(0, 16, stride=8)),
           Vec(func=VecFunc.INSERT, length=8, imm=insert_imm(0, 16, stride=4))]
    got = vec_cycles_fields(decode_fields(program_words(ins)), VCFG)
    assert list(got) == [vec_cycles(i, VCFG) for i in ins]
    assert got[1] == got[2]


@given(st.integers(0, 2**32 - 1), st.sampled_from([(64, 32), (64, None), (16, 16)]))
@settings(max_examples=30, deadline=None)
def test_the_fast_model_runs_kv4_then_insert4(seed, shape):
    """A VEC KV4 of a VIN row writes vec_kv4's words to VOUT; an INSERT4 of its nibbles into
    a loaded row writes vec_insert4's."""
    d, group = shape
    rng = np.random.default_rng(seed)
    x = _row(rng, d)
    st_ = MachineState(VCFG)
    vin, vout = st_.spads[Spad.VIN], st_.spads[Spad.VOUT]
    vin[:4 * d] = x.astype("<i4").view(np.uint8)
    exec_vec(st_, Vec(func=VecFunc.KV4, length=d, imm=kv4_imm(group), a_addr=0, dst_addr=3))
    n = int(vec_out_words(VecFunc.KV4.value, d, kv4_imm(group)))
    got = vout[12:12 + 4 * n].view("<u4").astype(np.int64)
    assert np.array_equal(got, vec_kv4(x, group))
    row = rng.integers(-2**31, 2**31, 8)
    vin[4 * d:4 * d + 32] = row.astype("<i4").view(np.uint8)
    vin[4 * d + 32:4 * d + 32 + 4 * n] = got.astype("<u4").view(np.uint8)
    geom = (int(rng.integers(0, 16)), d // 8, 1, 8, 0)
    exec_vec(st_, Vec(func=VecFunc.INSERT4, length=8, a_addr=d, b_addr=d + 8, dst_addr=0,
                      imm=insert_imm(*geom)))
    want = vec_insert4(row, got[:8], *geom)
    assert np.array_equal(vout[:32].view("<i4").astype(np.int64), want)


def test_the_rtl_builds_every_vec_sub_op():
    """The RTL vector engine builds every sub-op (KV4 and INSERT4 included): the RTL
    equivalence harness draws from all of them."""
    from hw.isa import RTL_VEC_FUNCS
    assert set(RTL_VEC_FUNCS) == set(VecFunc)
