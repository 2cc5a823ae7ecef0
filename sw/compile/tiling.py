"""Tiling: how one linear layer ``y[T, N] = x[T, K] @ W[N, K]^T`` is cut into GEMMs, and where
its weight tiles lie in DRAM.

The weight stream (:mod:`hw.format`) is cut into **n-tiles** of ``lanes`` output channels (one
GEMM each), each starting on a DRAM beat: :func:`tile_stride` bytes apart, so a layer's stream
takes :func:`stream_bytes` and its DRAM image is :func:`weight_image`, whatever the token count.
Along K the stream is cut into **chunks** of whole quantisation groups that fit half of the WGT
scratchpad, so the LOAD engine fills one half while the array streams the other; tokens are
cut into **token tiles** of at most ``max_tokens`` (the accumulator depth). Activations stay
*resident* in the ACT scratchpad when a token tile's whole K fits (decode), else they are
chunked along K with the weights (prefill). :func:`plan_linear` makes these choices once per
layer (:class:`LinearPlan`); the scheduler (:mod:`sw.compile.schedule`) reads them.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from hw.config import AcceleratorConfig
from hw.format import QuantizedWeight, StreamLayout, WeightFormat, pack, stream_layout
from hw.isa import bias_row_bytes
from sw.compile.errors import LoweringError

__all__ = ["LinearPlan", "plan_linear", "bias_token_tile", "tile_stride", "stream_bytes",
           "weight_image"]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def tile_stride(layout: StreamLayout, beat: int) -> int:
    """Bytes from one n-tile's start to the next in DRAM: a tile's stream rounded up to whole
    ``beat``-byte beats (every weight load starts on a beat)."""
    return _ceil(layout.tile_bytes, beat) * beat


def stream_bytes(layout: StreamLayout, beat: int) -> int:
    """DRAM bytes of a layer's weight stream: every tile at its :func:`tile_stride`."""
    return layout.tiles * tile_stride(layout, beat)


def weight_image(weight: QuantizedWeight, lanes: int, beat: int) -> np.ndarray:
    """The packed stream of ``weight`` as programs read it from DRAM (uint8, 1-D,
    :func:`stream_bytes` long): tile ``j`` at byte ``j * tile_stride``, zero-padded."""
    layout = stream_layout(weight.fmt, weight.n_out, weight.k, lanes)
    stream = pack(weight, lanes).reshape(layout.tiles, -1)
    out = np.zeros((layout.tiles, tile_stride(layout, beat)), dtype=np.uint8)
    out[:, :stream.shape[1]] = stream
    return out.reshape(-1)


@dataclass(frozen=True)
class LinearPlan:
    """Tiling decisions for one linear layer; the stream geometry is ``layout``'s (derived
    sizes are computed once: the scheduler reads them for every instruction).

    Parameters
    ----------
    tokens : int
        Activation rows ``T``.
    layout : StreamLayout
        The weight stream.
    token_tile : int
        Most tokens per GEMM.
    chunk_sizes : tuple of int
        Quantisation groups per K chunk.
    act_row_bytes : int
        ACT/DRAM bytes per token row of int8 activations (K padded to whole beats).
    resident_acts : bool
        A token tile's whole-K activations stay in ACT.
    tile_stride : int
        Bytes between n-tiles in DRAM (:func:`tile_stride`).
    bias : bool
        WIDE_BIAS epilogue: int32 bias rows, laid out as the outputs.
    """

    tokens: int
    layout: StreamLayout
    token_tile: int
    chunk_sizes: tuple[int, ...]
    act_row_bytes: int
    resident_acts: bool
    tile_stride: int
    bias: bool = False

    @property
    def fmt(self) -> WeightFormat:
        return self.layout.fmt

    @functools.cached_property
    def n(self) -> int:
        return self.layout.n_out

    @functools.cached_property
    def k_padded(self) -> int:
        return self.layout.k_padded

    @functools.cached_property
    def n_tiles(self) -> int:
        return self.layout.tiles

    @functools.cached_property
    def group_bytes(self) -> int:
        return self.layout.group_bytes

    @functools.cached_property
    def group_k(self) -> int:
        """Dense K positions per quantisation group."""
        return self.fmt.group_of(self.k_padded)

    @property
    def k_chunks(self) -> int:
        return len(self.chunk_sizes)

    def chunk_groups(self, c: int) -> int:
        """Quantisation groups in K chunk ``c``."""
        return self.chunk_sizes[c]

    def chunk_start(self, c: int) -> int:
        """First group of K chunk ``c``."""
        return self._chunk_starts[c]

    @functools.cached_property
    def _chunk_starts(self) -> tuple[int, ...]:
        return tuple(itertools.accumulate(self.chunk_sizes, initial=0))

    def chunk_weight_start(self, c: int) -> int:
        """Byte of K chunk ``c`` in its tile's weight stream."""
        return self.chunk_start(c) * self.group_bytes

    def chunk_weight_bytes(self, c: int) -> int:
        """Weight stream bytes of K chunk ``c``."""
        return self.chunk_groups(c) * self.group_bytes

    def chunk_act_start(self, c: int) -> int:
        """Byte of K chunk ``c`` in a token's int8 activation row."""
        return self.chunk_start(c) * self.group_k

    def chunk_act_bytes(self, c: int) -> int:
        """Int8 activation bytes of K chunk ``c`` per token."""
        return self.chunk_groups(c) * self.group_k

    @functools.cached_property
    def token_tiles(self) -> int:
        return _ceil(self.tokens, self.token_tile)

    def first_token(self, t: int) -> int:
        """First token row of token tile ``t``."""
        return t * self.token_tile

    def tile_tokens(self, t: int) -> int:
        """Token rows in token tile ``t`` (the last one may be short)."""
        return min(self.token_tile, self.tokens - self.first_token(t))

    @functools.cached_property
    def out_row_bytes(self) -> int:
        """DRAM bytes per token row of the int32 outputs (every tile's lanes)."""
        return self.n_tiles * self.layout.lanes * 4


def bias_token_tile(cfg: AcceleratorConfig) -> int:
    """Most tokens per GEMM of a biased layer: two PARAM buffers (the next tile's rows load
    while the epilogue reads this tile's) of one int32 row per token."""
    return min(cfg.max_tokens, cfg.param_spad_bytes // (2 * bias_row_bytes(cfg)))


def plan_linear(cfg: AcceleratorConfig, fmt: WeightFormat, n: int, k: int,
                tokens: int, bias: bool = False) -> LinearPlan:
    """Choose tile and chunk sizes for ``tokens x k @ (n x k)^T`` on ``cfg``.

    Parameters
    ----------
    cfg : AcceleratorConfig
        The accelerator.
    fmt : WeightFormat
        The weights' format.
    n, k : int
        Output channels and input features.
    tokens : int
        Activation rows.
    bias : bool
        A per-channel bias the WIDE_BIAS epilogue adds.

    Raises
    ------
    LoweringError
        The format is not supported, a group does not fit half the WGT scratchpad, two bias
        rows do not fit the PARAM scratchpad, or K cannot be cut on beats.
    """
    try:
        fmt.check_supported(cfg)
    except ValueError as e:
        raise LoweringError(str(e)) from None
    if tokens < 1:
        raise LoweringError(f"tokens must be >= 1, got {tokens}")
    lay = stream_layout(fmt, n, k, cfg.lanes)
    kp = lay.k_padded
    beat = cfg.beat_bytes
    half_wgt = cfg.wgt_spad_bytes // 2
    if lay.group_bytes > half_wgt:
        raise LoweringError(f"one quantisation group of {lay.group_bytes} bytes exceeds half "
                            f"the WGT spad ({half_wgt}); use smaller groups")
    tt = min(tokens, bias_token_tile(cfg) if bias else cfg.max_tokens)
    if tt < 1:
        raise LoweringError(f"a PARAM spad of {cfg.param_spad_bytes} bytes cannot hold two "
                            f"bias rows of {bias_row_bytes(cfg)} bytes")
    row = _ceil(kp, beat) * beat
    group_k = fmt.group_of(kp)
    resident = tt * row <= cfg.act_spad_bytes
    gmax = half_wgt // lay.group_bytes
    if not resident:  # two activation chunks of tt tokens must fit as well
        gmax = min(gmax, cfg.act_spad_bytes // (2 * tt * group_k))
    sizes = _chunk_sizes(lay.groups, gmax, beat, lay.group_bytes, group_k)
    if sizes is None:
        raise LoweringError(
            f"cannot split K into beat-aligned chunks: a group is {lay.group_bytes} bytes "
            f"({group_k} activations), at most {gmax} fit a buffer, and chunk boundaries must "
            f"fall on {beat}-byte beats")
    return LinearPlan(tokens=tokens, layout=lay, token_tile=tt, chunk_sizes=sizes,
                      act_row_bytes=row, resident_acts=resident,
                      tile_stride=tile_stride(lay, beat), bias=bias)


def _chunk_sizes(groups: int, gmax: int, beat: int, group_bytes: int,
                 group_k: int) -> tuple[int, ...] | None:
    """Groups per K chunk: as few chunks as fit ``gmax`` groups, balanced (so every load is
    long enough to hide the previous GEMM), each boundary on a beat of both the weight stream
    and the activation rows. None if impossible."""
    if groups <= gmax:
        return (groups,)
    unit = math.lcm(beat // math.gcd(beat, group_bytes), beat // math.gcd(beat, group_k))
    per = gmax // unit
    if per == 0:
        return None
    units = _ceil(groups, unit)
    k = _ceil(units, per)
    sizes = [(units // k + (c < units % k)) * unit for c in range(k)]
    sizes[-1] -= sum(sizes) - groups
    return tuple(sizes)
