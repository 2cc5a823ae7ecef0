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

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from amaranth.lib import data, enum

from hw.config import AcceleratorConfig

__all__ = [
    "INSTR_BITS", "INSTR_BYTES", "NO_EVENT", "Opcode", "Spad", "Engine", "Epilogue", "ErrorCode",
    "Header", "DmaBody", "GemmBody", "SyncBody", "InstrLayout",
    "Load", "Store", "Gemm", "Sync", "End", "Instr", "ISAError",
    "encode", "decode", "encode_program", "decode_program", "engine_of", "dispatch_error",
    "check", "gemm_weight_bytes", "word_beats", "program_words", "decode_fields",
    "dispatch_errors",
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


class Spad(enum.Enum, shape=2):
    ACT = 0    # activations, read by the array
    WGT = 1    # packed weight streams, read by the decoder
    OUT = 2    # epilogue results, read by the store engine
    PARAM = 3  # epilogue operands: per-lane multipliers, residual rows


class Engine(enum.Enum, shape=2):
    LOAD = 0
    COMPUTE = 1
    STORE = 2


class Epilogue(enum.Enum, shape=2):
    NONE = 0           # keep results in the accumulators (more K chunks follow)
    WIDE = 1           # write accumulators as int32
    INT8 = 2           # requantise with per-lane multipliers and a shift
    INT8_RESIDUAL = 3  # as INT8, plus an int8 residual read from PARAM


class ErrorCode(enum.Enum, shape=4):
    NONE = 0
    ILLEGAL_OPCODE = 1
    BAD_EVENT = 2
    BAD_ADDRESS = 3
    BAD_GEMM = 4
    PC_OVERFLOW = 5
    EVENT_OVERFLOW = 6
    DEADLOCK = 7


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
    "dram_stride": 32,
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
    "epilogue": Epilogue,
    "shift": 5,
})

SyncBody = data.StructLayout({
    "engine": Engine,
})

InstrLayout = data.StructLayout({
    "header": Header,
    "body": data.UnionLayout({"dma": DmaBody, "gemm": GemmBody, "sync": SyncBody}),
})
assert InstrLayout.size <= INSTR_BITS, InstrLayout.size


class ISAError(ValueError):
    """An instruction the encoder refuses; the message names the field and value."""


# ---------------------------------------------------------------------- field offsets
def _fields(layout: data.StructLayout, base: int) -> dict[str, tuple[int, int]]:
    return {name: (base + f.offset, f.width) for name, f in layout}


_HDR = _fields(Header, InstrLayout["header"].offset)
_BODY = InstrLayout["body"].offset
_BODIES = {"dma": _fields(DmaBody, _BODY), "gemm": _fields(GemmBody, _BODY),
           "sync": _fields(SyncBody, _BODY)}


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
    """Common header: wait on an event before executing, signal one when done."""

    wait: int | None = None
    signal: int | None = None
    opcode: ClassVar[Opcode]
    body: ClassVar[str | None] = None

    def _body_fields(self) -> dict[str, int]:
        return {}


@dataclass(frozen=True, kw_only=True)
class Load(_Base):
    """DRAM -> scratchpad: ``rows`` rows of ``row_beats`` beats, DRAM rows ``dram_stride`` apart,
    written contiguously from ``spad_addr``."""

    spad: Spad = Spad.ACT
    dram_addr: int = 0
    spad_addr: int = 0
    rows: int = 1
    row_beats: int = 1
    dram_stride: int = 0
    opcode: ClassVar[Opcode] = Opcode.LOAD
    body: ClassVar[str] = "dma"

    def _body_fields(self):
        return {"spad": self.spad.value, "dram_addr": self.dram_addr,
                "spad_addr": self.spad_addr, "rows": self.rows, "row_beats": self.row_beats,
                "dram_stride": self.dram_stride}


@dataclass(frozen=True, kw_only=True)
class Store(Load):
    """Scratchpad (OUT) -> DRAM, the mirror image of :class:`Load`."""

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
    epilogue: Epilogue = Epilogue.WIDE
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


@dataclass(frozen=True, kw_only=True)
class Sync(_Base):
    """Only wait and/or signal, on the queue of ``engine`` (e.g. to seed buffer credits)."""

    engine: Engine = Engine.LOAD
    opcode: ClassVar[Opcode] = Opcode.SYNC
    body: ClassVar[str] = "sync"

    def _body_fields(self):
        return {"engine": self.engine.value}


@dataclass(frozen=True, kw_only=True)
class End(_Base):
    """End of program: the accelerator is done once every engine has drained."""

    opcode: ClassVar[Opcode] = Opcode.END


Instr = Load | Store | Gemm | Sync | End
_BY_OPCODE = {c.opcode: c for c in (Load, Store, Gemm, Sync, End)}


def engine_of(ins: Instr) -> Engine | None:
    """The engine whose queue receives ``ins`` (None for END)."""
    if isinstance(ins, Store):
        return Engine.STORE
    if isinstance(ins, Load):
        return Engine.LOAD
    if isinstance(ins, Gemm):
        return Engine.COMPUTE
    if isinstance(ins, Sync):
        return ins.engine
    return None


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
    if cls is End:
        return End(**ev)
    f = {name: _get(word, fld) for name, fld in _BODIES[cls.body].items()}
    if cls is Sync:
        if f["engine"] not in Engine._value2member_map_:
            raise ISAError(f"SYNC names engine {f['engine']}, which does not exist")
        return Sync(engine=Engine(f["engine"]), **ev)
    if cls in (Load, Store):
        return cls(spad=Spad(f.pop("spad")), **f, **ev)
    f["tokens"] = f.pop("tokens_m1") + 1
    for b in ("int8", "asym", "accumulate"):
        f[b] = bool(f[b])
    f["epilogue"] = Epilogue(f["epilogue"])
    return Gemm(**f, **ev)


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


# ---------------------------------------------------------------------- validation
def gemm_weight_bytes(g: Gemm, cfg: AcceleratorConfig) -> int:
    """Bytes of the weight stream a GEMM instruction reads from the WGT spad."""
    pat = cfg.pattern_table[g.pattern]
    field = (8 if g.int8 else 4) + pat.index_bits
    headers = 0 if g.group_steps == 0 else -(-g.k_steps // g.group_steps) * (1 + g.asym)
    return headers * cfg.lanes + g.k_steps * cfg.lanes * field // 8


def word_beats(word_bytes: int, cfg: AcceleratorConfig) -> int:
    """Beats per scratchpad word of ``word_bytes`` (1 when a word is no wider than a beat)."""
    return max(1, word_bytes // cfg.beat_bytes)


def _misaligned(g: Gemm, cfg: AcceleratorConfig) -> str | None:
    """The first GEMM address that is not on a word of its scratchpad, as ``"name=value:
    beats"``; None if all are aligned.

    The compute engine reads one word of each scratchpad per cycle and writes whole OUT words,
    so every ACT row (``act_addr + t * act_stride``), the OUT destination (unless the epilogue
    is NONE) and the PARAM operands (INT8 epilogues) must start on a word, as the WGT stream
    already must. With the default configuration only OUT (4 beats) and PARAM (8 beats) words
    are wider than a beat.
    """
    act = word_beats(cfg.act_word_bytes, cfg)
    rules = [("act_addr", g.act_addr, act), ("act_stride", g.act_stride, act)]
    if g.epilogue != Epilogue.NONE:
        rules.append(("out_addr", g.out_addr, word_beats(cfg.out_word_bytes, cfg)))
    if g.epilogue in (Epilogue.INT8, Epilogue.INT8_RESIDUAL):
        rules.append(("param_addr", g.param_addr, word_beats(cfg.param_word_bytes, cfg)))
    for name, value, words in rules:
        if value % words:
            return f"{name}={value}: {words}"
    return None


@dataclass(frozen=True)
class _Limits:
    """Per-configuration constants of the dispatch checks (computed once per config)."""

    num_events: int
    spad_beats: tuple[int, ...]   # indexed by Spad value
    dram_beats: int
    patterns: int
    max_tokens: int
    int8: bool
    wgt_words: int
    act_words: int
    out_words: int
    param_words: int


def _limits(cfg: AcceleratorConfig) -> _Limits:
    # Cached in the (frozen) config's __dict__: the fast model checks every instruction of
    # programs with 10^5 instructions, and recomputing these dominated its run time.
    lim = cfg.__dict__.get("_isa_limits")
    if lim is None:
        lim = _Limits(
            num_events=cfg.num_events,
            spad_beats=tuple(cfg.spad_beats(sp.name.lower()) for sp in Spad),
            dram_beats=cfg.dram_beats, patterns=len(cfg.pattern_table),
            max_tokens=cfg.max_tokens, int8=8 in cfg.weight_bits,
            wgt_words=word_beats(cfg.wgt_word_bytes, cfg),
            act_words=word_beats(cfg.act_word_bytes, cfg),
            out_words=word_beats(cfg.out_word_bytes, cfg),
            param_words=word_beats(cfg.param_word_bytes, cfg))
        cfg.__dict__["_isa_limits"] = lim
    return lim


def dispatch_error(ins: Instr, cfg: AcceleratorConfig) -> ErrorCode:
    """The checks the hardware's fetch unit applies when an instruction reaches dispatch.

    Deliberately cheap: opcode, event ids, pattern/width/token limits, start addresses (range
    and scratchpad-word alignment) and DMA extents. GEMM streams that run past the end of a
    scratchpad wrap around (the Python :func:`check` rejects those before they reach the
    hardware). Alignment: see :func:`_misaligned`.
    """
    lim = _limits(cfg)
    if (ins.wait is not None and ins.wait >= lim.num_events) or \
            (ins.signal is not None and ins.signal >= lim.num_events):
        return ErrorCode.BAD_EVENT
    kind = type(ins)
    if kind is Load or kind is Store:
        if (kind is Store) != (ins.spad == Spad.OUT) or ins.rows == 0 or ins.row_beats == 0:
            return ErrorCode.BAD_ADDRESS
        if ins.spad_addr + ins.rows * ins.row_beats > lim.spad_beats[ins.spad.value]:
            return ErrorCode.BAD_ADDRESS
        if ins.dram_addr + (ins.rows - 1) * ins.dram_stride + ins.row_beats > lim.dram_beats:
            return ErrorCode.BAD_ADDRESS
    elif kind is Gemm:
        if ins.pattern >= lim.patterns or ins.tokens > lim.max_tokens or ins.k_steps == 0:
            return ErrorCode.BAD_GEMM
        if ins.int8 and (not lim.int8 or ins.pattern != 0):
            return ErrorCode.BAD_GEMM
        if ins.asym and ins.group_steps == 0:
            return ErrorCode.BAD_GEMM
        sb = lim.spad_beats
        if (ins.wgt_addr >= sb[Spad.WGT.value] or ins.wgt_addr % lim.wgt_words
                or ins.act_addr >= sb[Spad.ACT.value] or ins.out_addr >= sb[Spad.OUT.value]
                or ins.param_addr >= sb[Spad.PARAM.value]):
            return ErrorCode.BAD_ADDRESS
        if ins.act_addr % lim.act_words or ins.act_stride % lim.act_words:
            return ErrorCode.BAD_ADDRESS
        if ins.epilogue != Epilogue.NONE and ins.out_addr % lim.out_words:
            return ErrorCode.BAD_ADDRESS
        if ins.epilogue in (Epilogue.INT8, Epilogue.INT8_RESIDUAL) and \
                ins.param_addr % lim.param_words:
            return ErrorCode.BAD_ADDRESS
    return ErrorCode.NONE


# ---------------------------------------------------------------------- vectorised twins
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


def decode_fields(words: np.ndarray) -> dict[str, np.ndarray]:
    """Every field of every instruction as ``int64`` arrays (the vectorised :func:`decode`).

    Header fields keep their names (``opcode``, ``wait``, ``signal``); body fields are decoded
    under every layout of the union and named ``dma.rows``, ``gemm.k_steps``, ``sync.engine``...
    Offsets come from the same Amaranth layouts as :func:`encode`.
    """
    out = {name: _field_array(words, f) for name, f in _HDR.items()}
    for body, fields in _BODIES.items():
        for name, f in fields.items():
            out[f"{body}.{name}"] = _field_array(words, f)
    return out


def dispatch_errors(f: dict[str, np.ndarray], cfg: AcceleratorConfig) -> np.ndarray:
    """:func:`dispatch_error` for many instructions at once (``ErrorCode`` values, int64).

    ``f`` comes from :func:`decode_fields`. Undefined opcodes and SYNCs naming no engine are
    ILLEGAL_OPCODE, as for the scalar decoder. Tests check both agree on random instructions.
    """
    lim = _limits(cfg)
    op = f["opcode"]
    err = np.zeros(op.shape, dtype=np.int64)

    def flag(cond, code):
        np.putmask(err, (err == 0) & cond, code.value)

    legal = np.isin(op, [o.value for o in _BY_OPCODE]) & \
        ~((op == Opcode.SYNC.value) & (f["sync.engine"] > Engine.STORE.value))
    flag(~legal, ErrorCode.ILLEGAL_OPCODE)
    for ev in (f["wait"], f["signal"]):
        flag((ev != NO_EVENT) & (ev >= lim.num_events), ErrorCode.BAD_EVENT)
    dma = (op == Opcode.LOAD.value) | (op == Opcode.STORE.value)
    spad, rows, rb = f["dma.spad"], f["dma.rows"], f["dma.row_beats"]
    spad_beats = np.asarray(lim.spad_beats, dtype=np.int64)[spad]
    bad_dma = ((op == Opcode.STORE.value) != (spad == Spad.OUT.value)) | (rows == 0) | \
        (rb == 0) | (f["dma.spad_addr"] + rows * rb > spad_beats) | \
        (f["dma.dram_addr"] + (rows - 1) * f["dma.dram_stride"] + rb > lim.dram_beats)
    flag(dma & bad_dma, ErrorCode.BAD_ADDRESS)
    gemm = op == Opcode.GEMM.value
    g = {k.split(".", 1)[1]: v for k, v in f.items() if k.startswith("gemm.")}
    bad_gemm = (g["pattern"] >= lim.patterns) | (g["tokens_m1"] + 1 > lim.max_tokens) | \
        (g["k_steps"] == 0) | ((g["int8"] == 1) & ((g["pattern"] != 0) | (not lim.int8))) | \
        ((g["asym"] == 1) & (g["group_steps"] == 0))
    flag(gemm & bad_gemm, ErrorCode.BAD_GEMM)
    sb = lim.spad_beats
    epi = g["epilogue"]
    int8_epi = (epi == Epilogue.INT8.value) | (epi == Epilogue.INT8_RESIDUAL.value)
    bad_addr = (g["wgt_addr"] >= sb[Spad.WGT.value]) | (g["wgt_addr"] % lim.wgt_words != 0) | \
        (g["act_addr"] >= sb[Spad.ACT.value]) | (g["out_addr"] >= sb[Spad.OUT.value]) | \
        (g["param_addr"] >= sb[Spad.PARAM.value]) | (g["act_addr"] % lim.act_words != 0) | \
        (g["act_stride"] % lim.act_words != 0) | \
        ((epi != Epilogue.NONE.value) & (g["out_addr"] % lim.out_words != 0)) | \
        (int8_epi & (g["param_addr"] % lim.param_words != 0))
    flag(gemm & bad_addr, ErrorCode.BAD_ADDRESS)
    return err


def check(ins: Instr, cfg: AcceleratorConfig) -> None:
    """Full validation for the Python side: everything the hardware checks, and more.

    Raises :class:`ISAError` naming the offending field and value.
    """
    if not isinstance(ins, (Load, Store, Gemm, Sync, End)):
        raise ISAError(f"not an instruction: {ins!r}")
    for name in ("wait", "signal"):
        ev = getattr(ins, name)
        if ev is not None and not 0 <= ev < cfg.num_events:
            raise ISAError(f"{name}={ev}: events are 0..{cfg.num_events - 1}")
    if isinstance(ins, Load):
        kind = "STORE" if isinstance(ins, Store) else "LOAD"
        if isinstance(ins, Store) and ins.spad != Spad.OUT:
            raise ISAError(f"STORE reads the OUT scratchpad only, got spad={ins.spad.name}")
        if not isinstance(ins, Store) and ins.spad == Spad.OUT:
            raise ISAError("LOAD cannot write the OUT scratchpad (the epilogue owns it)")
        if ins.rows < 1 or ins.row_beats < 1:
            raise ISAError(f"{kind} of rows={ins.rows} x row_beats={ins.row_beats} is empty")
        end = ins.spad_addr + ins.rows * ins.row_beats
        if end > cfg.spad_beats(ins.spad.name.lower()):
            raise ISAError(f"{kind} spad range [{ins.spad_addr}, {end}) beats exceeds "
                           f"{ins.spad.name} ({cfg.spad_beats(ins.spad.name.lower())} beats)")
        dend = ins.dram_addr + (ins.rows - 1) * ins.dram_stride + ins.row_beats
        if dend > cfg.dram_beats:
            raise ISAError(f"{kind} DRAM range ends at beat {dend}, DRAM has "
                           f"{cfg.dram_beats} beats")
    elif isinstance(ins, Gemm):
        if not 0 <= ins.pattern < len(cfg.pattern_table):
            raise ISAError(f"pattern={ins.pattern}: this accelerator has patterns "
                           f"{[str(p) for p in cfg.pattern_table]}")
        if not 1 <= ins.tokens <= cfg.max_tokens:
            raise ISAError(f"tokens={ins.tokens}: must be in [1, {cfg.max_tokens}]")
        if ins.k_steps < 1:
            raise ISAError(f"k_steps={ins.k_steps} must be >= 1")
        if ins.int8 and 8 not in cfg.weight_bits:
            raise ISAError("int8 weights are not supported by this accelerator")
        if ins.int8 and ins.pattern != 0:
            raise ISAError("int8 weights are streamed dense only (pattern 0)")
        if ins.asym and ins.group_steps == 0:
            raise ISAError("asymmetric weights need group headers (group_steps > 0)")
        words = max(1, cfg.wgt_word_bytes // cfg.beat_bytes)
        if ins.wgt_addr % words:
            raise ISAError(f"wgt_addr={ins.wgt_addr} must be a multiple of {words} beats "
                           f"(one WGT word)")
        wend = ins.wgt_addr * cfg.beat_bytes + gemm_weight_bytes(ins, cfg)
        if wend > cfg.wgt_spad_bytes:
            raise ISAError(f"weight stream ends at byte {wend}, WGT spad has "
                           f"{cfg.wgt_spad_bytes}")
        pat = cfg.pattern_table[ins.pattern]
        k_dense = -(-ins.k_steps // pat.steps_per_block) * pat.block
        aend = (ins.act_addr + (ins.tokens - 1) * ins.act_stride) * cfg.beat_bytes + k_dense
        if aend > cfg.act_spad_bytes:
            raise ISAError(f"activations end at byte {aend}, ACT spad has "
                           f"{cfg.act_spad_bytes}")
        row = {Epilogue.NONE: 0, Epilogue.WIDE: 4 * cfg.lanes}.get(ins.epilogue, cfg.lanes)
        oend = ins.out_addr * cfg.beat_bytes + ins.tokens * row
        if oend > cfg.out_spad_bytes:
            raise ISAError(f"outputs end at byte {oend}, OUT spad has {cfg.out_spad_bytes}")
        if ins.epilogue in (Epilogue.INT8, Epilogue.INT8_RESIDUAL):
            pend = ins.param_addr * cfg.beat_bytes + 2 * cfg.lanes
            if ins.epilogue == Epilogue.INT8_RESIDUAL:
                pend += ins.tokens * cfg.lanes
            if pend > cfg.param_spad_bytes:
                raise ISAError(f"epilogue operands end at byte {pend}, PARAM spad has "
                               f"{cfg.param_spad_bytes}")
        bad = _misaligned(ins, cfg)
        if bad:
            field, words = bad.split(": ")
            raise ISAError(f"{field} must be a multiple of {words} beats (one scratchpad word)")
    err = dispatch_error(ins, cfg)
    if err != ErrorCode.NONE:  # anything the checks above missed
        raise ISAError(f"instruction rejected by the hardware checks: {err.name}: {ins}")
    # Field widths: let the encoder raise with the field name.
    w = _put(0, _HDR["opcode"], ins.opcode.value, "opcode")
    if ins.body:
        for name, value in ins._body_fields().items():
            w = _put(w, _BODIES[ins.body][name], int(value), name)


def replace(ins: Instr, **changes) -> Instr:
    return dataclasses.replace(ins, **changes)
