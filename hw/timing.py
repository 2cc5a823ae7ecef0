"""The timing contract: how many cycles every instruction and the whole machine take.

This module is the single source of the accelerator's timing. The RTL implements it (the
equivalence harness proves cycle counts and counters match), the fast model (sim/) computes it,
and the compiler uses it for cost estimates. Constants below are properties of the RTL pipeline;
changing the RTL pipeline means changing them here, nowhere else. Every opcode's duration is a
pair of formulas here, one on an instruction and its twin on decoded fields (ints or numpy
arrays); which pair is an opcode's, and which completion delay an engine's, is said once, in the
table of :mod:`hw.engines` (:func:`hw.engines.exec_cycles`, :func:`hw.engines.exec_cycles_fields`,
:func:`hw.engines.completion_delay`).

Machine-level rules (cycle 0 is :data:`START_LATENCY` cycles after the ``start`` pulse)
------------------------------------------------------------------------------------
Fetch
    Instruction ``i`` is *available* at ``a_0 = FETCH_LATENCY`` and ``a_i = d_{i-1} + 1``. It is
    *dispatched* into its engine's queue at ``d_i = max(a_i, f_i)`` where ``f_i`` is one cycle
    after the pop of the instruction ``queue_depth`` places earlier in the same queue (a queue
    slot freed by a pop in cycle ``p`` can be written in ``p + 1``); ``f_i = 0`` if there is none.
    ``END`` is dispatched like any instruction but enters no queue; fetching stops.
    A dispatch error (:func:`hw.isa.dispatch_error`) in instruction ``i`` stops the machine at
    cycle ``a_i``; so does reaching ``pc == imem_depth`` (PC_OVERFLOW, ``error_pc =
    imem_depth``). An undefined opcode, and a SYNC whose engine field is not an engine, is
    ILLEGAL_OPCODE. (The fetch pipeline reads and checks instructions ahead of dispatch, so
    ``a_i = d_{i-1} + 1`` holds whatever the check latency; only ``a_0`` shows it.)
    REPEAT (:class:`hw.isa.Repeat`) is dispatched like END, into no queue, and fetching goes
    on: the ``i`` above counts dispatch slots of the expanded stream
    (:func:`hw.isa.loop_stream`), the body once per iteration. After the last instruction of
    a body iteration that is not the last, the fetch unit jumps back to the body's first
    instruction and refills its pipeline: that instruction is available at
    ``d_{i-1} + LOOP_BACK_LATENCY``. A REPEAT or END that reaches dispatch inside a body, and a
    REPEAT of no body or no iterations, stop the machine with BAD_REPEAT.
Engines (LOAD, COMPUTE, STORE and, when the configuration has one, VECTOR), each in order,
one instruction at a time
    *pop* ``p = max(d + 1, free)`` where ``free`` is the cycle after the previous instruction's
    execution (0 initially). The engine then waits from ``p + 1``: the *grant* ``g`` is ``p + 1``
    without a wait event, otherwise the first cycle ``>= p + 1`` in which the event counter
    (as registered at the start of that cycle) is >= 1; the grant decrements it. Execution
    occupies cycles ``g + 1 .. g + D`` (``D`` from the functions below) and ends in
    ``e = g + D``; ``free = e + 1``. The instruction *completes* in ``c = e + X`` (``X`` =
    :func:`hw.engines.completion_delay` of its engine): its last effect (a LOAD's last
    scratchpad write) lands and its signal event is incremented at the end of cycle ``c``
    (visible from ``c + 1``). The LOAD engine's ``X`` is the memory latency plus
    :data:`LOAD_OVERHEAD` (its ``D`` covers the read requests only): it pops and issues the
    next LOAD's requests while the previous LOAD's responses are still in flight, and its
    instructions (SYNCs too) complete in order, at most one per cycle. The other engines'
    ``X`` is 0.
Events
    Counters start at 0 and are ``event_bits`` wide. An increment that would exceed the maximum
    (the cycle's increments minus its grant, added to the registered value) ends the run with
    EVENT_OVERFLOW in that cycle (see Stop). Programs must give every event a single consumer
    engine (the hardware grants one waiter per event and cycle, the lowest engine number first).
Done
    ``cycles = max(d_END + 1, c + 1 of every engine's last instruction)``: the first cycle in
    which fetch has ended and every engine is idle with an empty queue and nothing left to
    complete.
Deadlock
    The first cycle in which no engine executes or has an instruction left to complete, every
    engine is either idle with an empty queue or waiting on an event whose counter is 0, fetch
    has ended or holds an instruction whose queue is full, and the machine is not done: the run
    ends with DEADLOCK in that cycle (see Stop).
Stop
    ``busy`` falls in cycle ``cycles + 1 + stop_delay(error)``. Done, a deadlock and an event
    overflow are decided a cycle after the cycle they are reported for (:data:`STOP_DELAY`):
    each reads state from across the whole machine, and the cycle lets the stop reach the
    machine's run register, its outcome and its counters from one flip-flop. Done and deadlock
    are states that no later cycle leaves, and in the extra cycle nothing observable happens
    (no DRAM traffic, counters held). A dispatch error stops the machine at once.

Errors report ``cycles`` = the cycle they were raised in; of several errors in one cycle the
lowest :class:`hw.isa.ErrorCode` is reported. Counters (:data:`hw.counters.COUNTERS`) cover
cycles ``0 .. cycles - 1``; the DMA beat and MAC counters count instructions that ended
(``e < cycles``). After an error, a STORE still executing in the error cycle may have written
part of its beats to DRAM.
"""

from __future__ import annotations

import numpy as np

from hw.config import AcceleratorConfig
from hw.format import StreamGeometry
from hw.isa import (
    EpilogueMode,
    ErrorCode,
    Gemm,
    Load,
    Opcode,
    Store,
    Sync,
    Vec,
    VecFunc,
    epilogue_words,
    gemm_geometry,
    gemm_geometry_fields,
    is_move,
    kv4_fields,
    kv4_groups,
    rope_heads_laned,
    vec_lanes,
    vec_out_words,
)

__all__ = [
    "START_LATENCY", "FETCH_LATENCY", "LOOP_BACK_LATENCY", "LOAD_OVERHEAD", "STORE_OVERHEAD",
    "SYNC_CYCLES", "GEMM_FILL",
    "GEMM_DRAIN", "EPILOGUE_FILL", "STOP_DELAY", "stop_delay", "dma_beats", "dma_beats_fields",
    "paced_cycles", "LOAD_TURNAROUND", "read_request_spacing",
    "load_cycles", "load_cycles_fields", "load_completion_delay", "store_cycles",
    "store_cycles_fields", "sync_cycles", "sync_cycles_fields", "gemm_step_cycles",
    "epilogue_cycles", "gemm_cycles", "gemm_cycles_fields", "mac_cycles_fields",
    "VECTOR_LATENCY", "VEC_READ_LATENCY", "VEC_FEED_LATENCY", "vec_cycles", "vec_cycles_fields",
    "vec_lane_tree",
    "vec_elements_fields", "KV4_CODE_LATENCY", "store_dram_beats_fields",
]

#: Cycles from the host's ``start`` pulse to cycle 0 (hw/top.py): ``start`` is accepted in
#: cycle -2, and every block is reset at the end of cycle -1 by its own registered copy of it.
START_LATENCY = 2
#: Cycles from cycle 0 to the first instruction being available at dispatch (hw/fetch.py:
#: instruction memory read in cycle 0, then word register, extent products, extent sums,
#: range comparisons).
FETCH_LATENCY = 5
#: Cycles from the dispatch of a body's last instruction to the availability of its first,
#: when a REPEAT loops back (hw/fetch.py: the dispatch loads the body's start into ``pc`` and
#: empties the pipeline, which then refills as from cycle 0).
LOOP_BACK_LATENCY = FETCH_LATENCY + 1
#: LOAD completion = its last read request + memory latency + this (the response register
#: before the scratchpad write of the last beat).
LOAD_OVERHEAD = 1
#: STORE execution = beats + this (spad read latency before the first write).
STORE_OVERHEAD = 1
#: SYNC executes in one cycle.
SYNC_CYCLES = 1
#: GEMM cycles before the first step enters row 0 (command in cycle c, hw/compute.py): the WGT
#: window fills (c+1, c+2), up to two header words (c+3, c+4), the first record (c+5) is
#: rotated, dequantised and loaded into row 0, which multiplies from c+9 = c + GEMM_FILL + 1.
GEMM_FILL = 8
#: GEMM cycles after the last step enters the last row until its accumulators are written
#: (PE multiply and accumulate stages).
GEMM_DRAIN = 2
#: Epilogue cycles before the first output word is written (accumulator read; partial products
#: on the borrowed PE and Dequant multipliers; their sum; window; rounding, residual and
#: saturation; see hw/epilogue.py).
EPILOGUE_FILL = 5
#: Cycles from the cycle a run is done, deadlocked or overflows an event to the cycle it stops.
STOP_DELAY = 1


def stop_delay(error: ErrorCode) -> int:
    """Cycles the stop of a run that ended with ``error`` comes after its ``cycles`` (see Stop):
    :data:`STOP_DELAY` after done (``NONE``), DEADLOCK and EVENT_OVERFLOW, 0 after a dispatch
    error."""
    late = (ErrorCode.NONE, ErrorCode.EVENT_OVERFLOW, ErrorCode.DEADLOCK)
    return STOP_DELAY if ErrorCode(error) in late else 0


def dma_beats(ins: Load | Store) -> int:
    """Beats a LOAD or STORE moves: ``rows * row_beats``."""
    return ins.rows * ins.row_beats


def dma_beats_fields(f: dict):
    """:func:`dma_beats` from :func:`hw.isa.decode_fields` (ints or arrays): the total a LOAD
    adds to ``dram_read_beats`` and a STORE to ``dram_write_beats`` when it ends."""
    return f["dma.rows"] * f["dma.row_beats"]


def paced_cycles(beats, k: int):
    """Cycles from the first to the last of ``beats`` beats issued one every ``k`` cycles
    (:attr:`hw.config.MemoryModel.cycles_per_beat`), both included: ``k * (beats - 1) + 1``
    (``beats`` at ``k = 1``; 0 for no beats; ints or arrays)."""
    return beats if k == 1 else beats + (k - 1) * np.maximum(beats - 1, 0)


#: Cycles from the last read request of a LOAD to the first of the next LOAD, at least: the
#: engine is free in ``e + 1``, pops then, is granted in ``e + 2`` and requests in ``e + 3``.
LOAD_TURNAROUND = 3


def read_request_spacing(cfg: AcceleratorConfig) -> int:
    """The fewest cycles between two consecutive DRAM read requests: ``k`` within a LOAD
    (:func:`load_cycles`), :data:`LOAD_TURNAROUND` between two LOADs."""
    return min(cfg.memory.cycles_per_beat, LOAD_TURNAROUND)


def load_cycles(ins: Load, cfg: AcceleratorConfig) -> int:
    """LOAD: a read request in ``g + 1`` and one every ``k`` cycles after it (``k`` =
    ``cfg.memory.cycles_per_beat``: one per cycle unpaced, :func:`paced_cycles`); execution
    ends with the last request (the beats land later: :func:`load_completion_delay`)."""
    return int(paced_cycles(dma_beats(ins), cfg.memory.cycles_per_beat))


def load_cycles_fields(f: dict, cfg: AcceleratorConfig):
    """:func:`load_cycles` from :func:`hw.isa.decode_fields` (ints or arrays)."""
    return paced_cycles(dma_beats_fields(f), cfg.memory.cycles_per_beat)


def load_completion_delay(cfg: AcceleratorConfig) -> int:
    """Cycles ``X`` from the end ``e`` of an instruction on the LOAD engine to its completion
    ``c`` (its last effect and its signal event, see Engines): the last request's response
    comes ``cfg.memory.latency`` cycles after it and is written :data:`LOAD_OVERHEAD` cycles
    later; a SYNC on that engine completes as late, so that its signal follows the data of
    every LOAD before it. (An engine without such a delay completes as it ends: ``X = 0``.)
    """
    return cfg.memory.latency + LOAD_OVERHEAD


def store_cycles(ins: Store, cfg: AcceleratorConfig) -> int:
    """STORE: a spad read in ``g + 1`` and one every ``k`` cycles after it (``k`` =
    ``cfg.memory.cycles_per_beat``, :func:`paced_cycles`), each written to DRAM the cycle
    after (posted writes). A move (:func:`hw.isa.is_move`, from VOUT or OUT) is not paced:
    it reads one beat a cycle and writes each into VIN the cycle after its read, where a
    STORE writes DRAM; its last VIN write is in ``e``, so a VEC granted on its signal reads
    the beats."""
    move = is_move(Opcode.STORE.value, int(getattr(ins.spad, "value", ins.spad)))
    k = 1 if move else cfg.memory.cycles_per_beat
    return int(paced_cycles(dma_beats(ins), k)) + STORE_OVERHEAD


def store_cycles_fields(f: dict, cfg: AcceleratorConfig):
    """:func:`store_cycles` from :func:`hw.isa.decode_fields` (ints or arrays)."""
    beats, k = dma_beats_fields(f), cfg.memory.cycles_per_beat
    if k == 1:
        return beats + STORE_OVERHEAD
    move = is_move(f["opcode"], f["dma.spad"])
    return np.where(move, beats, paced_cycles(beats, k)) + STORE_OVERHEAD


def store_dram_beats_fields(f: dict):
    """Beats a STORE writes to DRAM, from :func:`hw.isa.decode_fields` (ints or arrays): what
    it adds to ``dram_write_beats`` when it ends; a move's beats stay on chip (0)."""
    return dma_beats_fields(f) * np.logical_not(is_move(f["opcode"], f["dma.spad"]))


def sync_cycles(ins: Sync, cfg: AcceleratorConfig) -> int:
    """SYNC: :data:`SYNC_CYCLES` (its sequencer only waits and signals)."""
    return SYNC_CYCLES


def sync_cycles_fields(f: dict, cfg: AcceleratorConfig) -> int:
    """:func:`sync_cycles` from :func:`hw.isa.decode_fields` (an int for every SYNC)."""
    return SYNC_CYCLES


def _step_cycles(tokens, geo: StreamGeometry):
    """:func:`gemm_step_cycles` on ints or arrays: ``max(T, 1 + header words)`` for the first
    step of each group, ``T`` for the others."""
    excess = 1 + geo.header_words - tokens
    return geo.steps * tokens + geo.groups * excess * (excess > 0)


def gemm_step_cycles(ins: Gemm, cfg: AcceleratorConfig) -> int:
    """Cycles to stream all steps: each step holds its weights for ``tokens`` cycles, but a step
    that starts a group also needs its header words read first (one per word), one per cycle.
    The stream's groups and header words are :func:`hw.isa.gemm_geometry`'s."""
    return _step_cycles(ins.tokens, gemm_geometry(ins, cfg))


def epilogue_cycles(ins: Gemm, cfg: AcceleratorConfig) -> int:
    """Epilogue: one OUT word (``lanes`` bytes) per cycle; WIDE and WIDE_BIAS write four per
    token (:func:`hw.isa.epilogue_words`)."""
    if ins.epilogue == EpilogueMode.NONE:
        return 0
    return EPILOGUE_FILL + ins.tokens * int(epilogue_words(ins.epilogue.value))


def gemm_cycles(ins: Gemm, cfg: AcceleratorConfig) -> int:
    """GEMM: fill, stream the steps, skew through the rows, drain, epilogue."""
    return (GEMM_FILL + gemm_step_cycles(ins, cfg) + (cfg.rows - 1) + GEMM_DRAIN
            + epilogue_cycles(ins, cfg))


def gemm_cycles_fields(f: dict, cfg: AcceleratorConfig) -> np.ndarray:
    """:func:`gemm_cycles` from :func:`hw.isa.decode_fields` (arrays): the same formulas
    written with array operations."""
    t = f["gemm.tokens_m1"] + 1
    steps = _step_cycles(t, gemm_geometry_fields(f, cfg))
    epi = f["gemm.epilogue"]
    epilogue = np.where(epi == EpilogueMode.NONE.value, 0, EPILOGUE_FILL + t * epilogue_words(epi))
    return GEMM_FILL + steps + (cfg.rows - 1) + GEMM_DRAIN + epilogue


def mac_cycles_fields(f: dict):
    """Cycles row 0 of the array multiplies in a GEMM, ``k_steps * tokens``, from
    :func:`hw.isa.decode_fields` (ints or arrays): what it adds to ``mac_cycles`` when it
    ends."""
    return f["gemm.k_steps"] * (f["gemm.tokens_m1"] + 1)


# ---------------------------------------------------------------------- vector unit
#: Latency of each function unit of the vector unit (:mod:`hw.vector`), by its ``NAME``: the
#: cycles from the cycle a unit accepts an element (a reduction: the last element of a row) to
#: the first cycle its result is valid, when its output is never stalled. Every unit takes one
#: element per cycle; its constructor checks that its pipeline has exactly this many stages.
VECTOR_LATENCY = {
    "recip": 8, "rsqrt": 9, "exp": 9,
    "sum": 2, "max": 2, "absmax": 2, "argmax": 2, "sumsq": 3,
    "add": 1, "mul": 4, "rope": 4, "scale": 4, "requant": 7,
    "dequant_factor": 5,
}

#: Cycles from a VEC's read of a VIN element to the element entering its function unit (the
#: scratchpad's synchronous read, then a register on the read data).
VEC_READ_LATENCY = 2

#: Cycles from the vector engine selecting a function unit's operands to the unit taking them
#: (a register on every unit's input): each unit's result comes ``VEC_FEED_LATENCY +
#: VECTOR_LATENCY[name]`` cycles after the engine feeds it.
VEC_FEED_LATENCY = 1

#: Registers between a KV4 key row's group product leaving its Mul and the group's code
#: entering Recip's feed: ``-255 p``, its shift by ``sh``'s high bits, then the clipped
#: ceiling of the shift by the low bits (the code), then the partial products of ``(amax >>
#: s) * c`` (summed as they enter the feed).
KV4_CODE_LATENCY = 4


def vec_lane_tree(lanes):
    """Cycles a laned reduction adds (:func:`_vec_cycles`): the ``lanes`` elements of a cycle
    are combined (a maximum, a sum) in a tree of ``log2(lanes)`` registered levels before the
    row's running reduction takes them; 0 with one lane (ints or arrays of powers of two)."""
    return np.log2(lanes).astype(np.int64) if isinstance(lanes, np.ndarray) \
        else int(lanes).bit_length() - 1


def _vec_cycles(func, length, imm=0, lanes=1, silu=False, rope_heads=False):
    """:func:`vec_cycles` on ints or arrays, on an engine of ``lanes``
    (:attr:`hw.config.AcceleratorConfig.vector_lanes`; ``silu`` its ``vector_laned_silu``,
    ``rope_heads`` its ``vector_laned_rope_heads``). The engine reads ``n`` elements (of each
    operand row) per cycle, ``n = hw.isa.vec_lanes(func, lanes, imm, silu, rope_heads)`` (one
    but for :func:`hw.isa.laned_vec_funcs` and the INSERTs, ROPEs and KV4s of its rules), in
    ``g + 1 .. g + ceil(length / n)``; each cycle's elements are fed to their units (``n`` of
    each, side by side) ``VEC_READ_LATENCY`` cycles later, and a unit gives its result
    ``VEC_FEED_LATENCY + VECTOR_LATENCY[name]`` cycles after it is fed (``lat`` below); a
    reduction's ``n`` values of a cycle first pass :func:`vec_lane_tree`. ADD writes each
    cycle's results as its units give them: the last ``lat["add"]`` cycles after the last
    elements were fed. ARGMAX writes its result's words one per cycle from the cycle its unit
    gives it, ``lat["argmax"]`` cycles after the last element was fed. The instruction ends
    with its last VOUT write."""
    # A unit's result comes VEC_FEED_LATENCY + its latency after the engine feeds it.
    lat = {k: VEC_FEED_LATENCY + v for k, v in VECTOR_LATENCY.items()}
    n = vec_lanes(func, lanes, imm, silu, rope_heads)
    stream = (length + n - 1) // n + VEC_READ_LATENCY
    tree = vec_lane_tree(n)
    add = stream + lat["add"]
    argmax = (stream + lat["argmax"]
              + vec_out_words(VecFunc.ARGMAX.value, length) - 1)
    # REQUANT: pass 1 into AbsMax; its result enters Recip in the cycle it is given (the
    # scalar s is a bit of it); pass 2 reads from the cycle after Recip's result, into Requant,
    # each code packed and a word written with the fourth code or the row's last; amax the
    # cycle after.
    # (n lanes: n codes a cycle into the word being packed.)
    requant = (stream + tree + lat["absmax"] + lat["recip"] + stream + lat["requant"] + 1)
    # SOFTMAX: pass 1 into Max, m as it comes out; pass 2 from the cycle after into Exp and
    # Sum; Recip of the sum; pass 3 from the cycle after its result into Exp and Scale,
    # written as they come out. (n lanes: Max and Sum through their lane trees.)
    softmax = (stream + tree + lat["max"] + stream + lat["exp"] + tree + lat["sum"]
               + lat["recip"] + stream + lat["exp"] + lat["scale"])
    # RMSNORM: pass 1 into AbsMax, s as amax comes out; pass 2 from the cycle after into SumSq;
    # Rsqrt of the sum plus epsilon; pass 3 from the cycle after its result into Scale and Mul
    # (the weight beside it), written as they come out.
    rmsnorm = (stream + tree + lat["absmax"] + stream + tree + lat["sumsq"] + lat["rsqrt"]
               + stream + lat["scale"] + lat["mul"])
    # MUL: one pass through Mul(16). SILU_GATE: one pass, each element through Exp(30),
    # Recip, Scale(60) and three Muls (e * s, g * sigmoid, * u), written as it comes out
    # (n lanes, vector_laned_silu: a chain a lane, no reduction).
    mul = stream + lat["mul"]
    silu = stream + lat["exp"] + lat["recip"] + lat["scale"] + 3 * lat["mul"]
    # ROPE: two reads per pair of elements (x[k] and x[k + d/2] on the two ports, then the
    # table word), so the row's reads still take `length` cycles; each pair's two elements
    # enter Rope in the cycles the table word arrives and after it: the last one a cycle after
    # the last read's data. A ROPE over whole heads (hw.isa.rope_heads_laned, with
    # rope_heads) reads a group of its row a cycle, its table's group beside it, each lane's
    # element entering Rope with its partner lane's as the read's data arrives: no second read.
    heads = rope_heads & rope_heads_laned(func, imm, lanes)
    rope = stream + 1 - heads + lat["rope"]
    # DEQUANT: the amax word read in g + 1 (it is the row's scalar as it is read), then one
    # pass from g + 2, each element through DequantFactor and Scale (the accumulator carried
    # beside the factor), written as it comes out.
    dequant = 1 + stream + lat["dequant_factor"] + lat["scale"]
    # FOLD: REQUANT of the products a * c, computed in both passes: pass 1 through Mul into
    # AbsMax; amax and its bit length registered as they come out, Recip fed from them the
    # cycle after; pass 2 from the cycle after Recip's result through Mul into Requant, the
    # codes packed as REQUANT's; the amax word the cycle after the last code.
    fold = (stream + lat["mul"] + tree + lat["absmax"] + 1 + lat["recip"]
            + stream + lat["mul"] + lat["requant"] + 1)
    # INSERT: one pass; each word of the row, with the code word it takes read beside it on
    # the second port, merged by byte multiplexers into the unit-feed register and written
    # from it the cycle after it arrives (no function unit). (n lanes, hw.isa.insert_laned:
    # n words a cycle, the one code a group takes merged into its lane.)
    insert = stream + VEC_FEED_LATENCY
    # CHANNEL: one pass, each amax word (A and its bit length from it as it is read) through
    # DequantFactor with imm's word, the factor's channel word written as it comes out.
    channel = stream + lat["dequant_factor"]
    # KV4 (hw.numerics.vec_kv4): pass 1 into AbsMax, through the engine's lane tree whatever
    # n (its one AbsMax: `lanes`, not n), each group's max kept beside; Recip of amax as it
    # comes out; a key row's group codes then one per cycle through Mul, the code (the
    # ceiling of max_g * 255 * r, KV4_CODE_LATENCY) and Recip of amax times the code, the
    # last reciprocal a cycle after the one before; pass 2 from the cycle after the last
    # reciprocal into Requant, the nibbles packed eight to a word as they come out (n
    # lanes, hw.isa.kv4_laned: n codes a cycle); then the code words and the amax word, one
    # per cycle.
    groups = kv4_groups(length, imm)
    codes = kv4_fields(imm)[1]
    kv4 = (stream + vec_lane_tree(lanes) + lat["absmax"] + lat["recip"]
           + codes * (lat["mul"] + KV4_CODE_LATENCY + lat["recip"] + groups - 1)
           + stream + lat["requant"] + ((groups + 3) >> 2) + 1)
    # INSERT4: INSERT's pass, nibble multiplexers in place of the byte ones.
    insert4 = insert
    return ((func == VecFunc.ADD.value) * add + (func == VecFunc.ARGMAX.value) * argmax
            + (func == VecFunc.MUL.value) * mul + (func == VecFunc.SILU_GATE.value) * silu
            + (func == VecFunc.REQUANT.value) * requant
            + (func == VecFunc.SOFTMAX.value) * softmax
            + (func == VecFunc.RMSNORM.value) * rmsnorm + (func == VecFunc.ROPE.value) * rope
            + (func == VecFunc.DEQUANT.value) * dequant + (func == VecFunc.FOLD.value) * fold
            + (func == VecFunc.INSERT.value) * insert
            + (func == VecFunc.CHANNEL.value) * channel
            + (func == VecFunc.KV4.value) * kv4 + (func == VecFunc.INSERT4.value) * insert4)


def vec_cycles(ins: Vec, cfg: AcceleratorConfig) -> int:
    """VEC: stream the row through the sub-op's function unit, write the results to VOUT
    (see :func:`_vec_cycles`)."""
    return int(_vec_cycles(ins.func.value, ins.length, ins.imm, cfg.vector_lanes,
                           cfg.vector_laned_silu, cfg.vector_laned_rope_heads))


def vec_cycles_fields(f: dict, cfg: AcceleratorConfig):
    """:func:`vec_cycles` from :func:`hw.isa.decode_fields` (ints or arrays)."""
    return _vec_cycles(f["vec.func"], f["vec.length"], f["vec.imm"], cfg.vector_lanes,
                       cfg.vector_laned_silu, cfg.vector_laned_rope_heads)


def vec_elements_fields(f: dict):
    """Elements a VEC streams through its unit (``length``), from
    :func:`hw.isa.decode_fields` (ints or arrays): what it adds to ``vector_elements`` when it
    ends."""
    return f["vec.length"]
