"""A few linear layers compiled alone: one program, its DRAM image and its outputs.

The compiler's pipeline without a model graph: each :class:`LayerSpec` is tiled
(:func:`~sw.compile.tiling.plan_linear`) into a :class:`~sw.compile.lower.Member` with the
DRAM symbols ``w:<i>``, ``x:<i>``, ``y:<i>`` (and ``b:<i>`` for bias rows), the members are
scheduled into one template (:func:`~sw.compile.relocation.lower_template`), DRAM is laid out
by :func:`~sw.compile.plan.layout_dram` (weights, then an arena holding every input, output
and bias buffer: all are live during the one program), and the template is relocated there.
The layers run back to back in the double-buffered pipeline, so the next layer's first
weights load while the previous layer computes. ``python -m sim --layer``, the benchmarks and
the equivalence harness run layers this way.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from hw.config import AcceleratorConfig
from hw.format import QuantizedWeight, WeightFormat
from hw.isa import Instr, decode_program
from sw.compile.errors import LoweringError
from sw.compile.lower import Member
from sw.compile.plan import Buffer, Region, buffer_regions, layout_dram, plan_arena
from sw.compile.relocation import lower_template, relocate
from sw.compile.tiling import LinearPlan, plan_linear, stream_bytes, weight_image

__all__ = ["LayerSpec", "LinearProgram", "build_layers", "build_linear"]


@dataclass(frozen=True)
class LayerSpec:
    """One layer to compile: its format and shape, and optionally its data.

    Parameters
    ----------
    fmt : WeightFormat
        The weights' format.
    n, k : int
        Output channels and input features: ``y[tokens, n] = x[tokens, k] @ W[n, k]^T``.
    tokens : int
        Activation rows.
    weight : QuantizedWeight, optional
        ``W`` (its format and shape must be ``fmt`` and ``(n, k)``).
    acts : numpy.ndarray, optional
        int8 activations ``[tokens, k]``.
    bias : numpy.ndarray, optional
        int32 bias rows ``[tokens, n]`` in accumulator units, for the WIDE_BIAS epilogue
        (given without data too, for timing).
    """

    fmt: WeightFormat
    n: int
    k: int
    tokens: int
    weight: QuantizedWeight | None = None
    acts: np.ndarray | None = None
    bias: np.ndarray | None = None


@dataclass(frozen=True)
class LinearProgram:
    """Compiled layers: the program's words, its DRAM image (None when timing-only) and where
    every operand lives.

    Parameters
    ----------
    cfg : AcceleratorConfig
        The accelerator.
    plans : list of LinearPlan
        Each layer's tiling.
    words : numpy.ndarray
        The program, END included (``uint64 [n, 2]``, :func:`hw.isa.program_words`).
    dram : numpy.ndarray or None
        The DRAM image (uint8, ``cfg.memory.size_bytes``), or None when timing-only.
    symbols : dict of str to Region
        The DRAM region of every operand: ``w:<i>``, ``x:<i>``, ``y:<i>``, ``b:<i>``.
    """

    cfg: AcceleratorConfig
    plans: list[LinearPlan]
    words: np.ndarray
    dram: np.ndarray | None
    symbols: dict[str, Region]

    @functools.cached_property
    def program(self) -> list[Instr]:
        """The program as instructions (decoded from :attr:`words`)."""
        return decode_program(self.words.view(np.uint8).reshape(-1))

    @property
    def plan(self) -> LinearPlan:
        """The plan of a single-layer program."""
        return self.plans[0]

    def read_output(self, dram: np.ndarray, layer: int = 0) -> np.ndarray:
        """The int32 accumulators ``[tokens, n]`` of ``layer`` from a final DRAM image."""
        y = self.symbols[f"y:{layer}"]
        plan = self.plans[layer]
        return dram[y.addr:y.end].view("<i4").reshape(plan.tokens, -1)[:, :plan.n]


def build_layers(cfg: AcceleratorConfig, specs: list[LayerSpec], ring: bool | None = None
                 ) -> LinearProgram:
    """Tile, schedule, lay out and relocate several layers into one program; fill the image
    (``ring``: the weights' ring, :func:`sw.compile.relocation.lower_template`).

    Without data (``weight``/``acts`` None in every spec) the program is timing-only: no DRAM
    image is allocated, so LLaMA-7B shapes need no memory.

    Raises
    ------
    LoweringError
        A layer cannot be tiled or scheduled on ``cfg``, the program exceeds the instruction
        memory, or the data does not match the specs.
    PlanError
        The layers do not fit the DRAM.
    """
    plans = [plan_linear(cfg, sp.fmt, sp.n, sp.k, sp.tokens, bias=sp.bias is not None)
             for sp in specs]
    members = [Member(p, f"w:{i}", f"x:{i}", f"y:{i}", b=f"b:{i}" if p.bias else None)
               for i, p in enumerate(plans)]
    template = lower_template(cfg, members, ring=ring)
    symbols = _layout(cfg, members)
    words = relocate(template, {s: r.addr for s, r in symbols.items()}, members,
                     cfg.beat_bytes)
    with_data = [sp.weight is not None or sp.acts is not None for sp in specs]
    dram = None
    if any(with_data):
        if not all(sp.weight is not None and sp.acts is not None for sp in specs):
            raise LoweringError("give weights and activations for every layer, or for none "
                                "(timing-only)")
        dram = np.zeros(cfg.memory.size_bytes, dtype=np.uint8)
        for sp, m in zip(specs, members, strict=True):
            _fill(cfg, dram, sp, m, symbols)
    return LinearProgram(cfg, plans, words, dram, symbols)


def build_linear(cfg: AcceleratorConfig, fmt: WeightFormat, n: int, k: int, tokens: int,
                 weight: QuantizedWeight | None = None, acts: np.ndarray | None = None
                 ) -> LinearProgram:
    """One layer: :func:`build_layers` with a single :class:`LayerSpec`."""
    return build_layers(cfg, [LayerSpec(fmt, n, k, tokens, weight, acts)])


def _layout(cfg: AcceleratorConfig, members: list[Member]) -> dict[str, Region]:
    """The DRAM region of every operand: the weight streams, then an arena of the buffers
    (all live at once: the host writes the inputs before the program, reads the outputs
    after)."""
    buffers = [Buffer(sym, size, 0, 0) for m in members for sym, size, _ in m.buffers()]
    arena = plan_arena(buffers, cfg.beat_bytes)
    weights = [(m.w, stream_bytes(m.plan.layout, cfg.beat_bytes)) for m in members]
    layout = layout_dram(cfg, weights, [], [arena])
    return {**layout.regions, **buffer_regions(layout, arena, buffers)}


def _fill(cfg: AcceleratorConfig, dram: np.ndarray, sp: LayerSpec, m: Member,
          symbols: dict[str, Region]) -> None:
    """Write a layer's packed weight tiles, int8 activations and bias rows into the image."""
    plan = m.plan
    if sp.weight.fmt != sp.fmt or sp.weight.shape != (sp.n, sp.k):
        raise LoweringError(f"weight is {sp.weight.shape} {sp.weight.fmt}, plan is "
                            f"{(sp.n, sp.k)} {sp.fmt}")
    acts = np.asarray(sp.acts)
    if acts.dtype != np.int8 or acts.shape != (sp.tokens, sp.k):
        raise LoweringError(f"activations must be int8 [{sp.tokens}, {sp.k}], got {acts.dtype} "
                            f"{list(acts.shape)}")
    _put(dram, symbols[m.w], weight_image(sp.weight, cfg.lanes, cfg.beat_bytes))
    xa = np.zeros((sp.tokens, plan.act_row_bytes), dtype=np.int8)
    xa[:, :sp.k] = acts
    _put(dram, symbols[m.x], xa.view(np.uint8).reshape(-1))
    if sp.bias is not None:  # laid out as the outputs: int32, every tile's lanes per row
        if sp.bias.shape != (sp.tokens, sp.n):
            raise LoweringError(f"bias rows must be [{sp.tokens}, {sp.n}], got "
                                f"{list(sp.bias.shape)}")
        rows = np.zeros((sp.tokens, plan.out_row_bytes // 4), dtype="<i4")
        rows[:, :sp.n] = sp.bias
        _put(dram, symbols[m.b], rows.view(np.uint8).reshape(-1))


def _put(dram: np.ndarray, region: Region, data: np.ndarray) -> None:
    dram[region.addr:region.addr + data.size] = data
