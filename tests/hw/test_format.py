"""Packed weight format: exact round trips, layout arithmetic, bad input."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hw.config import DENSE, NMPattern
from hw.format import (
    FormatError,
    QuantizedWeight,
    WeightFormat,
    pack,
    random_quantized,
    stream_layout,
    unpack,
)

PATTERNS = ["dense", "1:4", "2:4", "3:4", "1:8", "2:8", "4:8", "1:16", "4:16", "8:16"]


@st.composite
def formats(draw):
    pat = NMPattern.parse(draw(st.sampled_from(PATTERNS)))
    bits = draw(st.sampled_from([4, 8]))
    if bits == 8 or pat.index_bits + bits > 8:
        pass  # the format itself allows it; only the accelerator decoder restricts widths
    group = draw(st.sampled_from([0, 32, 64, 128]))
    if group and group % pat.block:
        group = pat.block * 4
    return WeightFormat(pat, bits, group, symmetric=draw(st.booleans()))


@given(formats(), st.integers(1, 150), st.integers(1, 300), st.sampled_from([8, 16, 64]),
       st.integers(0, 2**32 - 1))
def test_pack_unpack_round_trip_is_exact(fmt, n, k, lanes, seed):
    w = random_quantized(fmt, (n, k), np.random.default_rng(seed))
    stream = pack(w, lanes)
    lay = stream_layout(fmt, n, k, lanes)
    assert stream.dtype == np.uint8 and stream.size == lay.total_bytes
    back = unpack(stream, fmt, (n, k), lanes, w.row_scale)
    assert back.equals(w)
    # The same matrix packed for another lane count round-trips too.
    other = 8 if lanes != 8 else 16
    assert unpack(pack(w, other), fmt, (n, k), other, w.row_scale).equals(w)


def test_stream_bytes_follow_the_layout():
    """A hand-checked stream: 8 lanes, 2:4, group 8 -> 1 header word + 4 records of 6 bytes."""
    fmt = WeightFormat("2:4", bits=4, group=8)
    n, k, lanes = 8, 8, 8
    values = np.tile(np.array([1, -2, 3, -8], np.int16), (n, 1))
    index = np.tile(np.array([0, 3, 1, 2], np.uint8), (n, 1))
    codes = np.arange(1, 9, dtype=np.uint8)[:, None]
    w = QuantizedWeight(fmt, (n, k), values, index, codes, None, np.ones(n, np.float32))
    s = pack(w, lanes)
    assert s.size == 8 + 4 * 6
    assert list(s[:8]) == list(range(1, 9))  # codes, lane 0 first
    # Step 0: every lane holds value 1, index 0 -> field 0b000001; 4 fields per 3 bytes.
    f = 1 | (0 << 4)
    word = sum(f << (6 * i) for i in range(4))
    assert list(s[8:11]) == list(word.to_bytes(3, "little"))
    # Step 1: value -2 (0b1110), index 3 -> 0b111110.
    f = 0b1110 | (3 << 4)
    word = sum(f << (6 * i) for i in range(4))
    assert list(s[14:17]) == list(word.to_bytes(3, "little"))


@given(st.sampled_from([0, 16, 32, 128]), st.booleans(), st.booleans(), st.integers(1, 70),
       st.integers(1, 300), st.sampled_from([8, 16, 32]), st.integers(0, 3),
       st.integers(0, 2**32 - 1))
def test_byte_offsets_of_a_dense_int8_stream_are_where_pack_puts_each_weight(
        group, symmetric, raw, n, k, lanes, extra_beats, seed):
    """``StreamLayout.byte_offset``: the byte of the packed stream at each weight's offset is
    that weight, with tiles back to back (as packed) or further apart (a DRAM region)."""
    fmt = WeightFormat(DENSE, 8, group, symmetric=symmetric or raw, raw=raw)
    w = random_quantized(fmt, (n, k), np.random.default_rng(seed))
    lay = stream_layout(fmt, n, k, lanes)
    stream = pack(w, lanes)
    rows, ks = np.arange(n)[:, None], np.arange(lay.k_padded)[None, :]
    want = w.values.astype(np.uint8)           # two's complement or unsigned: the stored byte
    assert np.array_equal(stream[lay.byte_offset(rows, ks)], want)
    stride = lay.tile_bytes + 16 * extra_beats
    region = np.zeros(lay.tiles * stride, np.uint8)
    region.reshape(lay.tiles, stride)[:, :lay.tile_bytes] = stream.reshape(lay.tiles, -1)
    assert np.array_equal(region[lay.byte_offset(rows, ks, stride)], want)


@pytest.mark.parametrize("fmt", [WeightFormat("2:4", 4, 128), WeightFormat(DENSE, 4, 128)])
def test_byte_offsets_need_one_byte_per_weight(fmt):
    with pytest.raises(FormatError, match="dense stream of 8-bit fields"):
        stream_layout(fmt, 8, 128, 8).byte_offset(0, 0)


def test_bits_per_weight_2_4_int4_g128_meets_target():
    bpw = stream_layout(WeightFormat("2:4", 4, 128), 4096, 4096, 64).bits_per_weight
    assert bpw["values"] == 2.0 and bpw["indices"] == 1.0
    assert bpw["total"] == pytest.approx(2 + 1 + 8 / 128 + 32 / 4096)
    assert bpw["total"] <= 3.125 and 16 / bpw["total"] >= 5.1


@given(formats(), st.integers(0, 2**32 - 1))
def test_int_weight_places_values_at_their_positions(fmt, seed):
    w = random_quantized(fmt, (9, 40), np.random.default_rng(seed))
    dense = w.int_weight()
    assert dense.shape == (9, w.k_padded)
    # Every kept value lands on its position; everything else is zero.
    pos = w.positions()
    assert np.array_equal(np.take_along_axis(dense, pos, axis=1), w.int_values())
    assert np.count_nonzero(dense) <= pos.shape[1] * 9
    assert np.allclose(w.dequantize(), dense[:, :40] * w.row_scale[:, None])


def test_unpack_rejects_wrong_sizes():
    fmt = WeightFormat("2:4", 4, 32)
    w = random_quantized(fmt, (16, 64), np.random.default_rng(0))
    s = pack(w, 8)
    with pytest.raises(FormatError, match="expected"):
        unpack(s[:-1], fmt, (16, 64), 8, w.row_scale)
    with pytest.raises(FormatError, match="row_scale"):
        unpack(s, fmt, (16, 64), 8, w.row_scale[:3])
    with pytest.raises(FormatError, match="1-D uint8"):
        unpack(s.astype(np.int16), fmt, (16, 64), 8, w.row_scale)


@pytest.mark.parametrize("kwargs, needle", [
    ({"bits": 3}, r"bits must be one of \(4, 8\), got 3"),
    ({"pattern": "2:4", "group": 30}, "multiple of the block"),
    ({"group": -1}, "non-negative"),
    ({"code_bits": 5}, "code_bits"),
    ({"raw": True, "symmetric": False}, "raw"),
])
def test_bad_formats(kwargs, needle):
    with pytest.raises(FormatError, match=needle):
        WeightFormat(**kwargs)


def test_layout_rejects_bad_shapes_and_lanes():
    with pytest.raises(FormatError, match="lanes"):
        stream_layout(WeightFormat(), 4, 4, 12)
    with pytest.raises(FormatError, match="non-empty"):
        stream_layout(WeightFormat(), 0, 4, 8)


def test_quantized_weight_shape_checks():
    fmt = WeightFormat("2:4", 4, 32)
    w = random_quantized(fmt, (4, 32), np.random.default_rng(0))
    with pytest.raises(FormatError, match="index has shape"):
        QuantizedWeight(fmt, (4, 32), w.values, w.index[:, :3], w.codes, None, w.row_scale)


def test_storage_warning_says_when_a_format_is_a_poor_choice():
    from hw.format import storage_warning
    assert storage_warning(WeightFormat("2:4", 4, 128), 64, 4096, 64) is None
    pad = storage_warning(WeightFormat("2:4", 4, 128), 64, 100, 64)
    assert pad == "K=100 is padded with 28 zero columns to 128 (whole 2:4 blocks and groups of 128)"
    worse = storage_warning(WeightFormat("3:4", 4, 128), 64, 4096, 64)
    assert "3:4 INT4 stores 4.57 bits/weight, more than dense INT4's 4.07" in worse


@pytest.mark.parametrize("fmt", [WeightFormat(p, 4, g, symmetric=s) for p in
                                 (DENSE, "2:4", "4:8", "1:4", "4:16") for g in (32, 64, 128, 0)
                                 for s in (True, False)] + [WeightFormat(DENSE, 8, 128)])
def test_format_names_round_trip(fmt):
    assert WeightFormat.parse(fmt.name) == fmt


def test_format_names():
    assert [WeightFormat(p).name for p in (DENSE, "2:4")] == ["dense-int4", "2:4-int4"]
    assert WeightFormat.parse("dense-int4-g64") == WeightFormat(DENSE, 4, 64)
    assert WeightFormat.parse("4:8-int4-row-asym") == WeightFormat("4:8", 4, 0, symmetric=False)
    for bad in ("2:4", "2:4-int4-g", "2:4-int4-g6", "2:4-int3", "dense-int4 "):
        with pytest.raises(FormatError, match="group|bits|expected"):
            WeightFormat.parse(bad)
