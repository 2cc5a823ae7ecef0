"""The instruction scheduler: planned layers become one event-synchronised program.

Every layer (:class:`~sw.compile.tiling.LinearPlan`) is a sequence of GEMMs, one per (token
tile, n-tile, K chunk); a program runs the GEMMs of its layers back to back, alternating
between the two halves of the WGT (and, for chunked activations, ACT) scratchpad, so the LOAD
engine fills one half while the array streams the other -- across layer boundaries too (the
heads of an attention layer, q/k/v). The scratchpad buffers and the events are the contract
between this module and the hardware (:class:`SpadPlan`, :data:`EVENTS`); each event is a
counting semaphore with one producer and one consumer engine::

    FULL[b]      LOAD -> COMPUTE   GEMM i's weights (and activations) landed in half b = i % 2
    FREE[b]      COMPUTE -> LOAD   the GEMM reading half b is done (non-final K chunk)
    OUT_FULL[o]  COMPUTE -> STORE  the final GEMM of a tile filled output buffer o
    STORED[o]    STORE -> LOAD     output buffer o is written back (so its GEMM is done too)

A GEMM has one wait and one signal, so a tile's final GEMM signals OUT_FULL instead of FREE;
the load that next reuses its input half waits for STORED instead, which also orders the next
write of that output buffer after its store (the GEMM that writes it depends on a later load).
No SYNC instructions are needed. Instructions are emitted software-pipelined (the loads of GEMM
i+1 before GEMM i), so in-order fetch into short queues never blocks on an engine that waits
for a later instruction. Decode layers (resident activations, no bias) keep more weight
chunks in flight, in a ring of WGT slots with one counting event per role
(:func:`ring_slots`, :class:`_RingScheduler`).

A vector program (:func:`schedule_vector`: one host op lowered to the vector engine, one VEC
per row or row segment) uses the same events with the vector engine in the compute engine's
place: FULL[b] LOAD -> VECTOR (the rows of task ``i`` landed in VIN half ``b = i % 2``),
OUT_FULL[b] VECTOR -> STORE (its results are in VOUT half ``b``), STORED[b] STORE -> LOAD
(VOUT half ``b`` is written back, so the VECs that read VIN half ``b`` are done too: task
``i + 2`` may load into it). A constant row (RMSNorm's weight) is loaded once, first, below
the halves; a ROPE's table rows (one per token's position) are loaded with its rows.

Every DMA instruction names the operand its DRAM address points into (:data:`Reloc`): with
every address 0 the program is a template placed anywhere by :mod:`sw.compile.relocation`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple, TypeVar

from hw.config import AcceleratorConfig
from hw.isa import (
    Engine,
    EpilogueMode,
    Gemm,
    Instr,
    Load,
    Spad,
    Store,
    Sync,
    Vec,
    VecFunc,
    argmax_imm,
    dequant_imm,
    rope_geometry,
    vec_out_words,
)
from hw.timing import LOAD_TURNAROUND, gemm_cycles, load_completion_delay, load_cycles
from sw.compile.errors import LoweringError
from sw.compile.registers import POS as PENDING_POS
from sw.compile.tiling import LinearPlan

__all__ = ["EVENTS", "SpadPlan", "plan_spads", "PlacedLayer", "Reloc", "Schedule",
           "schedule_layers", "ring_slots", "ahead_slots", "half_slots", "MAX_RING_SLOTS",
           "ELEMENTWISE", "VectorTask", "vector_tasks", "schedule_vector",
           "rope_table_beats", "schedule_requant", "AmaxPlace", "amax_place", "schedule_dequant",
           "dequant_segment_beats", "DEQUANT_TILES", "SHORT_SET_DELAYS", "MAX_DEQUANT_SEGMENTS",
           "schedule_argmax", "argmax_segments", "argmax_beats", "check_head_row"]

#: The event table of a scheduled program: two per double buffer (docs/architecture.md, 9).
EVENTS = {"FULL0": 0, "FULL1": 1, "FREE0": 2, "FREE1": 3, "OUT_FULL0": 4, "OUT_FULL1": 5,
          "STORED0": 6, "STORED1": 7}

#: Which operand a DMA instruction's DRAM address is relative to: (layer, "w" | "x" | "y" |
#: "b").
Reloc = tuple[int, str]


@dataclass(frozen=True)
class SpadPlan:
    """The scratchpad buffers and events one program uses (beats): two WGT halves, two ACT
    halves (chunked activations; resident ones start at 0), two OUT buffers of ``token_tile``
    int32 rows and, for biased layers, two PARAM buffers of as many int32 bias rows (0 beats
    when none)."""

    wgt_half_beats: int
    act_half_beats: int
    out_row_beats: int
    out_buf_beats: int
    events: dict[str, int]
    param_buf_beats: int = 0


def plan_spads(cfg: AcceleratorConfig, token_tile: int, bias_tile: int = 0) -> SpadPlan:
    """The double buffers of a program whose largest token tile is ``token_tile`` and largest
    token tile of a biased layer ``bias_tile`` (0: no biases).

    Raises
    ------
    LoweringError
        The accelerator has too few events, or two OUT (PARAM) buffers do not fit.
    """
    if len(EVENTS) > cfg.num_events:
        raise LoweringError(f"lowered programs use {len(EVENTS)} events, the accelerator has "
                            f"num_events={cfg.num_events}")
    out_row_beats = 4 * cfg.lanes // cfg.beat_bytes
    out_buf_beats = token_tile * out_row_beats
    if 2 * out_buf_beats > cfg.spad_beats("out"):
        raise LoweringError(f"OUT spad of {cfg.out_spad_bytes} bytes cannot hold two tiles of "
                            f"{token_tile} tokens x {cfg.lanes} int32 outputs")
    param_buf_beats = bias_tile * out_row_beats  # bias rows: the outputs' int32 layout
    if 2 * param_buf_beats > cfg.spad_beats("param"):
        raise LoweringError(f"PARAM spad of {cfg.param_spad_bytes} bytes cannot hold two tiles "
                            f"of {bias_tile} tokens x {cfg.lanes} int32 bias rows")
    return SpadPlan(wgt_half_beats=cfg.spad_beats("wgt") // 2,
                    act_half_beats=cfg.spad_beats("act") // 2,
                    out_row_beats=out_row_beats, out_buf_beats=out_buf_beats,
                    events=dict(EVENTS), param_buf_beats=param_buf_beats)


@dataclass(frozen=True)
class PlacedLayer:
    """A planned layer and where its operands start in DRAM (beats; all 0 for a template).

    ``w_addr``: weight tiles, ``w_tile_stride`` bytes apart (default ``plan.tile_stride``: a
    region laid out for a longer K, such as the value cache, has wider tiles); ``x_addr``: int8
    activations ``[tokens, act_row_bytes]``; ``y_addr``: int32 outputs ``[tokens, n_tiles *
    lanes]``; ``b_addr``: int32 bias rows laid out as the outputs (biased plans). ``x_key``
    names the input buffer (default: ``x_addr``): consecutive layers of one program reading
    the same resident input (q/k/v) load it into ACT once.
    """

    plan: LinearPlan
    w_addr: int = 0
    x_addr: int = 0
    y_addr: int = 0
    b_addr: int = 0
    w_tile_stride: int | None = None
    x_key: object = None

    @property
    def tile_stride(self) -> int:
        return self.plan.tile_stride if self.w_tile_stride is None else self.w_tile_stride

    @property
    def input_id(self) -> object:
        return self.x_addr if self.x_key is None else self.x_key


class Schedule(NamedTuple):
    """A program (without END) and, per instruction, the operand its DRAM address points
    into (None: no DRAM address)."""

    instructions: list[Instr]
    relocs: list[Reloc | None]


def schedule_layers(cfg: AcceleratorConfig, layers: list[PlacedLayer],
                    spads: SpadPlan | None = None, ring: bool = True) -> Schedule:
    """One program for several independent layers run back to back.

    Outputs use the WIDE epilogue (WIDE_BIAS for biased layers). ``spads``: the scratchpad
    buffers and events (default :func:`plan_spads` for these layers' token tiles); ``ring``:
    the weights in a ring of :func:`ring_slots` chunks where that is more than two (else,
    and without it, the double buffers, whose instructions repeat every two GEMMs).
    """
    spads = spads or plan_spads(cfg, max(ly.plan.token_tile for ly in layers),
                                max((ly.plan.token_tile for ly in layers if ly.plan.bias),
                                    default=0))
    slots = ring_slots(cfg, layers, spads) if ring else 2
    if slots <= 2:
        return _Scheduler(cfg, layers, spads).run()
    one = _RingScheduler(cfg, layers, spads, slots, 1).run()
    if (fewer := max(ahead_slots(cfg, one.instructions), half_slots(cfg, one.instructions))
            ) < slots:
        slots, one = fewer, _RingScheduler(cfg, layers, spads, fewer, 1).run()
    buffers = act_buffers(cfg, layers, spads, one.instructions)
    return one if buffers == 1 else _RingScheduler(cfg, layers, spads, slots, buffers).run()


#: The most WGT slots of a ring (:func:`ring_slots`).
MAX_RING_SLOTS = 8


def ring_slots(cfg: AcceleratorConfig, layers: Sequence[PlacedLayer], spads: SpadPlan) -> int:
    """How many weight chunks a program of ``layers`` keeps in flight: 2 (the double buffers)
    unless every layer reads resident activations and has no bias, when as many slots of
    its largest weight chunk as the WGT scratchpad holds -- with an OUT buffer each -- up
    to :data:`MAX_RING_SLOTS`, its GEMMs and what an event counter holds (as many signals
    as slots may be outstanding), a power of two (a ring: the LOAD engine runs that many
    chunks ahead of the array, so the weights stream while the array, or another engine
    before it in a fused program, waits on activations). Its tiles' OUT buffers:
    :func:`out_ring`."""
    if not all(ly.plan.resident_acts and not ly.plan.bias for ly in layers):
        return 2
    beat = cfg.beat_bytes
    chunk = max(-(-ly.plan.chunk_weight_bytes(c) // beat)
                for ly in layers for c in range(ly.plan.k_chunks))
    steps = sum(ly.plan.token_tiles * ly.plan.n_tiles * ly.plan.k_chunks for ly in layers)
    fit = min(MAX_RING_SLOTS, steps, cfg.spad_beats("wgt") // chunk,
              cfg.spad_beats("out") // spads.out_buf_beats, (1 << cfg.event_bits) - 1)
    return 1 << max(1, fit.bit_length() - 1)


def ahead_slots(cfg: AcceleratorConfig, program: Sequence[Instr]) -> int:
    """The fewest slots (a power of two, at least 2) a ring needs to keep its array fed: a
    weights LOAD into slot ``i % slots`` waits for GEMM ``i - slots`` to be done, so its chunk
    must land (:func:`hw.timing.load_cycles`, :func:`hw.timing.load_completion_delay`, after
    :data:`hw.timing.LOAD_TURNAROUND`) while the ``slots - 1`` GEMMs between run
    (:func:`hw.timing.gemm_cycles`; ``program``: the ring's schedule, the longest LOAD
    against the shortest GEMM). Where the weights stream much faster than the array computes
    (HBM-class decode), two slots do: the ring then takes less of the WGT scratchpad, so the
    next GEMM part of a fused program packs its weights beside it and loads them while the
    vector parts between run (:func:`sw.compile.fusion._wgt_moved`)."""
    land = max(load_cycles(i, cfg) for i in program if isinstance(i, Load) and i.spad == Spad.WGT)
    gemm = min(gemm_cycles(i, cfg) for i in program if isinstance(i, Gemm))
    gemms = -(-(land + load_completion_delay(cfg) + LOAD_TURNAROUND) // gemm)
    return 1 << max(1, gemms.bit_length())


def half_slots(cfg: AcceleratorConfig, program: Sequence[Instr]) -> int:
    """The most slots of a ring's largest chunk (``program``: its schedule) that half the WGT
    scratchpad holds (a power of two, at least 1): a ring of no more leaves the other half
    to the next GEMM part of a fused program; one already that small keeps its slots
    (:func:`ahead_slots` lowers only rings that fill more of WGT)."""
    chunk = max(i.rows * i.row_beats for i in program
                if isinstance(i, Load) and i.spad == Spad.WGT)
    fit = cfg.spad_beats("wgt") // 2 // chunk
    return 1 << max(0, fit.bit_length() - 1)


def out_ring(cfg: AcceleratorConfig, slots: int, out_buf_beats: int) -> int:
    """How many OUT buffers (of ``out_buf_beats`` beats) a ring of ``slots`` WGT slots
    (:func:`ring_slots`) writes its tiles into, in turn: the most multiples of ``slots``
    that OUT holds (at least ``slots``, which :func:`ring_slots` fits). Tile ``t``'s buffer
    was last written by tile ``t - out_ring``, whose last GEMM is at least ``out_ring >=
    slots`` GEMMs before tile ``t``'s first, and that GEMM's done signal is consumed before
    the first GEMM's weights load: a buffer is free when it is written, as with ``slots``
    buffers. More buffers keep a tile's results in OUT for longer after its STORE, so a move
    of several tiles' rows to VIN (:func:`sw.compile.onchip.out_moves`) reads them before a
    GEMM writes the buffers again, and no GEMM need wait on the move."""
    return slots * max(1, cfg.spad_beats("out") // (slots * out_buf_beats))


@dataclass(frozen=True)
class _Step:
    """One GEMM of the program: K chunk ``chunk`` of n-tile ``n_tile`` of token tile
    ``token_tile`` of layer ``layer``, the ``index``-th GEMM."""

    index: int
    layer: int
    token_tile: int
    n_tile: int
    chunk: int
    final: bool      # the tile's last K chunk: signals OUT_FULL and is followed by a STORE
    out_buf: int     # the OUT (and PARAM) buffer its tile writes: finished tiles before, mod 2
    new_acts: bool   # starts a new activation set (its loads wait for GEMM index - 1)

    @property
    def half(self) -> int:
        """The WGT (and chunked ACT) half it reads."""
        return self.index % 2


class _ActChunk(NamedTuple):
    """A GEMM's activations in ACT (beats): its first, the stride between token rows, and the
    chunk's offset in a token's DRAM row (what a chunked load skips)."""

    spad_addr: int
    row_stride: int
    row_offset: int


def _steps(layers: list[PlacedLayer]) -> list[_Step]:
    """Every GEMM of the program, in order."""
    steps: list[_Step] = []
    tiles_done = 0
    for L, ly in enumerate(layers):
        p = ly.plan
        for t in range(p.token_tiles):
            for j in range(p.n_tiles):
                for c in range(p.k_chunks):
                    prev = steps[-1] if steps else None
                    new_acts = prev is None or (
                        (prev.layer, prev.token_tile) != (L, t)
                        and not _share_acts(layers[prev.layer], ly))
                    final = c == p.k_chunks - 1
                    steps.append(_Step(len(steps), L, t, j, c, final, tiles_done % 2, new_acts))
                    tiles_done += final
    return steps


def _share_acts(a: PlacedLayer, b: PlacedLayer) -> bool:
    """Whether layer ``b`` reads the resident activations layer ``a`` left in ACT: the same
    input buffer, laid out alike, in one token tile."""
    pa, pb = a.plan, b.plan
    return (pa.resident_acts and pb.resident_acts and a.input_id == b.input_id
            and pa.act_row_bytes == pb.act_row_bytes and pa.token_tile == pb.token_tile
            and pa.token_tiles == pb.token_tiles == 1)


class _Scheduler:
    """Emits the instructions of :func:`schedule_layers`: per GEMM its loads (emitted one GEMM
    ahead), the GEMM, and after a tile's final GEMM its store."""

    def __init__(self, cfg: AcceleratorConfig, layers: list[PlacedLayer], spads: SpadPlan):
        self.cfg, self.layers, self.spads = cfg, layers, spads
        self.beat = cfg.beat_bytes
        self.steps = _steps(layers)
        self.instructions: list[Instr] = []
        self.relocs: list[Reloc | None] = []
        self._stored_waited: set[int] = set()  # final GEMMs whose STORED a load consumed

    def run(self) -> Schedule:
        self._loads(self.steps[0])
        for s in self.steps:
            if s.index + 1 < len(self.steps):
                self._loads(self.steps[s.index + 1])
            self._gemm(s)
            if s.final:
                self._store(s)
        return Schedule(self.instructions, self.relocs)

    # ---- helpers
    def _event(self, name: str, buf: int) -> int:
        return self.spads.events[f"{name}{buf}"]

    def _emit(self, ins: Instr, reloc: Reloc | None) -> None:
        self.instructions.append(ins)
        self.relocs.append(reloc)

    def _done_wait(self, prev: int) -> int | None:
        """The wait that orders a load after GEMM ``prev``: FREE of its half, or STORED of its
        output buffer if it was a tile's final GEMM (consumed once: None after that, and
        before the first GEMM)."""
        if prev < 0 or prev in self._stored_waited:
            return None
        s = self.steps[prev]
        if s.final:
            self._stored_waited.add(prev)
            return self._event("STORED", s.out_buf)
        return self._event("FREE", s.half)

    def _act_chunk(self, s: _Step) -> _ActChunk:
        """Where GEMM ``s`` reads its activations in ACT, and where a chunked load puts them."""
        plan, beat = self.layers[s.layer].plan, self.beat
        k0, chunk = plan.chunk_act_start(s.chunk) // beat, plan.chunk_act_bytes(s.chunk) // beat
        if plan.resident_acts:  # the whole row is in ACT from beat 0
            return _ActChunk(k0, plan.act_row_bytes // beat, k0)
        return _ActChunk(s.half * self.spads.act_half_beats, chunk, k0)

    # ---- instructions
    def _loads(self, s: _Step) -> None:
        """The loads of GEMM ``s``: its activations (resident: once per activation set), its
        tile's bias rows before a final chunk of a biased layer, its weight chunk.

        Half ``s.half`` was last read by GEMM ``s.index - 2``: the first load into it waits
        for that GEMM; a new activation set also waits for GEMM ``s.index - 1``, which may
        still read the ACT spad. The LOAD engine is in order, so later loads need no wait.
        """
        ly, spads, beat = self.layers[s.layer], self.spads, self.beat
        plan = ly.plan
        half_free = self._done_wait(s.index - 2)
        acts_free = self._done_wait(s.index - 1) if s.new_acts else None
        t0, rows = plan.first_token(s.token_tile), plan.tile_tokens(s.token_tile)
        x_row_beats = plan.act_row_bytes // beat
        x_rows = ly.x_addr + t0 * x_row_beats
        if plan.resident_acts:
            if s.new_acts:  # activations for all of K
                self._emit(Load(spad=Spad.ACT, spad_addr=0, dram_addr=x_rows, rows=rows,
                                row_beats=x_row_beats, dram_stride=x_row_beats,
                                wait=acts_free), (s.layer, "x"))
        else:
            act = self._act_chunk(s)
            self._emit(Load(spad=Spad.ACT, spad_addr=act.spad_addr,
                            dram_addr=x_rows + act.row_offset, rows=rows,
                            row_beats=act.row_stride, dram_stride=x_row_beats,
                            wait=acts_free if s.new_acts else half_free), (s.layer, "x"))
            if not s.new_acts:
                half_free = None
        if plan.bias and s.final:
            # Into the PARAM buffer of the tile's OUT buffer: its previous reader is the GEMM
            # the STORED wait (here or in an earlier load) follows.
            y_row_beats = plan.out_row_bytes // beat
            self._emit(Load(spad=Spad.PARAM, spad_addr=s.out_buf * spads.param_buf_beats,
                            dram_addr=(ly.b_addr + t0 * y_row_beats
                                       + s.n_tile * spads.out_row_beats),
                            rows=rows, row_beats=spads.out_row_beats, dram_stride=y_row_beats,
                            wait=half_free), (s.layer, "b"))
            half_free = None
        w_start = s.n_tile * ly.tile_stride + plan.chunk_weight_start(s.chunk)
        self._emit(Load(spad=Spad.WGT, spad_addr=s.half * spads.wgt_half_beats,
                        dram_addr=ly.w_addr + w_start // beat, rows=1,
                        row_beats=-(-plan.chunk_weight_bytes(s.chunk) // beat),
                        wait=half_free, signal=self._event("FULL", s.half)), (s.layer, "w"))

    def _gemm(self, s: _Step) -> None:
        plan, spads = self.layers[s.layer].plan, self.spads
        fmt, spg = plan.fmt, plan.layout.steps_per_group
        act = self._act_chunk(s)
        wide = EpilogueMode.WIDE_BIAS if plan.bias else EpilogueMode.WIDE
        self._emit(Gemm(
            wgt_addr=s.half * spads.wgt_half_beats, act_addr=act.spad_addr,
            act_stride=act.row_stride,
            out_addr=s.out_buf * spads.out_buf_beats,
            param_addr=s.out_buf * spads.param_buf_beats,
            k_steps=plan.chunk_groups(s.chunk) * spg, group_steps=0 if fmt.raw else spg,
            tokens=plan.tile_tokens(s.token_tile), pattern=self.cfg.pattern_index(fmt.pattern),
            int8=fmt.bits == 8, asym=not fmt.symmetric, accumulate=s.chunk > 0,
            epilogue=wide if s.final else EpilogueMode.NONE,
            wait=self._event("FULL", s.half),
            signal=(self._event("OUT_FULL", s.out_buf) if s.final
                    else self._event("FREE", s.half))), None)

    def _store(self, s: _Step) -> None:
        ly, plan, spads = self.layers[s.layer], self.layers[s.layer].plan, self.spads
        y_row_beats = plan.out_row_bytes // self.beat
        self._emit(Store(
            spad=Spad.OUT, spad_addr=s.out_buf * spads.out_buf_beats,
            dram_addr=(ly.y_addr + plan.first_token(s.token_tile) * y_row_beats
                       + s.n_tile * spads.out_row_beats),
            rows=plan.tile_tokens(s.token_tile), row_beats=spads.out_row_beats,
            dram_stride=y_row_beats, wait=self._event("OUT_FULL", s.out_buf),
            signal=self._event("STORED", s.out_buf)), (s.layer, "y"))



#: A ring's activation sets are *short* (:func:`act_buffers`) where a set's GEMMs take at most
#: this many times what the array idles at the set with one buffer: the LOAD engine's
#: completion delay (:func:`hw.timing.load_completion_delay`) and the set's first weights
#: LOAD, which waits behind the set's activation LOAD; an eighth of its work or more. A
#: measured fit: HBM-class decode's attention scores (LLaMA-7B, 1:4 INT4, INT4 cache, a
#: 65-cycle delay) idled 108 cycles a head with one buffer, a program 24,779 -> 21,745
#: cycles with two at context 128 (a head's GEMM 166 cycles) and 106,715 -> 103,689 at 2048
#: (332); its values GEMMs at 2048 (2,082 cycles a head, a first weights LOAD of 513) idled
#: 598 cycles a head, 102,550 -> 85,653 with two; the reference deploy's shortest sets, 244
#: cycles against a 25-cycle delay, keep one buffer, where two cost its step 612 cycles
#: (97,390 -> 98,002).
SHORT_SET_DELAYS = 8


def _set_idle(cfg: AcceleratorConfig, program: Sequence[Instr]) -> int:
    """What the array idles over every activation set of the ring schedule ``program`` (one
    buffer) before the set's first GEMM: per activation LOAD, the LOAD completion delay and
    the first weights LOAD after it (:mod:`hw.timing`'s cycles)."""
    idle, pending = 0, False
    for i in program:
        if isinstance(i, Load) and i.spad == Spad.ACT:
            idle, pending = idle + load_completion_delay(cfg), True
        elif pending and isinstance(i, Load) and i.spad == Spad.WGT:
            idle, pending = idle + load_cycles(i, cfg), False
    return idle


def act_buffers(cfg: AcceleratorConfig, layers: Sequence[PlacedLayer], spads: SpadPlan,
                program: Sequence[Instr]) -> int:
    """How many resident activation sets a ring (:class:`_RingScheduler`) keeps in ACT: 2,
    one per half (:attr:`SpadPlan.act_half_beats`), where every layer's token tile of
    activation rows fits a half and either the ring is memory-bound -- its weights LOADs
    take longer than its GEMMs (``program``: its schedule with one buffer; :mod:`hw.timing`'s
    cycles), so a set's LOAD waiting for the GEMM before it idles the stream -- or its sets
    are short: several, whose GEMMs take at most :data:`SHORT_SET_DELAYS` times what the
    array idles at each set with one buffer (:func:`_set_idle`: a set's LOAD is issued only
    once the set before is stored, and its first weights LOAD after it), so that idling is
    a large part of its work. Else 1, from beat 0: an array-bound ring of long sets loses
    little by that wait, and a set's LOAD consumes the signal of the STORE just before it,
    which a fused program's vector part beside the ring (:func:`sw.compile.fusion.beside`:
    the scores' DEQUANT) follows."""
    beats = max(ly.plan.token_tile * ly.plan.act_row_bytes // cfg.beat_bytes for ly in layers)
    loads = sum(load_cycles(i, cfg) for i in program
                if isinstance(i, Load) and i.spad == Spad.WGT)
    gemms = sum(gemm_cycles(i, cfg) for i in program if isinstance(i, Gemm))
    sets = sum(isinstance(i, Load) and i.spad == Spad.ACT for i in program)
    short = sets > 1 and gemms <= SHORT_SET_DELAYS * _set_idle(cfg, program)
    return 2 if beats <= spads.act_half_beats and (loads > gemms or short) else 1


class _ActSet(NamedTuple):
    """Where a GEMM's activation set lies in ACT (``base``, beats) and, for the set's first
    GEMM, the last GEMM that reads that buffer before it (``after``; -1: none), which its
    LOAD waits for."""

    base: int
    after: int


def act_sets(new_acts: Sequence[bool], buffers: int, half_beats: int = 0) -> list[_ActSet]:
    """Per GEMM (``new_acts``: whether each starts a new activation set), its
    :class:`_ActSet` with ``buffers`` (:func:`act_buffers`) buffers ``half_beats`` apart:
    set ``k`` in buffer ``k % buffers``, last read by set ``k - buffers``, whose GEMMs end
    before set ``k - buffers + 1``'s first.

    >>> [tuple(a) for a in act_sets([True, True, False, True], 2, 100)]
    [(0, -1), (100, -1), (100, -1), (0, 0)]
    >>> [tuple(a) for a in act_sets([True, True, False, True], 1)]
    [(0, -1), (0, 0), (0, 0), (0, 2)]
    """
    starts = [i for i, new in enumerate(new_acts) if new]
    out, k = [], -1
    for new in new_acts:
        k += new
        j = k - buffers + 1
        out.append(_ActSet(k % buffers * half_beats, (starts[j] if j >= 0 else 0) - 1))
    return out


class _RingScheduler(_Scheduler):
    """:func:`schedule_layers` with ``slots`` WGT slots (:func:`ring_slots`), ``out_ring``
    OUT buffers (:func:`out_ring`) and one counting event each for FULL, FREE, OUT_FULL and
    STORED (``FULL0``, ``FREE0``, ``OUT_FULL0``, ``STORED0``): GEMM ``i`` reads slot
    ``i % slots``. Every event is signalled and consumed in order, so the k-th
    grant of one is its k-th signal. A GEMM is *done* when its FREE (a non-final K chunk) or
    its tile's STORED (the final one) is signalled; the load into slot ``i % slots`` first
    consumes the done signals of every GEMM up to ``i - slots`` not yet consumed (one on the
    LOAD itself, the others on SYNCs before it), and a new activation set's of every GEMM
    before it. Tile ``t`` writes OUT buffer ``t % out_ring`` (:func:`out_ring`: a multiple of
    ``slots``), then free when its first GEMM's weights land: the tile ``out_ring`` before it
    ended at GEMM ``i - slots`` or earlier. Loads are emitted up to
    ``min(slots, queue_depth) - 1`` GEMMs ahead (never past a new activation set, whose
    loads wait on the GEMM just before it): further, in-order fetch would wait on a full
    LOAD queue before dispatching the GEMMs. The first ``slots`` loads wait on nothing, so
    a fused program runs them before the parts ahead of it (:func:`sw.compile.fusion.
    fuse_parts`).

    With ``act_buffers`` 2 (:func:`act_buffers`), activation sets alternate between the
    halves of ACT: set ``k`` loads into half ``k % 2`` once the GEMMs of set ``k - 2``
    are done (those before set ``k - 1``'s first), not the GEMM just before it, so the next
    set (the next head's query row of the attention scores) and the weights after it load
    while set ``k - 1`` computes."""

    def __init__(self, cfg: AcceleratorConfig, layers: list[PlacedLayer], spads: SpadPlan,
                 slots: int, act_buffers: int = 1):
        super().__init__(cfg, layers, spads)
        self.slots = slots
        self.slot_beats = cfg.spad_beats("wgt") // slots
        self.out_buf = []
        tiles, ring = 0, out_ring(cfg, slots, spads.out_buf_beats)
        for s in self.steps:
            self.out_buf.append(tiles % ring)
            tiles += s.final
        self.done = 0  # GEMMs whose done signal a LOAD-engine word consumed
        self.act_sets = act_sets([s.new_acts for s in self.steps], act_buffers,
                                 spads.act_half_beats)

    def run(self) -> Schedule:
        emitted = 0
        for s in self.steps:
            ahead = s.index + min(self.slots, self.cfg.queue_depth) - 1
            while emitted < len(self.steps) and emitted <= ahead and (
                    emitted == s.index or not self.steps[emitted].new_acts):
                self._loads(self.steps[emitted])
                emitted += 1
            self._gemm(s)
            if s.final:
                self._store(s)
        return Schedule(self.instructions, self.relocs)

    def _through(self, last: int) -> int | None:
        """Consume the done signals of GEMMs up to ``last``: SYNCs for all but the last, whose
        event is returned for the LOAD (None: nothing left to consume)."""
        waits = []
        while self.done <= last:
            s = self.steps[self.done]
            waits.append(self.spads.events["STORED0" if s.final else "FREE0"])
            self.done += 1
        for e in waits[:-1]:
            self._emit(Sync(engine=Engine.LOAD, wait=e), None)
        return waits[-1] if waits else None

    def _loads(self, s: _Step) -> None:
        ly, beat = self.layers[s.layer], self.beat
        plan = ly.plan
        if s.new_acts:
            wait = self._through(self.act_sets[s.index].after)
            t0, rows = plan.first_token(s.token_tile), plan.tile_tokens(s.token_tile)
            x_row_beats = plan.act_row_bytes // beat
            self._emit(Load(spad=Spad.ACT, spad_addr=self.act_sets[s.index].base,
                            dram_addr=ly.x_addr + t0 * x_row_beats, rows=rows,
                            row_beats=x_row_beats, dram_stride=x_row_beats, wait=wait),
                       (s.layer, "x"))
        wait = self._through(s.index - self.slots)
        w_start = s.n_tile * ly.tile_stride + plan.chunk_weight_start(s.chunk)
        self._emit(Load(spad=Spad.WGT, spad_addr=(s.index % self.slots) * self.slot_beats,
                        dram_addr=ly.w_addr + w_start // beat, rows=1,
                        row_beats=-(-plan.chunk_weight_bytes(s.chunk) // beat),
                        wait=wait, signal=self.spads.events["FULL0"]), (s.layer, "w"))

    def _gemm(self, s: _Step) -> None:
        plan, spads = self.layers[s.layer].plan, self.spads
        fmt, spg = plan.fmt, plan.layout.steps_per_group
        act = self._act_chunk(s)
        self._emit(Gemm(
            wgt_addr=(s.index % self.slots) * self.slot_beats,
            act_addr=self.act_sets[s.index].base + act.spad_addr,
            act_stride=act.row_stride, out_addr=self.out_buf[s.index] * spads.out_buf_beats,
            param_addr=0, k_steps=plan.chunk_groups(s.chunk) * spg,
            group_steps=0 if fmt.raw else spg, tokens=plan.tile_tokens(s.token_tile),
            pattern=self.cfg.pattern_index(fmt.pattern), int8=fmt.bits == 8,
            asym=not fmt.symmetric, accumulate=s.chunk > 0,
            epilogue=EpilogueMode.WIDE if s.final else EpilogueMode.NONE,
            wait=spads.events["FULL0"],
            signal=spads.events["OUT_FULL0" if s.final else "FREE0"]), None)

    def _store(self, s: _Step) -> None:
        ly, plan, spads = self.layers[s.layer], self.layers[s.layer].plan, self.spads
        y_row_beats = plan.out_row_bytes // self.beat
        self._emit(Store(
            spad=Spad.OUT, spad_addr=self.out_buf[s.index] * spads.out_buf_beats,
            dram_addr=(ly.y_addr + plan.first_token(s.token_tile) * y_row_beats
                       + s.n_tile * spads.out_row_beats),
            rows=plan.tile_tokens(s.token_tile), row_beats=spads.out_row_beats,
            dram_stride=y_row_beats, wait=spads.events["OUT_FULL0"],
            signal=spads.events["STORED0"]), (s.layer, "y"))

# ---------------------------------------------------------------------- vector programs
#: Sub-ops whose every output element depends only on the same element of the operands: a row
#: too long for a VIN half is cut into segments (the others reduce over their whole row).
ELEMENTWISE = frozenset({VecFunc.ADD, VecFunc.MUL, VecFunc.SILU_GATE})


class VectorTask(NamedTuple):
    """Rows ``row .. row + rows - 1`` of a vector program, elements ``start .. start +
    length - 1`` of each: one LOAD per operand, one VEC per row, one STORE."""

    row: int
    rows: int
    start: int
    length: int


def _require_vector(cfg: AcceleratorConfig) -> None:
    """LoweringError unless ``cfg`` has a vector engine."""
    if not cfg.has_vector:
        raise LoweringError("the configuration has no vector engine (vin_spad_bytes = 0)")


def _no_fit(cfg: AcceleratorConfig, func: VecFunc, length: int,
            other: str = "vout_spad_bytes") -> LoweringError:
    """The error of a ``func`` row of ``length`` elements that no task holds (``other``: the
    configuration field named beside ``vin_spad_bytes``)."""
    article = "an" if func.name[0] in "AEIOU" else "a"
    return LoweringError(f"{article} {func.name} row of {length} elements does not fit the "
                         f"vector engine's scratchpad halves (vin_spad_bytes="
                         f"{cfg.vin_spad_bytes}, {other}={getattr(cfg, other)})")


def _elems_per_beat(cfg: AcceleratorConfig) -> int:
    return cfg.beat_bytes // cfg.vin_word_bytes


def vector_tasks(cfg: AcceleratorConfig, func: VecFunc, rows: int, length: int,
                 operands: int, const: bool, table_beats: int = 0
                 ) -> tuple[list[VectorTask], int, int]:
    """The tasks of a vector program over ``rows`` rows of ``length`` int32 elements with
    ``operands`` (1 or 2) input rows each, ``table_beats`` more VIN beats per row (a ROPE's
    table row) and, with ``const``, one constant row: as many whole rows per task as a VIN
    half (after the constant row) and a VOUT half hold; a row longer than that is cut into
    beat-aligned segments when ``func`` is :data:`ELEMENTWISE`.
    Returns the tasks, the beats of a VIN half and of a VOUT half.

    Raises
    ------
    LoweringError
        The configuration has no vector engine, or a row of a reducing sub-op does not fit.
    """
    _require_vector(cfg)
    if int(vec_out_words(func.value, length)) != length:
        raise LoweringError(f"vector programs compute row-shaped sub-ops; {func.name} writes "
                            f"{int(vec_out_words(func.value, length))} elements per row of "
                            f"{length}")
    per = _elems_per_beat(cfg)
    row_beats = -(-length // per)
    in_half = (cfg.spad_beats("vin") - (row_beats if const else 0)) // 2
    out_half = cfg.spad_beats("vout") // 2
    in_row = operands * row_beats + table_beats
    if in_row <= in_half and row_beats <= out_half:
        m = min(in_half // in_row, out_half // row_beats, rows)
        return ([VectorTask(r, min(m, rows - r), 0, length) for r in range(0, rows, m)],
                in_half, out_half)
    seg = min(in_half // operands, out_half) * per
    if func not in ELEMENTWISE or table_beats or seg < 1:
        raise LoweringError(
            f"a {func.name} row of {length} elements ({operands} operand(s)"
            + (" and a constant row" if const else "")
            + (f" and {table_beats} beats of table" if table_beats else "")
            + ") does not fit the vector engine's scratchpads halves (vin_spad_bytes="
            f"{cfg.vin_spad_bytes}, vout_spad_bytes={cfg.vout_spad_bytes}); configure larger "
            "ones or compile with vector=False")
    return ([VectorTask(r, 1, e, min(seg, length - e)) for r in range(rows)
             for e in range(0, length, seg)], in_half, out_half)


def rope_table_beats(cfg: AcceleratorConfig, imm: int) -> int:
    """Beats of one row of the rotary table of a ROPE with ``imm`` (:func:`hw.isa.rope_imm`):
    ``head_dim / 2`` words (:func:`hw.numerics.rope_pairs`) in whole beats."""
    head_dim = int(rope_geometry(imm)[0])
    return -(-(head_dim // 2) // _elems_per_beat(cfg))


_T = TypeVar("_T")
#: Instructions of one row task, each with the operand its DRAM address points into.
_Emitted = list[tuple[Instr, Reloc | None]]


def _row_tasks(tasks: Sequence[_T], load: Callable[[_T, int], _Emitted],
               run: Callable[[_T, int], _Emitted], store: Callable[[_T, int], _Emitted],
               head: Sequence[tuple[Instr, Reloc | None]] = ()) -> Schedule:
    """One vector-engine program of row ``tasks`` through the two halves of VIN and VOUT.

    ``head`` (a constant row's LOAD, loaded once below the halves) comes first. Task ``i``
    uses half ``h = i % 2``; ``load(task, h)``, ``run(task, h)`` (its VECs) and
    ``store(task, h)`` give its instructions without events, emitted so that task ``i + 1``'s
    loads come before task ``i``'s VECs and stores (software pipelining: the LOAD engine
    fills one half while the vector engine works on the other). The events
    (:data:`EVENTS`) are set here: a task's first LOAD waits ``STORED{h}`` (from the third
    task on: the half's earlier results have left) and its last signals ``FULL{h}``; its
    first VEC waits ``FULL{h}`` and its last signals ``OUT_FULL{h}``; its first STORE waits
    ``OUT_FULL{h}`` and its last signals ``STORED{h}``.
    """
    out: list[Instr] = [ins for ins, _ in head]
    relocs: list[Reloc | None] = [reloc for _, reloc in head]

    def emit(items: _Emitted, wait: int | None, signal: int) -> None:
        for k, (ins, reloc) in enumerate(items):
            out.append(replace(ins, wait=wait if k == 0 else None,
                               signal=signal if k == len(items) - 1 else None))
            relocs.append(reloc)

    def loads(i: int) -> None:
        h = i % 2
        emit(load(tasks[i], h), EVENTS[f"STORED{h}"] if i >= 2 else None, EVENTS[f"FULL{h}"])

    if tasks:
        loads(0)
    for i, task in enumerate(tasks):
        h = i % 2
        if i + 1 < len(tasks):
            loads(i + 1)
        emit(run(task, h), EVENTS[f"FULL{h}"], EVENTS[f"OUT_FULL{h}"])
        emit(store(task, h), EVENTS[f"OUT_FULL{h}"], EVENTS[f"STORED{h}"])
    return Schedule(out, relocs)


def _row_chunks(rows: int, m: int) -> list[tuple[int, int]]:
    """Tasks of at most ``m`` consecutive rows of ``rows``: ``(first row, rows)``."""
    return [(r, min(m, rows - r)) for r in range(0, rows, m)]


def _whole_rows(cfg: AcceleratorConfig, func: VecFunc, length: int, in_half: int,
                out_half: int, pitch: int, base: int = 0, stride: int = 0
                ) -> tuple[Callable[[tuple[int, int], int], _Emitted],
                           Callable[[tuple[int, int], int], _Emitted]]:
    """The ``load`` and ``run`` of :func:`_row_tasks` for tasks ``(first row, rows)`` of one
    operand, ``"x"``, rows of ``length`` elements in whole beats, ``stride`` beats apart in
    DRAM (0: consecutive): one LOAD of the task's rows into the half (``in_half`` beats
    each, from VIN beat ``base``: a constant row below, every VEC's second operand), one VEC
    of ``func`` per row, its results ``pitch`` beats apart in the VOUT half (``out_half``
    beats each)."""
    per = _elems_per_beat(cfg)
    beats = -(-length // per)
    stride = stride or beats

    def load(task: tuple[int, int], h: int) -> _Emitted:
        row, n = task
        return [(Load(spad=Spad.VIN, spad_addr=base + h * in_half, dram_addr=row * stride,
                      rows=n, row_beats=beats, dram_stride=stride), (0, "x"))]

    def run(task: tuple[int, int], h: int) -> _Emitted:
        return [(Vec(func=func, a_addr=(base + h * in_half + j * beats) * per,
                     dst_addr=(h * out_half + j * pitch) * per, length=length), None)
                for j in range(task[1])]

    return load, run


def schedule_vector(cfg: AcceleratorConfig, func: VecFunc, rows: int, length: int, *,
                    second: bool = False, const: bool = False, imm: int = 0,
                    table: bool = False, positions: int = 0, halves: bool = False,
                    stride: int = 0) -> Schedule:
    """One program computing ``func`` on ``rows`` rows of ``length`` int32 elements.

    DRAM operands (relocated as :data:`Reloc` of layer 0): ``"x"`` the rows (each
    ``ceil(length * 4 / beat)`` beats, consecutive), ``"b"`` the second operand's rows laid
    out alike (``second``: ADD, SILU_GATE), ``"w"`` one constant row read by every VEC as its
    second operand (``const``: RMSNORM's weight), ``"y"`` the results, laid out as ``"x"``.
    A ROPE (``table``) reads instead the rotary table from ``"w"``, rows of
    :func:`rope_table_beats` consecutive, one per position: row ``r`` of ``"x"`` turns by
    table row ``r + pos``, which a task loads after its rows (the LOADs relative to ``"w"``
    and to the run-time register ``pos``, the step's first position: rows ``pos ..`` of the
    table, :func:`hw.isa.relative_fields`). Every VEC gets ``imm`` (RMSNORM's epsilon;
    ROPE's :func:`hw.isa.rope_imm`); with ``positions`` (the step's tokens, a head's rows
    consecutive) a SOFTMAX's row ``r`` gets instead its causal valid positions ``pos + r %
    positions + 1``: ``imm`` ``r % positions + 1`` relative to ``pos``. With ``halves`` (an
    ADD), each row of ``"x"`` is ``2 * length`` elements and its VEC adds the two halves,
    naming the second first (``a_addr = b_addr + length``, as no other ADD does: a second
    row lies after the first; :func:`sw.compile.fusion._may_run_beside` tells the fold so):
    the fold of values split by position residue (:func:`sw.compile.lower.value_residue`);
    ``stride``: DRAM beats from a row of ``"x"`` and ``"y"`` to the next (0: consecutive),
    so the results may go in place (the first half's beats, the rest of their last beat
    overwritten). Tasks
    (:func:`vector_tasks`) alternate between the halves of VIN and VOUT; the
    loads of task ``i + 1`` are emitted before the VECs of task ``i`` (software pipelining, as
    :func:`schedule_layers`), so the LOAD engine fills one half while the vector engine
    reads the other.
    """
    per = _elems_per_beat(cfg)
    if len(EVENTS) > cfg.num_events:
        raise LoweringError(f"lowered programs use {len(EVENTS)} events, the accelerator has "
                            f"num_events={cfg.num_events}")
    if table and (func != VecFunc.ROPE or second or const):
        raise LoweringError(f"only a ROPE reads a rotary table, not {func.name}"
                            + (" with other operands" if func == VecFunc.ROPE else ""))
    if halves and (func != VecFunc.ADD or second or const or table):
        raise LoweringError(f"only an ADD of no other operand adds a row's halves, not "
                            f"{func.name}")
    row_beats = -(-length // per)
    x_beats = -(-2 * length // per) if halves else row_beats  # beats of a row of "x"
    pitch = stride or row_beats
    t_beats = rope_table_beats(cfg, imm) if table else 0
    tasks, in_half, out_half = vector_tasks(cfg, func, rows, length, 2 if second or halves
                                            else 1, const, t_beats)
    if halves and any(t.start or t.length != length for t in tasks):
        raise LoweringError(f"an ADD of the halves of a row of {2 * length} elements does "
                            "not fit the vector engine's scratchpad halves")
    base = row_beats if const else 0

    def loads(t: VectorTask, h: int) -> _Emitted:
        beats, offset = -(-t.length // per), t.start // per
        # (operand, VIN beats before it in the half, DRAM beats of a row, beats loaded)
        ops = [("x", 0, pitch, x_beats if halves else beats)]
        if second:
            ops.append(("b", t.rows * beats, row_beats, beats))
        if table:  # the task's table rows, the table's rows in the same order as x's
            ops.append(("w", t.rows * beats, t_beats, t_beats))
        return [(Load(spad=Spad.VIN, spad_addr=base + h * in_half + at,
                      dram_addr=t.row * stride + (offset if name != "w" else 0), rows=t.rows,
                      row_beats=n, dram_stride=stride,
                      reg=PENDING_POS if name == "w" else 0), (0, name))
                for name, at, stride, n in ops]

    def vecs(t: VectorTask, h: int) -> _Emitted:
        beats = -(-t.length // per)
        a0 = base + h * in_half
        return [(Vec(func=func, a_addr=(a0 + j * x_beats) * per + (length if halves else 0),
                     b_addr=((a0 + (t.rows + j) * beats) * per if second
                             else (a0 + j * x_beats) * per if halves
                             else (a0 + t.rows * beats + j * t_beats) * per if table
                             else 0),  # const: row 0
                     dst_addr=(h * out_half + j * beats) * per, length=t.length,
                     **causal(t.row + j)), None)
                for j in range(t.rows)]

    def causal(row: int) -> dict:
        if func != VecFunc.SOFTMAX or not positions:
            return {"imm": imm}
        return {"imm": row % positions + 1, "reg": PENDING_POS}

    def store(t: VectorTask, h: int) -> _Emitted:
        return [(Store(spad=Spad.VOUT, spad_addr=h * out_half,
                       dram_addr=t.row * pitch + t.start // per, rows=t.rows,
                       row_beats=-(-t.length // per), dram_stride=pitch), (0, "y"))]

    head = [(Load(spad=Spad.VIN, spad_addr=0, dram_addr=0, rows=1, row_beats=row_beats),
             (0, "w"))] if const else []
    return _row_tasks(tasks, loads, vecs, store, head)


class AmaxPlace(NamedTuple):
    """Where the ``amax`` words REQUANT writes lie in DRAM, for a DEQUANT that reads them:
    row ``r``'s word is element ``elem`` of beat ``r * stride + beat`` of symbol ``"b"``
    (``separate``: a buffer of its own, one beat per row) or of the INT8 rows themselves."""

    separate: bool
    beat: int
    elem: int
    stride: int


def _requant_beats(cfg: AcceleratorConfig, length: int, act_row_bytes: int) -> tuple[int, int]:
    """VOUT beats one REQUANT of ``length`` elements writes, and the beats of a row stored."""
    words = int(vec_out_words(VecFunc.REQUANT.value, length))
    full = -(-words // _elems_per_beat(cfg))
    return full, min(full, act_row_bytes // cfg.beat_bytes)


def amax_place(cfg: AcceleratorConfig, length: int, act_row_bytes: int) -> AmaxPlace:
    """Where :func:`schedule_requant` (``amax=True``) leaves each row's ``amax`` word: in the
    INT8 row (after its codes) when the row's stored beats hold it, else in a buffer of one
    beat per row (the beat of VOUT that holds it)."""
    per = _elems_per_beat(cfg)
    at = int(vec_out_words(VecFunc.REQUANT.value, length)) - 1  # the word after the codes
    full, store = _requant_beats(cfg, length, act_row_bytes)
    if full <= store:
        return AmaxPlace(False, at // per, at % per, act_row_bytes // cfg.beat_bytes)
    return AmaxPlace(True, 0, at % per, 1)


def schedule_requant(cfg: AcceleratorConfig, rows: int, length: int, act_row_bytes: int,
                     amax: bool = False, fold: bool = False, x_stride: int = 0) -> Schedule:
    """One program requantising ``rows`` rows of ``length`` int32 elements (Q15.16) into the
    int8 input rows of a GEMM (:data:`VecFunc.REQUANT`, :func:`hw.numerics.vec_requant`).

    With ``fold``, the attention's values prologue (:data:`VecFunc.FOLD`,
    :func:`hw.numerics.vec_fold`): each row (probabilities) times ``"w"``, one constant row
    of ``length`` value codes loaded once below the halves, requantised; the ``amax`` words
    are FOLD's (:func:`hw.numerics.fold_amax_word`), for a DEQUANT with ``fold``.

    DRAM operands (relocated as :data:`Reloc` of layer 0): ``"x"`` the rows (each
    ``ceil(length * 4 / beat)`` beats, consecutive, as :func:`schedule_vector`'s, or
    ``x_stride`` beats apart: a column range of wider rows), ``"y"``
    the int8 rows, ``act_row_bytes`` apart (:attr:`sw.compile.tiling.LinearPlan.act_row_bytes`).
    A REQUANT writes the codes, four to a word, then the row's ``amax`` word; a row's codes
    are stored with as many following words as fill its last beat (at most the row's
    ``act_row_bytes``: columns past ``length`` multiply the zero columns of a padded weight).
    In VOUT the rows of a task are ``store`` beats apart, so a row's ``amax`` is overwritten
    by the next row's codes; the last row's spill stays inside its half. Tasks alternate
    between the halves with the events of :func:`schedule_vector`.

    With ``amax``, every row's ``amax`` word also reaches DRAM where :func:`amax_place` says
    (for a DEQUANT of the GEMM's outputs): when a row's stored beats do not hold it, the rows
    of a task lie ``full`` beats apart in VOUT and each is stored with its own STORE of its
    codes and one of the beat holding its ``amax`` (into ``"b"``, a beat per row).

    Raises
    ------
    LoweringError
        No vector engine, one row does not fit a scratchpad half, or ``x_stride`` is
        shorter than a row.
    """
    _require_vector(cfg)
    per, beat = _elems_per_beat(cfg), cfg.beat_bytes
    if act_row_bytes % beat or act_row_bytes < length:
        raise LoweringError(f"int8 rows of {act_row_bytes} bytes cannot hold {length} codes "
                            f"in whole {beat}-byte beats")
    in_beats = -(-length // per)
    if x_stride and x_stride < in_beats:
        raise LoweringError(f"rows {x_stride} beats apart cannot hold {length} elements "
                            f"({in_beats} beats)")
    func = VecFunc.FOLD if fold else VecFunc.REQUANT
    const = in_beats if fold else 0        # the value codes' row, below the halves
    full, store = _requant_beats(cfg, length, act_row_bytes)  # VOUT beats a VEC writes, stored
    place = amax_place(cfg, length, act_row_bytes) if amax else None
    pitch = full if place is not None and place.separate else store  # VOUT beats per row
    in_half, out_half = (cfg.spad_beats("vin") - const) // 2, cfg.spad_beats("vout") // 2
    m = min(in_half // in_beats, (out_half - full) // pitch + 1 if full <= out_half else 0,
            rows)
    if m < 1:
        raise _no_fit(cfg, func, length)
    row_beats = act_row_bytes // beat

    load, vecs = _whole_rows(cfg, func, length, in_half, out_half, pitch, const, x_stride)

    def store_rows(task: tuple[int, int], h: int) -> _Emitted:
        row, n = task
        if place is None or not place.separate:
            return [(Store(spad=Spad.VOUT, spad_addr=h * out_half, dram_addr=row * row_beats,
                           rows=n, row_beats=store, dram_stride=row_beats), (0, "y"))]
        out = []  # per row: its amax beat, then its codes
        for j in range(n):
            at = h * out_half + j * pitch
            out += [(Store(spad=Spad.VOUT, spad_addr=at + full - 1, dram_addr=row + j,
                           rows=1, row_beats=1), (0, "b")),
                    (Store(spad=Spad.VOUT, spad_addr=at, dram_addr=(row + j) * row_beats,
                           rows=1, row_beats=store), (0, "y"))]
        return out

    head = [(Load(spad=Spad.VIN, spad_addr=0, dram_addr=0, rows=1, row_beats=in_beats),
             (0, "w"))] if fold else []
    return _row_tasks(_row_chunks(rows, m), load, vecs, store_rows, head)


def schedule_dequant(cfg: AcceleratorConfig, rows: int, length: int, acc_row_bytes: int,
                     place: AmaxPlace, fold: bool = False, y_stride: int = 0) -> Schedule:
    """One program dequantising ``rows`` rows of a GEMM's ``length`` int32 accumulators into
    Q15.16 rows (:data:`VecFunc.DEQUANT`, :func:`hw.numerics.vec_dequant`).

    DRAM operands (relocated as :data:`Reloc` of layer 0): ``"x"`` the accumulator rows,
    ``acc_row_bytes`` apart (the GEMM's ``out_row_bytes``); ``"w"`` the channel words, one
    constant row (:func:`hw.numerics.dequant_channels`), loaded once below the halves;
    ``"b"`` the ``amax`` words as :func:`schedule_requant` left them (``place``); ``"y"``
    the results, laid out as :func:`schedule_vector`'s (or ``y_stride`` beats apart: a
    column range of wider rows). A task loads its rows' ``amax``
    beats (one LOAD, a beat per row) and then its accumulator rows into a VIN half; each row's
    VEC reads its ``amax`` word (``imm``: its VIN address, FOLD's word with ``fold``:
    :func:`hw.isa.dequant_imm`; the values epilogue). A row too long for the halves, and a
    single row (a decode step's: :func:`dequant_segment_beats`), is cut into beat-aligned
    segments, one per task (:func:`_dequant_tasks`); rows whose channel row does not fit VIN
    beside a segment (an LM head's: its row is the vocabulary) are cut into segments that
    load their channel words with them (segments of whole GEMM output tiles: a VIN half
    holds a segment's accumulators, its channel words and the ``amax`` beat, a VOUT half its
    results). Tasks alternate between the halves with the events of
    :func:`schedule_vector`.

    Raises
    ------
    LoweringError
        No vector engine, the channel row and one beat of a row do not fit, or ``y_stride``
        is shorter than a row.
    """
    _require_vector(cfg)
    per, beat = _elems_per_beat(cfg), cfg.beat_bytes
    row_beats = -(-length // per)
    if y_stride and y_stride < row_beats:
        raise LoweringError(f"rows {y_stride} beats apart cannot hold {length} elements "
                            f"({row_beats} beats)")
    y_stride = y_stride or row_beats
    if acc_row_bytes % beat or acc_row_bytes < length * 4:
        raise LoweringError(f"accumulator rows of {acc_row_bytes} bytes cannot hold {length} "
                            f"int32 words in whole {beat}-byte beats")
    out_half = cfg.spad_beats("vout") // 2
    acc_beats = acc_row_bytes // beat
    segment = dequant_segment_beats(cfg, row_beats) if rows == 1 else 0
    const = row_beats  # the channel row's beats below the halves (0: a task's, with it)
    tasks = _dequant_tasks(rows, row_beats, (cfg.spad_beats("vin") - const) // 2, out_half,
                           segment)
    if not tasks:  # the channel row does not fit: each segment loads its own
        const, tile = 0, 4 * cfg.lanes // beat
        seg = min(segment or row_beats, (cfg.spad_beats("vin") // 2 - 1) // 2, out_half)
        seg -= seg % tile if seg > tile else 0  # whole GEMM output tiles (as segment's)
        tasks = _dequant_tasks(rows, row_beats, seg + 1, out_half, seg) if seg > 0 else []
    if not tasks:
        raise _no_fit(cfg, VecFunc.DEQUANT, length)
    in_half = (cfg.spad_beats("vin") - const) // 2

    def load(t: _DequantTask, h: int) -> _Emitted:
        at = const + h * in_half
        return [(Load(spad=Spad.VIN, spad_addr=at, dram_addr=t.row * place.stride + place.beat,
                      rows=t.rows, row_beats=1, dram_stride=place.stride), (0, "b")),
                (Load(spad=Spad.VIN, spad_addr=at + t.rows,
                      dram_addr=t.row * acc_beats + t.start, rows=t.rows, row_beats=t.beats,
                      dram_stride=acc_beats), (0, "x"))] + (
                [] if const else [(Load(spad=Spad.VIN, spad_addr=at + 1 + t.beats,
                                        dram_addr=t.start, rows=1, row_beats=t.beats),
                                   (0, "w"))])

    def vecs(t: _DequantTask, h: int) -> _Emitted:
        at = const + h * in_half
        n = min(t.beats * per, length - t.start * per)
        return [(Vec(func=VecFunc.DEQUANT, a_addr=(at + t.rows + j * t.beats) * per,
                     b_addr=t.start * per if const else (at + 1 + t.beats) * per,
                     dst_addr=(h * out_half + j * t.beats) * per,
                     length=n, imm=dequant_imm((at + j) * per + place.elem, fold)), None)
                for j in range(t.rows)]

    def store_rows(t: _DequantTask, h: int) -> _Emitted:
        return [(Store(spad=Spad.VOUT, spad_addr=h * out_half,
                       dram_addr=t.row * y_stride + t.start, rows=t.rows, row_beats=t.beats,
                       dram_stride=y_stride), (0, "y"))]

    head = [(Load(spad=Spad.VIN, spad_addr=0, dram_addr=0, rows=1, row_beats=row_beats),
             (0, "w"))] if const else []
    return _row_tasks(tasks, load, vecs, store_rows, head)


class _DequantTask(NamedTuple):
    """Rows ``row .. row + rows - 1`` of a DEQUANT, beats ``start .. start + beats - 1`` of
    each (whole rows: ``start`` 0, ``beats`` a row's)."""

    row: int
    rows: int
    start: int
    beats: int


#: GEMM output tiles per segment of a one-row DEQUANT (:func:`dequant_segment_beats`).
DEQUANT_TILES = 4
#: The most segments a one-row DEQUANT is cut into (longer rows get longer segments).
MAX_DEQUANT_SEGMENTS = 16


def dequant_segment_beats(cfg: AcceleratorConfig, row_beats: int) -> int:
    """The beats of each segment of a one-row DEQUANT of ``row_beats`` beats (a decode
    step's): :data:`DEQUANT_TILES` GEMM output tiles (``lanes`` int32 words each, the
    columns one STORE of the GEMM writes), or as many more as keep the segments at most
    :data:`MAX_DEQUANT_SEGMENTS`. A segment needs only its tiles' STOREs, so in a fused
    program the vector engine dequantises it while the array computes the next tiles
    (:func:`sw.compile.fusion.beside`); the sizes are the measured best on the reference
    model's decode step (1, 2, 4 and 8 tiles: 4)."""
    tile = 4 * cfg.lanes // cfg.beat_bytes
    return max(DEQUANT_TILES, -(-row_beats // (MAX_DEQUANT_SEGMENTS * tile))) * tile


def _dequant_tasks(rows: int, row_beats: int, in_half: int, out_half: int, segment: int = 0
                   ) -> list[_DequantTask]:
    """The tasks of a DEQUANT of ``rows`` rows of ``row_beats`` beats with VIN halves of
    ``in_half`` beats (a row's ``amax`` beat and its accumulators) and VOUT halves of
    ``out_half``: as many whole rows per task as both hold, unless ``segment`` (beats, 0:
    none) is shorter than a row; else one row per task, cut into segments of as many beats
    as both hold and at most ``segment`` (DEQUANT is elementwise: each segment's VEC reads
    its row's ``amax`` and the channel words from the segment's first). Empty: not even a
    beat fits."""
    m = min(in_half // (row_beats + 1), out_half // row_beats, rows)
    if m >= 1 and not 0 < segment < row_beats:
        return [_DequantTask(r, n, 0, row_beats) for r, n in _row_chunks(rows, m)]
    seg = min(in_half - 1, out_half, segment or out_half)
    if seg < 1:
        return []
    return [_DequantTask(r, 1, e, min(seg, row_beats - e)) for r in range(rows)
            for e in range(0, row_beats, seg)]


def argmax_segments(cfg: AcceleratorConfig, length: int) -> tuple[int, int]:
    """``(segment beats, pair beats)`` of an ARGMAX over rows of ``length`` elements
    (:func:`schedule_argmax`): ``(0, 0)`` where a row fits a VIN half whole; else the beats
    of each column segment (a VIN half's) and of the row of the segments' ``(index, max)``
    pairs (:func:`hw.isa.argmax_imm`).

    Raises
    ------
    LoweringError
        No vector engine, a beat narrower than two words, or a row whose segments' pairs do
        not fit a VIN half.
    """
    _require_vector(cfg)
    per = _elems_per_beat(cfg)
    words = int(vec_out_words(VecFunc.ARGMAX.value, length))
    row_beats = -(-length // per)
    in_half = cfg.spad_beats("vin") // 2
    if words > per:
        raise _no_fit(cfg, VecFunc.ARGMAX, length, 'beat_bytes')
    if row_beats <= in_half:
        return 0, 0
    pair_beats = -(-words * -(-row_beats // in_half) // per)
    if pair_beats > in_half or pair_beats + 2 > cfg.spad_beats("vout"):
        raise _no_fit(cfg, VecFunc.ARGMAX, length)
    return in_half, pair_beats


def argmax_beats(cfg: AcceleratorConfig, rows: int, length: int) -> int:
    """The beats of an ARGMAX's ``"y"`` (:func:`schedule_argmax`): a result beat per row,
    then, where the rows are cut into segments, each row's pairs (:func:`argmax_segments`)."""
    return rows * (1 + argmax_segments(cfg, length)[1])


def schedule_argmax(cfg: AcceleratorConfig, rows: int, length: int) -> Schedule:
    """One program finding the first maximum of each of ``rows`` rows of ``length`` int32
    elements (:data:`VecFunc.ARGMAX`, :func:`hw.numerics.vec_argmax_words`).

    DRAM operands (relocated as :data:`Reloc` of layer 0): ``"x"`` the rows (as
    :func:`schedule_vector`'s), ``"y"`` one beat per row holding its index and maximum (the
    two words ARGMAX writes, the rest of the beat 0), then the pairs of the rows cut into
    segments (:func:`argmax_beats`). Tasks alternate between the halves with the events of
    :func:`schedule_vector`. A row longer than a VIN half is cut into segments of a half
    (:func:`argmax_segments`), one task each: each segment's ARGMAX (its first element's
    index as base) writes its ``(index, max)`` pair into a row of pairs in VOUT, which its
    STORE writes to ``"y"``; a bridge task (one beat, its result overwritten) lets the row's
    last task, the PAIRS ARGMAX over the pairs loaded back, wait for the last segment's STORE
    with the events of :func:`_row_tasks`.

    Raises
    ------
    LoweringError
        As :func:`argmax_segments`.
    """
    seg, pair_beats = argmax_segments(cfg, length)
    per = _elems_per_beat(cfg)
    row_beats = -(-length // per)
    in_half, out_half = cfg.spad_beats("vin") // 2, cfg.spad_beats("vout") // 2
    if seg:
        return _segmented_argmax(cfg, rows, length, seg, pair_beats)
    m = min(in_half // row_beats, out_half, rows)
    load, vecs = _whole_rows(cfg, VecFunc.ARGMAX, length, in_half, out_half, 1)

    def store_rows(task: tuple[int, int], h: int) -> _Emitted:
        row, n = task
        return [(Store(spad=Spad.VOUT, spad_addr=h * out_half, dram_addr=row, rows=n,
                       row_beats=1, dram_stride=1), (0, "y"))]

    return _row_tasks(_row_chunks(rows, m), load, vecs, store_rows)


def check_head_row(cfg: AcceleratorConfig, length: int, argmax: bool = True) -> None:
    """Lower the one-row DEQUANT (and, with ``argmax``, ARGMAX) of a decode step's LM head
    of ``length`` logits as a compilation would (:func:`schedule_dequant`,
    :func:`schedule_argmax`): a check from the configuration and the model's shapes alone.

    Raises
    ------
    LoweringError
        As those do: no vector engine, or a row that even segments do not fit.
    """
    acc_row_bytes = -(-length // _elems_per_beat(cfg)) * cfg.beat_bytes
    schedule_dequant(cfg, 1, length, acc_row_bytes, AmaxPlace(True, 0, 0, 1))
    if argmax:
        schedule_argmax(cfg, 1, length)


class _ArgmaxTask(NamedTuple):
    """A task of a segmented ARGMAX (:func:`schedule_argmax`) of row ``row``: segment
    ``segment`` (its beats from ``start``, ``beats`` of them), or the bridge (``segment``
    -1) or the PAIRS ARGMAX (``segment`` -2)."""

    row: int
    segment: int
    start: int
    beats: int


def _segmented_argmax(cfg: AcceleratorConfig, rows: int, length: int, seg: int,
                      pair_beats: int) -> Schedule:
    """:func:`schedule_argmax` of rows cut into segments of ``seg`` beats, their pairs
    ``pair_beats`` beats in VOUT's first beats (the bridge's and the PAIRS ARGMAX's results
    in the two beats after)."""
    per = _elems_per_beat(cfg)
    words = int(vec_out_words(VecFunc.ARGMAX.value, length))
    row_beats = -(-length // per)
    in_half = cfg.spad_beats("vin") // 2
    tasks = [t for r in range(rows) for t in (
        *(_ArgmaxTask(r, s, e, min(seg, row_beats - e))
          for s, e in enumerate(range(0, row_beats, seg))),
        _ArgmaxTask(r, -1, 0, 1), _ArgmaxTask(r, -2, 0, pair_beats))]
    pairs_at = rows  # "y" beat of row 0's pairs

    def load(t: _ArgmaxTask, h: int) -> _Emitted:
        if t.segment >= 0:
            return [(Load(spad=Spad.VIN, spad_addr=h * in_half,
                          dram_addr=t.row * row_beats + t.start, rows=1, row_beats=t.beats),
                     (0, "x"))]
        if t.segment == -1:  # the row's first beat: any beat no STORE may be writing
            return [(Load(spad=Spad.VIN, spad_addr=h * in_half, dram_addr=t.row * row_beats,
                          rows=1, row_beats=1), (0, "x"))]
        return [(Load(spad=Spad.VIN, spad_addr=h * in_half,
                      dram_addr=pairs_at + t.row * pair_beats, rows=1, row_beats=t.beats),
                 (0, "y"))]

    def run(t: _ArgmaxTask, h: int) -> _Emitted:
        if t.segment >= 0:
            n = min(t.beats * per, length - t.start * per)
            return [(Vec(func=VecFunc.ARGMAX, a_addr=h * in_half * per,
                         dst_addr=words * t.segment, length=n,
                         imm=argmax_imm(t.start * per)), None)]
        return [(Vec(func=VecFunc.ARGMAX, a_addr=h * in_half * per,
                     dst_addr=(pair_beats + h) * per, imm=argmax_imm(pairs=t.segment == -2),
                     length=words if t.segment == -1 else words * -(-row_beats // seg)),
                 None)]

    def store(t: _ArgmaxTask, h: int) -> _Emitted:
        if t.segment >= 0:
            b = words * t.segment // per
            return [(Store(spad=Spad.VOUT, spad_addr=b,
                           dram_addr=pairs_at + t.row * pair_beats + b, rows=1, row_beats=1),
                     (0, "y"))]
        return [(Store(spad=Spad.VOUT, spad_addr=pair_beats + h, dram_addr=t.row, rows=1,
                       row_beats=1), (0, "y"))]

    return _row_tasks(tasks, load, run, store)
