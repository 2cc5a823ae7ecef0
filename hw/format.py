"""The packed N:M + INT4/INT8 weight format: written by the compressor, read by the hardware.

Two representations of one compressed weight matrix ``W[n_out, k]``:

* :class:`QuantizedWeight` -- canonical and unpacked: per output row, the kept values in step order,
  their in-block indices, per-group scale codes (and zero points) and one float32 row scale.
* the **stream** -- the bytes the accelerator's weight decoder consumes, laid out tile by tile in
  the order the array streams them (see docs/architecture.md, "Weight stream"):

  for each tile of ``lanes`` output rows, for each group of ``group`` dense K positions:

  ``[codes: lanes bytes] [zeros: lanes bytes, asymmetric only] [steps_per_group step records]``

  A step record holds one field of ``bits + index_bits`` bits per lane, lane 0 in the least
  significant bits, value in the low ``bits`` and the in-block index above it. Records are packed
  back to back, little-endian, so a record is ``lanes * field_bits / 8`` bytes.

:func:`pack` and :func:`unpack` convert between them exactly (vectorised numpy).

Numerics of the fields (docs/architecture.md, "Numerics"): the integer weight of a kept value is
``code * q`` (symmetric, ``q`` two's complement) or ``code * (u - zero)`` (asymmetric, ``u``
unsigned); the real weight is ``row_scale * integer weight``.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from hw.config import DENSE, WEIGHT_BITS, AcceleratorConfig, NMPattern
from hw.errors import ContractError

__all__ = ["FormatError", "WeightFormat", "QuantizedWeight", "StreamGeometry", "StreamLayout",
           "pack", "unpack", "stream_layout", "random_quantized"]


class FormatError(ContractError):
    """Invalid format parameters or a stream that does not match its metadata."""


_NAME = re.compile(r"(dense|\d+:\d+)-int(\d+)(?:-g(\d+)|-(row))?(-asym)?")


@dataclass(frozen=True)
class WeightFormat:
    """How one weight matrix is compressed.

    Parameters
    ----------
    pattern:
        N:M sparsity along K (:data:`hw.config.DENSE` for none).
    bits:
        Weight value width: 4 or 8.
    group:
        Dense K positions sharing one scale code (a multiple of the block); 0 = whole row.
    symmetric:
        Symmetric (two's complement values, no zero point) or asymmetric (unsigned + zero).
    code_bits:
        Width of the unsigned per-group scale code.
    raw:
        No scales at all: values are plain integers (``code = 1``, no header). Used for INT8
        operands such as the KV cache.
    """

    pattern: NMPattern = DENSE
    bits: int = 4
    group: int = 128
    symmetric: bool = True
    code_bits: int = 8
    raw: bool = False

    def __post_init__(self):
        object.__setattr__(self, "pattern", NMPattern.parse(self.pattern))
        if self.bits not in WEIGHT_BITS:
            raise FormatError(f"weight bits must be one of {WEIGHT_BITS}, got {self.bits!r}")
        if not isinstance(self.group, int) or self.group < 0:
            raise FormatError(f"group must be a non-negative int (0 = whole row), "
                              f"got {self.group!r}")
        if self.group and self.group % self.block:
            raise FormatError(f"group ({self.group}) must be a multiple of the block size "
                              f"({self.block} for {self.pattern})")
        if self.code_bits not in (4, 6, 8):
            raise FormatError(f"code_bits must be 4, 6 or 8, got {self.code_bits!r}")
        if self.raw and not self.symmetric:
            raise FormatError("raw (unscaled) weights must be symmetric")

    @property
    def block(self) -> int:
        return self.pattern.block

    @property
    def field_bits(self) -> int:
        """Bits per lane per step: value + in-block index."""
        return self.bits + self.pattern.index_bits

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1)) if self.symmetric else 0

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.symmetric else (1 << self.bits) - 1

    @property
    def code_max(self) -> int:
        return (1 << self.code_bits) - 1

    @property
    def header_bytes_per_lane(self) -> int:
        return 0 if self.raw else (1 if self.symmetric else 2)

    def padded_k(self, k: int) -> int:
        """K rounded up so that every group and block is complete."""
        unit = math.lcm(self.block, self.group) if self.group else self.block
        return -(-k // unit) * unit

    def group_of(self, k_padded: int) -> int:
        """Dense K positions per group for a padded K (whole row when ``group == 0``)."""
        return self.group or k_padded

    def steps(self, k_padded: int) -> int:
        """Steps (kept values per row) for a padded K."""
        return k_padded * self.pattern.n // self.pattern.m

    def steps_per_group(self, k_padded: int) -> int:
        return self.group_of(k_padded) * self.pattern.n // self.pattern.m

    def fields(self, values: np.ndarray, index: np.ndarray | None) -> np.ndarray:
        """The per-lane fields (``uint16``, elementwise) of kept ``values`` (two's complement
        if symmetric) and their in-block ``index`` (None for dense): the value's low
        :attr:`bits`, the index above them."""
        out = np.asarray(values).astype(np.int16).astype(np.uint16) & np.uint16(
            (1 << self.bits) - 1)
        if not self.pattern.dense:
            out |= np.asarray(index).astype(np.uint16) << np.uint16(self.bits)
        return out

    def bits_per_weight(self, k: int, n_out: int = 1, lanes: int = 64) -> dict[str, float]:
        """Storage cost per dense weight position, split into its parts."""
        return stream_layout(self, n_out, k, lanes).bits_per_weight

    def check_supported(self, cfg: AcceleratorConfig) -> None:
        """Raise :class:`FormatError` if ``cfg``'s decoder cannot stream this format."""
        if self.bits not in cfg.weight_bits:
            raise FormatError(f"{self.bits}-bit weights not supported by this accelerator "
                              f"(weight_bits={cfg.weight_bits})")
        if self.bits == 8 and not self.pattern.dense:
            raise FormatError(f"the decoder streams INT8 weights dense only, got {self.pattern}")
        if self.field_bits > 8:
            raise FormatError(f"field of {self.field_bits} bits exceeds one byte per lane")
        if not self.pattern.dense and self.pattern not in cfg.patterns:
            raise FormatError(f"pattern {self.pattern} not supported by this accelerator; "
                              f"supported: {[str(p) for p in cfg.pattern_table]}")
        if self.code_bits != cfg.scale_code_bits:
            raise FormatError(f"scale codes of {self.code_bits} bits, accelerator decodes "
                              f"{cfg.scale_code_bits}")

    @property
    def name(self) -> str:
        """Short name: ``<pattern>-int<bits>``, then ``-g<group>`` when the group is not the
        default 128 (``-row`` for whole-row groups) and ``-asym`` when asymmetric:
        ``"2:4-int4"``, ``"dense-int4-g64"``, ``"4:8-int4-row"``. Scale-code width and raw
        are not named (the defaults)."""
        group = "" if self.group == 128 else "-row" if self.group == 0 else f"-g{self.group}"
        return f"{self.pattern}-int{self.bits}{group}{'' if self.symmetric else '-asym'}"

    @classmethod
    def parse(cls, name: str) -> WeightFormat:
        """The format :attr:`name` names (:class:`FormatError` naming a bad one)."""
        m = _NAME.fullmatch(name)
        if not m:
            raise FormatError(f"format {name!r}: expected "
                              "<pattern>-int<bits>[-g<group>|-row][-asym], "
                              "e.g. '2:4-int4' or 'dense-int4-g64'")
        pattern, bits, group, row, asym = m.groups()
        try:
            return cls(pattern, int(bits), 0 if row else int(group or 128), symmetric=not asym)
        except ValueError as e:
            raise FormatError(f"format {name!r}: {e}") from None

    def to_dict(self) -> dict:
        return {"pattern": str(self.pattern), "bits": self.bits, "group": self.group,
                "symmetric": self.symmetric, "code_bits": self.code_bits, "raw": self.raw}

    @classmethod
    def from_dict(cls, d: dict) -> WeightFormat:
        return cls(**d)


@dataclass
class QuantizedWeight:
    """A compressed weight matrix in canonical, unpacked form (exact).

    Attributes
    ----------
    fmt:
        The format.
    shape:
        ``(n_out, k)`` of the original matrix; K is padded to ``fmt.padded_k(k)`` with zeros.
    values:
        ``int16 [n_out, steps]``: kept values in step order (two's complement if symmetric).
    index:
        ``uint8 [n_out, steps]``: position of each kept value inside its M-block (``None`` for
        dense, where step ``s`` is position ``s`` of the row).
    codes:
        ``uint8 [n_out, groups]`` scale codes (all ones when raw).
    zeros:
        ``uint8 [n_out, groups]`` zero points (``None`` if symmetric).
    row_scale:
        ``float32 [n_out]``: real weight = row_scale * integer weight.
    """

    fmt: WeightFormat
    shape: tuple[int, int]
    values: np.ndarray
    index: np.ndarray | None
    codes: np.ndarray
    zeros: np.ndarray | None
    row_scale: np.ndarray

    def __post_init__(self):
        self.shape = tuple(int(s) for s in self.shape)
        n, _ = self.shape
        steps = self.fmt.steps(self.k_padded)
        groups = self.k_padded // self.fmt.group_of(self.k_padded)
        expect = {"values": (n, steps), "codes": (n, groups), "row_scale": (n,)}
        if not self.fmt.pattern.dense:
            expect["index"] = (n, steps)
        if not self.fmt.symmetric:
            expect["zeros"] = (n, groups)
        for name, shp in expect.items():
            arr = getattr(self, name)
            if arr is None or arr.shape != shp:
                got = None if arr is None else arr.shape
                raise FormatError(f"{name} has shape {got}, expected {shp} for "
                                  f"{self.shape} {self.fmt.pattern} group {self.fmt.group}")

    @property
    def n_out(self) -> int:
        return self.shape[0]

    @property
    def k(self) -> int:
        return self.shape[1]

    @property
    def k_padded(self) -> int:
        return self.fmt.padded_k(self.shape[1])

    @property
    def n_groups(self) -> int:
        return self.codes.shape[1]

    def positions(self) -> np.ndarray:
        """``int64 [n_out, steps]``: dense K position of every kept value."""
        p = self.fmt.pattern
        steps = self.values.shape[1]
        if p.dense:
            return np.broadcast_to(np.arange(steps, dtype=np.int64), self.values.shape)
        block = np.arange(steps, dtype=np.int64) // p.n
        return block[None, :] * p.m + self.index.astype(np.int64)

    def step_groups(self) -> np.ndarray:
        """``int64 [steps]``: group of every step."""
        steps = self.values.shape[1]
        return np.arange(steps, dtype=np.int64) // self.fmt.steps_per_group(self.k_padded)

    def int_values(self) -> np.ndarray:
        """``int32 [n_out, steps]``: the integer weight ``code * (q - zero)`` of each step."""
        g = self.step_groups()
        q = self.values.astype(np.int32)
        if self.zeros is not None:
            q = q - self.zeros[:, g].astype(np.int32)
        return q * self.codes[:, g].astype(np.int32)

    def int_weight(self) -> np.ndarray:
        """``int32 [n_out, k_padded]``: the dense integer weight matrix the datapath computes."""
        if self.fmt.pattern.dense:
            return self.int_values()
        w = np.zeros((self.n_out, self.k_padded), dtype=np.int32)
        np.put_along_axis(w, self.positions(), self.int_values(), axis=1)
        return w

    def dequantize(self) -> np.ndarray:
        """``float32 [n_out, k]``: the real weights this compressed matrix stands for."""
        w = self.int_weight()[:, : self.k].astype(np.float32)
        return w * self.row_scale[:, None]

    def equals(self, other: QuantizedWeight) -> bool:
        """Exact equality of every field."""
        def same(a, b):
            return (a is None and b is None) or (
                a is not None and b is not None and a.shape == b.shape and np.array_equal(a, b))
        return (self.fmt == other.fmt and self.shape == other.shape
                and all(same(getattr(self, f), getattr(other, f))
                        for f in ("values", "index", "codes", "zeros"))
                and np.array_equal(self.row_scale.view(np.uint32),
                                   other.row_scale.view(np.uint32)))


@dataclass(frozen=True)
class StreamGeometry:
    """Byte geometry of one tile's weight stream (see module docstring): the single source of
    record, header and group sizes for the packer, the GEMM instruction that reads the stream
    (:func:`hw.isa.gemm_geometry`), its functional decode and its timing.

    Every attribute is an int for one stream, or an ``int64`` array (elementwise) for many: the
    formulas use only arithmetic that works on both.

    Parameters
    ----------
    lanes:
        Lanes of the array (one byte per lane in a header word).
    steps:
        Step records in the stream.
    group_steps:
        Steps per quantisation group; 0: no groups (the records of the whole stream follow
        each other without headers).
    header_words:
        Header words (``lanes`` bytes each) before each group's records: 0 (raw), 1 (scale
        codes) or 2 (codes, zero points).
    value_bits, index_bits:
        The two parts of a record's per-lane field.
    """

    lanes: int
    steps: Any
    group_steps: Any
    header_words: Any
    value_bits: Any
    index_bits: Any

    @property
    def field_bits(self):
        """Bits per lane per record."""
        return self.value_bits + self.index_bits

    @property
    def record_bytes(self):
        return self.lanes * self.field_bits // 8

    @property
    def header_bytes(self):
        """Header bytes before each group's records."""
        return self.header_words * self.lanes

    @property
    def group_len(self):
        """Steps per group: the whole stream when there are no groups (at least 1)."""
        n = self.group_steps + (self.group_steps == 0) * self.steps
        return n + (n == 0)

    @property
    def groups(self):
        """Groups in the stream, the last one possibly partial (one when there are none)."""
        return -(-self.steps // self.group_len)

    @property
    def group_bytes(self):
        """Bytes of one whole group: its headers and records."""
        return self.header_bytes + self.group_len * self.record_bytes

    @property
    def total_bytes(self):
        return self.groups * self.header_bytes + self.steps * self.record_bytes

    def record_offset(self, step):
        """Byte offset of step ``step``'s record from the start of the stream: the whole
        groups before its group, its group's headers, then the records before it."""
        group, within = step // self.group_len, step % self.group_len
        return group * self.group_bytes + self.header_bytes + within * self.record_bytes


@dataclass(frozen=True)
class StreamLayout:
    """Byte layout of a packed stream (see module docstring)."""

    fmt: WeightFormat
    n_out: int
    k: int
    lanes: int

    @property
    def k_padded(self) -> int:
        return self.fmt.padded_k(self.k)

    @property
    def tiles(self) -> int:
        return -(-self.n_out // self.lanes)

    @functools.cached_property
    def geometry(self) -> StreamGeometry:
        """The stream of one tile."""
        f = self.fmt
        return StreamGeometry(lanes=self.lanes, steps=f.steps(self.k_padded),
                              group_steps=self.steps_per_group,
                              header_words=f.header_bytes_per_lane, value_bits=f.bits,
                              index_bits=f.pattern.index_bits)

    @property
    def groups(self) -> int:
        return self.geometry.groups

    @property
    def steps_per_group(self) -> int:
        return self.fmt.steps_per_group(self.k_padded)

    @property
    def record_bytes(self) -> int:
        return self.geometry.record_bytes

    @property
    def header_bytes(self) -> int:
        return self.geometry.header_bytes

    @property
    def group_bytes(self) -> int:
        return self.geometry.group_bytes

    @property
    def tile_bytes(self) -> int:
        return self.geometry.total_bytes

    @property
    def total_bytes(self) -> int:
        return self.tiles * self.tile_bytes

    def byte_offset(self, row, k, tile_stride: int | None = None):
        """Byte offset of weight ``W[row, k]`` in a dense stream of one byte per field.

        Parameters
        ----------
        row, k:
            Output row and (dense) K position: ints or int arrays, broadcast elementwise. In
            a dense stream step ``k`` holds K position ``k``; its record holds lane
            ``row % lanes`` of tile ``row // lanes``.
        tile_stride:
            Bytes from one tile's start to the next: :attr:`tile_bytes` (default) where the
            tiles follow each other as :func:`pack` writes them, more where a DRAM region
            places them further apart.

        Raises
        ------
        FormatError
            The format is sparse or its fields are not 8 bits wide (an element is then not
            one byte, or not stored at its K position).
        """
        if not self.fmt.pattern.dense or self.fmt.field_bits != 8:
            raise FormatError(f"byte offsets need a dense stream of 8-bit fields, got "
                              f"{self.fmt.name}")
        row, k = np.asarray(row), np.asarray(k)
        stride = self.tile_bytes if tile_stride is None else tile_stride
        lane = row % self.lanes
        return ((row // self.lanes) * stride + self.geometry.record_offset(k)
                + lane * self.fmt.field_bits // 8)

    def write_fields(self, region: np.ndarray, row, step, fields,
                     tile_stride: int | None = None) -> None:
        """Write the ``fields`` (:meth:`WeightFormat.fields`) of output rows ``row`` at steps
        ``step`` (int arrays, broadcast elementwise; each pair at most once) into ``region``
        (the stream's uint8 bytes, in place; ``tile_stride`` as :meth:`byte_offset`'s),
        keeping every other field: each record touched is unpacked, its lanes set and packed
        back, so fields of any width (not byte-aligned ones too) land where :func:`pack`
        puts them."""
        row, step, fields = np.broadcast_arrays(np.asarray(row), np.asarray(step),
                                                np.asarray(fields))
        stride = self.tile_bytes if tile_stride is None else tile_stride
        start = ((row // self.lanes) * stride + self.geometry.record_offset(step)).reshape(-1)
        first, which = np.unique(start, return_inverse=True)
        at = first[:, None] + np.arange(self.record_bytes)
        width = self.fmt.field_bits
        lanes = _unpack_fields(region[at], width, self.lanes).astype(np.uint16)
        lanes[which, (row % self.lanes).reshape(-1)] = fields.reshape(-1)
        region[at] = _pack_fields(lanes, width)

    @property
    def bits_per_weight(self) -> dict[str, float]:
        """Bits per dense weight of the original (unpadded) matrix, split by part."""
        dense = self.n_out * self.k
        body = self.tiles * self.groups * self.steps_per_group * self.lanes
        parts = {
            "values": body * self.fmt.bits,
            "indices": body * self.fmt.pattern.index_bits,
            "scales": self.tiles * self.groups * self.header_bytes * 8
            + (0 if self.fmt.raw else 32 * self.n_out),
        }
        out = {name: v / dense for name, v in parts.items()}
        out["total"] = sum(out.values())
        return out


def storage_warning(fmt: WeightFormat, n_out: int, k: int, lanes: int) -> str | None:
    """Why ``fmt`` may be a poor choice for ``W[n_out, k]``, or None: K padded to whole
    blocks and groups, or a sparse pattern whose stream is larger than dense at the same
    width (its index bits cost more than the zeros it skips, e.g. 3:4 INT4)."""
    notes = []
    kp = fmt.padded_k(k)
    if kp != k:
        notes.append(f"K={k} is padded with {kp - k} zero columns to {kp} (whole "
                     f"{fmt.pattern} blocks and groups of {fmt.group_of(kp)})")
    if not fmt.pattern.dense:
        dense = WeightFormat(DENSE, fmt.bits, fmt.group, fmt.symmetric, fmt.code_bits, fmt.raw)
        ours = stream_layout(fmt, n_out, k, lanes).bits_per_weight["total"]
        base = stream_layout(dense, n_out, k, lanes).bits_per_weight["total"]
        if ours > base:
            notes.append(f"{fmt.pattern} INT{fmt.bits} stores {ours:.2f} bits/weight, more than "
                         f"dense INT{fmt.bits}'s {base:.2f}: its index bits cost more than the "
                         "zeros it skips")
    return "; ".join(notes) or None


def stream_layout(fmt: WeightFormat, n_out: int, k: int, lanes: int) -> StreamLayout:
    """The byte layout of ``W[n_out, k]`` packed for ``lanes`` lanes."""
    if lanes % 8 or lanes <= 0:
        raise FormatError(f"lanes must be a positive multiple of 8, got {lanes!r}")
    if n_out <= 0 or k <= 0:
        raise FormatError(f"weight shape must be non-empty, got ({n_out}, {k})")
    return StreamLayout(fmt, n_out, k, lanes)


# ---------------------------------------------------------------------- bit packing helpers
def _pack_fields(fields: np.ndarray, width: int) -> np.ndarray:
    """Pack the last axis of ``fields`` (a multiple of 8 long) as ``width``-bit fields, LSB first.

    Returns uint8 with the last axis ``len * width / 8`` long.
    """
    *lead, n = fields.shape
    if width == 8:
        return fields.astype(np.uint8)
    if width == 4:
        f = fields.astype(np.uint8).reshape(*lead, n // 2, 2)
        return (f[..., 0] | (f[..., 1] << 4)).astype(np.uint8)
    if width > 8:  # wide fields (INT8 + index; software-only formats): go through bits
        bits = (fields.astype(np.uint16)[..., None] >> np.arange(width, dtype=np.uint16)) & 1
        return np.packbits(bits.astype(np.uint8).reshape(*lead, n * width), axis=-1,
                           bitorder="little")
    f = fields.astype(np.uint64).reshape(*lead, n // 8, 8)
    shifts = np.arange(8, dtype=np.uint64) * np.uint64(width)
    word = np.bitwise_or.reduce(f << shifts, axis=-1)  # 8 fields -> `width` bytes
    return word[..., None].view(np.uint8).reshape(*lead, n // 8, 8)[..., :width].reshape(
        *lead, n * width // 8)


def _unpack_fields(data: np.ndarray, width: int, n: int) -> np.ndarray:
    """Inverse of :func:`_pack_fields`: uint8 ``[..., n*width/8]`` -> ``[..., n]`` (uint8 for
    fields up to 8 bits, else uint16)."""
    *lead, _ = data.shape
    if width == 8:
        return data
    if width == 4:
        out = np.empty((*lead, n), dtype=np.uint8)
        out[..., 0::2] = data & 0xF
        out[..., 1::2] = data >> 4
        return out
    if width > 8:
        bits = np.unpackbits(data, axis=-1, bitorder="little").reshape(*lead, n, width)
        return (bits.astype(np.uint16) << np.arange(width, dtype=np.uint16)).sum(
            axis=-1, dtype=np.uint16)
    chunks = data.reshape(*lead, n // 8, width)
    padded = np.zeros((*lead, n // 8, 8), dtype=np.uint8)
    padded[..., :width] = chunks
    word = padded.view(np.uint64)  # [..., n//8, 1]
    shifts = np.arange(8, dtype=np.uint64) * np.uint64(width)
    f = (word >> shifts) & np.uint64((1 << width) - 1)
    return f.reshape(*lead, n).astype(np.uint8)


# ---------------------------------------------------------------------- pack / unpack
#: Output rows packed/unpacked per chunk: bounds temporaries to a few MB.
_CHUNK_ROWS = 512


def pack(w: QuantizedWeight, lanes: int) -> np.ndarray:
    """Pack ``w`` into the hardware stream for an array of ``lanes`` lanes (uint8, 1-D).

    Rows beyond ``n_out`` in the last tile are zero (code 0), so they contribute nothing.
    """
    fmt = w.fmt
    lay = stream_layout(fmt, w.n_out, w.k, lanes)
    out = np.empty((lay.tiles, lay.groups, lay.group_bytes), dtype=np.uint8)
    per = max(1, _CHUNK_ROWS // lanes)
    for t0 in range(0, lay.tiles, per):
        t1 = min(lay.tiles, t0 + per)
        _pack_tiles(w, lay, t0, t1, out[t0:t1])
    return out.reshape(-1)


def _pack_tiles(w: QuantizedWeight, lay: StreamLayout, t0: int, t1: int,
                out: np.ndarray) -> None:
    fmt, lanes = lay.fmt, lay.lanes
    r0, r1 = t0 * lanes, min(w.n_out, t1 * lanes)
    nt = t1 - t0

    def rows(a, dtype):
        res = np.zeros((nt * lanes, a.shape[1]), dtype=dtype)
        res[: r1 - r0] = a[r0:r1]
        return res

    fields = fmt.fields(rows(w.values, np.int16),
                        None if fmt.pattern.dense else rows(w.index, np.uint16))
    # [tiles, lanes, groups, spg] -> [tiles, groups, spg, lanes]: one record per step.
    fields = fields.reshape(nt, lanes, lay.groups, lay.steps_per_group)
    records = _pack_fields(fields.transpose(0, 2, 3, 1), fmt.field_bits)
    hb = lay.header_bytes
    out[:, :, hb:] = records.reshape(nt, lay.groups, -1)
    if fmt.raw:
        return
    # Header words: [tiles, lanes, groups] -> [tiles, groups, lanes].
    out[:, :, :lanes] = rows(w.codes, np.uint8).reshape(nt, lanes, -1).transpose(0, 2, 1)
    if not fmt.symmetric:
        out[:, :, lanes:2 * lanes] = rows(w.zeros, np.uint8).reshape(nt, lanes, -1).transpose(
            0, 2, 1)


def unpack(stream: np.ndarray, fmt: WeightFormat, shape: tuple[int, int], lanes: int,
           row_scale: np.ndarray) -> QuantizedWeight:
    """Parse a stream produced by :func:`pack` back into a :class:`QuantizedWeight` (exact)."""
    n_out, k = shape
    lay = stream_layout(fmt, n_out, k, lanes)
    stream = np.asarray(stream)
    if stream.dtype != np.uint8 or stream.ndim != 1:
        raise FormatError(f"stream must be a 1-D uint8 array, got {stream.dtype} "
                          f"{stream.shape}")
    if stream.size != lay.total_bytes:
        raise FormatError(f"stream is {stream.size} bytes, expected {lay.total_bytes} for "
                          f"{shape} {fmt.pattern} int{fmt.bits} group {fmt.group} "
                          f"on {lanes} lanes")
    row_scale = np.asarray(row_scale, dtype=np.float32)
    if row_scale.shape != (n_out,):
        raise FormatError(f"row_scale has shape {row_scale.shape}, expected ({n_out},)")
    grouped = stream.reshape(lay.tiles, lay.groups, lay.group_bytes)
    steps = lay.groups * lay.steps_per_group
    values = np.empty((n_out, steps), dtype=np.int16)
    index = None if fmt.pattern.dense else np.empty((n_out, steps), dtype=np.uint8)
    # Lookup tables from a raw field to its value (sign-extended) and its index.
    raw = np.arange(1 << fmt.field_bits)
    v = raw & ((1 << fmt.bits) - 1)
    if fmt.symmetric:
        v = np.where(v > fmt.qmax, v - (1 << fmt.bits), v)
    value_lut, index_lut = v.astype(np.int16), (raw >> fmt.bits).astype(np.uint8)
    hb = lay.header_bytes
    per = max(1, _CHUNK_ROWS // lanes)
    for t0 in range(0, lay.tiles, per):
        t1 = min(lay.tiles, t0 + per)
        r0, r1 = t0 * lanes, min(n_out, t1 * lanes)
        records = grouped[t0:t1, :, hb:].reshape(t1 - t0, lay.groups, lay.steps_per_group,
                                                 lay.record_bytes)
        fields = _unpack_fields(records, fmt.field_bits, lanes)  # [t, g, spg, lanes]
        fields = fields.transpose(0, 3, 1, 2).reshape((t1 - t0) * lanes, steps)[: r1 - r0]
        values[r0:r1] = value_lut[fields]
        if index is not None:
            index[r0:r1] = index_lut[fields]

    def header(i):
        h = grouped[:, :, i * lanes:(i + 1) * lanes]  # [t, g, lanes]
        return np.ascontiguousarray(h.transpose(0, 2, 1).reshape(lay.tiles * lanes, -1)[:n_out])

    codes = np.ones((n_out, lay.groups), dtype=np.uint8) if fmt.raw else header(0)
    zeros = None if fmt.symmetric else header(1)
    return QuantizedWeight(fmt, (n_out, k), values, index, codes, zeros, row_scale.copy())


def random_quantized(fmt: WeightFormat, shape: tuple[int, int],
                     rng: np.random.Generator) -> QuantizedWeight:
    """A :class:`QuantizedWeight` with uniformly random fields (for tests and benchmarks).

    Every field covers its full legal range: values, distinct ascending in-block indices, codes
    (including 0), zero points and positive row scales.
    """
    n, k = shape
    kp = fmt.padded_k(k)
    steps, groups = fmt.steps(kp), kp // fmt.group_of(kp)
    p = fmt.pattern
    values = rng.integers(fmt.qmin, fmt.qmax + 1, size=(n, steps)).astype(np.int16)
    index = None
    if not p.dense:
        # N distinct ascending positions per block: sort random keys, keep the N smallest.
        keys = rng.random((n, kp // p.m, p.m))
        idx = np.sort(np.argsort(keys, axis=2)[:, :, :p.n], axis=2)
        index = idx.reshape(n, steps).astype(np.uint8)
    codes = np.ones((n, groups), np.uint8) if fmt.raw else \
        rng.integers(0, fmt.code_max + 1, size=(n, groups)).astype(np.uint8)
    zeros = None if fmt.symmetric else \
        rng.integers(0, fmt.qmax + 1, size=(n, groups)).astype(np.uint8)
    row_scale = (rng.random(n) + 0.5).astype(np.float32)
    return QuantizedWeight(fmt, (n, k), values, index, codes, zeros, row_scale)
