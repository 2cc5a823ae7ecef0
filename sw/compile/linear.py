"""Lower one linear layer ``y[T, N] = x[T, K] @ W[N, K]^T`` to a program for the array.

The weight stream is cut into tiles of ``lanes`` output channels (one tile per GEMM) and, along
K, into chunks of whole quantisation groups that fit half of the WGT scratchpad, so the LOAD
engine fills one half while the array streams the other. Tokens are processed
``max_tokens`` at a time. Activations stay resident in the ACT scratchpad when a token tile's
whole K fits (decode), else they are chunked along K with the weights (prefill).

Which scratchpad buffers and events a program uses is the planner's choice
(:class:`sw.compile.plan.SpadPlan`); this module only emits instructions. The events (counting
semaphores, one producer and one consumer engine each)::

    FULL[b]      LOAD -> COMPUTE   chunk b's weights (and activations) have landed
    FREE[b]      COMPUTE -> LOAD   the GEMM reading buffer b is done (non-final K chunk)
    OUT_FULL[o]  COMPUTE -> STORE  the final GEMM of a tile filled output buffer o
    STORED[o]    STORE -> LOAD     output buffer o is written back (so its GEMM is done too)

A GEMM has one wait and one signal, so a tile's final GEMM signals OUT_FULL instead of FREE;
the load that next reuses its input buffer waits for STORED instead, which also orders the
next write of that output buffer after its store (the GEMM that writes it depends on a later
load). No SYNC instructions are needed. Instructions are emitted in software-pipelined order
(the loads of chunk i+1 before the GEMM of chunk i), so in-order fetch into short queues never
blocks on an engine that waits for a later instruction.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from hw.config import AcceleratorConfig
from hw.format import QuantizedWeight, StreamLayout, WeightFormat, pack, stream_layout
from hw.isa import End, EpilogueMode, Gemm, Instr, Load, Spad, Store, bias_row_bytes
from sw.compile.errors import LoweringError
from sw.compile.plan import SpadPlan, plan_spads

__all__ = ["LoweringError", "DramAllocator", "LinearPlan", "LinearProgram", "LayerSpec",
           "PlacedLayer", "Reloc", "bias_token_tile", "plan_linear", "lower_linear", "lower_layers",
           "lower_relocatable", "build_linear", "build_layers", "weight_image"]

#: Which operand a DMA instruction's DRAM address is relative to: (layer, "w" | "x" | "y" |
#: "b").
Reloc = tuple[int, str]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class DramAllocator:
    """Bump allocator of beat-aligned DRAM regions."""

    cfg: AcceleratorConfig
    next_beat: int = 0
    regions: dict[str, tuple[int, int]] = field(default_factory=dict)

    def alloc(self, name: str, nbytes: int) -> int:
        """Reserve ``nbytes`` and return the region's start in beats."""
        if name in self.regions:
            raise LoweringError(f"DRAM region {name!r} allocated twice")
        beats = _ceil(max(nbytes, 1), self.cfg.beat_bytes)
        start = self.next_beat
        self.next_beat += beats
        if self.next_beat > self.cfg.dram_beats:
            raise LoweringError(f"DRAM of {self.cfg.memory.size_bytes} bytes is too small: "
                                f"region {name!r} needs {nbytes} more bytes")
        self.regions[name] = (start, nbytes)
        return start


@dataclass(frozen=True)
class LinearPlan:
    """Tiling decisions for one linear layer; the stream geometry is ``layout``'s (derived
    sizes are computed once: the lowering reads them for every instruction)."""

    tokens: int
    layout: StreamLayout
    token_tile: int
    chunk_sizes: tuple[int, ...]  # quantisation groups per K chunk
    act_row_bytes: int        # ACT/DRAM bytes per token row (K padded to whole beats)
    resident_acts: bool       # whole-K activations stay in ACT for a token tile
    tile_bytes: int           # weight stream bytes per n tile, rounded up to a whole beat
    bias: bool = False        # WIDE_BIAS: int32 bias rows, laid out as the outputs

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
        return self.chunk_sizes[c]

    def chunk_start(self, c: int) -> int:
        """First group of K chunk ``c``."""
        return self._chunk_starts[c]

    @functools.cached_property
    def _chunk_starts(self) -> tuple[int, ...]:
        return tuple(itertools.accumulate(self.chunk_sizes, initial=0))

    @functools.cached_property
    def token_tiles(self) -> int:
        return _ceil(self.tokens, self.token_tile)

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
    """Choose tile and chunk sizes for ``tokens x k @ (n x k)^T`` on ``cfg`` (``bias``: a
    per-channel bias the WIDE_BIAS epilogue adds)."""
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
                      tile_bytes=_ceil(lay.tile_bytes, beat) * beat, bias=bias)


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


@dataclass(frozen=True)
class PlacedLayer:
    """A planned layer and where its operands live in DRAM (beats).

    ``w_addr``: weight tiles, ``w_tile_stride`` bytes apart (default ``plan.tile_bytes``: a
    region laid out for a longer K, such as the value cache, has wider tiles); ``x_addr``: int8
    activations ``[tokens, act_row_bytes]``; ``y_addr``: int32 outputs ``[tokens, n_tiles *
    lanes]``; ``b_addr``: int32 bias rows laid out as the outputs (biased plans). ``x_key``
    names the input buffer (default: ``x_addr``): consecutive layers of one program reading
    the same resident input (q/k/v) load it into ACT once.
    """

    plan: LinearPlan
    w_addr: int
    x_addr: int
    y_addr: int
    w_tile_stride: int | None = None
    x_key: object = None
    b_addr: int = 0

    @property
    def tile_stride(self) -> int:
        return self.plan.tile_bytes if self.w_tile_stride is None else self.w_tile_stride

    @property
    def input_id(self) -> object:
        return self.x_addr if self.x_key is None else self.x_key


def lower_linear(cfg: AcceleratorConfig, plan: LinearPlan, w_addr: int, x_addr: int,
                 y_addr: int) -> list[Instr]:
    """The program (without END) for one planned layer; see :func:`lower_layers`."""
    return lower_layers(cfg, [PlacedLayer(plan, w_addr, x_addr, y_addr)])


def lower_layers(cfg: AcceleratorConfig, layers: list[PlacedLayer],
                 spads: SpadPlan | None = None) -> list[Instr]:
    """One program (without END) for several independent layers run back to back.

    The double-buffered pipeline runs on across layer boundaries, so the next layer's first
    weights load while the previous layer computes (e.g. the heads of an attention layer, or
    q/k/v). Outputs use the WIDE epilogue. ``spads``: the scratchpad buffers and events
    (default :func:`sw.compile.plan.plan_spads` for these layers).
    """
    return lower_relocatable(cfg, layers, spads)[0]


def lower_relocatable(cfg: AcceleratorConfig, layers: list[PlacedLayer],
                      spads: SpadPlan | None = None
                      ) -> tuple[list[Instr], list[Reloc | None]]:
    """:func:`lower_layers` and, per instruction, the operand its DRAM address points into.

    With every layer's addresses 0 the program is a *template*: adding each operand's base
    to the ``dram_addr`` of the instructions that name it places the same program anywhere
    (the compiler lowers one decoder block and relocates it for every block).
    """
    spads = spads or plan_spads(cfg, max(ly.plan.token_tile for ly in layers),
                                max((ly.plan.token_tile for ly in layers if ly.plan.bias),
                                    default=0))
    beat = cfg.beat_bytes
    E = spads.events
    relocs: list[Reloc | None] = []

    # One work item per GEMM: (layer, token tile, n tile, k chunk).
    items = [(L, t, j, c) for L, ly in enumerate(layers) for t in range(ly.plan.token_tiles)
             for j in range(ly.plan.n_tiles) for c in range(ly.plan.k_chunks)]
    final = [c == layers[L].plan.k_chunks - 1 for L, _, _, c in items]
    # parity of the number of finished tiles before item i: the OUT buffer it writes
    out_buf = [(n - f) % 2 for n, f in zip(itertools.accumulate(final), final, strict=True)]
    # A new activation set (layer or token tile) starts at these items -- unless the layer
    # reads the resident activations already in ACT (same input buffer and token tile).
    def same_acts(a: int, b: int) -> bool:
        (la, ta, _, _), (lb, tb, _, _) = items[a], items[b]
        pa, pb = layers[la].plan, layers[lb].plan
        return (ta == tb and pa.resident_acts and pb.resident_acts
                and layers[la].input_id == layers[lb].input_id
                and pa.act_row_bytes == pb.act_row_bytes and pa.token_tile == pb.token_tile
                and pa.token_tiles == pb.token_tiles == 1)

    new_set = [i == 0 or (items[i][:2] != items[i - 1][:2] and not same_acts(i - 1, i))
               for i in range(len(items))]
    stored_waited = set()  # final items whose STORED signal a load already consumed

    def done_wait(prev):
        """The wait that orders a load after GEMM ``prev`` (None if nothing to wait for)."""
        if prev < 0 or prev in stored_waited:
            return None
        if final[prev]:
            stored_waited.add(prev)
            return E[f"STORED{out_buf[prev]}"]
        return E[f"FREE{prev % 2}"]

    def act_geometry(i):
        """(ACT spad beat of the chunk's first activation, token row stride in beats)."""
        L, _, _, c = items[i]
        plan = layers[L].plan
        if plan.resident_acts:
            return plan.chunk_start(c) * plan.group_k // beat, plan.act_row_bytes // beat
        return (i % 2) * spads.act_half_beats, plan.chunk_groups(c) * plan.group_k // beat

    def dma(L: int, operand: str, ins: Instr) -> Instr:
        relocs.append((L, operand))
        return ins

    def loads(i):
        L, t, j, c = items[i]
        ly, plan = layers[L], layers[L].plan
        b = i % 2
        t0 = t * plan.token_tile
        tok = min(plan.token_tile, plan.tokens - t0)
        row_beats = plan.act_row_bytes // beat
        out = []
        # Buffer b was last read by GEMM i-2. The first load into it waits for that GEMM; a
        # new activation set also waits for GEMM i-1, which may still read the ACT spad. The
        # LOAD engine is in order, so later loads need no wait of their own.
        buffer_free = done_wait(i - 2)
        if plan.resident_acts:
            if new_set[i]:  # activations for all of K, once GEMM i-1 is done with the spad
                out.append(dma(L, "x", Load(
                    spad=Spad.ACT, dram_addr=ly.x_addr + t0 * row_beats, spad_addr=0,
                    rows=tok, row_beats=row_beats, dram_stride=row_beats,
                    wait=done_wait(i - 1))))
        else:
            start, _ = act_geometry(i)
            out.append(dma(L, "x", Load(
                spad=Spad.ACT, rows=tok, dram_stride=row_beats,
                row_beats=plan.chunk_groups(c) * plan.group_k // beat,
                dram_addr=ly.x_addr + t0 * row_beats + plan.chunk_start(c) * plan.group_k // beat,
                spad_addr=start, wait=done_wait(i - 1) if new_set[i] else buffer_free)))
            if not new_set[i]:
                buffer_free = None
        if plan.bias and final[i]:
            # The tile's bias rows, into the PARAM buffer of its OUT buffer: that buffer's
            # previous reader is the GEMM the STORED wait (here or in an earlier load) follows.
            y_row_beats = plan.out_row_bytes // beat
            out.append(dma(L, "b", Load(
                spad=Spad.PARAM, spad_addr=out_buf[i] * spads.param_buf_beats, rows=tok,
                row_beats=spads.out_row_beats, dram_stride=y_row_beats,
                dram_addr=ly.b_addr + t0 * y_row_beats + j * spads.out_row_beats,
                wait=buffer_free)))
            buffer_free = None
        nbytes = plan.chunk_groups(c) * plan.group_bytes
        out.append(dma(L, "w", Load(
            spad=Spad.WGT, rows=1, row_beats=_ceil(nbytes, beat),
            dram_addr=ly.w_addr + (j * ly.tile_stride + plan.chunk_start(c) * plan.group_bytes)
            // beat, spad_addr=b * spads.wgt_half_beats, wait=buffer_free,
            signal=E[f"FULL{b}"])))
        return out

    prog: list[Instr] = loads(0)
    for i, (L, t, j, c) in enumerate(items):
        if i + 1 < len(items):
            prog += loads(i + 1)
        ly, plan = layers[L], layers[L].plan
        fmt, lay = plan.fmt, plan.layout
        b, o = i % 2, out_buf[i]
        t0 = t * plan.token_tile
        tok = min(plan.token_tile, plan.tokens - t0)
        act_addr, stride = act_geometry(i)
        spg = lay.steps_per_group
        wide = EpilogueMode.WIDE_BIAS if plan.bias else EpilogueMode.WIDE
        prog.append(Gemm(
            wgt_addr=b * spads.wgt_half_beats, act_addr=act_addr, act_stride=stride,
            out_addr=o * spads.out_buf_beats, param_addr=o * spads.param_buf_beats,
            k_steps=plan.chunk_groups(c) * spg,
            group_steps=0 if fmt.raw else spg, tokens=tok,
            pattern=cfg.pattern_index(fmt.pattern), int8=fmt.bits == 8,
            asym=not fmt.symmetric, accumulate=c > 0,
            epilogue=wide if final[i] else EpilogueMode.NONE,
            wait=E[f"FULL{b}"], signal=E[f"OUT_FULL{o}" if final[i] else f"FREE{b}"]))
        relocs.append(None)
        if final[i]:
            y_row_beats = plan.out_row_bytes // beat
            prog.append(dma(L, "y", Store(
                spad=Spad.OUT, spad_addr=o * spads.out_buf_beats, rows=tok,
                row_beats=spads.out_row_beats, dram_stride=y_row_beats,
                dram_addr=ly.y_addr + t0 * y_row_beats + j * spads.out_row_beats,
                wait=E[f"OUT_FULL{o}"], signal=E[f"STORED{o}"])))
    assert len(relocs) == len(prog)
    return prog, relocs


@dataclass
class LinearProgram:
    """Lowered layers with their DRAM image (``dram`` is None when timing-only)."""

    cfg: AcceleratorConfig
    plans: list[LinearPlan]
    program: list[Instr]
    dram: np.ndarray | None
    regions: dict[str, tuple[int, int]]

    @property
    def plan(self) -> LinearPlan:
        """The plan of a single-layer program."""
        return self.plans[0]

    def read_output(self, dram: np.ndarray, layer: int = 0) -> np.ndarray:
        """The int32 accumulators ``[tokens, n]`` of ``layer`` from a final DRAM image."""
        start, nbytes = self.regions[f"y{layer}"]
        b = self.cfg.beat_bytes
        y = dram[start * b:start * b + nbytes].view("<i4")
        plan = self.plans[layer]
        return y.reshape(plan.tokens, -1)[:, : plan.n]


@dataclass(frozen=True)
class LayerSpec:
    """One layer to lower: its format and shape, and optionally its data (``bias``: int32
    bias rows ``[tokens, n]`` in accumulator units, for the WIDE_BIAS epilogue)."""

    fmt: WeightFormat
    n: int
    k: int
    tokens: int
    weight: QuantizedWeight | None = None
    acts: np.ndarray | None = None
    bias: np.ndarray | None = None


def build_layers(cfg: AcceleratorConfig, specs: list[LayerSpec]) -> LinearProgram:
    """Plan, allocate DRAM, lower several layers into one program, and fill the image.

    Without data (``weight``/``acts`` None in every spec) the program is timing-only: no DRAM
    image is allocated, so LLaMA-7B shapes need no memory.
    """
    alloc = DramAllocator(cfg)
    placed, plans = [], []
    for L, sp in enumerate(specs):
        plan = plan_linear(cfg, sp.fmt, sp.n, sp.k, sp.tokens, bias=sp.bias is not None)
        plans.append(plan)
        placed.append(PlacedLayer(
            plan, alloc.alloc(f"w{L}", plan.n_tiles * plan.tile_bytes),
            alloc.alloc(f"x{L}", sp.tokens * plan.act_row_bytes),
            alloc.alloc(f"y{L}", sp.tokens * plan.out_row_bytes),
            b_addr=alloc.alloc(f"b{L}", sp.tokens * plan.out_row_bytes) if plan.bias else 0))
    prog = lower_layers(cfg, placed) + [End()]
    if len(prog) > cfg.imem_depth:  # the hardware would stop with PC_OVERFLOW
        raise LoweringError(f"the program needs {len(prog)} instructions and the instruction "
                            f"memory holds {cfg.imem_depth}: lower fewer layers or tokens per "
                            "program, or configure a larger imem_depth")
    with_data = [sp.weight is not None or sp.acts is not None for sp in specs]
    dram = None
    if any(with_data):
        if not all(sp.weight is not None and sp.acts is not None for sp in specs):
            raise LoweringError("give weights and activations for every layer, or for none "
                                "(timing-only)")
        dram = np.zeros(cfg.memory.size_bytes, dtype=np.uint8)
        for sp, ly in zip(specs, placed, strict=True):
            _fill(cfg, dram, sp, ly)
    return LinearProgram(cfg, plans, prog, dram, dict(alloc.regions))


def _fill(cfg: AcceleratorConfig, dram: np.ndarray, sp: LayerSpec, ly: PlacedLayer) -> None:
    """Write a layer's packed weight tiles and int8 activations into the DRAM image."""
    plan, beat = ly.plan, cfg.beat_bytes
    if sp.weight.fmt != sp.fmt or sp.weight.shape != (sp.n, sp.k):
        raise LoweringError(f"weight is {sp.weight.shape} {sp.weight.fmt}, plan is "
                            f"{(sp.n, sp.k)} {sp.fmt}")
    acts = np.asarray(sp.acts)
    if acts.dtype != np.int8 or acts.shape != (sp.tokens, sp.k):
        raise LoweringError(f"activations must be int8 [{sp.tokens}, {sp.k}], got {acts.dtype} "
                            f"{list(acts.shape)}")
    image = weight_image(sp.weight, plan)
    dram[ly.w_addr * beat:ly.w_addr * beat + image.size] = image
    xa = np.zeros((sp.tokens, plan.act_row_bytes), dtype=np.int8)
    xa[:, :sp.k] = acts
    dram[ly.x_addr * beat:ly.x_addr * beat + xa.size] = xa.view(np.uint8).reshape(-1)
    if sp.bias is not None:  # laid out as the outputs: int32, every tile's lanes per row
        if sp.bias.shape != (sp.tokens, sp.n):
            raise LoweringError(f"bias rows must be [{sp.tokens}, {sp.n}], got "
                                f"{list(sp.bias.shape)}")
        rows = np.zeros((sp.tokens, plan.out_row_bytes // 4), dtype="<i4")
        rows[:, :sp.n] = sp.bias
        dram[ly.b_addr * beat:ly.b_addr * beat + rows.nbytes] = rows.view(np.uint8).reshape(-1)


def weight_image(weight: QuantizedWeight, plan: LinearPlan) -> np.ndarray:
    """The packed stream of ``weight`` as the program reads it from DRAM: tile ``j`` at byte
    ``j * plan.tile_bytes`` (tiles start on beats)."""
    stream = pack(weight, plan.layout.lanes).reshape(plan.n_tiles, -1)
    out = np.zeros((plan.n_tiles, plan.tile_bytes), dtype=np.uint8)
    out[:, :stream.shape[1]] = stream
    return out.reshape(-1)


def build_linear(cfg: AcceleratorConfig, fmt: WeightFormat, n: int, k: int, tokens: int,
                 weight: QuantizedWeight | None = None, acts: np.ndarray | None = None
                 ) -> LinearProgram:
    """One layer: :func:`build_layers` with a single :class:`LayerSpec`."""
    return build_layers(cfg, [LayerSpec(fmt, n, k, tokens, weight, acts)])
