"""Functional semantics of every instruction on byte-exact machine state (values, no timing).

This is what each instruction *does* to DRAM, the scratchpads and the accumulators; the RTL
must produce the same bytes. The fast model (:mod:`sim.model`) pairs it with the timing of
:mod:`hw.timing`. Arithmetic comes from :mod:`hw.numerics`; bit layouts from :mod:`hw.format` and
:mod:`hw.isa`. Scratchpad accesses wrap around modulo the scratchpad size (the hardware does
not check GEMM extents; :func:`hw.isa.check` rejects such programs before they get here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hw.config import AcceleratorConfig
from hw.format import _unpack_fields
from hw.isa import EpilogueMode, Gemm, Load, Spad, Store, bias_row_bytes, gemm_geometry
from hw.numerics import add_bias_wide, requantize_int8, wrap

__all__ = ["MachineState", "exec_load", "exec_store", "exec_gemm", "decode_gemm_weights"]


@dataclass
class MachineState:
    """DRAM, scratchpads and accumulator files of one accelerator, as bytes / integers."""

    cfg: AcceleratorConfig
    dram: np.ndarray = None
    spads: dict[Spad, np.ndarray] = field(default_factory=dict)
    acc: np.ndarray = None  # int64 [max_tokens, lanes]

    def __post_init__(self):
        cfg = self.cfg
        if self.dram is None:
            self.dram = np.zeros(cfg.memory.size_bytes, dtype=np.uint8)
        if self.dram.dtype != np.uint8 or self.dram.shape != (cfg.memory.size_bytes,):
            raise ValueError(f"DRAM image must be uint8[{cfg.memory.size_bytes}], got "
                             f"{self.dram.dtype}{list(self.dram.shape)}")
        for sp in Spad:
            self.spads.setdefault(sp, np.zeros(getattr(cfg, f"{sp.name.lower()}_spad_bytes"),
                                               dtype=np.uint8))
        if self.acc is None:
            self.acc = np.zeros((cfg.max_tokens, cfg.lanes), dtype=np.int64)


def exec_load(st: MachineState, ins: Load) -> None:
    """DRAM rows -> contiguous scratchpad beats."""
    beat = st.cfg.beat_bytes
    row = ins.row_beats * beat
    starts = (ins.dram_addr + np.arange(ins.rows) * ins.dram_stride) * beat
    src = st.dram[(starts[:, None] + np.arange(row)[None, :]).reshape(-1)]
    dst = ins.spad_addr * beat
    st.spads[ins.spad][dst:dst + src.size] = src


def exec_store(st: MachineState, ins: Store) -> None:
    """Contiguous OUT beats -> DRAM rows."""
    beat = st.cfg.beat_bytes
    row = ins.row_beats * beat
    src = ins.spad_addr * beat
    data = st.spads[ins.spad][src:src + ins.rows * row]
    starts = (ins.dram_addr + np.arange(ins.rows) * ins.dram_stride) * beat
    st.dram[(starts[:, None] + np.arange(row)[None, :]).reshape(-1)] = data


def _read_wrapped(buf: np.ndarray, start: int, n: int) -> np.ndarray:
    idx = (start + np.arange(n)) % buf.size
    return buf[idx]


def decode_gemm_weights(ins: Gemm, cfg: AcceleratorConfig, wgt: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Decode the weight stream of a GEMM instruction as the decoder does.

    Returns
    -------
    w_eff, pos:
        ``int32 [lanes, k_steps]`` dequantised integer weights ``code * (q - zero)`` and the
        activation offset ``block * block_size + index`` each step selects.
    """
    lanes = cfg.lanes
    pat = cfg.pattern_table[ins.pattern]
    geo = gemm_geometry(ins, cfg)
    bits, fbits, rec = geo.value_bits, geo.field_bits, geo.record_bytes
    S, gs, n_groups = ins.k_steps, geo.group_len, geo.groups
    hb, group_bytes, total = geo.header_bytes, geo.group_bytes, geo.total_bytes
    # The stream as one contiguous byte run (wrapping around the spad), padded to whole groups
    # so it reshapes into [group, header + records] without per-byte index arithmetic.
    base = ins.wgt_addr * cfg.beat_bytes
    if base + total <= wgt.size:
        buf = wgt[base:base + total]
    else:
        buf = np.take(wgt, np.arange(base, base + total), mode="wrap")
    buf = np.concatenate([buf, np.zeros(n_groups * group_bytes - total, np.uint8)])
    grouped = buf.reshape(n_groups, group_bytes)
    # Fields of every (group, step, lane); the last group may be partial (zero padding).
    fields = _unpack_fields(grouped[:, hb:].reshape(n_groups * gs, rec), fbits, lanes)
    fields = fields.reshape(n_groups, gs, lanes)
    # Lookup tables: raw field -> value (sign-extended unless asymmetric) and in-block index.
    raw = np.arange(1 << fbits)
    v = raw & ((1 << bits) - 1)
    if not ins.asym:
        v = np.where(v >= 1 << (bits - 1), v - (1 << bits), v)
    q = v.astype(np.int32)[fields]                                 # [groups, gs, lanes]
    if geo.header_words:
        # The decoder keeps the low scale_code_bits of a code byte and the low `bits` of a zero
        # byte (legal streams have no other bits set; this defines the rest).
        hdr = grouped[:, :hb].astype(np.int32)
        codes = hdr[:, None, :lanes] & ((1 << cfg.scale_code_bits) - 1)
        if ins.asym:
            q = q - (hdr[:, None, lanes:] & ((1 << bits) - 1))
        q = q * codes
    w_eff = q.reshape(n_groups * gs, lanes)[:S].T                 # [lanes, S]
    steps = np.arange(S)
    if pat.dense:
        pos = np.broadcast_to(steps, (lanes, S))
    else:
        index = (raw >> bits).astype(np.int32)[fields].reshape(n_groups * gs, lanes)[:S].T
        pos = (steps // pat.n)[None, :] * pat.m + index
    return w_eff, pos


def exec_gemm(st: MachineState, ins: Gemm) -> None:
    """Stream the weights against ``tokens`` activation rows, then run the epilogue."""
    cfg = st.cfg
    beat, lanes, T = cfg.beat_bytes, cfg.lanes, ins.tokens
    w_eff, pos = decode_gemm_weights(ins, cfg, st.spads[Spad.WGT])
    act = st.spads[Spad.ACT]
    k_span = int(pos.max()) + 1
    # Activation rows as the array sees them: [T, k_span] int8 from each token's base address.
    rows = (ins.act_addr + np.arange(T) * ins.act_stride) * beat
    a = act[(rows[:, None] + np.arange(k_span)[None, :]) % act.size].view(np.int8)
    # Dense integer weights over the span (kept values at their positions), then exact BLAS.
    # bincount sums repeated positions (possible in arbitrary streams) like the array does.
    flat = (np.arange(lanes)[:, None] * k_span + pos).ravel()
    w = np.bincount(flat, weights=w_eff.ravel().astype(np.float64),
                    minlength=lanes * k_span).reshape(lanes, k_span)
    acc = (a.astype(np.float64) @ w.T).astype(np.int64)
    if ins.accumulate:
        acc += st.acc[:T]
    st.acc[:T] = wrap(acc, cfg.acc_bits)
    _epilogue(st, ins)


def _epilogue(st: MachineState, ins: Gemm) -> None:
    cfg = st.cfg
    beat, lanes, T = cfg.beat_bytes, cfg.lanes, ins.tokens
    out = st.spads[Spad.OUT]
    base = ins.out_addr * beat
    acc = st.acc[:T]
    if ins.epilogue == EpilogueMode.NONE:
        return
    if ins.epilogue == EpilogueMode.WIDE:
        data = acc.astype("<i4").view(np.uint8).reshape(-1)  # int32 little-endian per lane
    elif ins.epilogue == EpilogueMode.WIDE_BIAS:
        n = bias_row_bytes(cfg)
        bias = _read_wrapped(st.spads[Spad.PARAM], ins.param_addr * beat, T * n).view("<i4")
        data = add_bias_wide(acc, bias.reshape(T, lanes)).view(np.uint8).reshape(-1)
    else:
        param = st.spads[Spad.PARAM]
        pbase = ins.param_addr * beat
        mult = _read_wrapped(param, pbase, 2 * lanes).view("<u2")
        res = None
        if ins.epilogue == EpilogueMode.INT8_RESIDUAL:
            res = _read_wrapped(param, pbase + 2 * lanes, T * lanes).view(np.int8)
            res = res.reshape(T, lanes)
        data = requantize_int8(acc, mult, ins.shift, res).view(np.uint8).reshape(-1)
    out[(base + np.arange(data.size)) % out.size] = data
