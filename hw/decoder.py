"""Weight-stream decoder: the "gearbox" that turns WGT scratchpad words into per-lane weights.

The stream (hw/format.py) is, per group, ``[codes word] [zeros word, asymmetric only]`` and then
one step record per step; a record holds one ``bits + index_bits`` field per lane, lane 0 in the
least significant bits. Records and header words are multiples of ``lanes`` bits (``lanes`` is a
multiple of 8), so the decoder works in **chunks** of ``lanes`` bits: a WGT word (``lanes``
bytes) is 8 chunks, a header word 8 chunks, a record ``field_bits`` chunks (4 to 8).

The decoder keeps a window of two consecutive words and a chunk pointer ``p`` (0..7). An
operation reads the 8 chunks starting at ``p`` -- an 8-way rotator, three 2:1 levels whatever
the lane count -- and consumes 8 (header) or ``field_bits`` (record) chunks. When the pointer
passes the end of the first word, the window shifts by one word and the next word, already
read, enters it; the read port address is chosen one cycle ahead so its data is always the word
after the window. One word is read per cycle at most, and an operation consumes at most one, so
any mix of operations runs at one per cycle::

    cycle x     op registered
    cycle x+1   rotate window by p -> R                          (pointer/window update)
    cycle x+2   CODES/ZEROS: header register <- R
                RECORD: extract the fields of R, Dequant stage 1 (q - zero)
    cycle x+3   Dequant stage 2 (code * diff)
    cycle x+4   w, idx, valid out

Reads wrap modulo the scratchpad depth. ``start`` (of the machine, hw/top.py "Reset") resets the
pointer, the fill count and the operation and valid registers, not the words and fields: a
stream refills the window before its first operation.

Also here: small helpers for the scratchpad port signatures and wrapping address arithmetic
shared by the compute engine.
"""

from __future__ import annotations

import functools
import operator

from amaranth import Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, enum, wiring
from amaranth.lib.memory import ReadPort, WritePort
from amaranth.lib.wiring import In, Out

from hw.config import AcceleratorConfig
from hw.dequant import Dequant, hi_product_shape
from hw.fanout import lane_groups, replica
from hw.isa import ErrorCode, Gemm, GemmBody, dispatch_error, gemm_geometry
from hw.pe import MULT_BITS, hi_slice_bits, index_bits

__all__ = [
    "SPADS", "WeightOp", "Decoder", "spad_depth", "spad_addr_width", "spad_word_bits",
    "spad_read_signature", "spad_write_signature", "beats_to_words", "wrap_add", "wrap_inc",
    "field_formats",
]

#: Scratchpad names, as in the ``AcceleratorConfig`` attributes ``<name>_spad_bytes``.
SPADS = ("act", "wgt", "out", "param")
#: Chunks per WGT word: a chunk is ``lanes`` bits, a word ``lanes`` bytes.
CHUNKS = 8


# ---------------------------------------------------------------------- scratchpad helpers
def _check_spad(name: str) -> None:
    if name not in SPADS:
        raise ValueError(f"scratchpad must be one of {SPADS}, got {name!r}")


def spad_depth(cfg: AcceleratorConfig, name: str) -> int:
    """Words in scratchpad ``name``."""
    _check_spad(name)
    return getattr(cfg, f"{name}_spad_bytes") // getattr(cfg, f"{name}_word_bytes")


def spad_addr_width(cfg: AcceleratorConfig, name: str) -> int:
    """Word address width of scratchpad ``name`` (as :class:`~amaranth.lib.memory.Memory`)."""
    return (spad_depth(cfg, name) - 1).bit_length()


def spad_word_bits(cfg: AcceleratorConfig, name: str) -> int:
    _check_spad(name)
    return 8 * getattr(cfg, f"{name}_word_bytes")


def spad_read_signature(cfg: AcceleratorConfig, name: str) -> ReadPort.Signature:
    """Signature of a read port of scratchpad ``name``: word address, ``unsigned`` word with byte
    ``i`` in bits ``8i..8i+7``. A reader declares ``In(spad_read_signature(...))``."""
    return ReadPort.Signature(addr_width=spad_addr_width(cfg, name),
                              shape=unsigned(spad_word_bits(cfg, name)))


def spad_write_signature(cfg: AcceleratorConfig, name: str) -> WritePort.Signature:
    """Signature of a full-word write port of scratchpad ``name``."""
    return WritePort.Signature(addr_width=spad_addr_width(cfg, name),
                               shape=unsigned(spad_word_bits(cfg, name)))


def beats_to_words(beats: Value, cfg: AcceleratorConfig, name: str) -> Value:
    """Word address of an ISA beat address in scratchpad ``name`` (exact for the aligned
    addresses :func:`hw.isa.dispatch_error` admits)."""
    word = getattr(cfg, f"{name}_word_bytes")
    beat = cfg.beat_bytes
    if word >= beat:
        return beats >> ((word // beat).bit_length() - 1)
    return beats << ((beat // word).bit_length() - 1)


def wrap_add(a: Value, b: Value, depth: int) -> Value:
    """``(a + b) % depth`` for ``a, b`` in ``[0, depth)``: a mask for a power of two, else one
    conditional subtraction."""
    width = (depth - 1).bit_length()
    if depth & (depth - 1) == 0:
        return (a + b)[:width]
    s = a + b
    return Mux(s >= depth, s - depth, s)[:width]


def wrap_inc(a: Value, depth: int) -> Value:
    """``(a + 1) % depth`` for ``a`` in ``[0, depth)``."""
    width = (depth - 1).bit_length()
    if depth & (depth - 1) == 0:
        return (a + 1)[:width]
    return Mux(a == depth - 1, 0, a + 1)[:width]


def field_formats(cfg: AcceleratorConfig) -> list[tuple[int, int]]:
    """Distinct ``(value_bits, index_bits)`` record field formats ``cfg`` can stream: the
    stream geometry (:func:`hw.isa.gemm_geometry`) of every pattern and weight width that the
    dispatch checks admit."""
    fmts = set()
    for pattern in range(len(cfg.pattern_table)):
        for int8 in (False, True):
            g = Gemm(pattern=pattern, int8=int8)
            if dispatch_error(g, cfg) != ErrorCode.BAD_GEMM:
                geo = gemm_geometry(g, cfg)
                fmts.add((geo.value_bits, geo.index_bits))
    return sorted(fmts)


class WeightOp(enum.Enum, shape=2):
    """What the decoder does with the window in one cycle."""

    NONE = 0
    CODES = 1   # consume a header word of scale codes
    ZEROS = 2   # consume a header word of zero points
    RECORD = 3  # consume one step record and emit its weights


class Decoder(wiring.Component):
    """Weight-stream decoder for ``cfg.lanes`` lanes.

    Protocol: a stream starts in cycle ``c``, the last cycle of ``idle``, with ``wgt_addr`` (ISA
    beats, word aligned); the window is full and operations may be issued from
    ``c + FIRST_OP``.
    ``ins`` must hold the instruction (pattern, int8, asym, group_steps) from ``c + 1`` on. A
    RECORD issued in cycle ``x`` with index offset ``sub`` appears on ``w``/``idx`` with
    ``valid`` in ``x + LATENCY`` (only then are ``w`` and ``idx`` meaningful).

    Parameters
    ----------
    cfg:
        The accelerator configuration.

    Members
    -------
    rd: In(spad_read_signature(cfg, "wgt"))
        WGT scratchpad read port (synchronous).
    wgt_addr: In(16)
        Start of the stream in beats (sampled in its first cycle).
    idle: In(1)
        No stream is running: high until a stream's first cycle ``c``, low from ``c + 1`` to
        the stream's last operation. While it is high the window is reset and the read port
        addresses ``wgt_addr``, in every cycle: the decoder has no start strobe, because the
        compute core's (the event grant's) comes late in its cycle.
    ins: In(GemmBody)
        The instruction being decoded (mode fields).
    op: In(WeightOp)
        Operation of this cycle.
    sub: In(index_bits(cfg))
        Offset of the step's M-block inside the activation word, OR-ed into every lane's index
        (RECORD only; for dense streams the step's position in the word).
    w: Out(data.ArrayLayout(signed(cfg.weight_operand_bits), cfg.lanes))
        Dequantised weights.
    idx: Out(data.ArrayLayout(index_bits(cfg), cfg.lanes))
        Activation index of each lane inside the activation word.
    valid: Out(1)
        ``w``/``idx`` hold a record this cycle.
    ext, ext_a, ext_b, ext_prod:
        The lanes' Dequant multipliers lent to the epilogue (:class:`hw.dequant.Dequant`):
        with ``ext`` high in cycle ``e``, ``ext_prod[l]`` in ``e + 2`` is
        ``ext_a[l] * ext_b[l]``. Only while no RECORD is in flight. ``ext`` has a bit per
        group of lanes (:func:`hw.fanout.lane_groups`), all equal.
    """

    #: Cycles from a stream's first cycle to its first operation.
    FIRST_OP = 2
    #: Cycles from a RECORD operation to its outputs.
    LATENCY = 2 + Dequant.LATENCY

    def __init__(self, cfg: AcceleratorConfig):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if cfg.wgt_word_bytes * 8 != CHUNKS * cfg.lanes:
            raise ValueError(f"WGT word of {cfg.wgt_word_bytes} bytes is not {CHUNKS} chunks of "
                             f"{cfg.lanes} bits")
        self._cfg = cfg
        super().__init__({
            "rd": In(spad_read_signature(cfg, "wgt")),
            "wgt_addr": In(GemmBody["wgt_addr"].shape),
            "idle": In(1),
            "ins": In(GemmBody),
            "op": In(WeightOp),
            "sub": In(index_bits(cfg)),
            "w": Out(data.ArrayLayout(signed(cfg.weight_operand_bits), cfg.lanes)),
            "idx": Out(data.ArrayLayout(index_bits(cfg), cfg.lanes)),
            "valid": Out(1),
            "ext": In(len(lane_groups(cfg.lanes))),
            "ext_a": In(data.ArrayLayout(signed(hi_slice_bits(cfg)), cfg.lanes)),
            "ext_b": In(data.ArrayLayout(MULT_BITS, cfg.lanes)),
            "ext_prod": Out(data.ArrayLayout(hi_product_shape(cfg), cfg.lanes)),
        })

    @property
    def cfg(self) -> AcceleratorConfig:
        return self._cfg

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        lanes = cfg.lanes
        depth = spad_depth(cfg, "wgt")
        wbits = spad_word_bits(cfg, "wgt")
        vmax = max(cfg.weight_bits)
        fmts = field_formats(cfg)
        ins = self.ins

        # ---- window: two words, chunk pointer, next-word read address --------------------------
        w0 = Signal(wbits, reset_less=True)
        w1 = Signal(wbits, reset_less=True)
        ra = Signal(range(depth))        # word whose data the read port returns this cycle

        # Field format of the instruction (one-hot over `fmts`), registered: it is constant while
        # the instruction runs and drives wide multiplexers.
        ib = Signal(range(5))
        with m.Switch(ins.pattern):
            for i, p in enumerate(cfg.pattern_table):
                with m.Case(i):
                    m.d.comb += ib.eq(p.index_bits)
        int8 = ins.int8 if 8 in cfg.weight_bits else Const(0)
        fmt = Cat(Mux(int8, vb == 8, (vb == 4) & (ib == xb)) for vb, xb in fmts)
        fmt_sel = Signal(len(fmts), reset_less=True)
        m.d.sync += fmt_sel.eq(fmt)
        fbits = Signal(range(CHUNKS + 1))  # chunks per record = field bits
        m.d.comb += fbits.eq(sum(Mux(fmt_sel[i], vb + xb, 0) for i, (vb, xb) in enumerate(fmts)))

        # Operations are registered on entry, with the chunks they consume: the window update
        # they drive (pointer, word shift of 2 x 8 x lanes bits, next read address) then starts
        # from registers, not from the sequencer.
        op = Signal(WeightOp)
        sub = Signal.like(self.sub, reset_less=True)
        m.d.sync += [op.eq(self.op), sub.eq(self.sub)]
        consume_now = Signal(range(CHUNKS + 1))
        with m.Switch(self.op):
            with m.Case(WeightOp.CODES, WeightOp.ZEROS):
                m.d.comb += consume_now.eq(CHUNKS)
            with m.Case(WeightOp.RECORD):
                m.d.comb += consume_now.eq(fbits)

        def wraps(p: Value) -> Value:
            """``p + consume_now >= CHUNKS`` for a pointer ``p < CHUNKS``: a header always
            wraps, a record by a test of registers, so the late operation picks a flag."""
            return (((self.op == WeightOp.CODES) | (self.op == WeightOp.ZEROS))
                    | (self.op == WeightOp.RECORD) & (p + fbits >= CHUNKS))

        def control(name: str) -> tuple[Signal, Signal]:
            """One copy of the window's control: the chunk pointer and the shift of this cycle.
            Every copy sees the same inputs, so all hold the same state; `keep` stops Yosys
            from merging them back into one (hw.fanout).

            The shift is ``fill != 0 | ptr + consume >= CHUNKS`` of this cycle's registers,
            computed from their next values a cycle ahead, so that it is a flip-flop: it
            selects the next read address, whose net reaches every block RAM of WGT."""
            ptr = Signal(range(CHUNKS), name=f"ptr{name}", attrs={"keep": 1})
            fill = Signal(range(3), name=f"fill{name}", attrs={"keep": 1})  # forced shifts
            consume = Signal(range(CHUNKS + 1), name=f"consume{name}", attrs={"keep": 1})
            shift = Signal(name=f"shift{name}", attrs={"keep": 1})
            m.d.sync += consume.eq(consume_now)
            nxt = Signal(range(2 * CHUNKS), name=f"nxt{name}")
            m.d.comb += nxt.eq(ptr + consume)
            with m.If(self.idle):
                m.d.sync += [fill.eq(2), ptr.eq(0), shift.eq(1)]
            with m.Elif(fill != 0):
                m.d.sync += [fill.eq(fill - 1),
                             shift.eq((fill != 1) | wraps(ptr))]
            with m.Else():
                m.d.sync += [ptr.eq(nxt % CHUNKS),
                             shift.eq(wraps(nxt % CHUNKS))]
            return ptr, shift

        # The window's lanes are independent: chunk c of lane l only ever moves to chunk c' of
        # lane l. So every group of lanes (hw.fanout.lane_groups) shifts and rotates its part
        # of the window under its own copy of the control, and the shift enables (2 x 8 x
        # lanes) and rotator selects (8 x lanes multiplexers) do not hang off one flip-flop.
        window = Cat(w0, w1)
        rot = Signal(wbits)
        shifts = []
        for g, ls in enumerate(lane_groups(lanes)):
            lo, hi = ls.start, ls.stop
            ptr_g, shift_g = control(f"_g{g}")
            shifts.append(shift_g)
            # Idle or not: the two forced shifts of a stream replace both words.
            with m.If(shift_g):
                for c in range(CHUNKS):
                    part = slice(c * lanes + lo, c * lanes + hi)
                    m.d.sync += [w0[part].eq(w1[part]), w1[part].eq(self.rd.data[part])]
            # ---- cycle x: rotate by the pointer
            with m.Switch(ptr_g):
                for k in range(CHUNKS):
                    with m.Case(k):
                        m.d.comb += [rot[c * lanes + lo:c * lanes + hi].eq(
                            window[(k + c) * lanes + lo:(k + c) * lanes + hi])
                            for c in range(CHUNKS)]

        # Idle, the port reads the next stream's first word whether or not it starts now: the
        # window is refilled after, so what it read before does not matter.
        # The word after `ra` is registered with it (no increment before the address).
        addr = Signal(range(depth))
        ra_inc = Signal(range(depth), reset_less=True)  # read after an idle cycle wrote it
        m.d.comb += addr.eq(Mux(self.idle, beats_to_words(self.wgt_addr, cfg, "wgt"),
                                Mux(shifts[0], ra_inc, ra)))  # group 0's
        m.d.comb += self.rd.addr.eq(addr)
        m.d.sync += [ra.eq(addr), ra_inc.eq(wrap_inc(addr, depth))]

        r = Signal(wbits, reset_less=True)
        r_op = Signal(WeightOp)
        r_sub = Signal.like(self.sub, reset_less=True)
        m.d.sync += [r.eq(rot), r_op.eq(op), r_sub.eq(sub)]
        # A copy of r per field width, each lane's field in it masked by "the instruction's
        # format has this width": a bit of r is a field of a different lane in every format,
        # lanes that sit apart, so each copy's bits feed one lane's extraction; with the mask
        # applied where the copy is written, a lane's number is an OR of its copies' bits
        # (the format's one-hot multiplexer is one LUT level from the copies, not five from a
        # format register: the default's critical path). Beside them, per lane and format, the
        # field's sign bit masked by "this format, two's complement": the extension bits.
        # The masks are registered per group of lanes from `fmt` (hw.fanout), one cycle behind
        # `ins` like the per-lane format below, and read a cycle earlier than it: the
        # instruction is in `ins` from a cycle before its first operation (FIRST_OP).
        widths = sorted({vb + xb for vb, xb in fmts})
        r_fb = {fb: Signal(lanes * fb, name=f"r_f{fb}", reset_less=True, attrs={"keep": 1})
                for fb in widths}
        r_sg = [Signal(lanes, name=f"r_sg{i}", reset_less=True, attrs={"keep": 1})
                for i in range(len(fmts))]
        for g, ls in enumerate(lane_groups(lanes)):
            w_sel = {fb: replica(m, Cat(fmt[i] for i, (vb, xb) in enumerate(fmts)
                                        if vb + xb == fb).any(), f"w{fb}_sel_g{g}")
                     for fb in widths}
            sx_sel = [replica(m, fmt[i] & ~ins.asym, f"sx{i}_sel_g{g}")
                      for i in range(len(fmts))]
            for l in ls:
                for fb in widths:
                    m.d.sync += r_fb[fb][l * fb:(l + 1) * fb].eq(
                        rot[l * fb:(l + 1) * fb] & w_sel[fb].replicate(fb))
                for i, (vb, xb) in enumerate(fmts):
                    fb = vb + xb
                    m.d.sync += r_sg[i][l].eq(rot[l * fb + vb - 1] & sx_sel[i])
        # What bit p of a width's field is in each format of that width: where the formats
        # agree, the masked copy's bit alone is the term; where they do not, the lane's format
        # bit qualifies it.
        roles: dict[tuple[int, int], set] = {}
        for vb, xb in fmts:
            for p_ in range(vb + xb):
                roles.setdefault((vb + xb, p_), set()).add(("v", p_) if p_ < vb else ("x", p_ - vb))

        # ---- cycle x+1: headers, or field extraction + dequant stage 1 ----------------------
        codes = Signal(data.ArrayLayout(cfg.scale_code_bits, lanes), reset_less=True)
        zeros = Signal(data.ArrayLayout(vmax, lanes), reset_less=True)
        # The header registers' enables come from a copy of r_op per group of lanes (16 a
        # lane). The copies are not reset: one left over from before the machine's `start`
        # loads a header that every group's own CODES/ZEROS replaces before a RECORD reads it.
        for g, ls in enumerate(lane_groups(lanes)):
            op_g = replica(m, op, f"r_op_g{g}")   # = r_op
            with m.If(op_g == WeightOp.CODES):
                m.d.sync += [codes[l].eq(r[8 * l:8 * l + cfg.scale_code_bits]) for l in ls]
            with m.If(op_g == WeightOp.ZEROS):
                m.d.sync += [zeros[l].eq(r[8 * l:8 * l + vmax]) for l in ls]

        e_idx = Signal(data.ArrayLayout(index_bits(cfg), lanes), reset_less=True)
        e_valid = Signal()
        m.d.sync += e_valid.eq(r_op == WeightOp.RECORD)
        # Every lane reads its own registered copies of the format and of the instruction's
        # flags (hw.fanout): they fan out to the lane's field multiplexers and Dequant unit.
        # One cycle behind `ins` is what the format register always was: the instruction is in
        # `ins` from before its first record's previous cycle until its last record has left
        # this stage (the stage reads `ins` combinationally nowhere any more).
        group_of = {l: g for g, ls in enumerate(lane_groups(lanes)) for l in ls}
        for l in range(lanes):
            m.submodules[f"dq{l}"] = dq = Dequant(cfg)
            q = Signal(signed(vmax + 1), name=f"q{l}")
            index = Signal(index_bits(cfg), name=f"index{l}")
            l_fmt = replica(m, fmt, f"fmt_l{l}")
            l_asym = replica(m, ins.asym, f"asym_l{l}")

            def bit(i: int, p_: int, l: int = l, l_fmt: Signal = l_fmt) -> tuple:
                """Bit ``p_`` of lane ``l``'s field in format ``i`` (0 in other formats), and
                a key that is the same for formats whose term is the same."""
                fb = sum(fmts[i])
                b = r_fb[fb][l * fb + p_]
                if len(roles[(fb, p_)]) == 1:
                    return ("width", fb, p_), b
                return ("format", i, p_), b & l_fmt[i]

            def any_of(terms: list[tuple]) -> Value:
                return functools.reduce(operator.or_, dict(terms).values(), Const(0))

            # The format is one-hot and every term is 0 outside its format: q is an OR.
            m.d.comb += q.eq(Cat(
                any_of([bit(i, j) if j < f[0] else (("sign", i), r_sg[i][l])
                        for i, f in enumerate(fmts)])
                for j in range(vmax + 1)))
            m.d.comb += index.eq(Cat(
                any_of([bit(i, f[0] + k) for i, f in enumerate(fmts) if f[1] > k])
                for k in range(index_bits(cfg))))
            m.d.comb += [
                dq.q.eq(q), dq.code.eq(codes[l]), dq.zero.eq(zeros[l]),
                dq.int8.eq(replica(m, int8, f"int8_l{l}")), dq.asym.eq(l_asym),
                dq.raw.eq(replica(m, ins.group_steps == 0, f"raw_l{l}")),
                self.w[l].eq(dq.w),
                dq.ext.eq(self.ext[group_of[l]]), dq.ext_a.eq(self.ext_a[l]),
                dq.ext_b.eq(self.ext_b[l]),
                self.ext_prod[l].eq(dq.prod),
            ]
            m.d.sync += e_idx[l].eq(index | r_sub)

        # ---- cycle x+2: Dequant stage 2; index and valid registered alongside ----------------
        m.d.sync += [self.idx.eq(e_idx), self.valid.eq(e_valid)]
        return m
