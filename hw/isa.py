"""The instruction set, defined once as Amaranth data layouts.

The RTL decodes instructions with these layouts; the Python encoder/decoder below derives every
field offset and width from the same layouts, so the compiler, the fast model and the tests can
never disagree with the hardware about bit positions. See docs/architecture.md, "Instruction set".

An instruction is 128 bits: a 13-bit header (opcode, wait event, signal event) and a body whose
meaning depends on the opcode. Addresses into scratchpads and DRAM count *beats*
(``cfg.beat_bytes`` bytes).

Example
-------
>>> from hw.config import AcceleratorConfig
>>> cfg = AcceleratorConfig()
>>> ins = Load(spad=Spad.WGT, dram_addr=0, spad_addr=0, rows=1, row_beats=4, signal=2)
>>> decode(encode(ins, cfg)) == ins
True
"""

from __future__ import annotations

import collections
import dataclasses
import enum as pyenum
import functools
import itertools
import operator
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np
from amaranth.hdl import Mux, Value
from amaranth.lib import data, enum

from hw.config import AcceleratorConfig
from hw.errors import ContractError
from hw.format import StreamGeometry

__all__ = [
    "INSTR_BITS", "INSTR_BYTES", "NO_EVENT", "MAX_HEADER_WORDS", "Opcode",
    "Spad", "Engine", "EpilogueMode", "ErrorCode", "VecFunc", "LOAD_SPADS", "STORE_SPADS",
    "MOVE_SPAD", "SpadMove", "OUT_MOVE_SPAD", "MOVE_SOURCES", "is_move",
    "dma_source",
    "REG_FIELD_BITS", "NUM_REGS", "REG_BITS", "REG_VEC_FUNCS", "RunRegs", "RegTerm",
    "REG_SOURCES", "reg_value", "reg_table_values", "RegTable", "reg_values", "relative_fields",
    "relative_words",
    "relative_instruction", "uses_regs", "RELATIVE", "IMM_MAX",
    "Header", "DmaBody", "GemmBody", "SyncBody", "VecBody", "RepeatBody", "InstrLayout",
    "Load", "Store", "Gemm", "Sync", "Vec", "End", "Repeat", "Instr", "ISAError",
    "LoopStream", "loop_stream", "loop_stride", "loop_instruction", "DRAM_ADDR_MAX",
    "vec_out_words", "vec_out_terms", "vec_reads_b", "vec_reads_amax", "DEQUANT_FOLD_BIT",
    "dequant_imm", "dequant_amax_addr", "dequant_fold", "ARGMAX_BASE_BITS", "argmax_imm",
    "argmax_base", "argmax_pairs", "argmax_bad", "VEC_FUNC_VALUES", "LANED_VEC_FUNCS",
    "laned_vec_funcs", "vec_lanes", "rope_laned", "rope_heads_laned", "kv4_laned",
    "insert_laned", "vec_unaligned", "RTL_VEC_FUNCS", "ROPE_HEAD_DIM_BITS",
    "rope_imm", "rope_geometry", "INSERT_FIELDS", "InsertGeometry", "insert_imm",
    "insert_fields", "insert_geometry", "insert_bad", "KV4_GROUP_BITS", "kv4_imm", "kv4_fields",
    "kv4_group", "kv4_groups", "kv4_bad",
    "INSTRUCTIONS", "encode", "decode", "encode_program", "decode_program", "field_location",
    "program_words", "FieldArrays",
    "decode_fields", "set_field", "gemm_header_words", "gemm_geometry", "gemm_geometry_fields",
    "gemm_weight_bytes", "gemm_extents", "EPILOGUE_VALUES", "reads_param", "writes_wide",
    "epilogue_words",
    "bias_row_bytes", "word_beats", "DispatchLimits", "dispatch_limits",
    "legal_words", "dispatch_error", "dispatch_errors", "check",
]

INSTR_BITS = 128
INSTR_BYTES = INSTR_BITS // 8
#: Event id meaning "no event" in the wait/signal fields.
NO_EVENT = 31


class Opcode(enum.Enum, shape=3):
    INVALID = 0  # zeroed memory decodes as an illegal instruction, never as END
    LOAD = 1
    STORE = 2
    GEMM = 3
    SYNC = 4
    END = 5
    VEC = 6    # the vector engine (absent from configurations without one: ILLEGAL_OPCODE)
    REPEAT = 7  # a hardware loop, expanded by the fetch unit (:class:`Repeat`)


class Spad(enum.Enum, shape=3):
    ACT = 0    # activations, read by the array
    WGT = 1    # packed weight streams, read by the decoder
    OUT = 2    # epilogue results, read by the store engine
    PARAM = 3  # epilogue operands: per-lane multipliers, residual rows
    VIN = 4    # vector engine operands (int32 elements), written by LOAD
    VOUT = 5   # vector engine results (int32 elements), read by the store engine


class SpadMove(pyenum.Enum):
    """DMA ``spad`` values past :class:`Spad`'s that name a move, not a scratchpad (defined
    only with a vector engine: :func:`legal_words`). A plain Python enum, not a member of
    :class:`Spad`: the RTL carries that enum's names as attributes of every signal of its
    shape, so a member there would change configurations without a vector engine (the
    board's design) too."""

    OUT_VIN = 6   # a STORE naming it moves OUT beats into VIN (:data:`OUT_MOVE_SPAD`)


#: The scratchpads a LOAD may write and a STORE may read: every scratchpad has one writer and
#: one reader (the compute core or the vector engine on one side, a DMA engine on the other).
#: A DMA instruction naming another one fails with BAD_ADDRESS; an undefined value (7, and 6
#: without a vector engine) is ILLEGAL_OPCODE (:func:`legal_words`). A configuration without a
#: vector engine has empty VIN and VOUT scratchpads, so a transfer naming them fails its range
#: check (BAD_ADDRESS).
LOAD_SPADS = (Spad.ACT, Spad.WGT, Spad.PARAM, Spad.VIN)
#: A STORE naming :data:`MOVE_SPAD` (VIN) is a *move*: it reads VOUT from ``spad_addr`` as a
#: STORE of VOUT does and writes the beats into VIN where a STORE writes DRAM (``dram_addr``,
#: ``dram_stride``: VIN beat addresses), so a vector result reaches the next VEC's operands
#: without DRAM (docs/architecture.md, "Vector engine").
MOVE_SPAD = Spad.VIN
#: A STORE naming :data:`OUT_MOVE_SPAD` is the same move from OUT: a GEMM's epilogue results
#: (int32 lanes of a WIDE epilogue, the beats a STORE of OUT writes to DRAM) reach VIN, where a
#: DEQUANT reads them, without DRAM. The value is defined only with a vector engine.
OUT_MOVE_SPAD = SpadMove.OUT_VIN
#: Each move's field value and the scratchpad it reads (:func:`is_move`, :func:`dma_source`).
MOVE_SOURCES = {MOVE_SPAD: Spad.VOUT, OUT_MOVE_SPAD: Spad.OUT}
STORE_SPADS = (Spad.OUT, Spad.VOUT, *MOVE_SOURCES)


def is_move(opcode, spad):
    """Whether a DMA word of ``opcode`` and ``spad`` (values: ints, numpy arrays or Amaranth
    values) is a move, a STORE of VOUT or OUT beats into VIN (:data:`MOVE_SOURCES`)."""
    return (opcode == Opcode.STORE.value) & functools.reduce(
        operator.or_, (spad == s.value for s in MOVE_SOURCES))


def dma_source(opcode, spad):
    """The scratchpad value whose beats ``spad_addr`` counts in a DMA word: a move's source
    (:data:`MOVE_SOURCES`), ``spad`` otherwise (ints, numpy arrays or Amaranth values)."""
    store = opcode == Opcode.STORE.value
    return spad + sum((store & (spad == k.value)) * (v.value - k.value)
                      for k, v in MOVE_SOURCES.items())


class Engine(enum.Enum, shape=2):
    LOAD = 0
    COMPUTE = 1
    STORE = 2
    VECTOR = 3


class EpilogueMode(enum.Enum, shape=3):
    NONE = 0           # keep results in the accumulators (more K chunks follow)
    WIDE = 1           # write accumulators as int32
    INT8 = 2           # requantise with per-lane multipliers and a shift
    INT8_RESIDUAL = 3  # as INT8, plus an int8 residual read from PARAM
    WIDE_BIAS = 4      # as WIDE, plus a per-token int32 bias row read from PARAM


class VecFunc(enum.Enum, shape=4):
    """The sub-operation of a VEC instruction (its ``func`` field; docs/architecture.md,
    "Vector engine"). Rows are ``length`` int32 elements of VIN; results go to VOUT."""

    ADD = 0      # dst[i] = sat32(a[i] + b[i])                   (hw.numerics.vec_add)
    ARGMAX = 1   # dst[0] = imm's base + first index of max(a), dst[1] = max; imm's PAIRS
    #              bit: over a's (index, value) pairs (argmax_imm, hw.numerics.vec_argmax_words)
    REQUANT = 2  # int8 codes of a, four per word, then amax      (hw.numerics.vec_requant)
    SOFTMAX = 3  # dst[i] = softmax of a over its first imm positions (hw.numerics.vec_softmax)
    RMSNORM = 4  # dst[i] = RMSNorm of a, weight row b, eps imm    (hw.numerics.vec_rmsnorm)
    MUL = 5      # dst[i] = sat32(round_shift(a[i] * b[i], 16))   (hw.numerics.vec_mul)
    SILU_GATE = 6  # dst[i] = silu(a[i]) * b[i]                  (hw.numerics.vec_silu_gate)
    ROPE = 7     # rotary rotation of heads, table at b_addr     (hw.numerics.vec_rope_pairs)
    DEQUANT = 8  # dst[i] = acc a[i], channel word b[i], amax VIN[imm] (hw.numerics.vec_dequant)
    FOLD = 9     # REQUANT of the 54-bit a[i] * b[i]: codes, then its amax word (vec_fold)
    INSERT = 10  # dst = row a with the int8 codes of b scattered into its bytes (vec_insert)
    CHANNEL = 11  # dst[i] = channel word of imm's word times amax a[i] (vec_channel)
    KV4 = 12     # INT4 KV row of a: nibbles, group codes (imm), amax (hw.numerics.vec_kv4)
    INSERT4 = 13  # INSERT in nibbles: the nibbles of b into row a (hw.numerics.vec_insert4)


#: The func field's defined values (any other is ILLEGAL_OPCODE: :func:`legal_words`).
VEC_FUNC_VALUES = tuple(m.value for m in VecFunc)
#: The sub-ops the RTL vector engine (:mod:`hw.vector.engine`) builds: every one (the RTL
#: equivalence harness draws from these).
RTL_VEC_FUNCS = tuple(VecFunc)
#: Values below the largest defined one that name no sub-op (ILLEGAL_OPCODE as those above).
_VEC_FUNC_GAPS = tuple(v for v in range(max(VEC_FUNC_VALUES)) if v not in VEC_FUNC_VALUES)
#: The sub-ops whose ``imm`` a run-time register may move (any other VEC naming one is
#: ILLEGAL_OPCODE): a SOFTMAX's valid positions, an INSERT's or INSERT4's ``base``. Their
#: checks of ``imm`` read the sum; the fetch unit checks those a stage after the others
#: (hw/fetch.py), and the checks of every other sub-op's ``imm`` need no adder.
REG_VEC_FUNCS = (VecFunc.SOFTMAX.value, VecFunc.INSERT.value, VecFunc.INSERT4.value)


#: Run-time registers: a LOAD, STORE or VEC word names one of them (its ``reg`` field, 0:
#: none), whose value the fetch unit adds to the word's run-time field as it dispatches it
#: (:func:`relative_fields`): an offset, no product. The host writes them when it starts a
#: program (hw/top.py samples them with ``start``); :class:`RegTerm` says what a compiled
#: executable keeps in each.
REG_FIELD_BITS = 4
#: The registers, numbered 1 .. NUM_REGS (0 in a ``reg`` field names none).
NUM_REGS = (1 << REG_FIELD_BITS) - 1
#: Bits of a register: as wide as a DMA's ``dram_addr`` (set below), the widest field one
#: moves within range (a VEC's ``imm`` is wider, but every ``imm`` a register moves, a
#: SOFTMAX count or an INSERT's base, is below 2**16).
REG_BITS = 32
#: The run-time registers as a port: register ``i`` (1 .. NUM_REGS) is element ``i - 1``.
RunRegs = data.ArrayLayout(REG_BITS, NUM_REGS)


class ErrorCode(enum.Enum, shape=4):
    NONE = 0
    ILLEGAL_OPCODE = 1
    BAD_EVENT = 2
    BAD_ADDRESS = 3
    BAD_GEMM = 4
    PC_OVERFLOW = 5
    EVENT_OVERFLOW = 6
    DEADLOCK = 7
    BAD_REPEAT = 8  # a REPEAT of no body or no iterations; a REPEAT or END inside a body


Header = data.StructLayout({
    "opcode": Opcode,
    "wait": 5,
    "signal": 5,
})

DmaBody = data.StructLayout({
    "spad": Spad,
    "dram_addr": 32,
    "spad_addr": 16,
    "rows": 16,
    "row_beats": 16,
    "dram_stride": 28,
    "reg": REG_FIELD_BITS,   # dram_addr + the register's value (0: none)
})

GemmBody = data.StructLayout({
    "wgt_addr": 16,
    "act_addr": 16,
    "act_stride": 12,
    "out_addr": 16,
    "param_addr": 8,
    "k_steps": 14,
    "group_steps": 14,   # 0: raw weights, no group headers
    "tokens_m1": 5,      # tokens - 1
    "pattern": 3,        # index into cfg.pattern_table (0 = dense)
    "int8": 1,           # 8-bit weight values (dense only)
    "asym": 1,           # asymmetric: a zero-point header word follows each code word
    "accumulate": 1,     # add onto the accumulators instead of clearing them
    "epilogue": EpilogueMode,
    "shift": 5,
})

SyncBody = data.StructLayout({
    "engine": Engine,
})

#: A VEC instruction: addresses and lengths count elements (int32 words), not beats.
VecBody = data.StructLayout({
    "func": VecFunc,
    "a_addr": 16,   # VIN: the row (ADD's first operand)
    "b_addr": 16,   # VIN: the second operand (ADD, MUL, SILU_GATE, RMSNORM); ROPE: its table
    "dst_addr": 16,  # VOUT: the results (vec_out_words of them)
    "length": 16,   # elements of the row, >= 1
    "imm": 40,      # SOFTMAX: valid positions (<= length); RMSNORM: epsilon (norm_eps);
                    # ROPE: head_dim + heads * 2**16 (rope_imm)
                    # DEQUANT: the VIN address of the token's amax word, FOLD's with
                    # bit 16 (dequant_imm); INSERT: the codes' bytes (insert_imm);
                    # CHANNEL: a channel word (bits 0..23, those above ignored);
                    # ARGMAX: an index base and the PAIRS bit (argmax_imm)
    "reg": REG_FIELD_BITS,  # imm + the register's value, saturated (0: none; REG_VEC_FUNCS)
})

#: REPEAT: the next ``length`` instructions (the *body*) run ``count`` times; iteration ``i``
#: adds ``i * stride`` beats to the DRAM address of every LOAD and STORE in the body, the
#: stride by the transfer's class (:func:`loop_stride`): a layer's weight tiles, its other
#: operands (activations, bias rows, vector inputs) and its results advance differently.
RepeatBody = data.StructLayout({
    "length": 16,        # instructions in the body, >= 1
    "count": 16,         # iterations, >= 1
    "wgt_stride": 27,    # DRAM beats per iteration: LOADs into WGT
    "load_stride": 27,   # DRAM beats per iteration: the other LOADs
    "store_stride": 27,  # DRAM beats per iteration: STOREs
})

InstrLayout = data.StructLayout({
    "header": Header,
    "body": data.UnionLayout({"dma": DmaBody, "gemm": GemmBody, "sync": SyncBody,
                              "vec": VecBody, "repeat": RepeatBody}),
})
assert InstrLayout.size <= INSTR_BITS, InstrLayout.size
# The DMA body is the widest: it fills the instruction exactly.
assert Header.size + DmaBody.size == INSTR_BITS, Header.size + DmaBody.size


class ISAError(ContractError):
    """An instruction the encoder refuses; the message names the field and value."""


# ---------------------------------------------------------------------- field offsets
def _fields(layout: data.StructLayout, base: int) -> dict[str, tuple[int, int]]:
    return {name: (base + f.offset, f.width) for name, f in layout}


_HDR = _fields(Header, InstrLayout["header"].offset)
_BODY = InstrLayout["body"].offset
#: Every body layout of the union, by its name there (an instruction class's ``body``).
_BODIES = {name: _fields(f.shape, _BODY) for name, f in InstrLayout["body"].shape}


def _put(word: int, field: tuple[int, int], value: int, name: str) -> int:
    off, width = field
    if not 0 <= value < (1 << width):
        raise ISAError(f"field {name}={value} does not fit in {width} bits")
    return word | (value << off)


def _get(word: int, field: tuple[int, int]) -> int:
    off, width = field
    return (word >> off) & ((1 << width) - 1)


# ---------------------------------------------------------------------- instructions
@dataclass(frozen=True, kw_only=True)
class _Base:
    """Common header: wait on an event before executing, signal one when done.

    A class per opcode: ``opcode``, ``body`` (the name of its layout in ``InstrLayout``'s body
    union, None without one), ``_body_fields`` (its fields as encoded integers) and
    ``_from_body`` (the inverse, raising :class:`ISAError` for a value no field member names).
    """

    wait: int | None = None
    signal: int | None = None
    opcode: ClassVar[Opcode]
    body: ClassVar[str | None] = None

    def _body_fields(self) -> dict[str, int]:
        return {}

    @classmethod
    def _from_body(cls, f: dict[str, int], ev: dict[str, int | None]) -> _Base:
        """The instruction of encoded body fields ``f`` and events ``ev``."""
        return cls(**ev)


@dataclass(frozen=True, kw_only=True)
class _Dma(_Base):
    """The body shared by :class:`Load` and :class:`Store`: ``rows`` rows of ``row_beats``
    beats, DRAM rows ``dram_stride`` apart, scratchpad rows contiguous from ``spad_addr``."""

    spad: Spad | SpadMove = Spad.ACT   # SpadMove: a move (STORE only; hw.isa.MOVE_SOURCES)
    dram_addr: int = 0
    spad_addr: int = 0
    rows: int = 1
    row_beats: int = 1
    dram_stride: int = 0
    reg: int = 0
    body: ClassVar[str] = "dma"

    def _body_fields(self):
        return {"spad": self.spad.value, "dram_addr": self.dram_addr,
                "spad_addr": self.spad_addr, "rows": self.rows, "row_beats": self.row_beats,
                "dram_stride": self.dram_stride, "reg": self.reg}

    @classmethod
    def _from_body(cls, f: dict[str, int], ev: dict[str, int | None]) -> _Base:
        if f["spad"] == OUT_MOVE_SPAD.value:   # (a LOAD naming it: BAD_ADDRESS, as OUT)
            return cls(**{**f, "spad": OUT_MOVE_SPAD}, **ev)
        if f["spad"] not in Spad._value2member_map_:
            raise ISAError(f"{cls.opcode.name} names spad {f['spad']}, which does not exist")
        return cls(**{**f, "spad": Spad(f["spad"])}, **ev)


@dataclass(frozen=True, kw_only=True)
class Load(_Dma):
    """DRAM -> scratchpad: ``rows`` rows of ``row_beats`` beats, DRAM rows ``dram_stride`` apart,
    written contiguously from ``spad_addr``."""

    opcode: ClassVar[Opcode] = Opcode.LOAD


@dataclass(frozen=True, kw_only=True)
class Store(_Dma):
    """Scratchpad (OUT) -> DRAM, the mirror image of :class:`Load`; a move into VIN where
    ``spad`` is a key of :data:`MOVE_SOURCES`."""

    spad: Spad = Spad.OUT
    opcode: ClassVar[Opcode] = Opcode.STORE


@dataclass(frozen=True, kw_only=True)
class Gemm(_Base):
    """Stream ``k_steps`` steps of a packed weight tile against ``tokens`` activation rows.

    Lane ``l`` computes output channel ``l`` of the tile for every token. Token ``t``'s
    activations start at ACT beat ``act_addr + t * act_stride``.
    """

    wgt_addr: int = 0
    act_addr: int = 0
    act_stride: int = 0
    out_addr: int = 0
    param_addr: int = 0
    k_steps: int = 1
    group_steps: int = 0
    tokens: int = 1
    pattern: int = 0
    int8: bool = False
    asym: bool = False
    accumulate: bool = False
    epilogue: EpilogueMode = EpilogueMode.WIDE
    shift: int = 0
    opcode: ClassVar[Opcode] = Opcode.GEMM
    body: ClassVar[str] = "gemm"

    def _body_fields(self):
        if self.tokens < 1:
            raise ISAError(f"tokens must be >= 1, got {self.tokens}")
        return {"wgt_addr": self.wgt_addr, "act_addr": self.act_addr,
                "act_stride": self.act_stride, "out_addr": self.out_addr,
                "param_addr": self.param_addr, "k_steps": self.k_steps,
                "group_steps": self.group_steps, "tokens_m1": self.tokens - 1,
                "pattern": self.pattern, "int8": int(self.int8), "asym": int(self.asym),
                "accumulate": int(self.accumulate), "epilogue": self.epilogue.value,
                "shift": self.shift}

    @classmethod
    def _from_body(cls, f: dict[str, int], ev: dict[str, int | None]) -> _Base:
        f = dict(f)
        f["tokens"] = f.pop("tokens_m1") + 1
        for b in ("int8", "asym", "accumulate"):
            f[b] = bool(f[b])
        if f["epilogue"] not in EpilogueMode._value2member_map_:
            raise ISAError(f"GEMM names epilogue {f['epilogue']}, which does not exist")
        f["epilogue"] = EpilogueMode(f["epilogue"])
        return cls(**f, **ev)


@dataclass(frozen=True, kw_only=True)
class Sync(_Base):
    """Only wait and/or signal, on the queue of ``engine`` (e.g. to seed buffer credits)."""

    engine: Engine = Engine.LOAD
    opcode: ClassVar[Opcode] = Opcode.SYNC
    body: ClassVar[str] = "sync"

    def _body_fields(self):
        return {"engine": self.engine.value}

    @classmethod
    def _from_body(cls, f: dict[str, int], ev: dict[str, int | None]) -> _Base:
        if f["engine"] not in Engine._value2member_map_:
            raise ISAError(f"SYNC names engine {f['engine']}, which does not exist")
        return cls(engine=Engine(f["engine"]), **ev)


@dataclass(frozen=True, kw_only=True)
class Vec(_Base):
    """One pass of the vector engine over a row of ``length`` VIN elements from ``a_addr``
    (ADD: and one from ``b_addr``; ROPE: its table, :func:`rope_imm`), writing
    :func:`vec_out_words` VOUT elements from ``dst_addr`` (:class:`VecFunc`; semantics:
    :mod:`sim.functional`, from :mod:`hw.numerics`)."""

    func: VecFunc = VecFunc.ADD
    a_addr: int = 0
    b_addr: int = 0
    dst_addr: int = 0
    length: int = 1
    imm: int = 0
    reg: int = 0
    opcode: ClassVar[Opcode] = Opcode.VEC
    body: ClassVar[str] = "vec"

    def _body_fields(self):
        return {"func": self.func.value, "a_addr": self.a_addr, "b_addr": self.b_addr,
                "dst_addr": self.dst_addr, "length": self.length, "imm": self.imm,
                "reg": self.reg}

    @classmethod
    def _from_body(cls, f: dict[str, int], ev: dict[str, int | None]) -> _Base:
        if f["func"] not in VecFunc._value2member_map_:
            raise ISAError(f"VEC names func {f['func']}, which does not exist")
        if f["reg"] and f["func"] not in REG_VEC_FUNCS:
            raise ISAError(f"VEC {VecFunc(f['func']).name} names run-time register {f['reg']}; "
                           f"only {[VecFunc(v).name for v in REG_VEC_FUNCS]} take one")
        return cls(**{**f, "func": VecFunc(f["func"])}, **ev)


def _masked(cond, value):
    """``value`` where ``cond``, else 0: ints and arrays as a product, Amaranth values as a
    multiplexer (no multiplier and no adder in hardware)."""
    if isinstance(cond, Value) or isinstance(value, Value):
        return Mux(cond, value, 0)
    return cond * value


def vec_out_terms(func, length, imm=0):
    """The terms whose sum is :func:`vec_out_words`, each 0 but for ``func``'s: the row
    sub-ops' ``length``; ARGMAX's 2; REQUANT's and FOLD's ``(length + 7) >> 2`` (``ceil(length
    / 4) + 1``); KV4's ``(length + 7) >> 3`` and ``(groups + 7) >> 2`` (``ceil(groups / 4) +
    1``). Each is at most one adder of the instruction's fields (none of another term), so the
    fetch unit registers them and sums them with ``dst_addr`` in one carry-save sum. Ints,
    arrays or Amaranth values."""
    rows = ((func == VecFunc.ADD.value) | (func == VecFunc.SOFTMAX.value)
            | (func == VecFunc.RMSNORM.value) | (func == VecFunc.MUL.value)
            | (func == VecFunc.SILU_GATE.value) | (func == VecFunc.ROPE.value)
            | (func == VecFunc.DEQUANT.value) | (func == VecFunc.INSERT.value)
            | (func == VecFunc.CHANNEL.value) | (func == VecFunc.INSERT4.value))
    packs = (func == VecFunc.REQUANT.value) | (func == VecFunc.FOLD.value)
    kv4 = func == VecFunc.KV4.value
    return (_masked(rows, length), _masked(func == VecFunc.ARGMAX.value, 2),
            _masked(packs, (length + 7) >> 2), _masked(kv4, (length + 7) >> 3),
            _masked(kv4, (kv4_groups(length, imm) + 7) >> 2))


def vec_out_words(func, length, imm=0):
    """VOUT elements (words) a VEC writes: ``length`` (the row sub-ops: ADD, SOFTMAX, RMSNORM,
    MUL, SILU_GATE, ROPE, DEQUANT, INSERT, CHANNEL, INSERT4); 2 (ARGMAX: the index, the max);
    ``ceil(length / 4) + 1`` (REQUANT and FOLD: the int8 codes packed four to a word, code
    ``i`` in byte ``i % 4`` of word ``i // 4``, the last word's unused bytes 0; then ``amax``
    as an unsigned 32-bit word, FOLD's as :func:`hw.numerics.fold_amax_word`);
    ``ceil(length / 8) + ceil(groups / 4) + 1`` (KV4: the nibbles, the group codes of
    ``imm``'s groups, :func:`kv4_groups`, and amax: :func:`hw.numerics.kv4_words`). Ints,
    arrays or Amaranth values (the sum of :func:`vec_out_terms`, so that the three agree)."""
    return functools.reduce(operator.add, vec_out_terms(func, length, imm))


def vec_reads_b(func):
    """The sub-op reads a second operand row from ``b_addr`` (the second operand of ADD, MUL
    and SILU_GATE, RMSNORM's weight row, DEQUANT's channel words, FOLD's value codes,
    INSERT's and INSERT4's packed codes: at most ``length`` words of them,
    :func:`insert_geometry`); ints,
    arrays or Amaranth values."""
    return ((func == VecFunc.ADD.value) | (func == VecFunc.RMSNORM.value)
            | (func == VecFunc.MUL.value) | (func == VecFunc.SILU_GATE.value)
            | (func == VecFunc.DEQUANT.value) | (func == VecFunc.FOLD.value)
            | (func == VecFunc.INSERT.value) | (func == VecFunc.INSERT4.value))


#: The sub-ops the vector engine streams :attr:`hw.config.AcceleratorConfig.vector_lanes`
#: elements a cycle (every other one element a cycle, but INSERT's and INSERT4's whose codes
#: lie a group of lanes apart, :func:`insert_laned`, ROPE's of :func:`rope_laned` and KV4's
#: of :func:`kv4_laned`): the one table the timing
#: (:func:`hw.timing.vec_cycles`), the dispatch checks (their rows aligned to the lanes) and
#: the compiler read.
LANED_VEC_FUNCS = (VecFunc.ADD, VecFunc.REQUANT, VecFunc.RMSNORM, VecFunc.MUL, VecFunc.DEQUANT,
                   VecFunc.FOLD, VecFunc.SOFTMAX)


def laned_vec_funcs(cfg: AcceleratorConfig) -> tuple[VecFunc, ...]:
    """The sub-ops ``cfg``'s vector engine streams ``vector_lanes`` elements a cycle (but the
    INSERTs of :func:`insert_laned`): :data:`LANED_VEC_FUNCS`, and SILU_GATE where
    :attr:`hw.config.AcceleratorConfig.vector_laned_silu` says its chain has a copy a lane."""
    return LANED_VEC_FUNCS + ((VecFunc.SILU_GATE,) if cfg.vector_laned_silu else ())


def vec_lanes(func, lanes: int, imm, silu: bool = False, rope_heads: bool = False):
    """Elements a VEC of ``func`` and ``imm`` streams per cycle on an engine of ``lanes``
    (:attr:`hw.config.AcceleratorConfig.vector_lanes`; ``silu`` its ``vector_laned_silu``,
    ``rope_heads`` its ``vector_laned_rope_heads``): ``lanes`` for a sub-op of
    :func:`laned_vec_funcs`, an INSERT or INSERT4 of :func:`insert_laned`, a ROPE of
    :func:`rope_laned` and a KV4 of :func:`kv4_laned`, 1 for the others; ints, arrays or
    Amaranth values."""
    return 1 + (lanes - 1) * (_vec_laned(func, silu) | insert_laned(func, imm, lanes)
                              | rope_laned(func, imm, lanes, rope_heads)
                              | kv4_laned(func, imm, lanes))


def rope_laned(func, imm, lanes: int, heads: bool = False):
    """A ROPE that streams ``lanes`` elements a cycle (:func:`vec_lanes`): one whose half
    head ``head_dim / 2`` (:func:`rope_geometry`) is a multiple of ``lanes``, so that a
    group of ``lanes`` pairs ``k .. k + lanes - 1`` lies in two aligned groups of the row
    (``x[k ..]`` and ``x[k + d/2 ..]``) and one of the table; with ``heads`` (the
    configuration's ``vector_laned_rope_heads``) also one of :func:`rope_heads_laned`. Never
    with one lane; ints, arrays or Amaranth values."""
    if lanes == 1:
        return func != func   # false, of func's kind
    half = rope_geometry(imm)[0] >> 1
    pairs = (func == VecFunc.ROPE.value) & (half != 0) & ((half & (lanes - 1)) == 0)
    return (pairs | rope_heads_laned(func, imm, lanes)) if heads else pairs


def rope_heads_laned(func, imm, lanes: int):
    """A ROPE whose heads an aligned group of ``lanes`` elements holds whole: its
    ``head_dim`` (:func:`rope_geometry`) a power of two dividing ``lanes`` (a half head of 1
    to ``lanes / 2``), so that element ``k``'s partner ``k ^ d/2`` lies in the group of
    ``k`` and every head's table words ``0 .. d/2 - 1`` in one group of the table. Streamed
    ``lanes`` elements a cycle by an engine with ``vector_laned_rope_heads``
    (:func:`rope_laned`); disjoint from :func:`rope_laned`'s half heads of a multiple of the
    lanes. Never with one lane; ints, arrays or Amaranth values."""
    if lanes == 1:
        return func != func   # false, of func's kind
    half = rope_geometry(imm)[0] >> 1
    return ((func == VecFunc.ROPE.value) & (half != 0) & ((half & (half - 1)) == 0)
            & ((half >> (lanes.bit_length() - 1)) == 0))


def kv4_laned(func, imm, lanes: int):
    """A KV4 that streams ``lanes`` elements a cycle (:func:`vec_lanes`): a value row, or a
    key row whose group (:func:`kv4_imm`) is ``lanes`` elements or more, so that a cycle's
    aligned group of elements lies in one group of the row (one maximum of it, one
    reciprocal). Never with one lane; ints, arrays or Amaranth values."""
    if lanes == 1:
        return func != func   # false, of func's kind
    lg, codes = kv4_fields(imm)
    return (func == VecFunc.KV4.value) & ((codes == 0) | (lg >= lanes.bit_length() - 1))


def _vec_laned(func, silu: bool = False):
    """The sub-op is one of :data:`LANED_VEC_FUNCS`, or SILU_GATE with ``silu`` (ints, arrays
    or Amaranth values)."""
    funcs = LANED_VEC_FUNCS + ((VecFunc.SILU_GATE,) if silu else ())
    return functools.reduce(operator.or_, (func == v.value for v in funcs))


def _is_insert_func(func):
    return (func == VecFunc.INSERT.value) | (func == VecFunc.INSERT4.value)


def insert_laned(func, imm, lanes: int):
    """An INSERT or INSERT4 that streams ``lanes`` words a cycle (:func:`vec_lanes`): one whose
    consecutive codes (:func:`insert_imm`) lie at least ``lanes`` words apart -- ``stride``
    within a group, ``stride + skip`` from group to group where a group is one code, counted
    in bytes (INSERT, 4 to a word) or nibbles (INSERT4, 8) -- or that places one code; so an
    aligned group of ``lanes`` words read takes at most one code, in the lane of its word,
    and the engine walks the codes as with one lane. (A key cache's append: a code per loaded
    beat, a beat's words apart.) Never with one lane, nor at stride 1 (whole code words);
    ints, arrays or Amaranth values."""
    if lanes == 1:
        return func != func   # false, of func's kind
    f = insert_fields(imm)
    one = f["group_m1"] == 0
    spacing = f["stride"] + f["skip"] * one
    per = 4 + 4 * (func == VecFunc.INSERT4.value)   # codes a word
    return _is_insert_func(func) & (f["stride"] != 1) & (
        (spacing >= per * lanes) | (one & (f["groups_m1"] == 0)))


def vec_unaligned(func, a_addr, b_addr, dst_addr, lanes: int, silu: bool = False):
    """A VEC that may stream ``lanes`` elements a cycle (:data:`LANED_VEC_FUNCS`, SILU_GATE
    with ``silu``, INSERT, INSERT4, ROPE and KV4: :func:`vec_lanes`) whose row ``a_addr``,
    second row ``b_addr`` (where a laned sub-op reads one: :func:`vec_reads_b`) or results
    ``dst_addr`` do not start on a multiple of its lanes: the engine reads and writes
    ``lanes`` elements of one scratchpad row a cycle. An INSERT's rows are aligned whatever
    its ``imm`` (so that the rule reads no ``imm``, which a run-time register moves); it reads
    its code words one at a time. A ROPE's row, its table (``b_addr``) and its results are
    held to the lanes whatever its ``imm`` too (:func:`rope_laned` reads the head from it;
    one of :func:`rope_heads_laned` reads its table's group whole), and a KV4's row and
    results (:func:`kv4_laned` reads the group from it). Always false with one lane; ints,
    arrays or Amaranth values."""
    mask = lanes - 1
    laned = _vec_laned(func, silu)
    rope = func == VecFunc.ROPE.value
    rows = laned | _is_insert_func(func) | rope | (func == VecFunc.KV4.value)
    return ((rows & (((a_addr | dst_addr) & mask) != 0))
            | (((laned & vec_reads_b(func)) | rope) & ((b_addr & mask) != 0)))


def vec_reads_amax(func):
    """The sub-op reads one VIN word at the element address ``imm`` before its row (DEQUANT's
    amax, :func:`dequant_imm`); ints, arrays or Amaranth values."""
    return func == VecFunc.DEQUANT.value


#: The bit of a DEQUANT's ``imm`` that marks its amax word as FOLD's
#: (:func:`hw.numerics.fold_amax_word`: a mantissa and a shift) rather than REQUANT's.
DEQUANT_FOLD_BIT = 16


def dequant_imm(addr: int, fold: bool = False) -> int:
    """The ``imm`` of a DEQUANT whose amax word is VIN element ``addr`` (below 2**16), FOLD's
    with ``fold``."""
    if not 0 <= addr < 1 << DEQUANT_FOLD_BIT:
        raise ValueError(f"amax word address {addr} must be in [0, {1 << DEQUANT_FOLD_BIT})")
    return addr | (int(fold) << DEQUANT_FOLD_BIT)


def dequant_amax_addr(imm):
    """The VIN element a DEQUANT's ``imm`` names (:func:`dequant_imm`): its bits but the FOLD
    bit, those above it moved down (an ``imm`` with them set names an element past every VIN);
    ints, arrays or Amaranth values."""
    low = (1 << DEQUANT_FOLD_BIT) - 1
    return (imm & low) | ((imm >> (DEQUANT_FOLD_BIT + 1)) << DEQUANT_FOLD_BIT)


def dequant_fold(imm):
    """The DEQUANT's amax word is FOLD's (:data:`DEQUANT_FOLD_BIT` of ``imm``); ints, arrays or
    Amaranth values."""
    return (imm >> DEQUANT_FOLD_BIT) & 1


#: Bits of an ARGMAX's ``imm`` holding its index base; the bit above is its PAIRS bit
#: (:func:`argmax_imm`), the bits above that are ignored.
ARGMAX_BASE_BITS = 24


def argmax_imm(base: int = 0, pairs: bool = False) -> int:
    """The ``imm`` of an ARGMAX (:func:`hw.numerics.vec_argmax_words`) whose index word is
    ``base`` (below ``2**ARGMAX_BASE_BITS``) plus the first maximum's index, or, with
    ``pairs``, plus the index word of the first pair of maximal value word (its row:
    ``length / 2`` pairs ``(index, value)``; an odd ``length`` is BAD_ADDRESS,
    :func:`argmax_bad`): a row too long for a scratchpad half is cut into segments, each
    segment's ARGMAX with its first element's index as ``base``, their ``(index, max)``
    words one row of pairs, whose PAIRS ARGMAX is the whole row's."""
    if not 0 <= base < 1 << ARGMAX_BASE_BITS:
        raise ValueError(f"ARGMAX index base {base} must be in [0, {1 << ARGMAX_BASE_BITS})")
    return base | (int(pairs) << ARGMAX_BASE_BITS)


def argmax_base(imm):
    """The index base of an ARGMAX's ``imm`` (:func:`argmax_imm`); ints, arrays or Amaranth
    values."""
    return imm & ((1 << ARGMAX_BASE_BITS) - 1)


def argmax_pairs(imm):
    """The PAIRS bit of an ARGMAX's ``imm`` (:func:`argmax_imm`); ints, arrays or Amaranth
    values."""
    return (imm >> ARGMAX_BASE_BITS) & 1


#: Bits of ``imm`` that hold a ROPE's ``head_dim`` (the bits above hold its number of heads).
ROPE_HEAD_DIM_BITS = 16


def rope_imm(head_dim: int, heads: int) -> int:
    """The ``imm`` of a ROPE over ``heads`` heads of ``head_dim`` elements: ``head_dim +
    heads * 2**ROPE_HEAD_DIM_BITS``; its ``length`` is ``heads * head_dim``.

    Why both: the engine pairs element ``i`` of a head with ``i +- head_dim / 2`` and reads
    the table (``head_dim / 2`` words from ``b_addr``) again for every head, so it needs
    ``head_dim``; the fetch unit checks that the row is whole heads, ``heads * head_dim ==
    length``, which with the quotient given is one 16 x 16 product (without it, a divider).
    """
    if not 0 <= head_dim < 1 << ROPE_HEAD_DIM_BITS or heads < 0:
        raise ValueError(f"head_dim={head_dim} must be in [0, {1 << ROPE_HEAD_DIM_BITS}) and "
                         f"heads={heads} >= 0")
    return head_dim + (heads << ROPE_HEAD_DIM_BITS)


def rope_geometry(imm):
    """``(head_dim, heads)`` of a ROPE's ``imm`` (:func:`rope_imm`); ints, arrays or Amaranth
    values."""
    return imm & ((1 << ROPE_HEAD_DIM_BITS) - 1), imm >> ROPE_HEAD_DIM_BITS


#: INSERT's ``imm`` fields, low bits first, and their widths (:func:`insert_imm`): the byte
#: of code 0 in the row, the codes per group less one, the groups less one, the bytes from a
#: code to the next in its group, the bytes skipped after a group's last code's stride.
INSERT_FIELDS = (("base", 10), ("group_m1", 9), ("groups_m1", 5), ("stride", 8), ("skip", 8))
if sum(w for _, w in INSERT_FIELDS) != VecBody["imm"].width:
    raise ImportError("INSERT_FIELDS do not fill a VEC's imm")


class InsertGeometry(NamedTuple):
    """Where an INSERT puts its codes (:func:`insert_imm`): ``groups`` groups of ``group``
    codes; code ``j`` goes to byte ``base + (j // group) * (group * stride + skip) + (j %
    group) * stride`` of the row."""

    base: int
    group: int
    groups: int
    stride: int
    skip: int

    @property
    def codes(self) -> int:
        """The codes inserted, ``group * groups``."""
        return self.group * self.groups

    @property
    def span(self) -> int:
        """Bytes from one group's first code to the next's: ``group * stride + skip``."""
        return self.group * self.stride + self.skip


def insert_imm(base: int, group: int, groups: int = 1, stride: int = 1, skip: int = 0
               ) -> int:
    """The ``imm`` of an INSERT (:class:`InsertGeometry`): ``groups`` groups of ``group``
    codes, the first at byte ``base`` of the row, ``stride`` bytes apart in a group, each
    group's first ``skip`` bytes past the previous group's last code's ``stride``. Fields
    low bits first (:data:`INSERT_FIELDS`): ``base``, ``group - 1``, ``groups - 1``,
    ``stride``, ``skip``.

    Why this form: the engine walks the codes' bytes in increasing order with one adder
    (``+ stride``, or ``+ stride + skip`` after a group's last code), so they never go back
    and the fetch unit checks the geometry without a product (the rule table: ``stride`` 1 or
    at least 4, and with 1 whole words: ``base``, ``group`` and ``skip`` multiples of 4).
    Keys of a position: one group of ``head_dim`` codes, ``stride`` the bytes from one
    channel's record to the next in VIN; values: ``head_dim / lanes`` groups of ``lanes``,
    stride 1; one word: one group of 4.

    Raises
    ------
    ValueError
        A field outside its width (the message names it and its value).
    """
    values = {"base": base, "group_m1": group - 1, "groups_m1": groups - 1, "stride": stride,
              "skip": skip}
    imm, at = 0, 0
    for name, width in INSERT_FIELDS:
        v = values[name]
        if not 0 <= v < 1 << width:
            shown = name.removesuffix("_m1")
            raise ValueError(f"INSERT {shown}={v + (name != shown)} does not fit its "
                             f"{width}-bit field{' (less one)' if name != shown else ''}")
        imm |= v << at
        at += width
    return imm


def insert_fields(imm) -> dict:
    """The raw fields of an INSERT's ``imm`` by their :data:`INSERT_FIELDS` names (``group``
    and ``groups`` less one, as the engine and the fetch unit hold them); ints, arrays or
    Amaranth values."""
    fields, at = {}, 0
    for name, width in INSERT_FIELDS:
        fields[name] = (imm >> at) & ((1 << width) - 1)
        at += width
    return fields


def insert_geometry(imm) -> InsertGeometry:
    """:class:`InsertGeometry` of an INSERT's ``imm`` (:func:`insert_imm`); ints or arrays."""
    f = insert_fields(imm)
    return InsertGeometry(f["base"], f["group_m1"] + 1, f["groups_m1"] + 1, f["stride"],
                          f["skip"])


#: Bits of a KV4's ``imm`` holding its group's log2 (:func:`kv4_imm`); the bit above says the
#: row has group codes (keys) or not (values).
KV4_GROUP_BITS = 4


def kv4_imm(group: int | None) -> int:
    """The ``imm`` of a KV4 (:func:`hw.numerics.vec_kv4`): 0 for a value row (no group codes);
    for a key row, its group's log2 with the codes bit above (:data:`KV4_GROUP_BITS`).

    Raises
    ------
    ValueError
        A group that is not a power of two below ``2**16`` (the message names it).
    """
    if group is None:
        return 0
    if group < 1 or group & (group - 1) or group >= 1 << (1 << KV4_GROUP_BITS):
        raise ValueError(f"a KV4 group must be a power of two below "
                         f"{1 << (1 << KV4_GROUP_BITS)}, got {group}")
    return (group.bit_length() - 1) | (1 << KV4_GROUP_BITS)


def kv4_fields(imm):
    """The fields of a KV4's ``imm`` (:func:`kv4_imm`): its group's log2 and the codes bit (1:
    a key row, with group codes); ints, arrays or Amaranth values."""
    return imm & ((1 << KV4_GROUP_BITS) - 1), (imm >> KV4_GROUP_BITS) & 1


def kv4_group(imm) -> int | None:
    """The group of a KV4's ``imm`` (:func:`kv4_imm`), None for a value row; ints."""
    lg, codes = kv4_fields(int(imm))
    return 1 << lg if codes else None


def kv4_groups(length, imm):
    """The group codes a KV4 of ``length`` writes: ``length >> log2(group)`` with codes, else
    0 (:func:`kv4_imm`); ints, arrays or Amaranth values (an OR over the 16 shifts, at most
    one of them selected, so that a shift by a field stays a constant one in hardware and no
    adder sums them)."""
    lg, codes = kv4_fields(imm)
    shifted = functools.reduce(operator.or_, (_masked(lg == k, length >> k)
                                              for k in range(1 << KV4_GROUP_BITS)))
    return _masked(codes, shifted)


@dataclass(frozen=True, kw_only=True)
class End(_Base):
    """End of program: the accelerator is done once every engine has drained."""

    opcode: ClassVar[Opcode] = Opcode.END


@dataclass(frozen=True, kw_only=True)
class Repeat(_Base):
    """A hardware loop: the next ``length`` instructions (the body) run ``count`` times.

    The fetch unit expands it (no engine sees it; it is dispatched like END, into no queue,
    and its events are checked but unused). In iteration ``i`` (from 0) every LOAD and STORE
    of the body transfers from DRAM beat ``dram_addr + i * stride``, ``stride`` the REPEAT's
    stride of the transfer's class (:func:`loop_stride`); scratchpad addresses and every
    other field are those of the words in memory, so a body that covers a whole
    double-buffer period repeats exactly. Rules (:class:`ErrorCode` ``BAD_REPEAT``):
    ``length >= 1`` and ``count >= 1`` (checked at dispatch), and no REPEAT or END inside a
    body (checked when it reaches dispatch inside one: loops do not nest, and a body ends
    before the program does). A body instruction is checked with its effective DRAM address
    (:func:`loop_stream`): one out of DRAM in some iteration fails with BAD_ADDRESS there.
    Timing: hw/timing.py, "Fetch".
    """

    length: int = 1
    count: int = 1
    wgt_stride: int = 0
    load_stride: int = 0
    store_stride: int = 0
    opcode: ClassVar[Opcode] = Opcode.REPEAT
    body: ClassVar[str] = "repeat"

    def _body_fields(self):
        return {"length": self.length, "count": self.count, "wgt_stride": self.wgt_stride,
                "load_stride": self.load_stride, "store_stride": self.store_stride}

    @classmethod
    def _from_body(cls, f: dict[str, int], ev: dict[str, int | None]) -> _Base:
        return cls(**f, **ev)


#: Every instruction class, one per defined opcode (which engine runs each, how long it takes
#: and what it counts: the table of :mod:`hw.engines`).
Instr = Load | Store | Gemm | Sync | End | Vec | Repeat
INSTRUCTIONS: tuple[type[_Base], ...] = typing.get_args(Instr)
_BY_OPCODE = {c.opcode: c for c in INSTRUCTIONS}
assert set(_BY_OPCODE) == set(Opcode) - {Opcode.INVALID}, set(Opcode) ^ set(_BY_OPCODE)


# ---------------------------------------------------------------------- encode / decode
def _event(v: int | None) -> int:
    return NO_EVENT if v is None else v


def encode(ins: Instr, cfg: AcceleratorConfig | None = None) -> int:
    """Encode one instruction as a 128-bit integer; with ``cfg``, validate it first."""
    if cfg is not None:
        check(ins, cfg)
    w = _put(0, _HDR["opcode"], ins.opcode.value, "opcode")
    w = _put(w, _HDR["wait"], _event(ins.wait), "wait")
    w = _put(w, _HDR["signal"], _event(ins.signal), "signal")
    if ins.body:
        fields = _BODIES[ins.body]
        for name, value in ins._body_fields().items():
            w = _put(w, fields[name], int(value), name)
    return w


def decode(word: int) -> Instr:
    """Decode a 128-bit instruction word (raises :class:`ISAError` for an illegal opcode)."""
    op = _get(word, _HDR["opcode"])
    try:
        cls = _BY_OPCODE[Opcode(op)]
    except (ValueError, KeyError):
        raise ISAError(f"illegal opcode {op}") from None
    ev = {k: (None if (v := _get(word, _HDR[k])) == NO_EVENT else v) for k in ("wait", "signal")}
    f = {name: _get(word, fld) for name, fld in _BODIES[cls.body].items()} if cls.body else {}
    return cls._from_body(f, ev)


def encode_program(program: list[Instr], cfg: AcceleratorConfig | None = None) -> np.ndarray:
    """Encode a program as little-endian bytes (``INSTR_BYTES`` per instruction)."""
    out = bytearray()
    for ins in program:
        out += encode(ins, cfg).to_bytes(INSTR_BYTES, "little")
    return np.frombuffer(bytes(out), dtype=np.uint8).copy()


def decode_program(blob: np.ndarray | bytes) -> list[Instr]:
    raw = bytes(np.asarray(blob, dtype=np.uint8)) if not isinstance(blob, bytes) else blob
    if len(raw) % INSTR_BYTES:
        raise ISAError(f"program of {len(raw)} bytes is not a whole number of instructions")
    return [decode(int.from_bytes(raw[i:i + INSTR_BYTES], "little"))
            for i in range(0, len(raw), INSTR_BYTES)]


# ---------------------------------------------------------------------- vectorised decode
def program_words(program) -> np.ndarray:
    """A program as ``uint64 [n, 2]`` (low, high halves of each 128-bit word).

    Accepts instruction objects, raw ints, encoded little-endian bytes, or words already.
    """
    if isinstance(program, (bytes, bytearray)):
        program = np.frombuffer(bytes(program), dtype=np.uint8)
    if isinstance(program, np.ndarray) and program.dtype == np.uint64 and program.ndim == 2:
        return program  # already words
    if isinstance(program, np.ndarray):
        raw = np.ascontiguousarray(program, dtype=np.uint8)
        if raw.size % INSTR_BYTES:
            raise ISAError(f"program of {raw.size} bytes is not a whole number of instructions")
        return raw.view("<u8").reshape(-1, 2).astype(np.uint64)
    words = [w if isinstance(w, int) else encode(w) for w in program]
    mask = (1 << 64) - 1
    return np.array([[w & mask, w >> 64] for w in words], dtype=np.uint64).reshape(-1, 2)


def _field_array(words: np.ndarray, field: tuple[int, int]) -> np.ndarray:
    off, width = field
    lo, hi = words[:, 0], words[:, 1]
    if off >= 64:
        v = hi >> np.uint64(off - 64)
    elif off + width <= 64:
        v = lo >> np.uint64(off)
    else:  # straddles the two halves
        v = (lo >> np.uint64(off)) | (hi << np.uint64(64 - off))
    return (v & np.uint64((1 << width) - 1)).astype(np.int64)


def field_location(name: str) -> tuple[int, int]:
    """``(offset, width)`` in bits of a field named as :func:`decode_fields` names it
    (``"opcode"``, ``"dma.dram_addr"``, ``"gemm.k_steps"``...), from the same layouts."""
    if name in _HDR:
        return _HDR[name]
    body, _, field = name.partition(".")
    try:
        return _BODIES[body][field]
    except KeyError:
        raise ISAError(f"no instruction field {name!r}") from None


def set_field(words: np.ndarray, rows: np.ndarray, name: str, values) -> None:
    """Set field ``name`` (:func:`field_location`) of program ``words`` (``uint64 [n, 2]``,
    :func:`program_words`) at ``rows`` to ``values`` (in place; a field may straddle the two
    64-bit halves)."""
    at, bits = field_location(name)
    values = np.broadcast_to(np.asarray(values, dtype=np.uint64), np.shape(rows))
    for half in (0, 1):
        lo, hi = max(at, 64 * half), min(at + bits, 64 * half + 64)
        if lo >= hi:
            continue
        mask = np.uint64(((1 << (hi - lo)) - 1) << (lo - 64 * half))
        part = (values >> np.uint64(lo - at)) << np.uint64(lo - 64 * half)
        words[rows, half] = (words[rows, half] & ~mask) | (part & mask)


#: Every field's ``(offset, width)`` under its :func:`decode_fields` name, in the layouts' order.
_FIELD_LOCATIONS = {**_HDR, **{f"{body}.{name}": f for body, fields in _BODIES.items()
                               for name, f in fields.items()}}


class FieldArrays(typing.Mapping[str, np.ndarray]):
    """Named per-instruction arrays, each computed by ``read(name)`` on its first lookup and
    kept: a caller reads a few of a program's fields, most often of a word or two, so
    decoding all of them up front is most of the cost. ``names`` are every key, in order;
    looking up another raises ``KeyError``."""

    __slots__ = ("_read", "_names", "_kept")

    def __init__(self, read: Callable[[str], np.ndarray], names: typing.Collection[str]):
        self._read, self._names, self._kept = read, names, {}

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self._kept[name]
        except KeyError:
            if name not in self._names:
                raise
        value = self._kept[name] = self._read(name)
        return value

    def __iter__(self) -> typing.Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def decode_fields(words: np.ndarray) -> FieldArrays:
    """Every field of every instruction as ``int64`` arrays (the vectorised :func:`decode`),
    each decoded when it is first read (:class:`FieldArrays`) from a copy of ``words``.

    Header fields keep their names (``opcode``, ``wait``, ``signal``); body fields are decoded
    under every layout of the union and named ``dma.rows``, ``gemm.k_steps``, ``sync.engine``...
    Offsets come from the same Amaranth layouts as :func:`encode`.
    """
    words = np.array(words, dtype=np.uint64)
    return FieldArrays(lambda name: _field_array(words, _FIELD_LOCATIONS[name]),
                       _FIELD_LOCATIONS)


# ---------------------------------------------------------------------- GEMM stream geometry
def gemm_header_words(group_steps, asym):
    """Header words at the start of every group of a GEMM's weight stream (ints or arrays).

    None without groups (``group_steps == 0``: raw weights), else the scale codes, followed by
    the zero points when the weights are asymmetric.
    """
    return (group_steps != 0) * (1 + asym)


#: Header words of one group at most (codes and zero points).
MAX_HEADER_WORDS = gemm_header_words(1, True)


def _gemm_geometry(cfg: AcceleratorConfig, k_steps, group_steps, asym, int8,
                   index_bits) -> StreamGeometry:
    """How a GEMM's fields encode its weight stream (ints or arrays alike)."""
    return StreamGeometry(lanes=cfg.lanes, steps=k_steps, group_steps=group_steps,
                          header_words=gemm_header_words(group_steps, asym),
                          value_bits=4 + 4 * int8, index_bits=index_bits)


def _index_bits(pattern, cfg: AcceleratorConfig):
    """Index bits of pattern ``pattern`` (an int or an array); a pattern outside
    ``cfg.pattern_table`` (which never dispatches: BAD_GEMM) reads as dense."""
    table = [p.index_bits for p in cfg.pattern_table] + [0]
    if isinstance(pattern, np.ndarray):
        return np.array(table, dtype=np.int64)[np.clip(pattern, 0, len(table) - 1)]
    return table[pattern] if 0 <= pattern < len(table) else 0


def gemm_geometry(g: Gemm, cfg: AcceleratorConfig) -> StreamGeometry:
    """The weight stream a GEMM instruction reads from the WGT spad (:class:`StreamGeometry`).

    The single source of a GEMM's stream geometry: the functional semantics decode it, the
    timing contract counts its groups and header words, :func:`check` bounds it.
    """
    return _gemm_geometry(cfg, g.k_steps, g.group_steps, g.asym, g.int8,
                          _index_bits(g.pattern, cfg))


def gemm_geometry_fields(f: typing.Mapping[str, np.ndarray], cfg: AcceleratorConfig
                         ) -> StreamGeometry:
    """:func:`gemm_geometry` of many instructions at once, from :func:`decode_fields`
    (``int64`` arrays)."""
    return _gemm_geometry(cfg, f["gemm.k_steps"], f["gemm.group_steps"], f["gemm.asym"],
                          f["gemm.int8"], _index_bits(f["gemm.pattern"], cfg))


def gemm_weight_bytes(g: Gemm, cfg: AcceleratorConfig) -> int:
    """Bytes of the weight stream a GEMM instruction reads from the WGT spad."""
    return gemm_geometry(g, cfg).total_bytes


_EPI_NONE, _EPI_WIDE, _EPI_INT8, _EPI_INT8_RESIDUAL, _EPI_WIDE_BIAS = (
    m.value for m in EpilogueMode)
#: The epilogue field's defined values, 0..4 (any other is ILLEGAL_OPCODE: :func:`legal_words`).
EPILOGUE_VALUES = tuple(m.value for m in EpilogueMode)
assert EPILOGUE_VALUES == tuple(range(len(EPILOGUE_VALUES)))


def reads_param(epilogue):
    """The epilogue mode (its value) reads PARAM (multipliers, residual rows, bias rows);
    ints, arrays or Amaranth values (the fetch unit's alignment check)."""
    return (epilogue == _EPI_INT8) | (epilogue == _EPI_INT8_RESIDUAL) | (epilogue == _EPI_WIDE_BIAS)


def writes_wide(epilogue):
    """The epilogue mode (its value) writes int32 per lane (WIDE, WIDE_BIAS); ints, arrays or
    Amaranth values (the epilogue's datapath)."""
    return (epilogue == _EPI_WIDE) | (epilogue == _EPI_WIDE_BIAS)


def epilogue_words(epilogue):
    """OUT words (``lanes`` bytes each) the epilogue writes per token: 0 (NONE), 4 (int32 per
    lane) or 1 (int8 per lane); ints or arrays."""
    return (epilogue != _EPI_NONE) * (1 + 3 * writes_wide(epilogue))


def bias_row_bytes(cfg: AcceleratorConfig) -> int:
    """PARAM bytes of one token's WIDE_BIAS row: an int32 per lane."""
    return 4 * cfg.lanes


def gemm_extents(g: Gemm, cfg: AcceleratorConfig) -> dict[Spad, int]:
    """End (exclusive, in bytes) of the range of every scratchpad a GEMM instruction uses.

    WGT: its weight stream; ACT: the activation blocks of its last token; OUT: its results
    (an empty range when the epilogue is NONE); PARAM: the epilogue's multipliers and residual
    rows (INT8 epilogues) or bias rows (WIDE_BIAS). The hardware does not check these
    (streams wrap); :func:`check` does. The pattern must be in ``cfg.pattern_table``.
    """
    beat, lanes = cfg.beat_bytes, cfg.lanes
    pat = cfg.pattern_table[g.pattern]
    k_dense = -(-g.k_steps // pat.steps_per_block) * pat.block
    row = int(epilogue_words(g.epilogue.value)) * lanes
    ends = {
        Spad.WGT: g.wgt_addr * beat + gemm_weight_bytes(g, cfg),
        Spad.ACT: (g.act_addr + (g.tokens - 1) * g.act_stride) * beat + k_dense,
        Spad.OUT: g.out_addr * beat + g.tokens * row,
    }
    if g.epilogue == EpilogueMode.WIDE_BIAS:
        ends[Spad.PARAM] = g.param_addr * beat + g.tokens * bias_row_bytes(cfg)
    elif reads_param(g.epilogue.value):
        residual = g.tokens * lanes if g.epilogue == EpilogueMode.INT8_RESIDUAL else 0
        ends[Spad.PARAM] = g.param_addr * beat + 2 * lanes + residual
    return ends


# ---------------------------------------------------------------------- dispatch checks
def word_beats(word_bytes: int, cfg: AcceleratorConfig) -> int:
    """Beats per scratchpad word of ``word_bytes`` (1 when a word is no wider than a beat)."""
    return max(1, word_bytes // cfg.beat_bytes)


@dataclass(frozen=True, eq=False)
class DispatchLimits:
    """Per-configuration constants of the dispatch checks (computed once per config); the
    fetch unit's checks take their constants from here too."""

    num_events: int
    spad_beats: np.ndarray   # int64, indexed by Spad value
    dram_beats: int
    move_beats: int          # beats of a move's far side (VIN: is_move)
    max_spad: int            # the largest defined DMA spad value (OUT_MOVE_SPAD: a vector engine)
    patterns: int
    max_tokens: int
    int8: bool               # 8-bit weights supported
    wgt_words: int           # beats per word of each scratchpad
    act_words: int
    out_words: int
    param_words: int
    vin_elems: int           # elements (words) of the vector engine's scratchpads
    vout_elems: int
    vec_lanes: int           # the vector engine's lanes (AcceleratorConfig.vector_lanes)
    vec_silu: bool           # SILU_GATE laned (AcceleratorConfig.vector_laned_silu)
    opcodes: tuple[int, ...]  # the opcodes this configuration runs (END, REPEAT included)
    engines: tuple[int, ...]  # the engines it has (a SYNC may name)


def dispatch_limits(cfg: AcceleratorConfig) -> DispatchLimits:
    """The :class:`DispatchLimits` of ``cfg``."""
    # Cached in the (frozen) config's __dict__: the fast model checks every instruction of
    # programs with 10^5 instructions, and recomputing these dominated its run time.
    lim = cfg.__dict__.get("_isa_limits")
    if lim is None:
        from hw.engines import ENGINES, OPS  # (the table imports this module)
        engines = tuple(e.engine.value for e in ENGINES if e.present(cfg))
        opcodes = tuple(op.opcode.value for op in OPS
                        if op.engine is None or op.engine.value in engines)
        beats = [cfg.spad_beats(sp.name.lower()) for sp in Spad]
        lim = DispatchLimits(
            num_events=cfg.num_events,
            # by spad value, the undefined ones (ILLEGAL_OPCODE) included: 0 beats
            spad_beats=np.array(beats + [0] * ((1 << Spad.as_shape().width) - len(beats)),
                                dtype=np.int64),
            dram_beats=cfg.dram_beats, move_beats=cfg.spad_beats(MOVE_SPAD.name.lower()),
            max_spad=OUT_MOVE_SPAD.value if cfg.has_vector else max(s.value for s in Spad),
            patterns=len(cfg.pattern_table),
            max_tokens=cfg.max_tokens, int8=8 in cfg.weight_bits,
            wgt_words=word_beats(cfg.wgt_word_bytes, cfg),
            act_words=word_beats(cfg.act_word_bytes, cfg),
            out_words=word_beats(cfg.out_word_bytes, cfg),
            param_words=word_beats(cfg.param_word_bytes, cfg),
            vin_elems=cfg.vin_spad_bytes // cfg.vin_word_bytes,
            vout_elems=cfg.vout_spad_bytes // cfg.vout_word_bytes,
            vec_lanes=cfg.vector_lanes, vec_silu=cfg.vector_laned_silu,
            opcodes=opcodes + (Opcode.END.value, Opcode.REPEAT.value), engines=engines)
        cfg.__dict__["_isa_limits"] = lim
    return lim


@dataclass(frozen=True)
class _Rule:
    """One dispatch check: an instruction whose opcode is in ``ops`` and for which
    ``bad(f, lim)`` holds fails with ``code``.

    ``f`` maps the names of :func:`decode_fields` to encoded field values: ints for one
    instruction (:func:`dispatch_error`, :func:`check`) or arrays for a program
    (:func:`dispatch_errors`); ``bad`` uses only operators that work on both. ``message(f,
    cfg)`` names the field and value, for :func:`check`.
    """

    code: ErrorCode
    ops: tuple[Opcode, ...]
    bad: Callable[[dict, DispatchLimits], object]
    message: Callable[[dict, AcceleratorConfig], str]


_ALL = tuple(_BY_OPCODE)
_DMA = (Opcode.LOAD, Opcode.STORE)
_GEMM = (Opcode.GEMM,)
_VEC = (Opcode.VEC,)
_REPEAT = (Opcode.REPEAT,)


def _one_of(value, members) -> object:
    """``value`` equals one of the enum ``members`` (ints, arrays or Amaranth values)."""
    return functools.reduce(operator.or_, (value == m.value for m in members))


def _vec_end(f: dict, field: str) -> object:
    return f[f"vec.{field}_addr"] + f["vec.length"]


def _vec_dst_end(f: dict) -> object:
    return f["vec.dst_addr"] + vec_out_words(f["vec.func"], f["vec.length"],
                                               f["vec.imm"])


def _is_rope(f: dict) -> object:
    return f["vec.func"] == VecFunc.ROPE.value


def _rope_row(f: dict) -> object:
    """A ROPE's heads times head_dim."""
    head_dim, heads = rope_geometry(f["vec.imm"])
    return heads * head_dim


def _rope_table_end(f: dict) -> object:
    """The end of a ROPE's table: ``head_dim / 2`` words from ``b_addr``."""
    return f["vec.b_addr"] + (rope_geometry(f["vec.imm"])[0] >> 1)


def _is_insert(f: dict) -> object:
    return f["vec.func"] == VecFunc.INSERT.value


def _is_insert4(f: dict) -> object:
    return f["vec.func"] == VecFunc.INSERT4.value


def _insert_stride_bad(f: dict) -> object:
    """An INSERT's stride is neither 1 (whole words) nor at least 4 (one code per word); an
    INSERT4's (in nibbles) neither 1 nor at least 8."""
    stride = insert_fields(f["vec.imm"])["stride"]
    return ((_is_insert(f) & ((stride == 0) | (stride == 2) | (stride == 3)))
            | (_is_insert4(f) & ((stride == 0) | ((stride >= 2) & (stride < 8)))))


def _insert_words_bad(f: dict) -> object:
    """An INSERT of stride 1 whose codes are not whole words: ``base``, ``group`` or ``skip``
    not a multiple of 4 (an INSERT4's: of 8 nibbles)."""
    g = insert_fields(f["vec.imm"])
    partial = ((g["base"] | g["skip"] | (g["group_m1"] ^ 3)) & 3) != 0
    partial4 = ((g["base"] | g["skip"] | (g["group_m1"] ^ 7)) & 7) != 0
    return (g["stride"] == 1) & ((_is_insert(f) & partial) | (_is_insert4(f) & partial4))


def _kv4_group_bad(f: dict) -> object:
    return kv4_bad(f["vec.func"], f["vec.length"], f["vec.imm"])


def kv4_bad(func, length, imm):
    """The VEC is a KV4 with group codes whose group (:func:`kv4_imm`) does not divide its
    row ``length`` (the rule table's KV4 rule, for the fetch unit); ints, arrays or Amaranth
    values."""
    lg, codes = kv4_fields(imm)
    rest = functools.reduce(operator.or_, ((lg == k) & ((length & ((1 << k) - 1)) != 0)
                                           for k in range(1, 1 << KV4_GROUP_BITS)))
    return (func == VecFunc.KV4.value) & (codes == 1) & rest


def argmax_bad(func, length, imm):
    """The VEC is an ARGMAX over pairs (:func:`argmax_imm`) of an odd ``length``: a word
    with no pair (the rule table's ARGMAX rule, for the fetch unit); ints, arrays or Amaranth
    values."""
    return (func == VecFunc.ARGMAX.value) & (argmax_pairs(imm) == 1) & ((length & 1) == 1)


def insert_bad(func, imm):
    """The VEC is an INSERT or INSERT4 whose geometry the engine cannot walk (the two INSERT
    rules of the rule table, for the fetch unit); ints, arrays or Amaranth values."""
    f = {"vec.func": func, "vec.imm": imm}
    return _insert_stride_bad(f) | _insert_words_bad(f)
_BAD_ADDRESS, _BAD_GEMM = ErrorCode.BAD_ADDRESS, ErrorCode.BAD_GEMM


def _event_rule(name: str) -> _Rule:
    return _Rule(ErrorCode.BAD_EVENT, _ALL,
                 lambda f, lim: (f[name] != NO_EVENT) & (f[name] >= lim.num_events),
                 lambda f, cfg: f"{name}={f[name]}: events are 0..{cfg.num_events - 1}")


def _kind(f: dict) -> str:
    return Opcode(f["opcode"]).name


def _spad_name(value: int) -> str:
    v = int(value)
    return (OUT_MOVE_SPAD if v == OUT_MOVE_SPAD.value else Spad(v)).name


def _source_name(f: dict) -> str:
    return Spad(int(dma_source(f["opcode"], f["dma.spad"]))).name


def _dma_end(f: dict) -> int:
    return f["dma.spad_addr"] + f["dma.rows"] * f["dma.row_beats"]


def _dram_end(f: dict) -> int:
    return f["dma.dram_addr"] + (f["dma.rows"] - 1) * f["dma.dram_stride"] + f["dma.row_beats"]


def _dram_side(f: dict, lim: DispatchLimits):
    """Beats of a DMA word's far side: VIN's for a move (:func:`is_move`), DRAM's else (ints,
    numpy arrays or Amaranth values: no negative term)."""
    return lim.dram_beats - is_move(f["opcode"], f["dma.spad"]) * (lim.dram_beats
                                                                    - lim.move_beats)


def _range_rule(field: str, spad: Spad) -> _Rule:
    key, index = f"gemm.{field}", spad.value
    return _Rule(_BAD_ADDRESS, _GEMM,
                 lambda f, lim: f[key] >= lim.spad_beats[index],
                 lambda f, cfg: f"{field}={f[key]} is outside {spad.name} "
                                f"({cfg.spad_beats(spad.name.lower())} beats)")


def _align_rule(field: str, words: str, when=lambda f: True) -> _Rule:
    # ``when`` is ANDed in (ints or arrays): the OUT and PARAM addresses only matter to the
    # epilogues that use them.
    key = f"gemm.{field}"
    return _Rule(_BAD_ADDRESS, _GEMM,
                 lambda f, lim: when(f) & (f[key] % getattr(lim, words) != 0),
                 lambda f, cfg: f"{field}={f[key]} must be a multiple of "
                                f"{getattr(dispatch_limits(cfg), words)} beats "
                                f"(one scratchpad word)")


#: What the hardware checks when an instruction reaches dispatch, in its order of priority:
#: events, then the body (GEMM: the fields before the addresses). An instruction's error is
#: the code of the first rule it fails. The scratchpad-word alignment: the compute engine reads
#: one word of each scratchpad per cycle and writes whole OUT words, so every ACT row
#: (``act_addr + t * act_stride``), the OUT destination (unless the epilogue is NONE) and the
#: PARAM operands (INT8 epilogues) start on a word, as the WGT stream does.
_EVENT_RULES = (_event_rule("wait"), _event_rule("signal"))
_DMA_RULES = (
    _Rule(_BAD_ADDRESS, _DMA,
          lambda f, lim: (f["opcode"] == Opcode.STORE.value) & ~_one_of(f["dma.spad"],
                                                                         STORE_SPADS),
          lambda f, cfg: f"STORE reads the {[s.name for s in STORE_SPADS]} scratchpads only, "
                         f"got spad={_spad_name(f['dma.spad'])}"),
    _Rule(_BAD_ADDRESS, _DMA,
          lambda f, lim: (f["opcode"] == Opcode.LOAD.value) & ~_one_of(f["dma.spad"],
                                                                        LOAD_SPADS),
          lambda f, cfg: f"LOAD writes the {[s.name for s in LOAD_SPADS]} scratchpads only, "
                         f"got spad={_spad_name(f['dma.spad'])}"),
    _Rule(_BAD_ADDRESS, _DMA,
          lambda f, lim: (f["dma.rows"] < 1) | (f["dma.row_beats"] < 1),
          lambda f, cfg: f"{_kind(f)} of rows={f['dma.rows']} x "
                         f"row_beats={f['dma.row_beats']} is empty"),
    _Rule(_BAD_ADDRESS, _DMA,
          lambda f, lim: _dma_end(f) > lim.spad_beats[dma_source(f["opcode"], f["dma.spad"])],
          lambda f, cfg: f"{_kind(f)} spad range [{f['dma.spad_addr']}, {_dma_end(f)}) beats "
                         f"exceeds {_source_name(f)} "
                         f"({cfg.spad_beats(_source_name(f).lower())} beats)"),
    _Rule(_BAD_ADDRESS, _DMA,
          lambda f, lim: _dram_end(f) > _dram_side(f, lim),
          lambda f, cfg: (f"move's VIN range ends at beat {_dram_end(f)}, VIN has "
                          f"{cfg.spad_beats('vin')} beats"
                          if is_move(f["opcode"], f["dma.spad"]) else
                          f"{_kind(f)} DRAM range ends at beat {_dram_end(f)}, DRAM has "
                          f"{cfg.dram_beats} beats")),
)
_GEMM_FIELD_RULES = (
    _Rule(_BAD_GEMM, _GEMM,
          lambda f, lim: (f["gemm.pattern"] < 0) | (f["gemm.pattern"] >= lim.patterns),
          lambda f, cfg: f"pattern={f['gemm.pattern']}: this accelerator has patterns "
                         f"{[str(p) for p in cfg.pattern_table]}"),
    _Rule(_BAD_GEMM, _GEMM,
          lambda f, lim: (f["gemm.tokens_m1"] < 0) | (f["gemm.tokens_m1"] >= lim.max_tokens),
          lambda f, cfg: f"tokens={f['gemm.tokens_m1'] + 1}: must be in [1, {cfg.max_tokens}]"),
    _Rule(_BAD_GEMM, _GEMM,
          lambda f, lim: f["gemm.k_steps"] < 1,
          lambda f, cfg: f"k_steps={f['gemm.k_steps']} must be >= 1"),
    _Rule(_BAD_GEMM, _GEMM,
          lambda f, lim: (f["gemm.int8"] != 0) & (not lim.int8),
          lambda f, cfg: "int8 weights are not supported by this accelerator"),
    _Rule(_BAD_GEMM, _GEMM,
          lambda f, lim: (f["gemm.int8"] != 0) & (f["gemm.pattern"] != 0),
          lambda f, cfg: "int8 weights are streamed dense only (pattern 0)"),
    _Rule(_BAD_GEMM, _GEMM,
          lambda f, lim: (f["gemm.asym"] != 0) & (f["gemm.group_steps"] == 0),
          lambda f, cfg: "asymmetric weights need group headers (group_steps > 0)"),
)
_GEMM_ADDRESS_RULES = (
    _range_rule("wgt_addr", Spad.WGT),
    _range_rule("act_addr", Spad.ACT),
    _range_rule("out_addr", Spad.OUT),
    _range_rule("param_addr", Spad.PARAM),
    _align_rule("wgt_addr", "wgt_words"),
    _align_rule("act_addr", "act_words"),
    _align_rule("act_stride", "act_words"),
    _align_rule("out_addr", "out_words", lambda f: f["gemm.epilogue"] != _EPI_NONE),
    _align_rule("param_addr", "param_words", lambda f: reads_param(f["gemm.epilogue"])),
)
#: VEC: a row of at least one element, every range inside its scratchpad (elements).
_VEC_RULES = (
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: f["vec.length"] < 1,
          lambda f, cfg: f"VEC of length={f['vec.length']} is empty"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: _vec_end(f, "a") > lim.vin_elems,
          lambda f, cfg: f"VEC row [{f['vec.a_addr']}, {_vec_end(f, 'a')}) exceeds VIN "
                         f"({dispatch_limits(cfg).vin_elems} elements)"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: vec_reads_b(f["vec.func"]) & (_vec_end(f, "b") > lim.vin_elems),
          lambda f, cfg: f"VEC operand [{f['vec.b_addr']}, {_vec_end(f, 'b')}) exceeds VIN "
                         f"({dispatch_limits(cfg).vin_elems} elements)"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: (f["vec.func"] == VecFunc.SOFTMAX.value)
          & (f["vec.imm"] > f["vec.length"]),
          lambda f, cfg: f"SOFTMAX of {f['vec.imm']} valid positions in a row of "
                         f"length={f['vec.length']}"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: _is_rope(f) & (((rope_geometry(f["vec.imm"])[0] & 1) != 0)
                                        | (rope_geometry(f["vec.imm"])[0] == 0)),
          lambda f, cfg: f"ROPE of head_dim={rope_geometry(f['vec.imm'])[0]}: it must be even "
                         f"and >= 2 (imm={f['vec.imm']})"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: _is_rope(f) & (_rope_row(f) != f["vec.length"]),
          lambda f, cfg: f"ROPE of {rope_geometry(f['vec.imm'])[1]} heads x head_dim="
                         f"{rope_geometry(f['vec.imm'])[0]} (imm={f['vec.imm']}) is not its "
                         f"row of length={f['vec.length']}"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: _is_rope(f) & (_rope_table_end(f) > lim.vin_elems),
          lambda f, cfg: f"ROPE table [{f['vec.b_addr']}, {_rope_table_end(f)}) exceeds VIN "
                         f"({dispatch_limits(cfg).vin_elems} elements)"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: vec_reads_amax(f["vec.func"])
          & (dequant_amax_addr(f["vec.imm"]) >= lim.vin_elems),
          lambda f, cfg: f"DEQUANT's amax word imm={f['vec.imm']} is outside VIN "
                         f"({dispatch_limits(cfg).vin_elems} elements)"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: _insert_stride_bad(f),
          lambda f, cfg: f"{VecFunc(int(f['vec.func'])).name} of "
                         f"stride={insert_geometry(f['vec.imm']).stride} (imm={f['vec.imm']}): "
                         f"it must be 1 or >= "
                         f"{8 if int(f['vec.func']) == VecFunc.INSERT4.value else 4}"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: _insert_words_bad(f),
          lambda f, cfg: f"{VecFunc(int(f['vec.func'])).name} of stride 1 writes whole words: "
                         f"base, group and skip must be multiples of "
                         f"{8 if int(f['vec.func']) == VecFunc.INSERT4.value else 4}, got "
                         f"{insert_geometry(f['vec.imm'])}"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: _kv4_group_bad(f),
          lambda f, cfg: f"KV4 of length={f['vec.length']}: its group "
                         f"{kv4_group(f['vec.imm'])} (imm={f['vec.imm']}) does not divide it"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: argmax_bad(f["vec.func"], f["vec.length"], f["vec.imm"]),
          lambda f, cfg: f"ARGMAX over pairs (imm={f['vec.imm']}) of an odd "
                         f"length={f['vec.length']}"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: vec_unaligned(f["vec.func"], f["vec.a_addr"], f["vec.b_addr"],
                                       f["vec.dst_addr"], lim.vec_lanes, lim.vec_silu),
          lambda f, cfg: f"{VecFunc(int(f['vec.func'])).name} streams "
                         f"vector_lanes={cfg.vector_lanes} elements a cycle: a_addr="
                         f"{f['vec.a_addr']}, b_addr={f['vec.b_addr']} (if read, but by an "
                         f"INSERT) and dst_addr="
                         f"{f['vec.dst_addr']} must be multiples of {cfg.vector_lanes}"),
    _Rule(_BAD_ADDRESS, _VEC,
          lambda f, lim: _vec_dst_end(f) > lim.vout_elems,
          lambda f, cfg: f"VEC results [{f['vec.dst_addr']}, {_vec_dst_end(f)}) exceed VOUT "
                         f"({dispatch_limits(cfg).vout_elems} elements)"),
)
#: REPEAT: a body of at least one instruction, at least one iteration (the rules that span
#: instructions, no REPEAT or END inside a body, are :func:`loop_stream`'s).
_REPEAT_RULES = (
    _Rule(ErrorCode.BAD_REPEAT, _REPEAT,
          lambda f, lim: (f["repeat.length"] < 1) | (f["repeat.count"] < 1),
          lambda f, cfg: f"REPEAT of length={f['repeat.length']} instructions x "
                         f"count={f['repeat.count']} iterations is empty"),
)
_DISPATCH_RULES = (_EVENT_RULES + _DMA_RULES + _GEMM_FIELD_RULES + _GEMM_ADDRESS_RULES
                   + _VEC_RULES + _REPEAT_RULES)
_RULES_OF = {op: tuple(r for r in _DISPATCH_RULES if op in r.ops) for op in _BY_OPCODE}


_FIELD_NAMES = {body: {name: f"{body}.{name}" for name in fields}
                for body, fields in _BODIES.items()}


def _fields_of(ins: Instr) -> dict[str, int]:
    """The encoded fields of one instruction, named as by :func:`decode_fields` (``None``
    events read as ``NO_EVENT``)."""
    f = {"opcode": ins.opcode.value, "wait": _event(ins.wait), "signal": _event(ins.signal)}
    if ins.body:
        names = _FIELD_NAMES[ins.body]
        for name, value in ins._body_fields().items():
            f[names[name]] = value
    return f


def dispatch_error(ins: Instr, cfg: AcceleratorConfig) -> ErrorCode:
    """The checks the hardware's fetch unit applies when an instruction reaches dispatch.

    Deliberately cheap: event ids, pattern/width/token limits, start addresses (range and
    scratchpad-word alignment) and DMA extents. GEMM streams that run past the end of a
    scratchpad wrap around (the Python :func:`check` rejects those before they reach the
    hardware). The rules are defined once, for this function, :func:`dispatch_errors` and
    :func:`check`.
    """
    f, lim = _fields_of(ins), dispatch_limits(cfg)
    if _absent(ins, lim):
        return ErrorCode.ILLEGAL_OPCODE
    for rule in _RULES_OF[ins.opcode]:
        if rule.bad(f, lim):
            return rule.code
    return ErrorCode.NONE


def _absent(ins: Instr, lim: DispatchLimits) -> str | None:
    """Why an instruction object is ILLEGAL_OPCODE on a configuration (None if it is not):
    its opcode's engine, or the engine a SYNC names, is absent (:func:`legal_words`; an
    object's enum fields always name members)."""
    if ins.opcode.value not in lim.opcodes:
        return f"this accelerator has no engine for {ins.opcode.name} (no vector engine)"
    if isinstance(ins, Sync) and ins.engine.value not in lim.engines:
        return f"SYNC names engine {ins.engine.name}, which this accelerator does not have"
    if isinstance(ins, _Dma) and ins.spad.value > lim.max_spad:
        return (f"{ins.opcode.name} names spad {ins.spad.name}: a move from OUT needs a vector "
                "engine")
    return None


def legal_words(f: dict, lim: DispatchLimits):
    """Which words a configuration runs (its :class:`DispatchLimits` ``lim``; the others are
    ILLEGAL_OPCODE): an opcode it has (VEC only with a vector engine), a SYNC naming an engine
    it has, a GEMM naming an epilogue mode, a LOAD or STORE naming a scratchpad (or
    :data:`OUT_MOVE_SPAD`, with a vector engine), a VEC naming
    a sub-op, a VEC naming a run-time register only for a sub-op of :data:`REG_VEC_FUNCS`
    (:func:`decode` raises for every word these rules reject). ``f`` as from
    :func:`decode_fields`, numpy arrays or Amaranth values (the fetch unit and its proof use
    it too)."""
    op = f["opcode"]
    defined = functools.reduce(operator.or_, (op == o for o in lim.opcodes))
    engine = functools.reduce(operator.or_, (f["sync.engine"] == e for e in lim.engines))
    no_engine = (op == Opcode.SYNC.value) & ~engine
    no_mode = (op == Opcode.GEMM.value) & (f["gemm.epilogue"] > max(EPILOGUE_VALUES))
    is_dma = (op == Opcode.LOAD.value) | (op == Opcode.STORE.value)
    no_spad = is_dma & (f["dma.spad"] > lim.max_spad)
    func = f["vec.func"]
    no_func = (op == Opcode.VEC.value) & functools.reduce(
        operator.or_, (func == v for v in _VEC_FUNC_GAPS), func > max(VEC_FUNC_VALUES))
    no_reg = (op == Opcode.VEC.value) & (f["vec.reg"] != 0) & ~functools.reduce(
        operator.or_, (func == v for v in REG_VEC_FUNCS))
    return defined & ~no_engine & ~no_mode & ~no_spad & ~no_func & ~no_reg


def dispatch_errors(f: typing.Mapping[str, np.ndarray], cfg: AcceleratorConfig) -> np.ndarray:
    """:func:`dispatch_error` for many instructions at once (``ErrorCode`` values, int64).

    ``f`` comes from :func:`decode_fields`. Undefined opcodes and SYNCs naming no engine are
    ILLEGAL_OPCODE, as for the scalar decoder; the other rules are :func:`dispatch_error`'s.
    """
    lim = dispatch_limits(cfg)
    op = f["opcode"]
    err = np.zeros(op.shape, dtype=np.int64)
    np.putmask(err, ~legal_words(f, lim), ErrorCode.ILLEGAL_OPCODE.value)
    # Consecutive rules with one code and opcode set are one flag: their order cannot matter.
    for (code, ops), rules in itertools.groupby(_DISPATCH_RULES, lambda r: (r.code, r.ops)):
        bad = functools.reduce(operator.or_, (r.bad(f, lim) for r in rules))
        if ops != _ALL:  # (illegal words are flagged already)
            bad = bad & functools.reduce(operator.or_, (op == o.value for o in ops))
        np.putmask(err, (err == 0) & bad, code.value)
    return err


# ---------------------------------------------------------------------- hardware loops
#: The largest value of a DMA's ``dram_addr`` field. An effective address past it (a REPEAT's
#: iteration offset added, :func:`loop_stream`) reads as this value, which no DRAM range
#: contains (DRAM has fewer beats), so the instruction fails its DRAM range check.
DRAM_ADDR_MAX = (1 << DmaBody["dram_addr"].width) - 1
assert REG_BITS == DmaBody["dram_addr"].width, (REG_BITS, DmaBody["dram_addr"].width)


@dataclass(frozen=True)
class LoopStream:
    """The instructions the fetch unit brings to dispatch, in order, REPEATs expanded
    (:func:`loop_stream`); one entry per dispatch slot.

    Attributes
    ----------
    pcs:
        ``int64 [n]``: each entry's instruction-memory index.
    offsets:
        ``int64 [n]``: DRAM beats added to the entry's ``dram_addr`` (its iteration times
        the stride for a LOAD or STORE in a body; 0 otherwise).
    loop_back:
        ``bool [n]``: the entry is the first of a body's iterations ``1 ..``: the fetch unit
        jumps back to it (hw/timing.py, "Fetch": available ``LOOP_BACK_LATENCY`` cycles after
        the previous dispatch).
    bad_repeat:
        ``bool [n]``: the entry is a REPEAT or END inside a body (``BAD_REPEAT`` unless its
        own checks fail first).
    """

    pcs: np.ndarray
    offsets: np.ndarray
    loop_back: np.ndarray
    bad_repeat: np.ndarray

    @property
    def looped(self) -> bool:
        """Whether any entry differs from the straight program (a REPEAT was expanded)."""
        return bool(self.offsets.any() or self.loop_back.any() or self.bad_repeat.any())

    def fields(self, f: typing.Mapping[str, np.ndarray]) -> FieldArrays:
        """The entries' fields from the program's (:func:`decode_fields`), each LOAD's and
        STORE's ``dram_addr`` its effective address (at most :data:`DRAM_ADDR_MAX`)."""
        offset = self.offsets.any()

        def read(name: str) -> np.ndarray:
            v = f[name][self.pcs]
            if offset and name == "dma.dram_addr":
                return np.minimum(v + self.offsets, DRAM_ADDR_MAX)
            return v
        return FieldArrays(read, tuple(f))


_STRIDES = ("wgt_stride", "load_stride", "store_stride")


def loop_stride(op, spad, wgt_stride, load_stride, store_stride):
    """The DRAM beats a body instruction of opcode ``op`` and DMA scratchpad ``spad`` advances
    per iteration: ``wgt_stride`` for a LOAD into WGT, ``load_stride`` for another LOAD,
    ``store_stride`` for a STORE, 0 for a move (:func:`is_move`: its VIN rows are the same
    in every iteration) and for other opcodes. Ints or numpy arrays (the fetch unit selects
    the same way, hw/fetch.py)."""
    is_load = op == Opcode.LOAD.value
    store = (op == Opcode.STORE.value) & np.logical_not(is_move(op, spad))
    return np.where(is_load & (spad == Spad.WGT.value), wgt_stride,
                    np.where(is_load, load_stride, np.where(store, store_stride, 0)))


def _straight(start: int, stop: int) -> tuple:
    n = max(0, stop - start)
    return (np.arange(start, start + n, dtype=np.int64), np.zeros(n, np.int64),
            np.zeros(n, bool), np.zeros(n, bool))


def loop_stream(f: typing.Mapping[str, np.ndarray], errs: np.ndarray) -> LoopStream:
    """The order in which the fetch unit dispatches a program's instructions.

    ``f``: the program's fields (:func:`decode_fields`); ``errs``: their dispatch errors
    (:func:`dispatch_errors`). From ``pc = 0`` instructions follow one another; a REPEAT
    (dispatched like END, into no queue) is followed by ``count`` iterations of its body,
    then by the instruction after the body. The stream ends at the first END, at a REPEAT
    that fails its own checks, at the first REPEAT or END inside a body (``bad_repeat``), or
    past the last word of the program: the caller raises PC_OVERFLOW at ``imem_depth`` and
    ILLEGAL_OPCODE at an unwritten word (pc = the last entry's + 1) as without loops. Errors of
    other instructions end the run where the caller meets them; the stream may run past them.
    """
    op = f["opcode"]
    n = len(op)
    reps = np.flatnonzero(op == Opcode.REPEAT.value)
    if not reps.size:
        return LoopStream(*_straight(0, n))
    ends = np.flatnonzero(op == Opcode.END.value)
    parts, pc = [], 0
    for r in reps.tolist():
        if r < pc:
            continue
        first_end = ends[np.searchsorted(ends, pc):]
        if first_end.size and first_end[0] < r:
            parts.append(_straight(pc, int(first_end[0]) + 1))
            pc = None
            break
        parts.append(_straight(pc, r + 1))
        if errs[r]:
            pc = None
            break
        length, count = int(f["repeat.length"][r]), int(f["repeat.count"][r])
        strides = {k: int(f[f"repeat.{k}"][r]) for k in _STRIDES}
        body = np.arange(r + 1, min(r + 1 + length, n), dtype=np.int64)
        stop = np.flatnonzero((op[body] == Opcode.REPEAT.value) | (op[body] == Opcode.END.value))
        if stop.size or body.size < length:  # iteration 0 ends the run
            cut = body[:int(stop[0]) + 1] if stop.size else body
            pcs, offs, back, bad = _straight(int(cut[0]) if cut.size else r + 1,
                                             int(cut[-1]) + 1 if cut.size else r + 1)
            bad[-1:] = bool(stop.size)
            parts.append((pcs, offs, back, bad))
            pc = None
            break
        step = loop_stride(op[body], f["dma.spad"][body], **strides)
        it = np.arange(count, dtype=np.int64)[:, None]
        back = np.zeros((count, length), bool)
        back[1:, 0] = True
        parts.append((np.tile(body, count), (it * step[None, :]).ravel(),
                      back.ravel(), np.zeros(count * length, bool)))
        pc = r + 1 + length
    if pc is not None:
        parts.append(_straight(pc, n))
    return LoopStream(*(np.concatenate(x) for x in zip(*parts, strict=True)))


def loop_instruction(ins: Instr, offset: int) -> Instr:
    """Instruction ``ins`` as dispatched with DRAM ``offset`` (:attr:`LoopStream.offsets`):
    a LOAD's or STORE's ``dram_addr`` advanced (at most :data:`DRAM_ADDR_MAX`)."""
    if not offset or not isinstance(ins, _Dma):
        return ins
    return dataclasses.replace(ins, dram_addr=min(ins.dram_addr + offset, DRAM_ADDR_MAX))


# ---------------------------------------------------------------------- run-time registers
#: The largest value of a VEC's ``imm`` field: an effective ``imm`` past it reads as this.
IMM_MAX = (1 << VecBody["imm"].width) - 1
#: The field a run-time register moves, by body.
RELATIVE = {"dma": ("dram_addr",), "vec": ("imm",)}
_REL_MAX = {"dma": DRAM_ADDR_MAX, "vec": IMM_MAX}
_REL_OPS = {"dma": (Opcode.LOAD, Opcode.STORE), "vec": (Opcode.VEC,)}


def reg_values(regs: typing.Mapping[int, int] | None) -> np.ndarray:
    """The run-time registers ``regs`` (``{register: value}``, registers 1 .. :data:`NUM_REGS`;
    missing ones 0) as an ``int64`` array indexed by ``reg`` field value (index 0, which names
    none, holds 0).

    Raises
    ------
    ISAError
        A register outside 1 .. NUM_REGS, or a value outside :data:`REG_BITS` bits.
    """
    out = np.zeros(NUM_REGS + 1, dtype=np.int64)
    for reg, value in (regs or {}).items():
        if not 1 <= int(reg) <= NUM_REGS:
            raise ISAError(f"no run-time register {reg!r}; the registers are 1 .. {NUM_REGS}")
        if not 0 <= int(value) < 1 << REG_BITS:
            raise ISAError(f"run-time register {reg}={value} does not fit in {REG_BITS} bits")
        out[int(reg)] = int(value)
    return out


#: The sources a :class:`RegTerm` reads: the step's first position and its token id.
REG_SOURCES = ("pos", "tok")


@dataclass(frozen=True)
class RegTerm:
    """One term of a run-time register's value: ``((src * mul) // div % mod) * scale`` of the
    step's ``src`` (:data:`REG_SOURCES`; ``mod`` 0: no modulus). A register holds the sum of
    its terms (:func:`reg_value`): a few integer operations per register when a step starts.
    """

    src: str
    mul: int = 1
    div: int = 1
    mod: int = 0
    scale: int = 1

    def __post_init__(self):
        if self.src not in REG_SOURCES:
            raise ISAError(f"register term source {self.src!r} is not one of {REG_SOURCES}")
        if self.mul < 0 or self.div < 1 or self.mod < 0 or self.scale < 0:
            raise ISAError(f"register term {self}: mul, mod and scale must be >= 0, div >= 1")

    def value(self, sources: typing.Mapping[str, int]):
        """The term at ``sources`` (``{"pos": p, "tok": t}``; ints or integer arrays)."""
        return _reg_term(sources[self.src], self.mul, self.div, self.mod, self.scale)

    def to_list(self) -> list:
        return [self.src, self.mul, self.div, self.mod, self.scale]

    @classmethod
    def from_list(cls, x) -> RegTerm:
        return cls(*x)


def _reg_term(v, mul: int, div: int, mod: int, scale: int):
    """:class:`RegTerm`'s value of source value ``v``: the one place its formula lives."""
    v = v * mul // div
    return (v % mod if mod else v) * scale


def reg_value(terms: typing.Sequence[RegTerm], pos, tok=0):
    """A register holding ``terms`` (:class:`RegTerm`) in a step at position ``pos`` with
    token ``tok``: the sum of the terms (ints or integer arrays)."""
    sources = {"pos": pos, "tok": tok}
    return sum((t.value(sources) for t in terms), 0)


def reg_table_values(table: typing.Sequence[typing.Sequence[RegTerm]], pos: int,
                     tok: int = 0) -> dict[int, int]:
    """The run-time registers (:func:`reg_values`) of a register table (register ``i + 1``
    holds ``table[i]``, :func:`reg_value`) in a step at position ``pos`` with token ``tok``.

    Raises
    ------
    ISAError
        More than :data:`NUM_REGS` registers, or a value outside :data:`REG_BITS` bits.
    """
    return RegTable(table).values(pos, tok)


class RegTable:
    """A register table (register ``i + 1`` holds the sum of ``table[i]``'s
    :class:`RegTerm`) ready to be evaluated when each step starts: its terms flattened once,
    so a step's :meth:`values` is one pass of integer operations over them (a host that
    starts a program per token does it per token).

    Raises
    ------
    ISAError
        More than :data:`NUM_REGS` registers.
    """

    def __init__(self, table: typing.Sequence[typing.Sequence[RegTerm]]) -> None:
        if len(table) > NUM_REGS:
            raise ISAError(f"a register table of {len(table)} registers; there are {NUM_REGS}")
        self.registers = len(table)
        self._terms = tuple((i + 1, REG_SOURCES.index(t.src), t.mul, t.div, t.mod, t.scale)
                            for i, terms in enumerate(table) for t in terms)

    def values(self, pos: int, tok: int = 0) -> dict[int, int]:
        """The run-time registers (``{register: value}``, :func:`reg_values`) in a step at
        position ``pos`` with token ``tok``: :func:`reg_value` of each register's terms.

        Raises
        ------
        ISAError
            A value outside :data:`REG_BITS` bits (the register and value named).
        """
        sources = (int(pos), int(tok))
        regs = dict.fromkeys(range(1, self.registers + 1), 0)
        for reg, src, mul, div, mod, scale in self._terms:
            regs[reg] += _reg_term(sources[src], mul, div, mod, scale)
        for reg, value in regs.items():
            if not 0 <= value < 1 << REG_BITS:
                raise ISAError(f"run-time register {reg}={value} does not fit in {REG_BITS} "
                               "bits")
        return regs


def relative_fields(f: typing.Mapping[str, np.ndarray], regs: typing.Mapping[str, int] | None
                    ) -> typing.Mapping[str, np.ndarray]:
    """The fields of a program (:func:`decode_fields`) as the fetch unit dispatches them with
    run-time registers ``regs`` (:func:`reg_values`): a LOAD's or STORE's ``dram_addr`` plus
    the value of its register (at most :data:`DRAM_ADDR_MAX`: the transfer then fails its DRAM
    range), a VEC's ``imm`` plus its register's (at most :data:`IMM_MAX`; a sub-op outside
    :data:`REG_VEC_FUNCS` keeps its word, ILLEGAL_OPCODE), and their ``reg`` 0. Every check
    and the semantics read the effective fields; no field changes an instruction's cycles
    (hw/timing.py). Before a REPEAT's offsets: the two add (:meth:`LoopStream.fields`)."""
    values = reg_values(regs)
    g = collections.ChainMap({}, f)  # the moved fields over the program's, read lazily
    for body, (field,) in RELATIVE.items():
        reg = f[f"{body}.reg"]
        moved = functools.reduce(operator.or_, (f["opcode"] == o.value for o in _REL_OPS[body]))
        moved = moved & (reg != 0)
        if body == "vec":
            moved = moved & functools.reduce(operator.or_, (f["vec.func"] == v
                                                            for v in REG_VEC_FUNCS))
        if not moved.any():
            continue
        step = values[reg]
        g[f"{body}.{field}"] = np.where(moved, np.minimum(f[f"{body}.{field}"] + step,
                                                          _REL_MAX[body]),
                                        f[f"{body}.{field}"])
        g[f"{body}.reg"] = np.where(moved, 0, reg)
    return g


def uses_regs(words: np.ndarray) -> bool:
    """Whether a program (``uint64 [n, 2]``, :func:`program_words`) has a word relative to a
    run-time register (:func:`relative_fields`)."""
    f = decode_fields(words)
    return bool(any((functools.reduce(operator.or_, (f["opcode"] == o.value
                                                     for o in _REL_OPS[body]))
                     & (f[f"{body}.reg"] != 0)).any() for body in RELATIVE))


def relative_words(words: np.ndarray, regs: typing.Mapping[str, int] | None) -> np.ndarray:
    """A program's words (``uint64 [n, 2]``) with the run-time registers applied
    (:func:`relative_fields`): plain words, none relative, that run as the program runs
    with ``regs`` (the same words when none is relative)."""
    f = decode_fields(words)
    g = relative_fields(f, regs)
    changed = [(body, name) for body in RELATIVE for name in (RELATIVE[body][0], "reg")
               if g[f"{body}.{name}"] is not f[f"{body}.{name}"]]
    if not changed:
        return words
    out = words.copy()
    rows = np.flatnonzero(functools.reduce(operator.or_, (
        g[f"{b}.{n}"] != f[f"{b}.{n}"] for b, n in changed)))
    for body, name in changed:
        set_field(out, rows, f"{body}.{name}", g[f"{body}.{name}"][rows])
    return out


def relative_instruction(ins: Instr, regs: typing.Mapping[str, int] | None) -> Instr:
    """Instruction ``ins`` as dispatched with run-time registers ``regs``
    (:func:`relative_fields`; itself when it is relative to none)."""
    reg = getattr(ins, "reg", 0)
    if not reg:
        return ins
    value = int(reg_values(regs)[reg])
    if isinstance(ins, _Dma):
        return dataclasses.replace(ins, reg=0, dram_addr=min(ins.dram_addr + value,
                                                             DRAM_ADDR_MAX))
    return dataclasses.replace(ins, reg=0, imm=min(ins.imm + value, IMM_MAX))


# ---------------------------------------------------------------------- full validation
_EXTENT_NAMES = {Spad.WGT: "weight stream ends", Spad.ACT: "activations end",
                 Spad.OUT: "outputs end", Spad.PARAM: "epilogue operands end"}
assert _RULES_OF[Opcode.GEMM] == _EVENT_RULES + _GEMM_FIELD_RULES + _GEMM_ADDRESS_RULES


def _raise_first(rules: tuple[_Rule, ...], f: dict, lim: DispatchLimits,
                 cfg: AcceleratorConfig) -> None:
    for rule in rules:
        if rule.bad(f, lim):
            raise ISAError(rule.message(f, cfg))


def check(ins: Instr, cfg: AcceleratorConfig) -> None:
    """Full validation for the Python side: everything the hardware checks, and more.

    Raises :class:`ISAError` naming the offending field and value. Beyond the dispatch rules
    (:func:`dispatch_error`): explicit event ids must be encodable (``None`` is "no event"),
    every scratchpad range a GEMM uses must fit (:func:`gemm_extents`; the hardware wraps),
    and every field must fit its width.
    """
    if not isinstance(ins, INSTRUCTIONS):
        raise ISAError(f"not an instruction: {ins!r}")
    for name in ("wait", "signal"):
        ev = getattr(ins, name)
        if ev is not None and not 0 <= ev < NO_EVENT:
            raise ISAError(f"{name}={ev}: events are 0..{cfg.num_events - 1} "
                           f"(None for no event)")
    f, lim = _fields_of(ins), dispatch_limits(cfg)
    absent = _absent(ins, lim)
    if absent:
        raise ISAError(absent)
    if isinstance(ins, Gemm):
        _raise_first(_EVENT_RULES + _GEMM_FIELD_RULES, f, lim, cfg)
        # Before the start addresses: the ranges that begin at them.
        for spad, end in gemm_extents(ins, cfg).items():
            size = getattr(cfg, f"{spad.name.lower()}_spad_bytes")
            if end > size:
                raise ISAError(f"{_EXTENT_NAMES[spad]} at byte {end}, {spad.name} spad has "
                               f"{size}")
        _raise_first(_GEMM_ADDRESS_RULES, f, lim, cfg)
    else:
        _raise_first(_RULES_OF[ins.opcode], f, lim, cfg)
    # Field widths: let the encoder raise with the field name.
    w = _put(0, _HDR["opcode"], ins.opcode.value, "opcode")
    if ins.body:
        for name, value in ins._body_fields().items():
            w = _put(w, _BODIES[ins.body][name], int(value), name)


def replace(ins: Instr, **changes) -> Instr:
    return dataclasses.replace(ins, **changes)
