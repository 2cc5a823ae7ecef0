"""The vector engine's executor: VEC instructions over the VIN and VOUT scratchpads.

A VEC runs as one to three *passes* over its row of ``L = length`` elements, each streaming
the row (from ``a_addr``; ADD's second operand and RMSNORM's weight from ``b_addr`` beside it,
through VIN's second read port) through function units of :mod:`hw.vector`, one element per
cycle, the units' outputs never stalled. With the command transferred in cycle ``g`` (the
grant; :class:`hw.engine.EngineSequencer`):

read
    pass 1 reads element ``i`` in ``g + 1 + i``; a later pass starts the cycle after the
    per-row scalar it needs comes out of its unit (below) and reads one element per cycle;
unit
    each element is fed to its unit :data:`hw.timing.VEC_READ_LATENCY` cycles after its read
    (the scratchpad's read register, then one on the read data), with ``last`` on the row's
    final element; every unit takes what it is fed from a register,
    :data:`hw.timing.VEC_FEED_LATENCY` cycle later;
write
    the results go to VOUT from ``dst_addr``, one word per cycle as they come out.

=========  =================================================================================
ADD        ``Add(a, b)``, written as it comes out
ARGMAX     ``ArgMax``; its index plus imm's base and then its maximum written in two cycles;
           with imm's PAIRS bit only the odd positions' words enter, each tagged with the
           word before it, the tag the index (``hw.isa.argmax_imm``)
REQUANT    pass 1 ``AbsMax``; as ``amax`` comes out, ``s = bitlen(amax) - 31`` (0, or 1 for
           ``amax = 2**31``: bit 31) and ``Recip(amax >> s)``; pass 2 ``Requant(33)`` with
           ``r, sh, s``; codes packed four to a word (code ``i`` in byte ``i % 4``, a word
           written with its fourth code or the row's last, zeros above), then ``amax``
SOFTMAX    positions ``i >= imm`` are masked (``-ACT_MAX`` into Max, exponential 0);
           pass 1 ``Max``, ``m`` as it comes out; pass 2 ``Exp(16)(x, m)`` into
           ``Sum(unsigned(17))``; ``Recip`` of the sum; pass 3 ``Exp(16)(x, m)`` into
           ``Scale(16)`` with ``r, sh`` (the exponentials are computed again rather than kept)
MUL        ``Mul(16)(a, b)``, written as it comes out
SILU_GATE  one pass, each element ``g`` (with ``u`` from ``b_addr``) through ``Exp(30)(min(g,
           0), max(g, 0))``, ``Recip(2**30 + e)``, ``Scale(60)(1, r, sh)`` (the sigmoid of
           ``|g|``), ``Mul(30)(e, s)`` (the sigmoid of ``-|g|``, chosen for ``g < 0``),
           ``Mul(30)(g, sigmoid)`` and ``Mul(16)(silu, u)``, the operands carried beside
ROPE       ``Rope`` over ``imm``'s heads (:func:`hw.isa.rope_imm`), one pair ``k, k + d/2`` of
           a head after the other, two reads each: ``x[k]`` and ``x[k + d/2]`` on the two
           ports, then the table word ``k`` (``b_addr + k``: cos in its low half, sin in its
           high half, :func:`hw.numerics.rope_pairs`) on the first; element ``k`` enters the
           unit as the word arrives (``rot = -x[k + d/2]``, 33 bits), element ``k + d/2`` the
           cycle after (``rot = x[k]``, the word registered), each result written to its
           position as it comes out
RMSNORM    pass 1 ``AbsMax`` (pass 2 reads from the cycle after ``amax`` comes out), ``s =
           max(0, bitlen(amax) - 17)`` registered the cycle after and ``eps >> 2s`` the next
           (one stage each); pass 2 ``SumSq(x, s)``; ``Rsqrt`` of the sum plus ``eps >> 2s``
           (``r = 0`` for a sum of 0); pass 3 ``Scale(30)(x, r, sh + s)`` into ``Mul(30,
           b_bits=33)`` with the weight, read beside ``x`` and delayed by Scale's latency
DEQUANT    the ``amax`` word read from ``imm`` in ``g + 1`` (the command's ``a_addr`` stands
           aside for a cycle), ``A = amax`` (``127 * 2**16`` for 0) and ``b = bitlen(A)``
           registered as it comes (a FOLD word, imm's :data:`hw.isa.DEQUANT_FOLD_BIT`: ``A``
           its mantissa, its shift ``x`` registered beside); one pass from ``g + 2``, each
           accumulator's channel word (read beside it) through ``DequantFactor(c, A, b,
           x)``, the accumulator carried beside, into ``Scale(31)``, written as it comes out
FOLD       REQUANT of the products ``w = Mul(0, y54)(a, c)`` (``c`` from ``b_addr``), computed
           in both passes: pass 1 ``w`` into ``AbsMax``; ``amax`` (54 bits) and its shifts
           ``s = max(0, bitlen - 31)`` and ``max(0, bitlen - 27)`` registered as it comes out;
           the cycle after, ``Recip(amax >> s)`` and the amax word
           (:func:`hw.numerics.fold_amax_word`) registered;
           pass 2 ``w`` into ``Requant(54)`` with ``r, sh, s``; codes packed as REQUANT's, then
           the amax word
INSERT     one pass: the word read when ``idx`` is the next code's byte ``at`` over 4 (``at``
           from imm's ``base``, stepping ``+ stride``, or ``+ stride + skip`` after a group's
           last code: :func:`hw.isa.insert_imm`) takes that code, its code word read beside
           it from ``b_addr`` on the second port (stride 1: the whole code word); merged by
           byte multiplexers into a register and written the cycle after it arrives
INSERT4    INSERT in nibbles: ``at`` a nibble (the word read when ``idx`` is ``at`` over 8),
           eight codes to a code word, nibble multiplexers
CHANNEL    one pass, each element an amax word: ``A`` (``127 * 2**16`` for 0) and ``b =
           bitlen(A)`` into ``DequantFactor(c, A, b, 0)`` with ``c`` the channel word in
           ``imm``'s bits 0..23; the factor's channel word written as it comes out
KV4        REQUANT's pass 1, ``AbsMax`` and ``Recip(amax >> s)``; a key row's (``imm``'s codes
           bit) groups' maxima of ``|x|`` and ``|x >> 1|`` from AbsMax's of each cycle
           (``2 |x| + (x < 0)``: its signs), each group's kept in a memory the cycle after
           its end; from the cycle ``r`` comes out, one group a cycle:
           its maximum (for ``s``) into ``Mul(0)`` with ``r``; from the product ``p``, ``-255
           p``, its shift by ``sh``'s high bits and then the code ``c = clip(ceil(255 p /
           2**sh), 1, 255)`` registered, then
           the partial products of ``(amax >> s) * c`` (:data:`hw.timing.KV4_CODE_LATENCY`),
           and ``Recip((amax >> s) * c)``,
           each group's ``(r2, sh2)`` kept in a memory, its code packed four to a word in
           another; pass 2 from the cycle after the last reciprocal (a value row: after ``r``)
           ``Requant`` with 4-bit codes (factor 7 with ``r, sh``; a key row's 7 * 255 with its
           element's group's ``r2, sh2``, read beside the element); nibbles packed eight to a
           word, then the code words (read two cycles ahead, registered), then ``amax``
=========  =================================================================================

(:func:`hw.numerics.vec_add`, :func:`~hw.numerics.vec_argmax`,
:func:`~hw.numerics.vec_requant`, :func:`~hw.numerics.vec_softmax`,
:func:`~hw.numerics.vec_rmsnorm`, :func:`~hw.numerics.vec_rope_pairs`,
:func:`~hw.numerics.vec_dequant`, :func:`~hw.numerics.vec_fold`,
:func:`~hw.numerics.vec_insert`, :func:`~hw.numerics.vec_channel`,
:func:`~hw.numerics.vec_kv4`; the sequences are those
of :mod:`hw.vector`'s docstring.)
Lanes
    With ``n = cfg.vector_lanes > 1`` the VIN ports read, and the VOUT port writes, an aligned
    group of ``n`` elements (:class:`hw.spad.Scratchpad`'s ``core_lanes``; an enable per
    element on the write). A sub-op of :func:`hw.isa.laned_vec_funcs` (its rows aligned to
    ``n``: :func:`hw.isa.vec_unaligned`, a dispatch rule) reads a group a cycle per pass,
    ``ceil(L / n)`` reads; lane 0 goes to the units above and lane ``k`` to copies of ADD's,
    MUL's, RMSNORM's pass-3, DEQUANT's, FOLD's, SOFTMAX's (``Exp(16)``, ``Scale(16)``) and
    the codes' element units, side by side (``<name>_l<k>``). So does a KV4 of
    :func:`hw.isa.kv4_laned` (a value row, or a key row's groups of ``n`` elements or more:
    a cycle's elements lie in one group, whose maximum is AbsMax's of the cycle and whose
    ``r2, sh2`` every lane's ``Requant`` takes); its rows are aligned whatever its ``imm``.
    A ROPE of :func:`hw.isa.rope_laned` reads ``n`` pairs' lower and upper elements in one cycle and
    their table words in the next, each lane through its ``Rope`` (``k``, the pointers and
    the write positions step by ``n``; its rows are aligned whatever its ``imm``). With the
    configuration's ``vector_laned_rope_heads``, one whose heads a group holds whole
    (:func:`hw.isa.rope_heads_laned`, told from one over pairs by :func:`command_lanes`'
    ``writes_n``) reads a group of its row a cycle on the first port and its table's group
    (``b_addr``, held) beside it on the second: lane ``k``'s ``Rope`` takes its element as it
    arrives with lane ``k ^ d/2``'s (``rot``, negated where bit ``d/2`` of ``k`` is 0) and
    table word ``k mod d/2``, each through a multiplexer of the ``log2 n`` half heads
    (``imm``'s one-hot ``d/2``), its results written ``n`` a cycle. With the
    configuration's ``vector_laned_silu``, SILU_GATE's lane ``k`` goes to a copy of the
    SiLU-gate's chain (``Exp(30)``, a ``Recip`` of its own, ``Scale(60)``, the two
    ``Mul(30)``; lane 0's ``Recip`` is the per-row scalars' too). Lanes past a row's end
    read as 0, and SOFTMAX masks them as positions past
    ``imm`` (``-ACT_MAX`` into ``Max``, exponential 0). The reductions over a laned row,
    ``AbsMax`` (REQUANT, RMSNORM, FOLD), ``SumSq`` (RMSNORM), ``Max`` and ``Sum`` (SOFTMAX),
    take a cycle's ``n`` values through a tree of ``log2 n`` registered levels
    (:func:`hw.timing.vec_lane_tree`) into their running reduction; KV4's ``AbsMax`` too
    (a KV4 of one element a cycle, its lanes above 0 reading 0). ``Recip`` (but the
    SiLU-gate's lane copies), ``Rsqrt`` and the per-row scalars are single. The results are
    written ``n`` a cycle (the last group's lanes past the row's end kept), REQUANT's and
    FOLD's ``n`` codes a cycle packed as one lane's (``n < 4``: a word every ``4 / n``
    cycles; else ``n / 4`` words a cycle), a laned KV4's ``n`` nibbles alike (``n <= 8``: a
    word every ``8 / n`` cycles; else ``n / 8`` words a cycle). An INSERT or INSERT4 whose
    codes lie ``n`` words apart or more (:func:`hw.isa.insert_laned`: a key cache's append, a
    code a beat) reads a group a cycle too: ``idx`` counts groups, a group holds at most one
    code, merged into the lane of its word (``at``'s word bits below ``log2 n``); its code
    words are read one at a time as with one lane. The other sub-ops read one element a
    cycle, the lane of its address selected from the group read by address bits registered
    with the read (as the scratchpad selects its group in a row), and write it to the lane
    of its address (``dst`` steps by 1).

Shared units
    A VEC runs one sub-op at a time, so units no sub-op uses together share their
    multipliers (:data:`_SHARED`): each lane has one ``Mul`` for MUL's ``Mul(16)`` (and the
    SiLU-gate's last step), RMSNORM's ``Mul(30, b_bits=33)``, FOLD's ``Mul(0, y54)`` (and
    lane 0's KV4 group products) and ROPE's ``Rope`` (its two 32 x 16-bit products on the
    ``Mul``'s four multipliers), one ``Scale`` for SOFTMAX's ``Scale(16)``, RMSNORM's
    ``Scale(30)`` and DEQUANT's ``Scale(31)``, and lane 0 (and, with ``vector_laned_silu``,
    every lane) one ``Exp`` for SOFTMAX's ``Exp(16)`` and the SiLU-gate's ``Exp(30)``. Without
    ``vector_laned_silu``, lanes 1 and 2's ``Mul`` are idle while SILU_GATE runs: they take
    its two ``Mul(30)`` (:data:`_SILU_ON_LANES`, mode ``mul_w``). Each
    use feeds its unit with its mode (the unit's ``mode`` field: its rounding, its fraction
    bits) and its operands while its sub-op runs (the ``is_`` flag selects them in the feed
    register), and reads the unit's results only then; latencies and results are each
    use's own unit's. A unit may compute a second function on a port of its own
    (:data:`_PORTS`, :class:`hw.vector.base.UnitPort`), fed and read as a unit of its own at
    its own latency: lane 0's ``Recip`` is RMSNORM's ``Rsqrt``, the two sharing the
    normaliser and three multipliers (Rsqrt's results a stage later), and each lane's
    ``Scale`` its ``Requant(54)`` (REQUANT's, FOLD's and KV4's codes), whose 32 x 17-bit
    product is Scale's, on its two multipliers a stage behind a Scale element's.

``done`` pulses with the last VOUT write, in ``g + hw.timing.vec_cycles(ins, cfg)``, and the
engine takes the next command from the cycle after. Elements are int32 (VIN and VOUT words are
:data:`hw.config.VECTOR_WORD_BYTES` bytes); addresses count elements.
"""

from __future__ import annotations

import functools
import operator

from amaranth import Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw import timing
from hw.config import VECTOR_WORD_BYTES, AcceleratorConfig
from hw.ecp5_dsp import DSP_REGISTER
from hw.fanout import replica
from hw.isa import (
    DEQUANT_FOLD_BIT,
    INSERT_FIELDS,
    KV4_GROUP_BITS,
    ROPE_HEAD_DIM_BITS,
    VecBody,
    VecFunc,
    argmax_base,
    argmax_pairs,
    insert_fields,
    insert_laned,
    kv4_laned,
    laned_vec_funcs,
    rope_heads_laned,
    rope_laned,
    vec_out_words,
)
from hw.numerics import (
    ACT_BITS,
    ACT_FRAC,
    ACT_MAX,
    DEQUANT_WORD_BITS,
    DEQUANT_ZERO_AMAX,
    FOLD_AMAX_MANT_BITS,
    FOLD_AMAX_SHIFT_BITS,
    FOLD_BITS,
    KV4_CODE_BITS,
    KV4_CODE_MAX,
    KV4_NIBBLES_PER_WORD,
    NORM_FRAC,
    ROPE_HALF_BITS,
)
from hw.vector.base import MULT_CHUNK, ReductionUnit, chunks
from hw.vector.dequant import AMAX_BITS, DEQUANT_SCALE_FRAC, DequantFactor
from hw.vector.elementwise import Add, Mul, Scale
from hw.vector.reduce import SUMSQ_SHIFT_MAX, AbsMax, ArgMax, Max, Sum, SumSq
from hw.vector.tables import Exp, Recip

__all__ = ["VectorEngine", "command_lanes"]

#: Longest row a VEC names (its ``length`` field).
_MAX_LENGTH = 1 << VecBody["length"].width


def _word_port(elements: int, direction: str, lanes: int = 1):
    """A port of a vector scratchpad of ``lanes`` elements a cycle (an aligned group of them,
    :class:`hw.spad.Scratchpad`'s ``core_lanes``), as the engine sees it (it drives the
    address); a write port of lanes has an enable per element."""
    shape = unsigned(8 * VECTOR_WORD_BYTES * lanes)
    addr_width = ceil_log2(elements // lanes)
    if direction == "read":
        return In(memory.ReadPort.Signature(addr_width=addr_width, shape=shape))
    return In(memory.WritePort.Signature(
        addr_width=addr_width, shape=shape,
        granularity=8 * VECTOR_WORD_BYTES if lanes > 1 else None))


#: The laned sub-ops whose results are packed codes (four to a VOUT word) and an amax word,
#: not a result an element.
_CODE_FUNCS = (VecFunc.REQUANT, VecFunc.FOLD)


def _is_one_of(func, funcs):
    """``func`` is one of ``funcs`` (ints or Amaranth values)."""
    return functools.reduce(operator.or_, (func == f.value for f in funcs), func != func)


def command_lanes(cfg: AcceleratorConfig, func, imm):
    """``(laned, writes_n)`` of a VEC of ``func`` and ``imm`` on ``cfg``'s engine of ``n =
    vector_lanes > 1`` lanes: ``laned`` it reads ``n`` elements a cycle
    (:func:`hw.isa.vec_lanes`: a sub-op of :func:`hw.isa.laned_vec_funcs`, or an INSERT of
    :func:`hw.isa.insert_laned` or a ROPE of :func:`hw.isa.rope_laned`); ``writes_n`` its
    writes step by ``n`` words (a laned sub-op but REQUANT's and FOLD's packed codes, a
    laned INSERT, or with ``vector_laned_rope_heads`` a ROPE over whole heads,
    :func:`hw.isa.rope_heads_laned`, which the engine tells from a ROPE over pairs by this
    bit; a ROPE over pairs' writes step by its pairs). Ints or Amaranth
    values; the engine takes them as ``cmd_lanes``, which the vector sequencer registers at
    the pop (:class:`hw.engine.EngineSequencer`'s ``derive``): the compares and carry chains
    of ``imm``'s fields lie before the sequencer's register, not between it and the
    engine's across the die."""
    n = cfg.vector_lanes
    if n < 2:
        raise ValueError(f"command_lanes is for an engine of lanes > 1, got {n}")
    ins = insert_laned(func, imm, n)
    funcs = laned_vec_funcs(cfg)
    heads = cfg.vector_laned_rope_heads
    laned = (_is_one_of(func, funcs) | ins | rope_laned(func, imm, n, heads)
             | kv4_laned(func, imm, n))
    writes_n = _is_one_of(func, [f for f in funcs if f not in _CODE_FUNCS]) | ins
    if heads:
        writes_n = writes_n | rope_heads_laned(func, imm, n)
    return laned, writes_n

#: The shared units' uses, by unit: each use's ``(frac, y_bits)`` (a ``Mul``'s, or its
#: rotation, ``Rope``'s) or ``frac`` (a ``Scale``'s), its mode the use's index. A VEC runs
#: one sub-op at a time, and no sub-op takes two uses of one unit, so the uses share the
#: unit's multipliers: each feeds it with its mode while its sub-op runs, and reads its
#: results only then.
_SHARED = {
    "mul": {
        "mul16": (ACT_FRAC, ACT_BITS),     # MUL (and SILU_GATE's last step)
        "mul_w": (NORM_FRAC, ACT_BITS),    # RMSNORM's weight (33 bits: the unit's b_bits)
        "mul_fold": (0, FOLD_BITS),        # FOLD's products (and lane 0's KV4 codes')
        "rope": Mul.ROPE,                  # ROPE's pairs (hw.isa.rope_laned)
    },
    "scale": {
        "scale16": ACT_FRAC,               # SOFTMAX's probabilities
        "scale30": NORM_FRAC,              # RMSNORM's pass 3
        "scale31": DEQUANT_SCALE_FRAC,     # DEQUANT
    },
    "exp": {   # (a lane that runs SILU_GATE's; another lane's Exp is SOFTMAX's alone)
        "exp16": ACT_FRAC,                 # SOFTMAX's exponentials
        "exp30": NORM_FRAC,                # SILU_GATE's
    },
}

#: Each use of a shared unit: ``use -> (unit, mode)``; KV4's group products (lane 0's
#: ``mul_code``) are FOLD's mode, ``sat54(a * b)``, of 17-bit reciprocals.
_USES = {
    **{use: (unit, k) for unit, uses in _SHARED.items() for k, use in enumerate(uses)},
    "mul_code": ("mul", list(_SHARED["mul"]).index("mul_fold")),
}

#: The element units of the laned sub-ops (:data:`hw.isa.LANED_VEC_FUNCS`), by name: lane 0's
#: is the engine's unit of that name (the other sub-ops use some of them too), and every lane
#: beyond it has a copy, ``<name>_l<k>``. ``mul`` and ``scale`` are shared by the uses of
#: :data:`_SHARED`; ``requant``, REQUANT's, FOLD's and KV4's codes', is ``scale``'s port
#: (:data:`_PORTS`).
_LANE_UNITS = {
    "add": Add,                                          # ADD
    "mul": lambda: Mul(modes=tuple(_SHARED["mul"].values()), b_bits=ACT_BITS + 1),
    # (and REQUANT's, FOLD's and KV4's codes' Requant(54) on its port: _PORTS)
    "scale": lambda: Scale(tuple(_SHARED["scale"].values()), requant_bits=FOLD_BITS),
    "dequant_factor": DequantFactor,                     # DEQUANT (and CHANNEL)
    "exp": lambda: Exp(_SHARED["exp"]["exp16"]),         # SOFTMAX's exponentials
}

#: The units' ports (:class:`hw.vector.base.UnitPort`), each a function another unit computes on
#: its multipliers, by the host unit's name: lane 0's ``Recip`` is RMSNORM's ``Rsqrt`` too (a
#: stage longer: after their seven shared stages, two of its own on two more multipliers), and
#: each lane's ``Scale`` its ``Requant(54)`` (a stage behind a Scale element on its
#: multipliers: a Scale element must not follow a Requant element at once, which no VEC does).
#: No sub-op uses both of a unit's functions, and every VEC's elements leave its units before
#: its ``done``. Each is fed and read as a unit of its own.
_PORTS = {"rsqrt": "recip", "requant": "scale"}

#: The SiLU-gate's element units but its last ``Mul(16)`` (``mul16``, MUL's): lane 0's are
#: the engine's units of these names (``recip`` shared with the per-row reciprocals), and
#: every lane beyond it has a copy, ``<name>_l<k>``, where the configuration's
#: ``vector_laned_silu`` lanes SILU_GATE. ``exp``, the lane's SOFTMAX Exp of
#: :data:`_LANE_UNITS`, is there shared with the SiLU-gate's (:data:`_SHARED`).
_SILU_LANE_UNITS = {
    "exp": lambda: Exp(tuple(_SHARED["exp"].values())),
    "recip": Recip,
    "scale60": lambda: Scale(2 * NORM_FRAC),
    "mul_es": lambda: Mul(NORM_FRAC),
    "mul_gs": lambda: Mul(NORM_FRAC),
}

#: The SiLU-gate's two ``Mul(30)`` on the shared ``Mul`` of another lane, by lane: while
#: SILU_GATE streams one element a cycle (``vector_laned_silu`` off), lanes 1 and 2's ``Mul``
#: are idle, and their mode ``mul_w`` is ``Mul(NORM_FRAC)``'s rounding (the operands fit its
#: 32 x 33 bits). An engine of fewer lanes keeps the others' own ``Mul``.
_SILU_ON_LANES = {"mul_es": 1, "mul_gs": 2}


def _delay(m: Module, value: Value, n: int, name: str, *, data: bool = False) -> Value:
    """``value`` delayed by ``n`` cycles (the units never stall: plain registers).

    ``data``: the registers carry an operand, not a valid or ``last`` bit, and are not reset
    (``reset_less``): what they hold is used only beside a valid bit delayed with it, so the
    engine's reset reaches only its control state (hw/top.py, "Reset").
    """
    value = Value.cast(value)
    for k in range(n):
        r = Signal(value.shape(), name=f"{name}{k + 1}", reset_less=data)
        m.d.sync += r.eq(value)
        value = r
    return value


def _delay_ahead(m: Module, value: Value, n: int, name: str) -> tuple[Value, Value]:
    """``(ahead, delayed)``: :func:`_delay`'s chain of ``n >= 1`` registers, ``delayed`` its
    last and ``ahead`` the value that register loads (``delayed`` one cycle early), for a
    strobe registered a cycle before its use."""
    if n < 1:
        raise ValueError(f"a value one cycle ahead of a delay needs n >= 1, got n={n}")
    ahead = _delay(m, value, n - 1, name)
    delayed = Signal(Value.cast(value).shape(), name=f"{name}{n}")
    m.d.sync += delayed.eq(ahead)
    return ahead, delayed


class VectorEngine(wiring.Component):
    """VIN rows -> function units -> VOUT, one VEC instruction at a time.

    Parameters
    ----------
    cfg:
        The accelerator configuration; it must have a vector engine
        (:attr:`hw.config.AcceleratorConfig.has_vector`), of ``n = vector_lanes`` lanes
        (see *Lanes* in the module's docstring).

    Members
    -------
    cmd: In(stream.Signature(VecBody))
        VEC bodies (already checked by fetch); ``ready`` while no instruction is in progress.
        Transfer cycle ``g``.
    cmd_lanes: In(2), only with ``n > 1``
        :func:`command_lanes` of the command (``laned`` bit 0, ``writes_n`` bit 1), valid with
        ``cmd.payload`` (the vector sequencer's ``derived``).
    done: Out(1)
        Pulse in ``g + hw.timing.vec_cycles(ins, cfg)``, with the last VOUT write.
    elements: Out(16)
        The current instruction's ``length`` (what it adds to ``vector_elements`` when
        ``done`` pulses).
    vin_a, vin_b: In(ReadPort.Signature(...))
        Read ports of VIN, ``n`` elements (an aligned group) a read (the row; ADD's second
        operand, RMSNORM's weight; ROPE: ``x[k]`` and the table words, ``x[k + d/2]``;
        INSERT: the row, its code words).
    vout_wr: In(WritePort.Signature(...))
        Write port of VOUT, ``n`` elements (an aligned group) a write, an enable each.
    """

    #: Registers between a VIN read and its element entering a unit: the memory's, then one on
    #: the read data (the block RAM's clock-to-output apart from the units' logic).
    READ_LATENCY = 2
    #: Registers between the engine's selection of a unit's operands and the unit.
    FEED_LATENCY = 1
    #: Registers between a KV4 group's product and its code entering Recip's feed: ``-255 p``,
    #: the code, the partial products of ``(amax >> s) * c``.
    KV4_CODE_LATENCY = 4
    #: VOUT words ARGMAX writes: the index, then the maximum.
    ARGMAX_WORDS = 2

    def __init__(self, cfg: AcceleratorConfig):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if not cfg.has_vector:
            raise ValueError("this configuration has no vector engine (vin_spad_bytes = 0)")
        if timing.VEC_READ_LATENCY != self.READ_LATENCY:
            raise ValueError(f"hw.timing.VEC_READ_LATENCY={timing.VEC_READ_LATENCY} does not "
                             f"match the vector engine's {self.READ_LATENCY}-cycle VIN read")
        if timing.VEC_FEED_LATENCY != self.FEED_LATENCY:
            raise ValueError(f"hw.timing.VEC_FEED_LATENCY={timing.VEC_FEED_LATENCY} does not "
                             f"match the vector engine's {self.FEED_LATENCY}-cycle unit feeds")
        if timing.KV4_CODE_LATENCY != self.KV4_CODE_LATENCY:
            raise ValueError(f"hw.timing.KV4_CODE_LATENCY={timing.KV4_CODE_LATENCY} does not "
                             f"match the vector engine's {self.KV4_CODE_LATENCY} code stages")
        words = int(vec_out_words(VecFunc.ARGMAX.value, 1))
        if words != self.ARGMAX_WORDS:
            raise ValueError(f"hw.isa.vec_out_words(ARGMAX)={words} is not the vector "
                             f"engine's {self.ARGMAX_WORDS} result words")
        self._cfg = cfg
        n = self._lanes = cfg.vector_lanes
        # (a lane that runs SILU_GATE, lane 0 always, takes the SiLU-gate's Exp for its own)
        silu_exp = {"exp": _SILU_LANE_UNITS["exp"]}
        # the SiLU-gate's Muls that another lane's shared Mul takes (_SILU_ON_LANES), in the
        # mode of Mul(NORM_FRAC)'s rounding
        if _SHARED["mul"]["mul_w"] != (NORM_FRAC, ACT_BITS):
            raise ValueError(f"the shared Mul's mode mul_w {_SHARED['mul']['mul_w']} is not "
                             f"the SiLU-gate's Mul({NORM_FRAC}) rounding")
        self._silu_hosts = {} if cfg.vector_laned_silu else {
            name: f"mul_l{k}" for name, k in _SILU_ON_LANES.items() if k < n}
        self._units = {
            **{name: make() for name, make in {**_LANE_UNITS, **silu_exp}.items()},
            "argmax": ArgMax(signed(ACT_BITS), max_len=_MAX_LENGTH, tag_bits=ACT_BITS),
            # activations, FOLD's products; a laned row's through a lane tree; with signs
            # below the magnitudes (KV4's group maxima of |x >> 1|)
            "absmax": AbsMax(signed(FOLD_BITS), lanes=n, signs=True),
            # the per-row reciprocals' and RMSNORM's Rsqrt on its port (_PORTS)
            "recip": Recip(rsqrt=True),
            # SOFTMAX's reductions; a laned row's through a lane tree
            "max": Max(signed(ACT_BITS), lanes=n),
            "sum": Sum(unsigned(ACT_FRAC + 1), max_len=_MAX_LENGTH, lanes=n),
            "sumsq": SumSq(max_len=_MAX_LENGTH, lanes=n),
            "scale60": Scale(2 * NORM_FRAC),
            **{name: Mul(NORM_FRAC) for name in ("mul_es", "mul_gs")
               if name not in self._silu_hosts},
        }
        if n > 1:
            for k in range(1, n):
                lane = ({**_LANE_UNITS, **_SILU_LANE_UNITS} if cfg.vector_laned_silu else
                        _LANE_UNITS)
                for name, make in lane.items():
                    self._units[f"{name}_l{k}"] = make()
        vin = cfg.vin_spad_bytes // cfg.vin_word_bytes
        vout = cfg.vout_spad_bytes // cfg.vout_word_bytes
        super().__init__({
            "cmd": In(stream.Signature(VecBody)),
            "done": Out(1),
            "elements": Out(VecBody["length"].width),
            "vin_a": _word_port(vin, "read", n),
            "vin_b": _word_port(vin, "read", n),
            "vout_wr": _word_port(vout, "write", n),
            **({"cmd_lanes": In(2)} if n > 1 else {}),
        })

    def elaborate(self, platform):
        m = Module()
        for name, unit in self._units.items():
            m.submodules[name] = unit
            m.d.comb += [o.ready.eq(1) for o in [unit.o, *(p.o for p in unit.ports.values())]]
        n = self._lanes
        # A use of a shared unit (_USES) names its unit, lane by lane: u[use], u[use_l<k>];
        # a unit's port (_PORTS) is fed and read as a unit of its own, u[port], u[port_l<k>].
        u = {**self._units,
             **{f"{port}{sfx}": unit.ports[port] for port, host in _PORTS.items()
                for sfx in ["", *(f"_l{k}" for k in range(1, n))]
                if (unit := self._units.get(f"{host}{sfx}")) is not None and port in unit.ports},
             **{f"{use}{sfx}": self._units[f"{unit}{sfx}"] for use, (unit, _) in _USES.items()
                for sfx in ["", *(f"_l{k}" for k in range(1, n))]},
             **{name: self._units[host] for name, host in self._silu_hosts.items()}}
        # Cycles from feeding a unit (below) to its result: its feed register, then its own.
        lat = {k: self.FEED_LATENCY + v.latency for k, v in u.items()}
        body = self.cmd.payload
        width = VecBody["a_addr"].width

        active = Signal()     # from the command to the last write
        issuing = Signal()    # reading the row
        # INSERT's copy of `issuing`, set and cleared with it (its `keep` holds it apart): the
        # VIN ports' enables and the read pipeline load `issuing` across the die, and its
        # wire was most of the path into INSERT's walker and b_ptr's enable.
        ins_issuing = Signal(attrs={"keep": 1})
        issuers = (issuing, ins_issuing)
        # The instruction's registers below are loaded from the command in every idle cycle,
        # so in the cycle after a reset (which clears `active`, `issuing` and the units' valid
        # bits) before any use: they are not reset (hw/top.py, "Reset").
        func = Signal(VecFunc, reset_less=True)
        phase = Signal(range(3), reset_less=True)   # the pass (0: the first)
        a_ptr = Signal(width, reset_less=True)
        b_ptr = Signal(width, reset_less=True)
        a_base = Signal(width, reset_less=True)
        b_base = Signal(width, reset_less=True)
        dst = Signal(VecBody["dst_addr"].width, reset_less=True)
        left = Signal(VecBody["length"].width, reset_less=True)   # elements to read after this
        idx = Signal(VecBody["length"].width, reset_less=True)    # the element read now
        at_end = Signal(reset_less=True)    # left == 0, registered
        len_one = Signal(reset_less=True)   # length == 1
        imm = Signal(VecBody["imm"].width, reset_less=True)
        length = self.elements
        # ROPE: a_ptr / b_ptr point at x[k] / x[k + d/2], t_ptr at table word k; `tab`: this
        # read is the table word's; rk = k.
        t_ptr = Signal(width, reset_less=True)
        rk = Signal(ROPE_HEAD_DIM_BITS, reset_less=True)
        rk_last = Signal(reset_less=True)   # rk == head_dim / 2 - inc, registered
        tab = Signal()
        half = imm[1:ROPE_HEAD_DIM_BITS]        # head_dim / 2
        # ROPE's per-instruction constants, registered while idle (no adder behind imm).
        half_m1 = Signal(ROPE_HEAD_DIM_BITS - 1, reset_less=True)   # head_dim / 2 - 1
        half_p1 = Signal(ROPE_HEAD_DIM_BITS, reset_less=True)       # head_dim / 2 + 1
        half_m2 = Signal(ROPE_HEAD_DIM_BITS - 1, reset_less=True)   # head_dim / 2 - 2
        one_m_half = Signal(len(dst), reset_less=True)              # 1 - head_dim / 2

        # func's decode, registered with func (loaded together while idle, so always equal to
        # func == f): the sub-ops' control starts at a flag, not at func's comparators.
        is_ = {f: Signal(name=f"is_{f.name.lower()}", reset_less=True) for f in VecFunc}
        # A ROPE over whole heads (vector_laned_rope_heads, hw.isa.rope_heads_laned: a ROPE
        # whose writes step by n, command_lanes) reads a group of its row a cycle on the first
        # port, its table's group (t_ptr, held) on the second; `pairs`: a ROPE over pairs.
        heads_cfg = self._cfg.vector_laned_rope_heads
        heads = Signal(reset_less=True) if heads_cfg else Const(0)
        pairs = is_[VecFunc.ROPE] & ~heads if heads_cfg else is_[VecFunc.ROPE]
        # Lanes: a laned sub-op's reads are aligned groups of n elements (`left` counts
        # groups, the pointers step by n); the others read one element a cycle.
        lg = n.bit_length() - 1
        wide = Signal(reset_less=True)                  # the sub-op is laned (n > 1)
        inc = Signal(range(n + 1), reset_less=True)     # the pointers' step: n or 1
        reads_m1 = Signal(VecBody["length"].width, reset_less=True)  # a pass's reads - 1
        tail = Signal(n, reset_less=True)   # the lanes of a laned row's last group
        m.d.comb += self.cmd.ready.eq(~active)
        # the command's: laned (n > 1), from the sequencer's register (command_lanes), and
        # its pointers' step
        wide_now = 0 if n == 1 else self.cmd_lanes[0]
        inc_now = 1 if n == 1 else Mux(wide_now, n, 1)
        with m.If(~active):
            # The payload is stable from the cycle after the pop (hw.engine): copied while idle.
            # DEQUANT first reads its amax word (imm) alone.
            rope = body.func == VecFunc.ROPE
            amax_first = body.func == VecFunc.DEQUANT
            m.d.sync += [*(flag.eq(body.func == f) for f, flag in is_.items()),
                         func.eq(body.func),
                         a_ptr.eq(Mux(amax_first, body.imm[:width], body.a_addr)),
                         b_ptr.eq(Mux(rope, body.a_addr + body.imm[1:ROPE_HEAD_DIM_BITS],
                                      body.b_addr)),
                         t_ptr.eq(body.b_addr), rk.eq(0), tab.eq(0),
                         a_base.eq(body.a_addr), b_base.eq(body.b_addr),
                         dst.eq(body.dst_addr),
                         left.eq(Mux(amax_first, 0, body.length - 1)), idx.eq(0),
                         length.eq(body.length), imm.eq(body.imm), phase.eq(0),
                         at_end.eq(amax_first | (body.length == 1)),
                         len_one.eq(body.length == 1)]
            if n > 1:
                # The row's reads less one both ways, wide_now (adders and compares of
                # imm's fields) only selecting: no adder waits for it.
                g_wide = (body.length + (n - 1)) >> lg
                g_m1 = Mux(wide_now, g_wide - 1, body.length - 1)
                g_one = Mux(wide_now, g_wide == 1, body.length == 1)
                m.d.sync += [wide.eq(wide_now), inc.eq(inc_now),
                             reads_m1.eq(g_m1),
                             left.eq(Mux(amax_first, 0, g_m1)),
                             at_end.eq(amax_first | g_one),
                             len_one.eq(g_one),
                             tail.eq(Cat((body.length - 1)[:lg] >= j for j in range(n)))]
            if heads_cfg:
                m.d.sync += heads.eq(rope & self.cmd_lanes[1])
            # (a laned ROPE's pairs come `inc` = n at a time: k steps by n; each constant is
            # formed for both steps, wide_now only selecting, as the row counts above)
            body_half = body.imm[1:ROPE_HEAD_DIM_BITS]

            def per_step(f):
                return f(1) if n == 1 else Mux(wide_now, f(n), f(1))

            m.d.sync += [half_m1.eq(per_step(lambda i: body_half - i)),
                         half_p1.eq(per_step(lambda i: body_half + i)),
                         half_m2.eq(per_step(lambda i: body_half - 2 * i)),
                         one_m_half.eq(per_step(lambda i: i - body_half)),
                         rk_last.eq(per_step(lambda i: body_half == i))]
            with m.If(self.cmd.valid):
                m.d.sync += [active.eq(1), *(i.eq(1) for i in issuers)]

        # ---- read: one element (of each operand row) per cycle
        is_rope = is_[VecFunc.ROPE]
        a_rd = Mux(is_rope & tab, t_ptr, a_ptr)   # the element addresses read now
        b_rd = Mux(heads, t_ptr, b_ptr) if heads_cfg else b_ptr
        m.d.comb += [self.vin_a.addr.eq(a_rd[lg:]),
                     self.vin_a.en.eq(issuing),
                     self.vin_b.addr.eq(b_rd[lg:]), self.vin_b.en.eq(issuing)]
        step_rd = 1 if n == 1 else inc
        with m.If(issuing):
            m.d.sync += [a_ptr.eq(a_ptr + step_rd), b_ptr.eq(b_ptr + step_rd),
                         left.eq(left - 1),
                         idx.eq(idx + 1), at_end.eq(left == 1)]
            with m.If(pairs):   # the pointers move after each table read
                m.d.sync += tab.eq(~tab)
                with m.If(~tab):
                    m.d.sync += [a_ptr.eq(a_ptr), b_ptr.eq(b_ptr)]
                # The head's last pair is a registered flag (the write side's r_last too):
                # rk == half_m1 before the step is rk == half_m2 the step before, or a head of
                # one step's pairs, so no compare waits in front of the pointers' selection.
                with m.Elif(rk_last):   # the head's last pair: the next head's first
                    m.d.sync += [a_ptr.eq(a_ptr + half_p1), b_ptr.eq(b_ptr + half_p1),
                                 t_ptr.eq(b_base), rk.eq(0), rk_last.eq(half_m1 == 0)]
                with m.Else():
                    m.d.sync += [t_ptr.eq(t_ptr + step_rd), rk.eq(rk + step_rd),
                                 rk_last.eq(rk == half_m2)]
            with m.If(at_end):
                m.d.sync += [i.eq(0) for i in issuers]
        # A per-row scalar is ready: the next pass reads from the next cycle. The decision is
        # registered, from each unit's result one cycle ahead (below), and each group of
        # registers it loads takes its own copy of it (hw/fanout.py; reset, as the units'
        # valid bits are, so that no pass starts in the cycle after a reset).
        next_pass_d = Signal()
        pass_ptr, pass_ctr, pass_ctl = (replica(m, next_pass_d, f"next_pass_{k}", reset=True)
                                        for k in ("ptr", "ctr", "ctl"))
        with m.If(pass_ptr):
            m.d.sync += [a_ptr.eq(a_base), b_ptr.eq(b_base)]
        with m.If(pass_ctr):
            m.d.sync += [left.eq(length - 1 if n == 1 else reads_m1), idx.eq(0),
                         at_end.eq(len_one)]
        with m.If(pass_ctl):
            m.d.sync += [*(i.eq(1) for i in issuers), phase.eq(phase + 1)]

        # -- INSERT: the byte `at` of the next code (a whole code word at stride 1) walks up the
        # row; the word read now takes it when idx == at // 4 (`hit`), and then `at` steps
        # (+ stride, + stride + skip after a group's last code), b_ptr to the next code word.
        # `at` steps only on a hit (at < 4 * length), so it stays below 2**(width + 2) plus a
        # step: width + 3 bits.
        ins = {name: Signal(w, name=f"ins_{name}", reset_less=True) for name, w in INSERT_FIELDS}
        # INSERT4 walks nibbles the same way: `at` a nibble (8 to a word), a code word's
        # eight codes, stride 1 whole code words of 8 nibbles (`ins_nib`).
        ins_nib = Signal(reset_less=True)                  # INSERT4: nibbles
        ins_word = Signal(reset_less=True)                 # stride 1: whole code words
        ins_step = Signal(INSERT_FIELDS[3][1], reset_less=True)    # stride, or 4 (8)
        ins_jump = Signal(INSERT_FIELDS[3][1] + 1, reset_less=True)  # step + skip
        ins_at = Signal(width + 4, reset_less=True)
        ins_r = Signal.like(ins["group_m1"], reset_less=True)      # the code's place in its group
        ins_g = Signal.like(ins["groups_m1"], reset_less=True)     # its group
        ins_j3 = Signal(3, reset_less=True)                # its byte (nibble) in its code word
        ins_jl = Signal(3, reset_less=True)                # a code word's last: 3 (7)
        ins_end = Signal(reset_less=True)                  # every code placed
        with m.If(~active):
            f = insert_fields(body.imm)
            nib_now = body.func == VecFunc.INSERT4
            word_now = f["stride"] == 1
            step_now = Mux(word_now, Mux(nib_now, 8, 4), f["stride"])
            m.d.sync += [ins[k].eq(v) for k, v in f.items()]
            m.d.sync += [ins_nib.eq(nib_now), ins_jl.eq(Mux(nib_now, 7, 3)),
                         ins_word.eq(word_now), ins_step.eq(step_now),
                         ins_jump.eq(step_now + f["skip"]), ins_at.eq(f["base"]),
                         ins_r.eq(0), ins_g.eq(0), ins_j3.eq(0), ins_end.eq(0)]
        is_insert = is_[VecFunc.INSERT] | is_[VecFunc.INSERT4]
        # (n lanes, a laned INSERT: idx counts the groups of n words read, the code's word is
        # lane at // 4 % n of group at // 4n; hw.isa.insert_laned: a group takes one code)
        ins_word_at = Mux(ins_nib, ins_at[3:], ins_at[2:])
        hit = ins_issuing & is_insert & ~ins_end & (
            idx == (ins_word_at if n == 1 else Mux(wide, ins_word_at[lg:], ins_word_at)))
        with m.If(hit):
            r_last = (ins_r | Mux(ins_word, ins_jl, 0)) == ins["group_m1"]
            m.d.sync += [ins_r.eq(Mux(r_last, 0, ins_r + Mux(ins_word, ins_jl + 1, 1))),
                         ins_at.eq(ins_at + Mux(r_last, ins_jump, ins_step)),
                         ins_g.eq(ins_g + r_last),
                         ins_end.eq(r_last & (ins_g == ins["groups_m1"])),
                         ins_j3.eq(Mux(ins_word | (ins_j3 == ins_jl), 0, ins_j3 + 1))]
        with m.If(ins_issuing & is_insert):   # (after the read's b_ptr + 1: this one holds)
            # hit selects between b_ptr + 1 and b_ptr: the compare stays out of the adder
            m.d.sync += b_ptr.eq(Mux(hit & (ins_word | (ins_j3 == ins_jl)), b_ptr + 1, b_ptr))

        # ---- the element enters its units READ_LATENCY cycles after its read: the memory's
        # register, then the read data's (rd_a, rd_b), the control carried beside
        rl = self.READ_LATENCY
        valid = _delay(m, issuing, rl, "valid")
        last = _delay(m, issuing & at_end, rl, "last")
        # SOFTMAX: a valid position (its index below imm); n lanes: lane k of group idx is
        # position n * idx + k, valid only within the row (not past its last group's `tail`)
        if n == 1:
            inrows = [_delay(m, idx < imm, rl, "inrow")]
        else:
            in_tail = Mux(at_end, tail, Const((1 << n) - 1, n))
            # (operand bits: used only beside `valid`, not reset)
            ins_row = _delay(m, Cat(((Cat(Const(k, lg), idx) < imm) & in_tail[k])
                                    for k in range(n)), rl, "inrow", data=True)
            inrows = [ins_row[k] for k in range(n)]
        # With lanes, an element read alone is the lane of its address in the group read
        # (selected as the scratchpad selects a group in its row: by address bits registered
        # with the read), and a laned read's lanes 1 .. n-1 come beside lane 0's; those past a
        # laned row's end (the last group's, `tail`) read as 0 (the reductions' and the
        # packed codes' neutral element), and every lane above 0 of an element read alone.
        ew = 8 * VECTOR_WORD_BYTES
        if n == 1:
            rd_a = _delay(m, self.vin_a.data, rl - 1, "rd_a", data=True)
            rd_b = _delay(m, self.vin_b.data, rl - 1, "rd_b", data=True)
        else:
            sel_a = Signal(lg, reset_less=True)
            sel_b = Signal(lg, reset_less=True)
            ok = Signal(n, reset_less=True)   # the lanes of the group read now that count
            with m.If(issuing):
                m.d.sync += [sel_a.eq(a_rd[:lg]), sel_b.eq(b_rd[:lg]),
                             ok.eq(Mux(at_end, tail, Const((1 << n) - 1, n)) & wide.replicate(n))]
            rd_a = _delay(m, self.vin_a.data.word_select(sel_a, ew), rl - 1, "rd_a", data=True)
            rd_b = _delay(m, self.vin_b.data.word_select(sel_b, ew), rl - 1, "rd_b", data=True)
        xs = [rd_a.as_signed()] + [
            _delay(m, Mux(ok[k], self.vin_a.data.word_select(k, ew), 0), rl - 1,
                   f"rd_a_l{k}", data=True).as_signed() for k in range(1, n)]
        bs = [rd_b.as_signed()] + [
            _delay(m, self.vin_b.data.word_select(k, ew), rl - 1, f"rd_b_l{k}",
                   data=True).as_signed() for k in range(1, n)]
        x = xs[0]
        b = bs[0]
        p1, p2, p3 = valid & (phase == 0), valid & (phase == 1), valid & (phase == 2)

        # A shared unit's uses (_USES), each while its sub-op runs: the flag that selects
        # its operands and mode, and gates its results (is_ flags: they hold while active).
        use_sel = {"mul16": is_[VecFunc.MUL] | is_[VecFunc.SILU_GATE],
                   "mul_w": is_[VecFunc.RMSNORM], "mul_fold": is_[VecFunc.FOLD],
                   "mul_code": is_[VecFunc.KV4], "scale16": is_[VecFunc.SOFTMAX],
                   "scale30": is_[VecFunc.RMSNORM], "scale31": is_[VecFunc.DEQUANT],
                   "rope": is_[VecFunc.ROPE], "exp16": is_[VecFunc.SOFTMAX],
                   "exp30": is_[VecFunc.SILU_GATE]}
        if set(use_sel) != set(_USES):
            raise ValueError(f"the shared units' uses {sorted(_USES)} have no select flag")
        use_mode = {use: mode for use, (_, mode) in _USES.items()}
        for name in self._silu_hosts:   # (the SiLU-gate's Muls on other lanes' Mul: mul_w)
            use_sel[name], use_mode[name] = is_[VecFunc.SILU_GATE], use_mode["mul_w"]
        feeds = {}   # unit -> [(when, select, payload)], registered by _feed_units below

        def feed(unit, when, use=None, only=None, **payload):
            """The unit takes ``when`` and ``payload`` FEED_LATENCY (1) cycle later, from a
            register: the engine's operand selection stays apart from the unit's first
            stage. (A laned reduction's ``x`` is a list, a value a lane.) ``use``: a use of a
            shared unit (:data:`_USES`), fed with its mode while its sub-op runs; ``only``,
            if given, the flag that selects it instead of the use's (a narrower one)."""
            sel = when
            if use is not None:
                sel = use_sel[use] if only is None else only
                if len(getattr(unit, "modes", getattr(unit, "fracs", ()))) > 1:
                    payload["mode"] = use_mode[use]
            feeds.setdefault(id(unit), (unit, []))[1].append((when, sel, payload))

        def _feed_units():
            """Each unit's feed register: one use's operands, or a shared unit's uses'
            selected by their flags (one at a time), their valids ORed; a field that only
            some uses feed (ROPE's cos and sin) is theirs, whatever the others'."""
            for unit, uses in feeds.values():
                valid = Signal(name=f"{unit.NAME}_iv")
                m.d.sync += valid.eq(functools.reduce(operator.or_, (w for w, _, _ in uses)))
                m.d.comb += unit.i.valid.eq(valid)
                for k in unit.i.payload.shape().members:
                    port = getattr(unit.i.payload, k)
                    given = [(sel, p[k]) for _, sel, p in uses if k in p]
                    if not given:
                        raise ValueError(f"no use of unit {unit.NAME} feeds its {k!r}")
                    if isinstance(given[0][1], list):
                        port, given = Value.cast(port), [(c, Cat(v)) for c, v in given]
                    v = given[-1][1]
                    for sel, other in given[-2::-1]:
                        v = Mux(sel, other, v)
                    reg = Signal.like(port, name=f"{unit.NAME}_i_{k}", reset_less=True)
                    m.d.sync += reg.eq(v)
                    m.d.comb += port.eq(reg)

        def out_valid(use, k=0):
            """Use ``use``'s results of lane ``k``: its unit's valid while its sub-op runs."""
            unit = u[use] if k == 0 else u[f"{use}_l{k}"]
            return unit.o.valid & use_sel[use]

        def lanes(name):
            """Unit ``name``'s lane copies, lane 1 to n - 1 (:data:`_LANE_UNITS`)."""
            return [u[f"{name}_l{k}"] for k in range(1, n)]

        aheads = {}

        def valid_ahead(name, k=1):
            """Unit ``name``'s ``o.valid`` ``k`` cycles early (``1 <= k <= latency``): its
            input valid (with ``last``, a reduction's) delayed by its latency less ``k`` (the
            units never stall); one delay line a unit, however many read it. A use of a
            shared unit: its unit's, while its sub-op runs."""
            if name in _USES:
                return valid_ahead(_USES[name][0], k) & use_sel[name]
            if name not in aheads:
                unit = u[name]
                taken = unit.i.valid
                if isinstance(unit, ReductionUnit):
                    taken = taken & unit.i.payload.last
                line = [taken]   # line[j]: the input valid j cycles ago
                for j in range(1, unit.latency):
                    line.append(_delay(m, line[-1], 1, f"{name}_ahead{j}_"))
                aheads[name] = line
            line = aheads[name]
            if not 1 <= k <= len(line):
                raise ValueError(f"unit {name}'s valid is known at most {len(line)} cycles "
                                 f"ahead, not {k}")
            return line[len(line) - k]

        feed(u["add"], valid & is_[VecFunc.ADD], a=x, b=b)
        for k, unit in enumerate(lanes("add"), 1):
            feed(unit, valid & is_[VecFunc.ADD], a=xs[k], b=bs[k])
        # ARGMAX: with imm's PAIRS bit only a pair's value (an odd position's word) enters,
        # tagged with the word before it (hw.numerics.vec_argmax_words)
        arg_pairs = argmax_pairs(imm)
        arg_odd = _delay(m, idx[0], rl, "arg_odd")
        arg_prev = Signal(ACT_BITS, reset_less=True)
        with m.If(valid):
            m.d.sync += arg_prev.eq(x)
        feed(u["argmax"], valid & is_[VecFunc.ARGMAX] & (~arg_pairs | arg_odd), x=x,
             tag=arg_prev, pair=arg_pairs, last=last)
        # FOLD: the products a * c in both passes, into AbsMax (pass 1) or Requant (pass 2)
        fold = is_[VecFunc.FOLD]
        feed(u["mul_fold"], valid & fold, "mul_fold", a=x, b=b)
        for k, unit in enumerate(lanes("mul_fold"), 1):
            feed(unit, valid & fold, "mul_fold", a=xs[k], b=bs[k])
        wf = u["mul_fold"].o.payload.y
        wfs = [wf] + [unit.o.payload.y for unit in lanes("mul_fold")]
        wf_last = _delay(m, last & fold, lat["mul_fold"], "fold_last")
        wf_p1 = out_valid("mul_fold") & (phase == 0)
        wf_p2 = out_valid("mul_fold") & (phase == 1)
        kv = is_[VecFunc.KV4]
        # (n lanes: a laned row's through the lane tree; a KV4 of one lane's too, its lanes
        # above 0 reading 0)
        feed(u["absmax"], (p1 & (is_[VecFunc.REQUANT] | is_[VecFunc.RMSNORM] | kv)) | wf_p1,
             x=Mux(fold, wf, x) if n == 1 else [Mux(fold, wfs[k], xs[k]) for k in range(n)],
             last=Mux(fold, wf_last, last))
        am_valid = u["absmax"].o.valid
        y = u["absmax"].o.payload.y[1:]   # amax (the sign bit below it is KV4's)

        # -- per-row scalars, registered as their units give them
        amax = Signal(ACT_BITS, reset_less=True)
        shift = Signal(range(SUMSQ_SHIFT_MAX + 2), reset_less=True)  # RMSNORM: up to 15
        r = Signal.like(u["recip"].o.payload.r, reset_less=True)
        sh = Signal.like(u["recip"].o.payload.sh, reset_less=True)
        top = Signal(signed(ACT_BITS), reset_less=True)          # Max's m
        eps = Signal(VecBody["imm"].width, reset_less=True)      # eps >> 2s
        ss_zero = Signal(reset_less=True)
        # RMSNORM's scalars from the registered amax, one a cycle: s in the cycle after amax
        # (pass 2's first element enters SumSq no earlier than the cycle after that),
        # eps >> 2s the next (added to the sum of squares at its end)
        # s = max(0, bitlen(amax) - 17) is the bit length of amax's bits from 17 up.
        top_bits = amax[ACT_FRAC + 1:]
        s_now = Signal()       # amax is RMSNORM's: s from it now
        eps_now = Signal()     # s is: eps >> 2s from it now
        m.d.sync += [s_now.eq(am_valid & is_[VecFunc.RMSNORM]), eps_now.eq(s_now)]
        with m.If(am_valid):
            m.d.sync += amax.eq(y)
            with m.If(is_[VecFunc.REQUANT] | kv):
                m.d.sync += shift.eq(y[ACT_BITS - 1])                 # bitlen(amax) - 31
        with m.If(s_now):
            m.d.sync += shift.eq(_bitlen(top_bits))
        with m.If(eps_now):
            m.d.sync += eps.eq(imm >> (2 * shift)[:6])
        with m.If(u["max"].o.valid):
            m.d.sync += top.eq(u["max"].o.payload.y)
        # FOLD's amax (54 bits) and its shifts registered as it comes: s = max(0, bitlen - 31)
        # and s27 = max(0, bitlen - 27), the bit lengths of its bits from 31 and from 27 up;
        # the cycle after, Recip of amax >> s and the amax word (mantissa >> s27)
        famax = Signal(FOLD_BITS, reset_less=True)
        fs = Signal(range(FOLD_BITS - (ACT_BITS - 1) + 1), reset_less=True)
        fs27 = Signal(range(FOLD_BITS - FOLD_AMAX_MANT_BITS + 1), reset_less=True)
        fword = Signal(ACT_BITS, reset_less=True)
        fold_go = Signal()
        m.d.sync += fold_go.eq(am_valid & fold)
        with m.If(am_valid & fold):
            m.d.sync += [famax.eq(y), fs.eq(_bitlen(y[ACT_BITS - 1:])),
                         fs27.eq(_bitlen(y[FOLD_AMAX_MANT_BITS:]))]
        with m.If(fold_go):
            m.d.sync += fword.eq(Cat((famax >> fs27)[:FOLD_AMAX_MANT_BITS], fs27))
        # -- KV4 (hw.numerics.vec_kv4_rows): pass 1 into AbsMax and Recip as REQUANT's; a key
        # row's group maxima of |x| and of |x >> 1| (the row's s is 0 or 1) kept in a memory,
        # from AbsMax's maxima of each cycle's lanes (n lanes, hw.isa.kv4_laned: a cycle's
        # elements lie in one group). From the cycle the row's reciprocal comes out, one group
        # a cycle: its maximum (for s) into Mul with r; as the product p comes out, the code
        # c = clip(ceil(255 p / 2**sh), 1, 255) (two stages) and Recip of (amax >> s) * c;
        # each group's (r2, sh2) kept in a memory, its code packed four to a word in another.
        depth = self._cfg.vin_spad_bytes // self._cfg.vin_word_bytes
        kv_codes = Signal(reset_less=True)     # a key row: group codes
        kv_lg = Signal(KV4_GROUP_BITS, reset_less=True)   # log2 of a group's reads
        kv_gm = Signal(VecBody["length"].width, reset_less=True)      # a group's reads - 1
        kv_glast = Signal(VecBody["length"].width, reset_less=True)   # groups - 1
        with m.If(~active):
            lg_now = body.imm[:KV4_GROUP_BITS]
            gm_now = (Const(1, 1) << lg_now) - 1
            m.d.sync += [kv_codes.eq(body.imm[KV4_GROUP_BITS] & (body.func == VecFunc.KV4)),
                         kv_glast.eq((body.length >> lg_now) - 1)]
            if n == 1:
                m.d.sync += [kv_lg.eq(lg_now), kv_gm.eq(gm_now)]
            else:   # a laned row's reads are groups of n elements (the group >= n)
                m.d.sync += [kv_lg.eq(Mux(wide_now, lg_now - lg, lg_now)),
                             kv_gm.eq(Mux(wide_now, gm_now >> lg, gm_now))]
        # A cycle's maximum over its lanes of 2|x| + (x < 0) (AbsMax's signs), px = 2M + t:
        # M its largest |x| and t whether such an element is negative, so that its largest
        # |x >> 1| is (M + t) >> 1 = (px + 1) >> 2 (a negative x's |x >> 1| is (|x| + 1) >> 1).
        # A group's maximum of them gw; the cycle after its last, its M and (M + t) >> 1
        # written.
        part = u["absmax"].partial
        px = part.x[:ACT_BITS + 1]
        kv_p1 = part.valid & kv & kv_codes    # (pass 1's: only it feeds AbsMax)
        kv_ci = Signal(VecBody["length"].width, reset_less=True)   # its cycles so far
        gw = Signal(ACT_BITS + 1, reset_less=True)
        g_end = Signal()
        g_first = (kv_ci & kv_gm) == 0
        m.d.sync += g_end.eq(kv_p1 & ((kv_ci & kv_gm) == kv_gm))
        with m.If(kv_p1):
            m.d.sync += [gw.eq(Mux(g_first | (px > gw), px, gw)), kv_ci.eq(kv_ci + 1)]
        m.submodules.kv_gmax = gmem = memory.Memory(shape=unsigned(2 * ACT_BITS - 1),
                                                    depth=depth, init=[])
        g_wr, g_rd = gmem.write_port(), gmem.read_port()
        g_at = Signal(len(g_wr.addr), reset_less=True)
        with m.If(g_end):
            m.d.sync += g_at.eq(g_at + 1)
        m.d.comb += [g_wr.addr.eq(g_at), g_wr.en.eq(g_end),
                     g_wr.data.eq(Cat(gw[1:], ((gw + 1) >> 2)[:ACT_BITS - 1]))]
        # The per-row scalars' units' o.valid one cycle early (valid_ahead); for the group
        # memories' addresses and write enables a registered copy of Recip's, equal to its
        # o.valid (reset, as the unit's valid bits are), placed apart from the unit: the
        # memories' blocks lie across the die from it.
        ahead = {k: valid_ahead(k) for k in ("recip", "max", "rsqrt", "absmax")}
        recip_ov = replica(m, ahead["recip"], "kv_recip_valid", reset=True)
        kv_rowr = Signal()    # the row's reciprocal has come out
        row_r = recip_ov & kv & ~kv_rowr
        kv_busy = Signal()    # feeding the groups after the first
        kv_gi = Signal(VecBody["length"].width, reset_less=True)   # the group fed now
        feeding = (row_r & kv_codes) | kv_busy
        g_last = feeding & (kv_gi == kv_glast)
        with m.If(row_r):
            m.d.sync += kv_rowr.eq(1)
        with m.If(feeding):
            m.d.sync += [kv_gi.eq(kv_gi + 1), kv_busy.eq(~g_last)]
        with m.If(~active):
            m.d.sync += [g_at.eq(0), kv_ci.eq(0), kv_rowr.eq(0), kv_busy.eq(0), kv_gi.eq(0)]
        # The group fed in cycle t is read in t - 2 and its word registered (`kv_gq`), so the
        # block RAM's clock-to-output and its blocks' read multiplexer lie in a cycle of their
        # own, not in front of the shared Mul's feed selection. The groups are fed in
        # consecutive cycles from the one the row's reciprocal comes out, f0, so the address
        # is a register that counts from f0 - 2 (Recip's valid two cycles ahead; KV4's first
        # reciprocal is the row's, and kv_rowr is set only after f0) until the instruction
        # ends, so that no logic lies between the engine's control and the memories' blocks,
        # which lie across the die from it; the words read past the last group are not fed.
        # (Cleared while idle, as kv_gi is; not reset: nothing reads the memory before the
        # first clear.)
        g_addr = Signal.like(g_rd.addr, name="kv_g_addr", reset_less=True)
        g_q = Signal.like(g_rd.data, name="kv_gq", reset_less=True)
        kv_rd = Signal()      # reading the groups, two cycles ahead of feeding them
        rd_go = (valid_ahead("recip", 2) & kv & kv_codes & ~kv_rowr) | kv_rd
        m.d.sync += [kv_rd.eq(active & rd_go), g_addr.eq(Mux(active, g_addr + rd_go, 0)),
                     g_q.eq(g_rd.data)]
        m.d.comb += g_rd.addr.eq(g_addr)
        feed(u["mul_code"], feeding, "mul_code",
             a=Mux(shift, g_q[ACT_BITS:], g_q[:ACT_BITS]),
             b=Mux(row_r, u["recip"].o.payload.r, r))
        # the code in three stages of KV4_CODE_LATENCY: -255 p registered; its shift by sh's
        # high bits (a 63-bit shifter of four multiplexer levels was too long with the clip
        # behind it); then the shift by sh's low bits, t = -255 p >> sh, the ceiling of
        # 255 p / 2**sh, clipped and registered. The clip reads t's bits, not -t through a
        # carry chain as wide as the product: -t < 1 is t >= 0 (its sign, the sign of -255 p),
        # and -t is in [1, 255] exactly when t's bits from 8 up are all ones and its low 8 are
        # not all zeros; then the code is the negation of those 8 bits. t's bits from 8 up
        # are the partial shift's from 8 + (sh's low bits) up (an arithmetic shift copies the
        # sign), so their AND is the AND of its bits above 8 + 3, formed once, and of the few
        # between.
        pc = u["mul_code"].o.payload.y
        kv_np = Signal(signed(FOLD_BITS + KV4_CODE_BITS + 1), reset_less=True)
        kv_u = Signal.like(kv_np, name="kv_u", reset_less=True)
        kv_c = Signal(KV4_CODE_BITS, reset_less=True)
        lo_bits = 2
        sh_lo = sh[:lo_bits]
        lo_max = (1 << lo_bits) - 1
        t = kv_u >> sh_lo
        low = t[:KV4_CODE_BITS]
        hi_all = kv_u[KV4_CODE_BITS + lo_max:].all()
        ones = Cat(*(kv_u[KV4_CODE_BITS + k:KV4_CODE_BITS + lo_max].all() & hi_all
                     if k < lo_max else hi_all for k in range(lo_max + 1))).bit_select(sh_lo, 1)
        in_range = ones & low.any()
        m.d.sync += [kv_np.eq(pc - (pc << KV4_CODE_BITS)),   # -255 p: one adder, no DSP
                     kv_u.eq(kv_np >> Cat(Const(0, lo_bits), sh[lo_bits:])),
                     kv_c.eq(Mux(~kv_u[-1], 1, Mux(in_range, -low, KV4_CODE_MAX)))]
        kv_code_v = _delay(m, out_valid("mul_code"), self.KV4_CODE_LATENCY, "kv_code_v")
        kv_a = Signal(ACT_BITS, reset_less=True)     # amax >> s
        m.d.sync += kv_a.eq(amax >> shift)
        # the fourth stage: (amax >> s) * c as its chunk products, each in its DSP's output
        # register (a product and its adder in one stage into Recip's feed was too long), the
        # code beside them; summed as they enter Recip's feed
        a_chunks = chunks(kv_a)
        kv_pp = [Signal(len(ch) + KV4_CODE_BITS, name=f"kv_pp{k}", reset_less=True,
                        attrs={DSP_REGISTER: 1}) for k, ch in enumerate(a_chunks)]
        kv_c3 = Signal.like(kv_c, name="kv_c3", reset_less=True)
        m.d.sync += [*(pp.eq(ch * kv_c) for pp, ch in zip(kv_pp, a_chunks, strict=True)),
                     kv_c3.eq(kv_c)]
        kv_ac = sum((pp << (MULT_CHUNK * k) for k, pp in enumerate(kv_pp)), Const(0, 1))
        c_out = _delay(m, kv_c3, lat["recip"], "kv_code", data=True)
        g_out = recip_ov & kv & kv_rowr
        g_out_last = Signal()    # (registered below from the last group's Recip, a cycle early)
        m.submodules.kv_rs = rs_mem = memory.Memory(
            shape=unsigned(len(r) + len(sh)), depth=depth, init=[])
        rs_wr, kv_rs = rs_mem.write_port(), rs_mem.read_port()
        rs_at = Signal(len(rs_wr.addr), reset_less=True)
        with m.If(g_out):
            m.d.sync += rs_at.eq(rs_at + 1)
        m.d.comb += [rs_wr.addr.eq(rs_at), rs_wr.en.eq(g_out),
                     rs_wr.data.eq(Cat(u["recip"].o.payload.r, u["recip"].o.payload.sh))]
        # pass 2: the element's group registered beside its read, its (r2, sh2) read with it
        g_of = Signal(len(kv_rs.addr), reset_less=True)
        m.d.sync += g_of.eq(idx >> kv_lg)
        m.d.comb += kv_rs.addr.eq(g_of)
        m.submodules.kv_codes = cmem = memory.Memory(
            shape=unsigned(8 * VECTOR_WORD_BYTES), depth=depth // VECTOR_WORD_BYTES + 1, init=[])
        c_wr, c_rd = cmem.write_port(), cmem.read_port()
        c_pk = Signal(8 * VECTOR_WORD_BYTES, reset_less=True)
        c_lane = Signal(range(VECTOR_WORD_BYTES), reset_less=True)
        c_at = Signal(len(c_wr.addr), reset_less=True)
        c_word = c_pk | (c_out << (c_lane * 8))[:8 * VECTOR_WORD_BYTES]
        c_full = g_out & ((c_lane == VECTOR_WORD_BYTES - 1) | g_out_last)
        with m.If(g_out):
            m.d.sync += [c_pk.eq(Mux(c_full, 0, c_word)), c_lane.eq(Mux(c_full, 0, c_lane + 1))]
        with m.If(c_full):
            m.d.sync += c_at.eq(c_at + 1)
        with m.If(~active):
            m.d.sync += [rs_at.eq(0), c_pk.eq(0), c_lane.eq(0), c_at.eq(0)]
        m.d.comb += [c_wr.addr.eq(c_at), c_wr.en.eq(c_full), c_wr.data.eq(c_word)]
        big = y[ACT_BITS - 1]
        silu = is_[VecFunc.SILU_GATE]
        e30 = u["exp30"].o.payload.y
        rq_kv = is_[VecFunc.REQUANT] | kv
        feed(u["recip"], Mux(rq_kv, am_valid | kv_code_v,
                             Mux(fold, fold_go,
                                 Mux(silu, out_valid("exp30"), u["sum"].o.valid))),
             x=Mux(rq_kv, Mux(kv_code_v, kv_ac, y >> big),
                   Mux(fold, famax >> fs,
                       Mux(silu, (1 << NORM_FRAC) + e30, u["sum"].o.payload.y))))
        ss = u["sumsq"].o.payload.y + eps
        feed(u["rsqrt"], u["sumsq"].o.valid, x=ss)
        with m.If(u["sumsq"].o.valid):   # ss == 0 (both terms are non-negative)
            m.d.sync += ss_zero.eq((u["sumsq"].o.payload.y == 0) & (eps == 0))
        with m.If(u["recip"].o.valid & ~(kv & kv_rowr)):   # not a KV4 group's reciprocal
            m.d.sync += [r.eq(u["recip"].o.payload.r), sh.eq(u["recip"].o.payload.sh)]
        with m.If(u["rsqrt"].o.valid):
            m.d.sync += [r.eq(Mux(ss_zero, 0, u["rsqrt"].o.payload.r)),
                         sh.eq(u["rsqrt"].o.payload.sh + shift)]
        # The next pass starts (the copies of next_pass_d, a cycle behind) in the cycle a
        # per-row scalar's unit gives it, and DEQUANT's second in g + 2, after its amax read:
        # next_pass_d is that, a cycle early.
        # KV4: the last group's reciprocal next cycle, when kv_glast = rs_at + g_out (those
        # out before it). A count of the groups' reciprocals still to come, `gl` = kv_glast -
        # rs_at, with flags gl == 0 and gl == 1 registered beside it, so no adder and compare
        # lie in front of the pass decision: kv_glast - rs_at - g_out is 0 when gl is g_out.
        # (Loaded from kv_glast until the row's reciprocal comes out, after which the groups'
        # come.)
        gl = Signal.like(kv_glast, name="kv_gl", reset_less=True)
        gl0 = Signal(name="kv_gl0", reset_less=True)
        gl1 = Signal(name="kv_gl1", reset_less=True)
        with m.If(~kv_rowr):
            m.d.sync += [gl.eq(kv_glast), gl0.eq(kv_glast == 0), gl1.eq(kv_glast == 1)]
        with m.Elif(g_out):
            m.d.sync += [gl.eq(gl - 1), gl0.eq(gl1), gl1.eq(gl == 2)]
        kv_last_ahead = ahead["recip"] & kv & kv_rowr & Mux(g_out, gl1, gl0)
        m.d.sync += g_out_last.eq(kv_last_ahead)
        m.d.comb += next_pass_d.eq(
            (~active & self.cmd.valid & (body.func == VecFunc.DEQUANT))
            | ((is_[VecFunc.REQUANT] | fold | (kv & ~kv_codes)) & ahead["recip"])
            | (kv & kv_codes & kv_last_ahead)
            | (is_[VecFunc.SOFTMAX] & (ahead["max"] | ahead["recip"]))
            | (is_[VecFunc.RMSNORM] & (ahead["absmax"] | ahead["rsqrt"])))

        # -- REQUANT pass 2 (a key row's KV4: its element's group's r2, sh2; n lanes, a laned
        # KV4: a cycle's elements lie in one group, whose r2, sh2 every lane takes)
        rq_r = Mux(kv & kv_codes, kv_rs.data[:len(r)], r)
        rq_sh = Mux(kv & kv_codes, kv_rs.data[len(r):], sh)
        feed(u["requant"], (p2 & rq_kv) | wf_p2, x=Mux(fold, wf, x), r=rq_r, sh=rq_sh,
             s=Mux(fold, fs, shift), four=kv, key=kv_codes)
        for k, unit in enumerate(lanes("requant"), 1):
            feed(unit, (p2 & rq_kv) | wf_p2, x=Mux(fold, wfs[k], xs[k]), r=rq_r, sh=rq_sh,
                 s=Mux(fold, fs, shift), four=kv, key=kv_codes)
        # -- SOFTMAX: masked Max; Exp into Sum (pass 2) or Scale(16) (pass 3)
        # (n lanes: every lane through its Exp and Scale(16), Max and Sum through their lane
        # trees; a lane past the row's end is masked: -ACT_MAX into Max, exponential 0)
        sm = is_[VecFunc.SOFTMAX]
        maxed = [Mux(inrows[k], xs[k], -ACT_MAX) for k in range(n)]
        feed(u["max"], p1 & sm, x=maxed[0] if n == 1 else maxed, last=last)
        exp_lat = lat["exp"]
        e_last = _delay(m, last, exp_lat, "e_last")
        es = []
        for k, (ex, s16) in enumerate(zip([u["exp"], *lanes("exp")],
                                          [u["scale16"], *lanes("scale16")], strict=True)):
            feed(ex, (p2 | p3) & sm, "exp16", a=Mux(inrows[k], xs[k], top), b=top)
            e_in = _delay(m, inrows[k], exp_lat, "e_in" if k == 0 else f"e_in_l{k}_",
                          data=True)
            # (an Exp shared with the SiLU-gate's is wider: SOFTMAX's results have 17 bits)
            es.append(Mux(e_in, ex.o.payload.y[:ACT_FRAC + 1], 0))
            feed(s16, out_valid("exp16") & (phase == 2), "scale16", x=es[-1], r=r, sh=sh)
        feed(u["sum"], out_valid("exp16") & (phase == 1), x=es[0] if n == 1 else es,
             last=e_last)
        # (the probabilities' last: Scale(16)'s valid folded in before the delay, so that
        # the strobe alone is the write's last and its done, a cycle ahead below)
        p_last_a, p_last = _delay_ahead(m, e_last & out_valid("exp16") & (phase == 2),
                                        lat["scale16"], "p_last")
        # -- RMSNORM: SumSq (pass 2); Scale(30) and Mul with the delayed weight (pass 3)
        rn = is_[VecFunc.RMSNORM]
        feed(u["sumsq"], p2 & rn, x=x if n == 1 else xs, shift=shift, last=last)
        n_last = _delay(m, last & p3 & rn, lat["scale30"], "n_last")   # pass 3's: Mul's valid
        for k, (s30, mul30) in enumerate(zip([u["scale30"], *lanes("scale30")],
                                             [u["mul_w"], *lanes("mul_w")], strict=True)):
            feed(s30, p3 & rn, "scale30", x=xs[k], r=r, sh=sh)
            w = _delay(m, bs[k], lat["scale30"], "w" if k == 0 else f"w_l{k}_", data=True)
            feed(mul30, out_valid("scale30", k), "mul_w", a=s30.o.payload.y, b=w)
        y_last_a, y_last = _delay_ahead(m, n_last, lat["mul_w"], "y_last")

        # -- MUL; SILU_GATE: every unit's operands carried beside it (the units never stall)
        # (n lanes, vector_laned_silu: lane k's chain of copies, its own Recip; lane 0's
        # Recip is the per-row reciprocals' too)
        silu_lanes = n if self._cfg.vector_laned_silu else 1
        at_recip = lat["exp30"]
        at_scale = at_recip + lat["recip"]
        at_mul_es = at_scale + lat["scale60"]
        at_mul_gs = at_mul_es + lat["mul_es"]
        at_mul_u = at_mul_gs + lat["mul_gs"]
        s_last_a, s_last = _delay_ahead(m, last & silu, at_mul_u + lat["mul16"], "silu_last")
        mul = is_[VecFunc.MUL]   # Mul(16): MUL's row, or the SiLU-gate's last step
        for k in range(n):
            def unit(name, k=k):
                return u[name] if k == 0 else u[f"{name}_l{k}"]
            sfx = "" if k == 0 else f"_l{k}_"
            gates = []   # (valid, a, b) of the SiLU-gate's Mul(16) of this lane
            if k < silu_lanes:
                ex30, rc = unit("exp30"), unit("recip")
                feed(ex30, valid & silu, "exp30", a=Mux(xs[k][-1], xs[k], 0),
                     b=Mux(xs[k][-1], 0, xs[k]))
                e30k = ex30.o.payload.y
                if k > 0:   # lane 0's Recip is fed above, with the per-row reciprocals
                    feed(rc, out_valid("exp30", k), x=(1 << NORM_FRAC) + e30k)
                e_es = _delay(m, e30k, lat["recip"] + lat["scale60"], f"silu_e{sfx}", data=True)
                g_gs = _delay(m, xs[k], at_mul_gs, f"silu_g{sfx}", data=True)
                u_mu = _delay(m, bs[k], at_mul_u, f"silu_u{sfx}", data=True)
                s60, mes, mgs = unit("scale60"), unit("mul_es"), unit("mul_gs")
                feed(s60, rc.o.valid & silu, x=1, r=rc.o.payload.r, sh=rc.o.payload.sh)
                sig_pos = s60.o.payload.y

                def silu_mul(name, k=k):
                    """The use of lane ``k``'s SiLU-gate Mul ``name`` (a use of another
                    lane's Mul, _SILU_ON_LANES, or None: its own) and its results' valid."""
                    if k == 0 and name in self._silu_hosts:
                        return name, out_valid(name)
                    return None, unit(name).o.valid

                use_es, es_valid = silu_mul("mul_es")
                use_gs, gs_valid = silu_mul("mul_gs")
                feed(mes, s60.o.valid, use_es, a=e_es, b=sig_pos)
                sig = Mux(g_gs[-1], mes.o.payload.y,
                          _delay(m, sig_pos, lat["mul_es"], f"silu_s{sfx}", data=True))
                feed(mgs, es_valid, use_gs, a=g_gs, b=sig)
                gates = [(gs_valid, mgs.o.payload.y, u_mu)]
            if gates:
                g_valid, g_a, g_b = gates[0]
                feed(unit("mul16"), (valid & mul) | g_valid, "mul16", a=Mux(mul, xs[k], g_a),
                     b=Mux(mul, bs[k], g_b))
            else:
                # (MUL's alone: while SILU_GATE runs this lane's Mul may be lane 0's
                # SiLU-gate's, _SILU_ON_LANES)
                feed(unit("mul16"), valid & mul, "mul16", mul, a=xs[k], b=bs[k])
        mul_last_a, mul_last = _delay_ahead(m, last & is_[VecFunc.MUL], lat["mul16"],
                                            "mul_last")

        def _feed_rope_heads(k, unit):
            """A ROPE over whole heads (``heads``): lane ``k``'s element enters its Rope as
            the read's data arrives, with its partner lane ``k ^ d/2`` (negated in a head's
            first half, where bit ``d/2`` of ``k`` is 0) and table word ``k % (d/2)`` of the
            table's group read beside it; ``d/2`` is a power of two below ``n``, so its bits
            ``0 .. log2 n - 1`` select both (one of them set)."""
            partner, word = xs[k ^ 1], bs[0]
            for j in range(1, lg):
                partner = Mux(half[j], xs[k ^ (1 << j)], partner)
                word = Mux(half[j], bs[k & ((1 << j) - 1)], word)
            up = Cat(half[j] for j in range(lg) if k >> j & 1).any()
            feed(unit, valid & heads, "rope", only=heads, a=xs[k],
                 b=Mux(up, partner, -partner), cos=word[:ROPE_HALF_BITS],
                 sin=word[ROPE_HALF_BITS:2 * ROPE_HALF_BITS])

        # -- ROPE: x[k], x[k + d/2] registered as they arrive; element k enters Rope with the
        # table word, element k + d/2 the cycle after
        was_tab = _delay(m, tab, rl, "was_tab")
        lower = valid & is_rope & was_tab
        upper = Signal()
        up_last = Signal()
        m.d.sync += [upper.eq(lower), up_last.eq(lower & last)]
        # (n lanes, a laned ROPE: lane k of each read is pair k's, each lane through its Rope;
        # lane 0's is the one-lane ROPE's, whose elements the reads select)
        for k, rope_k in enumerate([u["rope"], *lanes("rope")]):
            sfx = "" if k == 0 else f"_l{k}"
            if heads_cfg:   # (first: its operands the outer selection, over a pair's)
                _feed_rope_heads(k, rope_k)
            xl = Signal(signed(ACT_BITS), name=f"rope_xl{sfx}", reset_less=True)
            xu = Signal(signed(ACT_BITS), name=f"rope_xu{sfx}", reset_less=True)
            cs = Signal(2 * ROPE_HALF_BITS, name=f"rope_cs{sfx}", reset_less=True)
            with m.If(valid & is_rope & ~was_tab):
                m.d.sync += [xl.eq(xs[k]), xu.eq(bs[k])]
            with m.If(lower):
                m.d.sync += cs.eq(xs[k])
            word_cs = Mux(upper, cs, xs[k][:2 * ROPE_HALF_BITS])
            feed(rope_k, lower | upper, "rope", a=Mux(upper, xu, xl), b=Mux(upper, xl, -xu),
                 cos=word_cs[:ROPE_HALF_BITS], sin=word_cs[ROPE_HALF_BITS:])
        rope_last_a, rope_last = _delay_ahead(
            m, (up_last | (valid & last & heads)) if heads_cfg else up_last, lat["rope"],
            "rope_last")
        # Each result's VOUT position: lower k -> upper k (+ d/2) -> lower k + 1 (+ 1 - d/2),
        # or the next head's first (+ 1) after its last pair (a laned ROPE: k steps by n,
        # `inc`, and so do these).
        # `step` is the next write's increment of dst, from registers only: 1 but in ROPE.
        r_up = Signal()      # the next ROPE result is an upper element
        r_k = Signal(ROPE_HEAD_DIM_BITS, reset_less=True)   # loaded while idle, as above
        r_last = Signal()    # r_k == head_dim / 2 - inc
        step = Signal(len(dst), init=1, reset_less=True)
        with m.If(out_valid("rope") & ~heads if heads_cfg else out_valid("rope")):
            r_last_next = Mux(r_up, Mux(r_last, half_m1 == 0, r_k == half_m2), r_last)
            inc_r = 1 if n == 1 else inc
            m.d.sync += [r_up.eq(~r_up), r_k.eq(Mux(r_up, Mux(r_last, 0, r_k + inc_r), r_k)),
                         r_last.eq(r_last_next),
                         step.eq(Mux(r_up, half, Mux(r_last, inc_r, one_m_half)))]
        with m.If(~active):
            # (n lanes: a laned sub-op's writes step by their words, n or a cycle's codes'; a
            # sub-op streaming one element a cycle writes one)
            one = 1 if n == 1 else Mux(
                self.cmd_lanes[1], n,
                Mux(Cat(body.func == f for f in _CODE_FUNCS).any(),
                    max(1, n // VECTOR_WORD_BYTES), 1))
            # (a ROPE over whole heads writes n a cycle: writes_n)
            rope_steps = body.func == VecFunc.ROPE
            if heads_cfg:
                rope_steps = rope_steps & ~self.cmd_lanes[1]
            m.d.sync += [r_up.eq(0), r_k.eq(0),
                         r_last.eq(body.imm[1:ROPE_HEAD_DIM_BITS] == inc_now),
                         step.eq(Mux(rope_steps, body.imm[1:ROPE_HEAD_DIM_BITS], one))]
        # -- DEQUANT: the amax word (pass 1, one element) gives the row's scalars; pass 2
        # streams the accumulators and channel words through DequantFactor and Scale(31).
        # CHANNEL: each element is an amax word, A and b from it as it is read, through
        # DequantFactor with imm's channel word; its channel word written as it comes out.
        dq = is_[VecFunc.DEQUANT]
        ch = is_[VecFunc.CHANNEL]
        amax_rd = _delay(m, issuing & dq & (phase == 0), rl, "amax_rd")  # rd_a is the amax word
        # (a FOLD word, imm's DEQUANT_FOLD_BIT: its mantissa and its shift)
        dq_a = Signal(AMAX_BITS, reset_less=True)
        dq_b = Signal(range(AMAX_BITS + 1), reset_less=True)
        dq_x = Signal(FOLD_AMAX_SHIFT_BITS, reset_less=True)
        # (registered while idle, from the command: no decode of `func` before the bit length)
        fold_word = Signal(reset_less=True)
        with m.If(~active):
            m.d.sync += fold_word.eq(body.imm[DEQUANT_FOLD_BIT]
                                     & (body.func == VecFunc.DEQUANT))
        amax_word = Mux(fold_word, rd_a[:FOLD_AMAX_MANT_BITS], rd_a)
        a_eff = Mux(amax_word == 0, DEQUANT_ZERO_AMAX, amax_word)
        a_bits = Mux(amax_word == 0, DEQUANT_ZERO_AMAX.bit_length(), _bitlen(amax_word))
        with m.If(amax_rd):
            m.d.sync += [dq_a.eq(a_eff), dq_b.eq(a_bits),
                         dq_x.eq(Mux(fold_word, rd_a[FOLD_AMAX_MANT_BITS:], 0))]
        dq_valid = valid & dq & ~amax_rd
        feed(u["dequant_factor"], dq_valid | (valid & ch),
             chan=Mux(ch, imm[:DEQUANT_WORD_BITS], rd_b), a=Mux(ch, a_eff, dq_a),
             b=Mux(ch, a_bits, dq_b), x=Mux(ch, 0, dq_x))
        for k, unit in enumerate(lanes("dequant_factor"), 1):
            feed(unit, dq_valid, chan=bs[k], a=dq_a, b=dq_b, x=dq_x)
        for k, (df, s31) in enumerate(zip([u["dequant_factor"], *lanes("dequant_factor")],
                                          [u["scale31"], *lanes("scale31")], strict=True)):
            dq_acc = _delay(m, xs[k], lat["dequant_factor"],
                            "dq_acc" if k == 0 else f"dq_acc_l{k}_", data=True)
            feed(s31, df.o.valid & dq, "scale31", x=dq_acc, r=df.o.payload.r,
                 sh=df.o.payload.sh)
        dq_last_a, dq_last = _delay_ahead(m, last & dq_valid,
                                          lat["dequant_factor"] + lat["scale31"], "dq_last")
        ch_last_a, ch_last = _delay_ahead(m, last & ch, lat["dequant_factor"], "ch_last")

        # -- INSERT: the word read with its code word beside it, the code's byte (or the whole
        # code word) multiplexed in, registered and written
        ins_hit = _delay(m, hit, rl, "ins_hit")
        ins_lane = _delay(m, ins_at[:3], rl, "ins_lane", data=True)   # a nibble's; [:2] a byte's
        ins_sel = _delay(m, ins_j3, rl, "ins_sel", data=True)
        code8 = rd_b.word_select(ins_sel[:2], 8)
        code4 = rd_b.word_select(ins_sel, 4)
        # (n lanes, a laned INSERT: the code goes to the lane of its word in the group read,
        # ins_word_at's low bits; one lane's INSERT and lane 0 otherwise)
        ins_k = _delay(m, ins_word_at[:lg], rl, "ins_k", data=True) if n > 1 else None

        def merged(k):
            """Lane ``k``'s word with the code multiplexed into its byte (nibble)."""
            at_k = ins_hit & (1 if n == 1 else Mux(wide, ins_k == k, k == 0))
            x8 = Cat(Mux(at_k & (ins_lane[:2] == j), code8, xs[k][8 * j:8 * j + 8])
                     for j in range(VECTOR_WORD_BYTES))
            x4 = Cat(Mux(at_k & (ins_lane == j), code4, xs[k][4 * j:4 * j + 4])
                     for j in range(2 * VECTOR_WORD_BYTES))
            return Mux(ins_nib, x4, x8)

        ins_v = Signal()
        ins_last = Signal()
        ins_y = [Signal(8 * VECTOR_WORD_BYTES, name=f"ins_y{k}" if k else "ins_y",
                        reset_less=True) for k in range(n)]
        m.d.sync += [ins_v.eq(valid & is_insert), ins_last.eq(last & is_insert),
                     ins_y[0].eq(Mux(ins_hit & ins_word, rd_b, merged(0)))]
        m.d.sync += [ins_y[k].eq(merged(k)) for k in range(1, n)]

        # ---- write
        add_last_a, add_last = _delay_ahead(m, last & is_[VecFunc.ADD], lat["add"], "add_last")
        code_last_a, code_last = _delay_ahead(
            m, (last & rq_kv & (phase == 1)) | (wf_last & wf_p2), lat["requant"], "code_last")
        # ARGMAX: the index now, the maximum next cycle
        second = Signal()
        arg_top = Signal(signed(ACT_BITS), reset_less=True)
        m.d.sync += second.eq(u["argmax"].o.valid)
        with m.If(u["argmax"].o.valid):
            m.d.sync += arg_top.eq(u["argmax"].o.payload.y)
        # REQUANT: codes packed four to a word; amax the cycle after the last code
        nbytes = VECTOR_WORD_BYTES
        packed = Signal(8 * nbytes, reset_less=True)   # this word's codes so far
        byte = Signal(range(nbytes))                   # the next code's byte
        rq = u["requant"].o
        code = rq.payload.a.as_unsigned()
        # (n lanes: a cycle's n codes, lane k's in byte k of them; a laned row's lanes past
        # its end read 0 and give code 0, the zeros above its last code)
        codes = Cat(code, *(unit.o.payload.a.as_unsigned() for unit in lanes("requant")))
        if n < nbytes:
            word = packed | (codes << (byte * 8))[:8 * nbytes]
            word_full = rq.valid & ~kv & ((byte == nbytes - n) | code_last)
        else:   # every cycle's codes fill n / 4 words: no packing register
            word = codes
            word_full = rq.valid & ~kv
        amax_write = Signal()
        m.d.sync += amax_write.eq(rq.valid & ~kv & code_last)
        with m.If(rq.valid & ~kv):
            m.d.sync += [packed.eq(Mux(word_full, 0, word)),
                         byte.eq(Mux(word_full, 0, byte + (n if n < nbytes else 0)))]
        with m.If(~active):
            m.d.sync += [packed.eq(0), byte.eq(0)]
        # KV4: nibbles packed eight to a word; then a key row's code words (read two cycles
        # ahead and registered out of their block RAM), then amax. (n lanes, a laned KV4: a
        # cycle's n nibbles, lane k's in nibble k of them, into the word being packed, n <= 8,
        # or filling n / 8 words a cycle, written as REQUANT's codes; a laned row's lanes
        # past its end give nibble 0, the zeros above its last.)
        nib_last = code_last
        per = KV4_NIBBLES_PER_WORD
        nibs = Cat(code[:4], *(unit.o.payload.a[:4] for unit in lanes("requant")))
        packs = n <= per                       # every KV4's nibbles packed into n_pk
        n_inc = inc if packs and n > 1 else 1  # the nibbles a cycle packed
        n_pk = Signal(8 * nbytes, reset_less=True)
        n_lane = Signal(range(per), reset_less=True)
        n_word = n_pk | ((nibs if packs else code[:4]) << (n_lane * 4))[:8 * nbytes]
        n_pack = rq.valid & kv & (1 if packs else ~wide)
        n_full = n_pack & ((n_lane == per - n_inc) | nib_last)
        with m.If(n_pack):
            m.d.sync += [n_pk.eq(Mux(n_full, 0, n_word)),
                         n_lane.eq(Mux(n_full, 0, n_lane + n_inc))]
        n_done = rq.valid & kv & nib_last     # the row's last nibbles written now
        k_tail = Signal()
        k_t = Signal(len(c_rd.addr), reset_less=True)
        t_last = k_tail & (k_t == (kv_glast >> 2))    # ceil(groups / 4) - 1
        k_amax = Signal()
        k_amax_a = (n_done & ~kv_codes) | t_last
        m.d.sync += k_amax.eq(k_amax_a)
        with m.If(n_done):
            m.d.sync += k_tail.eq(kv_codes)
        with m.If(k_tail):
            m.d.sync += [k_t.eq(k_t + 1), k_tail.eq(~t_last)]
        # The code words' read address is a register: word 0 read two cycles before the
        # tail's first write (the cycle before the last nibble word's: code_last a cycle
        # ahead, which for KV4 implies Requant's valid as code_last does), then one word a
        # cycle; the word read is registered (`kv_cq`), so the block RAM's clock-to-output
        # and the VOUT write multiplexer lie in different cycles. (The last code word was
        # written Requant's latency and more before: pass 2 starts after the last group's
        # reciprocal.)
        k_go = n_done & kv_codes                      # k_tail's first cycle next
        k_go_a = code_last_a & kv & kv_codes          # k_go next cycle
        c_ra = Signal.like(c_rd.addr, name="kv_c_ra", reset_less=True)
        c_q = Signal.like(c_rd.data, name="kv_cq", reset_less=True)
        with m.If(k_go_a | k_go | k_tail):
            m.d.sync += c_ra.eq(c_ra + 1)
        with m.If(~active):
            m.d.sync += [n_pk.eq(0), n_lane.eq(0), k_tail.eq(0), k_t.eq(0), c_ra.eq(0)]
        m.d.comb += c_rd.addr.eq(c_ra)
        m.d.sync += c_q.eq(c_rd.data)

        def ys(name):
            """Unit ``name``'s result: lane 0's alone (one lane), else every lane's."""
            return u[name].o.payload.y if n == 1 else \
                [u[name].o.payload.y] + [unit.o.payload.y for unit in lanes(name)]

        # Each enable the VOUT write multiplexer's priority chain selects on is a register
        # beside it, loaded one cycle ahead (as `done` is), not a unit's valid ANDed with the
        # engine's `is_` flags and counters across the die: a unit's valid ahead is
        # valid_ahead's, the flags (`kv`, `wide`, `ch`) hold while `active` (from before a
        # source's ahead cycle to its done), and a counter's compare reads the value the
        # counter loads next (its statements above, the idle clear last). The enables that
        # are the engine's own registers already (ARGMAX's second, amax_write, ins_v, k_amax,
        # k_tail) stay. (Reset, as the valid bits are: no write in the cycle after a reset.)
        def early(name, ahead):
            return replica(m, ahead, f"vout_en_{name}", reset=True)

        def unit_en(name, flag=None):
            ahead = valid_ahead(name)
            return early(name if flag is None else f"{name}_{flag[1]}",
                         ahead if flag is None else ahead & flag[0])

        rq_a = valid_ahead("requant")
        if n < nbytes:
            byte_next = Mux(~active, 0,
                            Mux(rq.valid & ~kv, Mux(word_full, 0, byte + n), byte))[:len(byte)]
            word_en = early("codes", rq_a & ~kv & ((byte_next == nbytes - n) | code_last_a))
        else:
            word_en = early("codes", rq_a & ~kv)
        lane_next = Mux(~active, 0,
                        Mux(n_pack, Mux(n_full, 0, n_lane + n_inc), n_lane))[:len(n_lane)]
        nib_en = early("nibbles", rq_a & kv & (1 if packs else ~wide)
                       & ((lane_next == per - n_inc) | code_last_a))
        # (n > 8 lanes: a laned KV4's n / 8 words a cycle, as REQUANT's codes)
        nib_words = [] if packs else [(early("nibble_words", rq_a & kv & wide), nibs, per)]
        if n == 1:
            mul16 = [(unit_en("mul16"), u["mul16"].o.payload.y, mul_last | s_last)]
        elif self._cfg.vector_laned_silu:   # MUL's or SILU_GATE's lanes
            mul16 = [(unit_en("mul16"), ys("mul16"), mul_last | s_last)]
        else:   # MUL's lanes, or SILU_GATE's one element
            mul16 = [(unit_en("mul16", (wide, "wide")), ys("mul16"), mul_last),
                     (unit_en("mul16", (~wide, "one")), u["mul16"].o.payload.y, s_last)]
        sources = [  # (write enable, data, the instruction's last write)
            (unit_en("add"), ys("add"), add_last),
            (unit_en("argmax"), (u["argmax"].o.payload.index + argmax_base(imm))[:ACT_BITS],
             0),
            (second, arg_top, 1),
            (word_en, word, 0),
            (amax_write, Mux(fold, fword, amax), 1),
            (unit_en("scale16"), ys("scale16"), p_last),   # 0 where masked
            (unit_en("mul_w"), ys("mul_w"), y_last),
            *mul16,
            *([(unit_en("rope"), u["rope"].o.payload.y, rope_last)] if n == 1 else
              [(unit_en("rope", (wide, "wide")), ys("rope"), rope_last),   # a laned ROPE's
               (unit_en("rope", (~wide, "one")), u["rope"].o.payload.y, rope_last)]),
            (unit_en("scale31"), ys("scale31"), dq_last),
            *([(ins_v, ins_y[0], ins_last)] if n == 1 else   # laned INSERT, or one word
              [(ins_v & wide, ins_y, ins_last), (ins_v & ~wide, ins_y[0], ins_last)]),
            (unit_en("dequant_factor", (ch, "ch")), u["dequant_factor"].o.payload.word,
             ch_last),
            (nib_en, n_word, 0),
            *((en, value, 0) for en, value, _ in nib_words),
            (k_amax, amax, 1),
        ]
        sources.insert(0, (k_tail, c_q, 0))
        if n == 1:
            data = 0
            for en, value, _ in reversed(sources):
                data = Mux(en, value, data)
            write = Cat(en for en, _, _ in sources).any()
            m.d.comb += [self.vout_wr.addr.eq(dst), self.vout_wr.en.eq(write),
                         self.vout_wr.data.eq(data)]
            dst_step = step
        else:
            write, dst_step = self._write_lanes(
                m, sources, dst=dst, step=step, tail=tail, code_last=code_last,
                packed=[(word_en, word, nbytes), *nib_words], length=length)
        # `done` is the OR of each source's enable and last (Cat(en & end ...).any()), which
        # the sequencer and the event unit read across the die in the same cycle: it is
        # registered from each source's (en & end) one cycle ahead instead. Each `end`
        # implies its `en` (a unit's valid is its input's delayed by its fixed latency, and
        # the last strobes are formed from what feeds it: SOFTMAX's and RMSNORM's with the
        # pass folded in), so the ahead value is the strobe's chain a register short; the
        # registered sources have their inputs. `wide` and the `is_` flags hold while
        # `active`, which holds from before a source's ahead cycle to its done. (Reset, as
        # the strobes are: no done in the cycle after a reset.) The port's copy and the one
        # that ends `active` are apart (hw/fanout.py), so that the placer can put the port's
        # beside its loads (the sequencer, the event unit, the counters).
        if n == 1 or self._cfg.vector_laned_silu:
            mul16_a = mul_last_a | s_last_a
        else:
            mul16_a = (wide & mul_last_a) | (~wide & s_last_a)
        done_ahead = Cat(add_last_a, u["argmax"].o.valid, rq.valid & ~kv & code_last,
                         p_last_a, y_last_a, mul16_a, rope_last_a, dq_last_a,
                         valid & last & is_insert, ch_last_a, k_amax_a).any()
        done = replica(m, done_ahead, "done_local", reset=True)
        m.d.comb += self.done.eq(replica(m, done_ahead, "done_port", reset=True))
        with m.If(write):
            m.d.sync += dst.eq(dst + dst_step)
        with m.If(done):
            m.d.sync += active.eq(0)
        _feed_units()
        return m

    def _write_lanes(self, m, sources, *, dst, step, tail, code_last, packed, length):
        """The VOUT write of an engine of ``n > 1`` lanes: ``(write, dst_step)``.

        ``sources`` are ``(enable, data, last)`` with ``data`` one word, written to the lane
        of ``dst`` (an element address), or a list of ``n`` (a laned sub-op's results,
        ``dst`` aligned, the lanes past the row's end, ``tail``, kept in its last write);
        ``packed``' ``(enable, word, per)`` name the sources of packed codes, ``per`` to a
        word (REQUANT's and FOLD's bytes, KV4's nibbles): ``kw = n / per`` words a write
        where that is more than one (a cycle's ``n`` codes, at ``dst``, a multiple of
        ``kw``, which steps by ``kw``; the row's last write, ``code_last``, only its words),
        else one word as the others.
        """
        n = self._lanes
        lg = n.bit_length() - 1
        ew = 8 * VECTOR_WORD_BYTES
        at = dst[:lg]
        one_hot = Cat(at == j for j in range(n))
        words = {}    # a packed source's enable -> (its values a lane, its lanes' mask)
        dst_step = step
        for code_en, code_word, per in packed:
            kw = n // per
            if kw < 2:
                continue
            lkw = kw.bit_length() - 1
            last_w = (length - 1)[:lg] >> (per.bit_length() - 1)
            mine = Mux(code_last, Cat(last_w >= j for j in range(kw)), Const((1 << kw) - 1, kw))
            words[id(code_en)] = ([code_word.word_select(j % kw, ew) for j in range(n)],
                                  Cat(mine[j % kw] & (at[lkw:] == j // kw) for j in range(n)))
            dst_step = Mux(code_en, Mux(code_last, last_w + 1, kw), dst_step)
        full = Const((1 << n) - 1, n)
        en = Const(0, n)
        lane_data = [Signal(ew, name=f"vout_l{j}") for j in range(n)]
        data = [0] * n
        for src_en, value, last in reversed(sources):
            if id(src_en) in words:
                vals, mask = words[id(src_en)]
            elif isinstance(value, list):
                vals, mask = value, Mux(last, tail, full)
            else:
                vals, mask = [value] * n, one_hot
            en = en | (src_en.replicate(n) & mask)
            data = [Mux(src_en, v, d) for v, d in zip(vals, data, strict=True)]
        m.d.comb += [sig.eq(d) for sig, d in zip(lane_data, data, strict=True)]
        m.d.comb += [self.vout_wr.addr.eq(dst[lg:]), self.vout_wr.en.eq(en),
                     self.vout_wr.data.eq(Cat(lane_data))]
        write = Cat(src_en for src_en, _, _ in sources).any()
        return write, dst_step


def _bitlen(y: Value) -> Value:
    """The bit length of unsigned ``y`` (0 for 0): :func:`_msb_index` of ``2y + 1``, no adder
    and no compare (``bitlen(v >> k)`` is ``max(0, bitlen(v) - k)``, a shift count without a
    subtraction)."""
    return _msb_index(Cat(Const(1, 1), Value.cast(y)))


def _msb_index(y: Value) -> Value:
    """The index of the highest set bit of unsigned ``y`` (``bitlen(y) - 1``; unspecified for
    0): a tree of halves, ``log2`` multiplexer levels deep and no adder (``y`` padded to a
    power-of-two width; the upper half's index with a 1 above it if it has a set bit, else the
    lower half's with a 0)."""
    y = Value.cast(y)
    n = 1 << max(0, (y.shape().width - 1).bit_length())
    y = Cat(y, Const(0, n - y.shape().width)) if n > y.shape().width else y
    if n == 1:
        return Cat()   # one bit: no index bits
    hi, lo = y[n // 2:], y[:n // 2]
    return Mux(hi.any(), Cat(_msb_index(hi), Const(1, 1)), Cat(_msb_index(lo), Const(0, 1)))
