"""Where a decode step's DRAM beats go and what its LOAD engine waits on (timing-only).

``python -m bench.beats`` compiles one decode step of --model at --context positions on the
board's accelerator (:data:`hw.board.ecpix5.ECPIX5` with --config, by default the 'vector'
preset: the persistent program that ``python -m bench.board`` predicts on --vector-config,
its DRAM port paced at the memory's peak as there, a beat every two cycles, unless
--unpaced), runs it on the fast model (timing-only, as :func:`sw.codesign.decode_step`) and
breaks down

  1. its DRAM beats (reads and writes, moves left out: they stay on chip) by the symbol each
     DMA word addresses (the smallest region of the executable's DRAM layout that holds its
     first beat; a block loop's frame copies, ``symbol@frame``, count as their symbol, and the
     layer number is left out, so every layer's ``dq:model.layers.N.mlp.up_proj`` is one
     row), and
  2. the cycles its LOAD engine streams nothing: every cycle outside a LOAD's
     ``[grant, end]`` is charged to the next LOAD (the symbol it reads) and to why it had not
     started: ``sync EVENT`` (a SYNC on the LOAD engine waited for EVENT before it, the drain
     between fused parts), ``wait EVENT`` (the LOAD's own wait), ``dispatch`` (the fetch
     unit had not yet dispatched it: another engine's queue was full) or ``busy`` (another
     LOAD-engine word was executing); the cycles after the last LOAD are ``tail``.

The board model (sim.board_memory.board_cycles) charges every beat the memory's shortfall on
top of the fast model's cycles (on the paced port only the shortfall below the memory's
peak), and every cycle the LOAD engine idles is a cycle the weight stream is not using: the
two are its levers. The breakdown is written as JSON (--out).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS, command, parser, positive_int, stamp, write_json
from hw.board.ecpix5 import ECPIX5
from hw.config import AcceleratorConfig, ConfigError, named_or_file
from hw.isa import MOVE_SOURCES, Engine, Load, Store, Sync, relative_words
from sim.model import Schedule, program_words, schedule
from sim.result import RunResult
from sw.compile.fusion import BESIDE_EVENTS, VECTOR_EVENTS
from sw.compile.plan import Region
from sw.compile.schedule import EVENTS
from sw.models.source import BUILTINS

__all__ = ["Run", "Recorder", "region_labels", "symbol_class", "event_name", "beat_breakdown",
           "coarse", "load_idle", "compute_idle", "Breakdown", "breakdown", "step_breakdown",
           "main"]


@dataclass(frozen=True)
class Run:
    """One program run as the backend received it: its words and run-time registers."""

    program: Any
    regs: Mapping[int, int] | None


class Recorder:
    """A backend that runs every program on ``backend`` and keeps each one's :class:`Run`
    (the runtime's programs with their registers, which a trace alone does not give)."""

    def __init__(self, backend):
        self.backend = backend
        self.runs: list[Run] = []

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def run(self, program, dram, *, trace: bool = False, regs=None, **kw) -> RunResult:
        if not isinstance(program, (bytes, bytearray, np.ndarray)):
            program = list(program)
        self.runs.append(Run(program, None if regs is None else dict(regs)))
        return self.backend.run(program, dram, trace=trace, regs=regs, **kw)


def region_labels(regions: Mapping[str, Region], beat_bytes: int
                  ) -> tuple[np.ndarray, list[str]]:
    """Per DRAM beat, the index into the returned names of the smallest region of
    ``regions`` that holds it (-1: none). Regions nest (a buffer's ``symbol+offset`` rows, the
    arena around its buffers); the smallest is the most specific."""
    names = sorted(regions, key=lambda n: (-regions[n].nbytes, n))
    top = max((r.end for r in regions.values()), default=0)
    labels = np.full(-(-top // beat_bytes), -1, dtype=np.int64)
    for j, n in enumerate(names):  # largest first: a smaller region overwrites its beats
        r = regions[n]
        labels[r.addr // beat_bytes:-(-r.end // beat_bytes)] = j
    return labels, names


def symbol_class(name: str, kind: str, weights: bool = False) -> str:
    """The row a symbol's beats are counted in: the weights of every linear (``weights``),
    the KV cache (``kv``), or the symbol without its frame suffix and with its layer
    number as ``L`` (``weights``: a linear's weights the same way).

    >>> symbol_class("w:model.layers.2.mlp.up_proj", "weight", weights=True)
    'w:model.layers.L.mlp.up_proj'
    >>> symbol_class("dq:model.layers.3.mlp.up_proj@7", "weight")
    'dq:model.layers.L.mlp.up_proj'
    >>> symbol_class("sc:12:1", "weight")
    'sc:L:1'
    >>> symbol_class("w:model.layers.0.mlp.up_proj", "weight"), symbol_class("k:0:1", "kv")
    ('weights', 'kv')
    """
    if name.startswith("w:") and not weights:
        return "weights"
    if kind == "kv":
        return "kv"
    name = re.sub(r"^(sc|vc):\d+:", r"\1:L:", name.split("@")[0])
    return re.sub(r"layers\.\d+", "layers.L", name)


def coarse(rows: Counter) -> Counter:
    """``rows`` (keyed by a tuple whose last item is a :func:`symbol_class`) summed by the
    class's kind, its name before the first ``:`` (``q`` for every ``q:...`` buffer).

    >>> coarse(Counter({("LOAD", "y:a"): 2, ("LOAD", "y:b"): 3, ("LOAD", "kv"): 1}))
    Counter({('LOAD', 'y'): 5, ('LOAD', 'kv'): 1})
    """
    out: Counter = Counter()
    for key, v in rows.items():
        out[(*key[:-1], key[-1].split(":")[0])] += v
    return out


def event_name(event: int) -> str:
    """A fused program's event by the scheduler's name (a vector part's and a beside run's
    renamed events get a ``vec:`` / ``beside:`` prefix)."""
    for prefix, table in (("vec:", VECTOR_EVENTS), ("beside:", BESIDE_EVENTS)):
        for old, new in table.items():
            if new == event:
                return prefix + next(k for k, v in EVENTS.items() if v == old)
    return next((k for k, v in EVENTS.items() if v == event), str(event))


def _rows(sched: Schedule, words: np.ndarray) -> list[tuple[int, Any]]:
    """``(row, instruction)`` of every dispatched engine word, its DRAM address advanced in a
    loop (:meth:`sim.model.Schedule.instruction`)."""
    return [(i, sched.instruction(None, words, i)) for i in range(len(sched.times))
            if sched.times[i, 0] >= 0]


def _klass(addr_beat: int, labels: np.ndarray, names: Sequence[str],
           regions: Mapping[str, Region], weights: bool = False) -> str:
    j = int(labels[addr_beat]) if 0 <= addr_beat < len(labels) else -1
    return "?" if j < 0 else symbol_class(names[j], regions[names[j]].kind, weights)


def beat_breakdown(sched: Schedule, words: np.ndarray, labels: np.ndarray,
                   names: Sequence[str], regions: Mapping[str, Region]) -> Counter:
    """DRAM beats of one scheduled program by ``(LOAD|STORE, scratchpad, symbol class)``
    (moves left out: no DRAM)."""
    out: Counter = Counter()
    for _, ins in _rows(sched, words):
        if not isinstance(ins, (Load, Store)) or (isinstance(ins, Store)
                                                  and ins.spad in MOVE_SOURCES):
            continue
        out[(type(ins).__name__.upper(), ins.spad.name,
             _klass(ins.dram_addr, labels, names, regions))] += ins.rows * ins.row_beats
    return out


def _idle(sched: Schedule, words_of: Sequence[tuple[int, Any, str]]) -> tuple[Counter, int]:
    """The cycles an engine whose words are ``words_of`` (``(row, instruction, symbol
    class)``, its SYNCs included) does no work, by ``(why, symbol class of its next worker
    word)`` (:func:`load_idle`'s reasons), and the cycles it works (its other words' ``end -
    grant + 1``); the two add up to the program's cycles."""
    idle: Counter = Counter()
    worked, free, why = 0, 0, None
    for i, ins, klass in sorted(words_of, key=lambda t: (int(sched.times[t[0], 4]), t[0])):
        grant, dispatch, end = (int(sched.times[i, c]) for c in (4, 2, 5))
        if isinstance(ins, Sync):
            if grant > free and ins.wait is not None:
                why = "sync " + event_name(ins.wait)
            continue
        if grant > free:
            reason = why or ("dispatch" if dispatch >= grant - 1 and dispatch > free
                             else f"wait {event_name(ins.wait)}" if ins.wait is not None
                             else "busy")
            idle[(reason, klass)] += grant - free
        worked += end - grant + 1
        free, why = max(free, end + 1), None
    if sched.cycles > free:
        idle[("tail", "")] += sched.cycles - free
    return idle, worked


def load_idle(sched: Schedule, words: np.ndarray, labels: np.ndarray, names: Sequence[str],
              regions: Mapping[str, Region]) -> tuple[Counter, int]:
    """The cycles one scheduled program's LOAD engine streams nothing, by ``(why, symbol
    class of the next LOAD)`` (the module docstring), and the cycles it streams (the LOADs'
    ``end - grant + 1``); the two add up to the program's cycles."""
    return _idle(sched, [(i, ins, "" if isinstance(ins, Sync)
                          else _klass(ins.dram_addr, labels, names, regions))
                         for i, ins in _rows(sched, words)
                         if int(sched.times[i, 0]) == Engine.LOAD.value])


def compute_idle(sched: Schedule, words: np.ndarray, labels: np.ndarray,
                 names: Sequence[str], regions: Mapping[str, Region]) -> tuple[Counter, int]:
    """The cycles one scheduled program's array computes nothing, by ``(why, symbol class of
    the weights the next GEMM reads)`` -- the latest WGT LOAD dispatched before it, a
    linear's by its layer (:func:`symbol_class` ``weights``); ``why`` as :func:`load_idle`'s
    (``wait FULL0``: the GEMM waited for its operands' LOAD; a SYNC on the compute engine
    likewise) -- and the cycles it computes (the GEMMs' ``end - grant + 1``); the two add up
    to the program's cycles."""
    wgt, gemms = "?", []
    for i, ins in _rows(sched, words):  # dispatch order: which weights each GEMM follows
        if isinstance(ins, Load) and ins.spad.name == "WGT":
            wgt = _klass(ins.dram_addr, labels, names, regions, weights=True)
        elif int(sched.times[i, 0]) == Engine.COMPUTE.value:
            gemms.append((i, ins, wgt))
    return _idle(sched, gemms)


@dataclass
class Breakdown:
    """A step's cycles and DRAM beats (the fast model's counters), its beats by
    :func:`beat_breakdown`'s rows and its LOAD idle by :func:`load_idle`'s."""

    cycles: int = 0
    dram_beats: int = 0
    streamed: int = 0
    computed: int = 0
    beats: Counter = field(default_factory=Counter)
    idle: Counter = field(default_factory=Counter)
    compute_idle: Counter = field(default_factory=Counter)

    def to_json(self) -> dict[str, Any]:
        return {"cycles": self.cycles, "dram_beats": self.dram_beats,
                "load_streamed_cycles": self.streamed,
                "beats": [[*k, v] for k, v in self.beats.most_common()],
                "load_idle": [[*k, v] for k, v in self.idle.most_common()],
                "compute_cycles": self.computed,
                "compute_idle": [[*k, v] for k, v in self.compute_idle.most_common()]}


def breakdown(runs: Sequence[Run], cfg: AcceleratorConfig,
              regions: Mapping[str, Region]) -> Breakdown:
    """The :class:`Breakdown` of the programs ``runs`` (a step's) on ``cfg`` with the DRAM
    layout ``regions`` (an executable's ``symbols``)."""
    labels, names = region_labels(regions, cfg.beat_bytes)
    out = Breakdown()
    for run in runs:
        words = relative_words(program_words(run.program), run.regs)
        sched = schedule(words, cfg)
        out.cycles += sched.cycles
        out.dram_beats += sched.counters["dram_read_beats"] + sched.counters["dram_write_beats"]
        out.beats += beat_breakdown(sched, words, labels, names, regions)
        idle, streamed = load_idle(sched, words, labels, names, regions)
        out.idle += idle
        out.streamed += streamed
        idle, computed = compute_idle(sched, words, labels, names, regions)
        out.compute_idle += idle
        out.computed += computed
    return out


def step_breakdown(model: str, cfg: AcceleratorConfig, context: int) -> Breakdown:
    """Compile ``model``'s decode step at ``context`` positions on ``cfg`` (its recipe's
    formats, :func:`sw.codesign.decode_step`'s options) and break one step down."""
    import torch

    from sim.backends import make_backend
    from sw.compile import CompileOptions, compile_model
    from sw.compress.model import selected_linears
    from sw.models.recipes import recipe_for
    from sw.models.source import open_model
    from sw.runtime import Runtime

    lm = open_model(model).model
    formats = recipe_for(model).formats(selected_linears(lm))
    opts = CompileOptions(prompt_tokens=context - 1, max_context=context,
                          decode_contexts=(context,), phases=("decode",))
    exe = compile_model(lm, cfg, opts, formats=formats)
    rec = Recorder(make_backend("model-timing", cfg))
    rt = Runtime(exe, rec, memo_timing=True, vector=cfg.has_vector)
    rt.seek(context - 1)
    rec.runs.clear()
    rt.step(torch.zeros((1, 1), dtype=torch.long))
    return breakdown(rec.runs, cfg, exe.symbols)


def _table(title: str, rows: Counter, total: int, top: int) -> list[str]:
    lines = [f"{title} (total {total:,})"]
    for key, v in rows.most_common(top):
        lines.append(f"  {v:>12,}  {100 * v / max(total, 1):5.1f}%  {' '.join(map(str, key))}")
    rest = sum(rows.values()) - sum(v for _, v in rows.most_common(top))
    if rest:
        lines.append(f"  {rest:>12,}  {100 * rest / max(total, 1):5.1f}%  (the rest)")
    return lines


@command("bench.beats")
def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m bench.beats", __doc__)
    ap.add_argument("--model", default="reference", choices=BUILTINS,
                    help="the model, a built-in with its recipe")
    ap.add_argument("--config", default="vector", metavar="NAME|JSON",
                    help="accelerator configuration before the board's memory")
    ap.add_argument("--context", type=positive_int, default=128,
                    help="positions the decode step attends to")
    ap.add_argument("--top", type=positive_int, default=25, help="rows of each table")
    ap.add_argument("--out", type=Path, default=RESULTS / "beats.json",
                    help="the breakdown as JSON, stamped with its commit and configuration")
    ap.add_argument("--unpaced", action="store_true",
                    help="the DRAM port a beat every cycle, as the board's bitstream has it, "
                         "instead of paced at the memory's peak (bench.board's persistent "
                         "prediction)")
    args = ap.parse_args(argv)
    try:
        cfg = ECPIX5.accelerator_config(named_or_file(args.config), paced=not args.unpaced)
    except (ConfigError, OSError, ValueError) as e:
        ap.error(f"--config {args.config}: {e}")
    print(f"compiling and running one decode step of {args.model} at context {args.context} "
          "(minutes for smollm2) ...", flush=True)
    b = step_breakdown(args.model, cfg, args.context)
    print(f"{args.model} at context {args.context} on {args.config} (ECPIX-5 memory, a beat "
          f"every {cfg.memory.cycles_per_beat} cycles): "
          f"{b.cycles:,} cycles, {b.dram_beats:,} DRAM beats, LOAD engine streaming "
          f"{b.streamed:,} cycles, the array computing {b.computed:,}")
    print("\n".join(_table("DRAM beats by (direction, scratchpad, symbol kind)",
                           coarse(b.beats), b.dram_beats, args.top)))
    print("\n".join(_table("LOAD engine idle cycles by (why, next LOAD's symbol kind)",
                           coarse(b.idle), b.cycles - b.streamed, args.top)))
    print("\n".join(_table("DRAM beats by (direction, scratchpad, symbol)", b.beats,
                           b.dram_beats, args.top)))
    print("\n".join(_table("LOAD engine idle cycles by (why, next LOAD's symbol)", b.idle,
                           b.cycles - b.streamed, args.top)))
    print("\n".join(_table("array idle cycles by (why, next GEMM's weights)",
                           b.compute_idle, b.cycles - b.computed, args.top)))
    path = write_json(args.out, stamp({"model": args.model, "context": args.context,
                                       **b.to_json()}, cfg))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
