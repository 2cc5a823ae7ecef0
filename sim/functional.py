"""Functional semantics of every instruction on byte-exact machine state (values, no timing).

This is what each instruction *does* to DRAM, the scratchpads and the accumulators; the RTL
must produce the same bytes. The fast model (:mod:`sim.model`) pairs it with the timing of
:mod:`hw.timing`. Arithmetic comes from :mod:`hw.numerics`; bit layouts from :mod:`hw.format` and
:mod:`hw.isa`. Scratchpad accesses wrap around modulo the scratchpad size (the hardware does
not check GEMM extents; :func:`hw.isa.check` rejects such programs before they get here).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from hw.config import AcceleratorConfig
from hw.engines import OPS
from hw.errors import ContractError
from hw.format import _unpack_fields
from hw.isa import (
    MOVE_SOURCES,
    EpilogueMode,
    Gemm,
    Instr,
    Load,
    Opcode,
    Spad,
    Store,
    Vec,
    VecFunc,
    argmax_base,
    argmax_pairs,
    bias_row_bytes,
    dequant_amax_addr,
    dequant_fold,
    gemm_geometry,
    insert_geometry,
    kv4_group,
    rope_geometry,
)
from hw.numerics import (
    add_bias_wide,
    fold_amax_fields,
    fold_amax_word,
    requantize_int8,
    vec_add,
    vec_argmax_words,
    vec_channel,
    vec_dequant,
    vec_fold,
    vec_insert,
    vec_insert4,
    vec_kv4,
    vec_mul,
    vec_requant,
    vec_rmsnorm,
    vec_rope_pairs,
    vec_silu_gate,
    vec_softmax,
    wrap,
)

__all__ = ["MachineState", "WeightCache", "Step", "prepare", "exec_load", "exec_store",
           "exec_gemm", "exec_vec", "decode_gemm_weights"]

#: float64 represents every integer of magnitude below 2**53 exactly.
F64_EXACT = 1 << 53


#: The configuration field of each scratchpad's size.
_SPAD_BYTES = {sp: f"{sp.name.lower()}_spad_bytes" for sp in Spad}
#: Indices of the scratchpads in ``MachineState.spad_arrays``.
_ACT, _WGT, _OUT, _PARAM = Spad.ACT.value, Spad.WGT.value, Spad.OUT.value, Spad.PARAM.value
_VIN, _VOUT = Spad.VIN.value, Spad.VOUT.value


@dataclass
class MachineState:
    """DRAM, scratchpads and accumulator files of one accelerator, as bytes / integers."""

    cfg: AcceleratorConfig
    dram: np.ndarray = None
    spads: Mapping[Spad, np.ndarray] = field(default_factory=dict)
    acc: np.ndarray = None  # int64 [max_tokens, lanes]
    #: Decoded weight streams shared across runs (:class:`WeightCache`), or None.
    weights: WeightCache | None = None

    def __post_init__(self):
        cfg = self.cfg
        if self.dram is None:
            self.dram = np.zeros(cfg.memory.size_bytes, dtype=np.uint8)
        if self.dram.dtype != np.uint8 or self.dram.shape != (cfg.memory.size_bytes,):
            raise ValueError(f"DRAM image must be uint8[{cfg.memory.size_bytes}], got "
                             f"{self.dram.dtype}{list(self.dram.shape)}")
        spads = dict(self.spads)
        for sp, size in _SPAD_BYTES.items():
            if sp not in spads:
                spads[sp] = np.zeros(getattr(cfg, size), dtype=np.uint8)
        # Fixed from here on (their bytes are written, the arrays are not replaced), so that
        # the steps can index them by value: an enum key costs a Python-level hash per lookup.
        self.spads = MappingProxyType(spads)
        #: The arrays of ``spads`` by ``Spad`` value.
        self.spad_arrays = tuple(spads[Spad(v)] for v in range(len(Spad)))
        if self.acc is None:
            self.acc = np.zeros((cfg.max_tokens, cfg.lanes), dtype=np.int64)
        if self.weights is not None and self.weights.cfg is not cfg and self.weights.cfg != cfg:
            raise ValueError("the weight cache belongs to another accelerator configuration")


class WeightCache:
    """Decoded weight streams, keyed by their exact bytes: a stream read again is decoded once.

    A GEMM's weights are a function of its stream's bytes in the WGT scratchpad and of the
    instruction fields that set the stream's geometry (``k_steps``, ``group_steps``,
    ``pattern``, ``int8``, ``asym``; the configuration is fixed per cache). The key is those
    fields *and the bytes themselves*: a dictionary hit compares the stored bytes with the
    stream's byte for byte (after a hash of them), so an entry is served only for exactly the
    bytes it was decoded from. The cache can therefore never be stale, whoever wrote the memory
    the stream came from -- the host between programs (the KV cache, a new weight image), a
    STORE, a LOAD of other bytes into the same scratchpad slot -- with no invalidation to get
    right: a stream whose bytes changed is a miss and is decoded again. The price per GEMM is a
    copy of the stream and a hash of it (a few GB/s) or, for a GEMM that streams the bytes of
    its previous lookup again (:meth:`lookup`), a comparison with them, against decoding it
    (bit unpacking, lookup tables and a scatter into the dense matrix, about a hundred times
    slower).

    Entries are the dense ``float64 [lanes, k_span]`` matrices :func:`exec_gemm` multiplies
    (read-only), with ``k_span`` and the largest weight magnitude; the least recently used are
    dropped beyond ``max_bytes`` (keys included).
    """

    def __init__(self, cfg: AcceleratorConfig, max_bytes: int = 2 << 30):
        self.cfg, self.max_bytes = cfg, max_bytes
        self._entries: OrderedDict[tuple, tuple[np.ndarray, int, int]] = OrderedDict()
        self.nbytes = self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def dense(self, ins: Gemm, stream: np.ndarray) -> tuple[np.ndarray, int, int]:
        """``(w, k_span, w_max)`` of ``ins`` for its stream bytes (see :func:`_dense`)."""
        return self.lookup(ins, stream, _stream_fields(ins), None)[0]

    def lookup(self, ins: Gemm, stream: np.ndarray, fields: tuple, last: tuple | None
               ) -> tuple[tuple[np.ndarray, int, int], tuple]:
        """:meth:`dense` and the entry's key, for a caller that keeps the key of its previous
        lookup (``last``, None at first; ``fields``: ``_stream_fields(ins)``).

        When the stream's bytes equal those of ``last`` (one comparison of the bytes), the
        lookup goes by ``last`` itself, whose bytes object keeps the hash computed when it
        was stored: a GEMM that streams what it streamed before is found without hashing its
        bytes again. Either way the entry served is the one of exactly these bytes.
        """
        data = stream.tobytes()
        if last is not None and last[-1] == data and last[:-1] == fields:
            key = last
        else:
            key = (*fields, data)
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return hit, key
        self.misses += 1
        entry = _dense(ins, self.cfg, stream)
        size = entry[0].nbytes + len(data)
        if size <= self.max_bytes:
            entry[0].flags.writeable = False
            self._entries[key] = entry
            self.nbytes += size
            while self.nbytes > self.max_bytes:
                k, (w, _, _) = self._entries.popitem(last=False)
                self.nbytes -= w.nbytes + len(k[-1])
        return entry, key


def _dram_rows(st: MachineState, ins: Load | Store) -> np.ndarray | None:
    """The DRAM rows a LOAD or STORE moves, ``[rows, row bytes]``: a strided view of the
    image when they lie inside it, else (the index arithmetic's IndexError is the behaviour
    then) a gathered copy for a LOAD and None for a STORE."""
    beat = st.cfg.beat_bytes
    row = ins.row_beats * beat
    first, step = ins.dram_addr * beat, ins.dram_stride * beat
    last = first + (ins.rows - 1) * step + row  # one past the last byte of the last row
    # a STORE's rows must not overlap (the gather's order of writes decides then)
    disjoint = isinstance(ins, Load) or ins.rows == 1 or step >= row
    if (ins.rows > 0 and row > 0 and last <= st.dram.size and disjoint
            and st.dram.flags.c_contiguous):
        if step == row or ins.rows == 1:  # one contiguous run
            return st.dram[first:first + ins.rows * row].reshape(ins.rows, row)
        return np.lib.stride_tricks.as_strided(st.dram[first:], shape=(ins.rows, row),
                                               strides=(step, 1), writeable=True)
    if isinstance(ins, Store):
        return None
    starts = (ins.dram_addr + np.arange(ins.rows) * ins.dram_stride) * beat
    return st.dram[(starts[:, None] + np.arange(row)[None, :]).reshape(-1)].reshape(ins.rows,
                                                                                    row)


#: One instruction's semantics, prepared for its fields: applies it to a machine state.
Step = Callable[[MachineState], None]


def prepare(ins: Instr, cfg: AcceleratorConfig) -> Step | None:
    """The semantics of ``ins`` as a function of the machine state (None for an instruction
    that moves no data: SYNC, END).

    What depends on the instruction alone -- its stream geometry, the address arithmetic,
    which of the copies below applies -- is worked out here, once; what depends on the state
    (bytes, sizes) is read when the step runs. :func:`exec_load`, :func:`exec_store` and
    :func:`exec_gemm` are a step prepared and applied once: the one implementation of the
    semantics, which the fast model runs with a program's steps prepared once per program
    (:class:`sim.model.FastModel`). Every opcode of :data:`hw.engines.OPS` that is not
    ``sync`` has its semantics in ``_PREPARE``.
    """
    make = _PREPARE.get(ins.opcode)
    return None if make is None else make(ins, cfg)


def _dram_run(ins: Load | Store, cfg: AcceleratorConfig) -> tuple[int, int] | None:
    """``(first, end)`` DRAM bytes of a LOAD's or STORE's rows when they form one contiguous
    run inside the memory (``rows`` back to back, or one row): the bytes :func:`_dram_rows`
    moves, as one slice; None otherwise."""
    beat = cfg.beat_bytes
    row = ins.row_beats * beat
    first = ins.dram_addr * beat
    end = first + ins.rows * row
    if (ins.rows > 0 and row > 0 and (ins.dram_stride * beat == row or ins.rows == 1)
            and end <= cfg.memory.size_bytes):
        return first, end
    return None


def _prepare_load(ins: Load, cfg: AcceleratorConfig) -> Step:
    beat = cfg.beat_bytes
    k, dst = ins.spad.value, ins.spad_addr * beat
    run = _dram_run(ins, cfg)
    if run is not None:
        first, end = run
        stop = dst + end - first

        def load_run(st: MachineState) -> None:
            st.spad_arrays[k][dst:stop] = st.dram[first:end]
        return load_run

    def load(st: MachineState) -> None:
        src = _dram_rows(st, ins).reshape(-1)
        st.spad_arrays[k][dst:dst + src.size] = src
    return load


def exec_load(st: MachineState, ins: Load) -> None:
    """DRAM rows -> contiguous scratchpad beats."""
    _prepare_load(ins, st.cfg)(st)


def _prepare_move(ins: Store, cfg: AcceleratorConfig) -> Step:
    """A move (:data:`hw.isa.MOVE_SOURCES`): contiguous beats of its source (VOUT, or OUT)
    from ``spad_addr`` into VIN rows from ``dram_addr``, ``dram_stride`` beats apart, each row
    written after the one before (overlapping rows: the later one's bytes)."""
    k = MOVE_SOURCES[ins.spad].value
    beat = cfg.beat_bytes
    row = ins.row_beats * beat
    src = ins.spad_addr * beat
    starts = [(ins.dram_addr + r * ins.dram_stride) * beat for r in range(ins.rows)]

    def move(st: MachineState) -> None:
        data = st.spad_arrays[k][src:src + ins.rows * row].copy()
        vin = st.spad_arrays[_VIN]
        for r, start in enumerate(starts):
            vin[start:start + row] = data[r * row:(r + 1) * row]
    return move


def _prepare_store(ins: Store, cfg: AcceleratorConfig) -> Step:
    if ins.spad in MOVE_SOURCES:
        return _prepare_move(ins, cfg)
    beat = cfg.beat_bytes
    row = ins.row_beats * beat
    k, src, n = ins.spad.value, ins.spad_addr * beat, ins.rows * row
    run = _dram_run(ins, cfg)

    def store(st: MachineState) -> None:
        data = st.spad_arrays[k][src:src + n]
        if run is not None and data.size == n:
            st.dram[run[0]:run[1]] = data
            return
        rows = _dram_rows(st, ins)
        if rows is not None and rows.size == data.size:
            rows[...] = data.reshape(rows.shape)
        else:
            starts = (ins.dram_addr + np.arange(ins.rows) * ins.dram_stride) * beat
            st.dram[(starts[:, None] + np.arange(row)[None, :]).reshape(-1)] = data
    return store


def exec_store(st: MachineState, ins: Store) -> None:
    """Contiguous OUT (VOUT) beats -> DRAM rows; a move's VOUT (OUT) beats -> VIN rows."""
    _prepare_store(ins, st.cfg)(st)


def _read_wrapped(buf: np.ndarray, start: int, n: int) -> np.ndarray:
    """``n`` bytes of a scratchpad from ``start``, wrapping around its end (read-only)."""
    if 0 <= start and start + n <= buf.size:
        return buf[start:start + n]
    return buf[(start + np.arange(n)) % buf.size]


def _write_wrapped(buf: np.ndarray, start: int, data: np.ndarray) -> None:
    """``data`` into a scratchpad from ``start``, wrapping around its end."""
    if 0 <= start and start + data.size <= buf.size:
        buf[start:start + data.size] = data
    else:
        buf[(start + np.arange(data.size)) % buf.size] = data


def decode_gemm_weights(ins: Gemm, cfg: AcceleratorConfig, wgt: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Decode the weight stream of a GEMM instruction as the decoder does.

    Returns
    -------
    w_eff, pos:
        ``int32 [lanes, k_steps]`` dequantised integer weights ``code * (q - zero)`` and the
        activation offset ``block * block_size + index`` each step selects.
    """
    return _decode_stream(ins, cfg, _stream_bytes(ins, cfg, wgt))


def _stream_bytes(ins: Gemm, cfg: AcceleratorConfig, wgt: np.ndarray) -> np.ndarray:
    """The GEMM's weight stream as one contiguous byte run (wrapping around the spad)."""
    return _stream_slice(wgt, ins.wgt_addr * cfg.beat_bytes, gemm_geometry(ins, cfg).total_bytes)


def _stream_slice(wgt: np.ndarray, base: int, total: int) -> np.ndarray:
    """``total`` bytes of the WGT scratchpad from ``base``, wrapping around its end."""
    if base + total <= wgt.size:
        return wgt[base:base + total]
    return np.take(wgt, np.arange(base, base + total), mode="wrap")


def _stream_fields(ins: Gemm) -> tuple:
    """The fields besides its bytes that decide how a GEMM's weight stream decodes (the
    configuration aside)."""
    return ins.k_steps, ins.group_steps, ins.pattern, ins.int8, ins.asym


def _decode_stream(ins: Gemm, cfg: AcceleratorConfig, stream: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`decode_gemm_weights` of the stream's bytes (:func:`_stream_bytes`)."""
    lanes = cfg.lanes
    pat = cfg.pattern_table[ins.pattern]
    geo = gemm_geometry(ins, cfg)
    bits, fbits, rec = geo.value_bits, geo.field_bits, geo.record_bytes
    S, gs, n_groups = ins.k_steps, geo.group_len, geo.groups
    hb, group_bytes, total = geo.header_bytes, geo.group_bytes, geo.total_bytes
    # Padded to whole groups so it reshapes into [group, header + records] without per-byte
    # index arithmetic.
    buf = np.concatenate([stream, np.zeros(n_groups * group_bytes - total, np.uint8)])
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


def _dense(ins: Gemm, cfg: AcceleratorConfig, stream: np.ndarray
           ) -> tuple[np.ndarray, int, int]:
    """The GEMM's weights as a dense ``float64 [lanes, k_span]`` matrix (kept values at their
    activation offsets, zeros elsewhere), ``k_span`` and ``max |w|``.

    ``bincount`` sums repeated positions (possible in arbitrary streams) like the array does;
    its float64 sums are exact: each is at most ``k_steps`` values ``code * (q - zero)`` of
    well under 2**31 each (8-bit codes, 8-bit values), far below 2**53.
    """
    lanes = cfg.lanes
    w_eff, pos = _decode_stream(ins, cfg, stream)
    if cfg.pattern_table[ins.pattern].dense and pos.size:
        # step s selects position s: every position holds exactly one value, which is what
        # the scatter below computes (0.0 + x == x), without the scatter
        w = np.ascontiguousarray(w_eff, dtype=np.float64)
        k_span = w.shape[1]
    else:
        k_span = int(pos.max()) + 1
        flat = (np.arange(lanes)[:, None] * k_span + pos).ravel()
        w = np.bincount(flat, weights=w_eff.ravel().astype(np.float64),
                        minlength=lanes * k_span).reshape(lanes, k_span)
    return w, k_span, int(np.abs(w).max()) if w.size else 0


def _prepare_gemm(ins: Gemm, cfg: AcceleratorConfig) -> Step:
    """:func:`exec_gemm` of ``ins``, prepared.

    The products are exact integers whatever the BLAS build, its blocking or thread count: the
    activations are int8 (``|a| <= 128``), so every partial sum of a dot product over ``k_span``
    positions is an integer of magnitude at most ``bound = k_span * 128 * max|w|``; below 2**53
    each is a float64 exactly, in any summation order, and float64 BLAS gives the exact sum.
    Otherwise (no legal stream comes near) the product is taken in int64, exact modulo 2**64,
    which the accumulator's wrap to ``acc_bits <= 64`` bits does not see. A product that does
    not accumulate and whose ``bound`` is below ``2**(acc_bits - 1)`` lies in the wrap's range
    already (``-2**(acc_bits-1) < -bound <= acc <= bound``): the wrap is the identity there and
    is skipped, and the exact float64 integers go into the int64 accumulators by the
    assignment's cast (exact for integers below 2**53).
    """
    beat, T = cfg.beat_bytes, ins.tokens
    fields = _stream_fields(ins)
    w0, total = ins.wgt_addr * beat, gemm_geometry(ins, cfg).total_bytes
    a0, astep = ins.act_addr * beat, ins.act_stride * beat
    starts = a0 + np.arange(T) * astep
    accumulate, acc_bits = ins.accumulate, cfg.acc_bits
    half = 1 << (acc_bits - 1)
    epilogue = _prepare_epilogue(ins, cfg)

    def act_rows(act: np.ndarray, k_span: int) -> np.ndarray:
        """Activation rows as the array sees them: ``int8 [T, k_span]`` from each token's base
        address, wrapping around the ACT scratchpad (slices where they do not wrap)."""
        if T == 1 and a0 + k_span <= act.size:
            return act[a0:a0 + k_span].view(np.int8)[None, :]
        if astep >= k_span and a0 + T * astep <= act.size:
            return act[a0:a0 + T * astep].reshape(T, astep)[:, :k_span].view(np.int8)
        return act[(starts[:, None] + np.arange(k_span)[None, :]) % act.size].view(np.int8)

    last = None  # the weight cache's key of the previous run's stream

    def gemm(st: MachineState) -> None:
        nonlocal last
        stream = _stream_slice(st.spad_arrays[_WGT], w0, total)
        if st.weights is not None:
            (w, k_span, w_max), last = st.weights.lookup(ins, stream, fields, last)
        else:
            w, k_span, w_max = _dense(ins, cfg, stream)
        a = act_rows(st.spad_arrays[_ACT], k_span)
        bound = k_span * 128 * w_max
        if bound < F64_EXACT:
            prod = a.astype(np.float64) @ w.T
        else:
            prod = a.astype(np.int64) @ w.astype(np.int64).T
        if not accumulate and bound < half:  # integers in the wrap's range: cast exactly
            st.acc[:T] = prod
        else:
            acc = np.asarray(prod, dtype=np.int64)
            if accumulate:
                acc = acc + st.acc[:T]
            st.acc[:T] = wrap(acc, acc_bits)
        if epilogue is not None:
            epilogue(st)
    return gemm


def exec_gemm(st: MachineState, ins: Gemm) -> None:
    """Stream the weights against ``tokens`` activation rows, then run the epilogue
    (exactness: :func:`_prepare_gemm`)."""
    _prepare_gemm(ins, st.cfg)(st)


def _prepare_epilogue(ins: Gemm, cfg: AcceleratorConfig) -> Step | None:
    """The epilogue of ``ins``: accumulators -> OUT (None for ``EpilogueMode.NONE``)."""
    beat, lanes, T = cfg.beat_bytes, cfg.lanes, ins.tokens
    base, pbase, mode = ins.out_addr * beat, ins.param_addr * beat, ins.epilogue
    if mode == EpilogueMode.NONE:
        return None
    if mode == EpilogueMode.WIDE:
        def wide(st: MachineState) -> None:  # int32 little-endian per lane
            _write_wrapped(st.spad_arrays[_OUT], base,
                           st.acc[:T].astype("<i4").view(np.uint8).reshape(-1))
        return wide

    def epilogue(st: MachineState) -> None:
        acc, param = st.acc[:T], st.spad_arrays[_PARAM]
        if mode == EpilogueMode.WIDE_BIAS:
            bias = _read_wrapped(param, pbase, T * bias_row_bytes(cfg)).view("<i4")
            data = add_bias_wide(acc, bias.reshape(T, lanes)).view(np.uint8).reshape(-1)
        else:
            mult = _read_wrapped(param, pbase, 2 * lanes).view("<u2")
            res = None
            if mode == EpilogueMode.INT8_RESIDUAL:
                res = _read_wrapped(param, pbase + 2 * lanes, T * lanes).view(np.int8)
                res = res.reshape(T, lanes)
            data = requantize_int8(acc, mult, ins.shift, res).view(np.uint8).reshape(-1)
        _write_wrapped(st.spad_arrays[_OUT], base, data)
    return epilogue


def _epilogue(st: MachineState, ins: Gemm) -> None:
    step = _prepare_epilogue(ins, st.cfg)
    if step is not None:
        step(st)


#: The two-operand elementwise sub-ops: ``a`` and ``b`` rows in, one row out.
_VEC_ELEMENTWISE = {VecFunc.ADD: vec_add, VecFunc.MUL: vec_mul,
                    VecFunc.SILU_GATE: vec_silu_gate}


def _prepare_vec(ins: Vec, cfg: AcceleratorConfig) -> Step:
    """:func:`exec_vec` of ``ins``, prepared. VIN and VOUT hold little-endian int32 elements;
    addresses count elements. The arithmetic is :mod:`hw.numerics`' (int64 in, int32 out:
    every result fits, the sums saturated to 32 bits, the index below 2**16)."""
    n, a0, b0, d0 = ins.length, 4 * ins.a_addr, 4 * ins.b_addr, 4 * ins.dst_addr

    def row(st: MachineState, start: int) -> np.ndarray:
        return st.spad_arrays[_VIN][start:start + 4 * n].view("<i4").astype(np.int64)

    def put(st: MachineState, values: np.ndarray) -> None:
        data = np.asarray(values, dtype=np.int64).astype("<i4").view(np.uint8)
        st.spad_arrays[_VOUT][d0:d0 + data.size] = data

    if ins.func in _VEC_ELEMENTWISE:
        fn = _VEC_ELEMENTWISE[ins.func]

        def elementwise(st: MachineState) -> None:
            put(st, fn(row(st, a0), row(st, b0)))
        return elementwise
    if ins.func in (VecFunc.REQUANT, VecFunc.FOLD):
        fold = ins.func == VecFunc.FOLD

        def requant(st: MachineState) -> None:
            if fold:   # the products a * c, then their amax as a word (fold_amax_word)
                codes, amax = vec_fold(row(st, a0), row(st, b0))
                amax = fold_amax_word(amax)
            else:
                codes, amax = vec_requant(row(st, a0))
            data = np.zeros(-(-n // 4) * 4 + 4, dtype=np.uint8)   # codes, padding, amax
            data[:n] = codes.view(np.uint8)
            data[-4:] = np.array([amax], dtype="<u4").view(np.uint8)
            st.spad_arrays[_VOUT][d0:d0 + data.size] = data
        return requant
    if ins.func == VecFunc.SOFTMAX:
        valid = np.arange(n) < ins.imm

        def softmax(st: MachineState) -> None:
            put(st, vec_softmax(row(st, a0)[None], valid[None])[0])
        return softmax
    if ins.func == VecFunc.RMSNORM:
        def rmsnorm(st: MachineState) -> None:
            put(st, vec_rmsnorm(row(st, a0)[None], row(st, b0), ins.imm)[0])
        return rmsnorm
    if ins.func == VecFunc.ROPE:
        head_dim = int(rope_geometry(ins.imm)[0])   # the table: head_dim / 2 words at b_addr
        t1 = b0 + 2 * head_dim

        def rope(st: MachineState) -> None:
            table = st.spad_arrays[_VIN][b0:t1].view("<i4").astype(np.int64)
            put(st, vec_rope_pairs(row(st, a0), table, head_dim))
        return rope
    if ins.func == VecFunc.INSERT:
        geometry = tuple(int(v) for v in insert_geometry(ins.imm))

        def insert(st: MachineState) -> None:
            put(st, vec_insert(row(st, a0), row(st, b0), *geometry))
        return insert
    if ins.func == VecFunc.INSERT4:
        geometry = tuple(int(v) for v in insert_geometry(ins.imm))

        def insert4(st: MachineState) -> None:
            put(st, vec_insert4(row(st, a0), row(st, b0), *geometry))
        return insert4
    if ins.func == VecFunc.KV4:   # nibbles, the group codes, amax (hw.numerics.kv4_words)
        group = kv4_group(ins.imm)

        def kv4(st: MachineState) -> None:
            put(st, vec_kv4(row(st, a0), group))
        return kv4
    if ins.func == VecFunc.DEQUANT:   # the amax word at imm, unsigned; FOLD's: two fields
        m0, fold = 4 * dequant_amax_addr(ins.imm), dequant_fold(ins.imm)

        def dequant(st: MachineState) -> None:
            amax = st.spad_arrays[_VIN][m0:m0 + 4].view("<u4").astype(np.int64)[0]
            amax, shift = fold_amax_fields(amax) if fold else (amax, 0)
            put(st, vec_dequant(row(st, a0), row(st, b0) & 0xFFFFFFFF, amax, shift))
        return dequant
    if ins.func == VecFunc.CHANNEL:   # amax words (unsigned) times imm's channel word

        def channel(st: MachineState) -> None:
            put(st, vec_channel(row(st, a0) & 0xFFFFFFFF, ins.imm))
        return channel

    base, pairs = int(argmax_base(ins.imm)), bool(argmax_pairs(ins.imm))

    def argmax(st: MachineState) -> None:
        put(st, vec_argmax_words(row(st, a0), base, pairs))
    return argmax


def exec_vec(st: MachineState, ins: Vec) -> None:
    """One vector-engine pass: VIN rows -> VOUT (:class:`hw.isa.VecFunc`)."""
    _prepare_vec(ins, st.cfg)(st)


#: The semantics of every opcode that moves data (:data:`hw.engines.OPS`, all but the ``sync``
#: ones), as a function ``(ins, cfg) -> Step``.
_PREPARE: dict[Opcode, Callable[[Instr, AcceleratorConfig], Step]] = {
    Opcode.LOAD: _prepare_load,
    Opcode.STORE: _prepare_store,
    Opcode.GEMM: _prepare_gemm,
    Opcode.VEC: _prepare_vec,
}
if set(_PREPARE) != {op.opcode for op in OPS if not op.sync}:
    raise ContractError(f"sim.functional has semantics for {sorted(o.name for o in _PREPARE)}, "
                        f"hw.engines.OPS moves data with "
                        f"{sorted(op.opcode.name for op in OPS if not op.sync)}")
