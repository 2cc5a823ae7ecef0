"""The engines and the opcodes they run: one table, from which every per-engine and per-opcode
piece of the design derives.

:data:`ENGINES` has one :class:`EngineSpec` per :class:`hw.isa.Engine`, in the order of their
values (an engine's value is its index everywhere: the event unit's ports, the fast model's
columns); :data:`OPS` one :class:`OpSpec` per opcode that enters a queue, in the order of their
values (END and REPEAT, :data:`FETCH_ONLY`, enter none: the fetch unit acts on them). From
them:

- the fetch unit (:class:`hw.fetch.FetchUnit`) has one dispatch port per engine, named
  :attr:`EngineSpec.name`, carrying the engine's body layout, and routes each opcode to its
  engine's port;
- the top level (:class:`hw.top.Accelerator`) builds a queue and a sequencer per engine, wires
  them to the engine's executor, and routes the signals of an engine that completes late
  through its executor;
- the counters (:data:`hw.counters.COUNTERS`) are each engine's ``<name>_exec`` and
  ``<name>_wait``, ``fetch_stall``, each opcode's work counters and ``instructions``;
- the timing functions :func:`exec_cycles`, :func:`exec_cycles_fields` and
  :func:`completion_delay` use each entry's formulas, which live in :mod:`hw.timing`;
- the fast model (:mod:`sim.model`) has a column per engine and a work total per work counter,
  and the functional model (:mod:`sim.functional`) has semantics for every opcode that is not
  :attr:`OpSpec.sync`.

The instruction encoding itself (the :class:`hw.isa.Opcode` and :class:`hw.isa.Engine` members,
body layouts, instruction classes) stays in :mod:`hw.isa`; docs/architecture.md, section 4, lists
what adding an opcode or an engine takes.

Example
-------
>>> from hw.isa import Gemm, Opcode
>>> OP[Opcode.GEMM].engine.name, ENGINE[OP[Opcode.GEMM].engine].name, OP[Opcode.GEMM].body
('COMPUTE', 'compute', 'gemm')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from amaranth.lib import data

from hw import timing
from hw.config import AcceleratorConfig
from hw.errors import ContractError
from hw.isa import (
    Engine,
    Gemm,
    Instr,
    InstrLayout,
    Load,
    Opcode,
    Store,
    Sync,
    Vec,
)

__all__ = ["EngineSpec", "OpSpec", "ENGINES", "ENGINE", "OPS", "OP", "ENGINE_OF_OPCODE",
           "FETCH_ONLY",
           "engines_of",
           "WORK_COUNTERS", "engine_of", "engines_fields", "exec_cycles", "exec_cycles_fields",
           "completion_delay", "work_fields"]


@dataclass(frozen=True)
class EngineSpec:
    """One engine: an in-order queue, a sequencer and an executor.

    Parameters
    ----------
    engine:
        Its :class:`hw.isa.Engine` member.
    body:
        The name, in ``hw.isa.InstrLayout``'s body union, of the body its queue entries carry
        (every opcode its executor runs has this body).
    completion:
        ``cfg -> X``: cycles from the end of an instruction on this engine to its completion
        (its last effect and its signal event; :mod:`hw.timing`, "Engines"), a function of
        :mod:`hw.timing`. None: ``X = 0``, the sequencer raises the signal as the instruction
        ends. Otherwise the executor delays the signal: it takes the sequencer's ``signal`` and
        ``ending`` (as ``signal_in`` and ``end_in``) and drives the event unit's signal port
        and ``in_flight`` (an instruction has ended and not yet completed), as
        :class:`hw.dma.LoadEngine` does.
    present:
        ``cfg -> bool``: the configuration has this engine (default: always). Without it, its
        opcodes and a SYNC naming it are ILLEGAL_OPCODE (:func:`hw.isa.legal_words`), the
        fetch unit has no port and the top no queue, sequencer, executor or scratchpads for
        it, and its counters are not among the configuration's (:func:`hw.counters.counters`).
    """

    engine: Engine
    body: str
    completion: Callable[[AcceleratorConfig], int] | None = None
    present: Callable[[AcceleratorConfig], bool] = lambda cfg: True

    @property
    def name(self) -> str:
        """Lower-case name: the fetch unit's port, the top's ``<name>_queue`` and
        ``<name>_seq`` blocks, the ``<name>_exec`` and ``<name>_wait`` counters."""
        return self.engine.name.lower()

    @property
    def body_layout(self) -> data.StructLayout:
        """The body layout itself (what the sequencer hands the executor)."""
        return InstrLayout["body"].shape[self.body].shape

    @property
    def exec_counter(self) -> str:
        """Counter of the cycles it executes (the sum of ``D``)."""
        return f"{self.name}_exec"

    @property
    def wait_counter(self) -> str:
        """Counter of the cycles it waits on an event whose counter is 0."""
        return f"{self.name}_wait"


@dataclass(frozen=True)
class OpSpec:
    """One opcode that enters an engine's queue.

    Parameters
    ----------
    cls:
        Its instruction class (:mod:`hw.isa`): the opcode and the body layout come from it.
    engine:
        The engine whose queue receives it; None when the instruction names it in its body's
        ``engine`` field (SYNC).
    cycles, cycles_fields:
        Its execution cycles ``D`` (:mod:`hw.timing`): of one instruction (``(ins, cfg) ->
        int``) and the same formula on :func:`hw.isa.decode_fields` arrays (``(f, cfg) ->
        array or int``), side by side; a test checks that they agree.
    work:
        Counter name -> ``f -> total``: what the instruction adds to that counter when it ends,
        from its decoded fields (ints or arrays), a function of :mod:`hw.timing`.
    sync:
        It only waits and signals on its engine's sequencer (the queue entry's ``sync`` bit):
        its executor never sees it and it moves no data.
    """

    cls: type
    engine: Engine | None
    cycles: Callable[[Instr, AcceleratorConfig], int]
    cycles_fields: Callable[[dict, AcceleratorConfig], object]
    work: Mapping[str, Callable[[dict], object]] = field(default_factory=dict)
    sync: bool = False

    @property
    def opcode(self) -> Opcode:
        return self.cls.opcode

    @property
    def body(self) -> str | None:
        """The name of its body layout in ``hw.isa.InstrLayout``'s body union."""
        return self.cls.body


#: The engines, in the order of their values.
ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec(Engine.LOAD, "dma", completion=timing.load_completion_delay),
    EngineSpec(Engine.COMPUTE, "gemm"),
    EngineSpec(Engine.STORE, "dma"),
    EngineSpec(Engine.VECTOR, "vec", present=lambda cfg: cfg.has_vector),
)

#: The opcodes that enter a queue, in the order of their values.
#: The opcodes the fetch unit acts on itself, dispatched into no queue (and the undefined 0).
FETCH_ONLY = (Opcode.INVALID, Opcode.END, Opcode.REPEAT)

OPS: tuple[OpSpec, ...] = (
    OpSpec(Load, Engine.LOAD, timing.load_cycles, timing.load_cycles_fields,
           work={"dram_read_beats": timing.dma_beats_fields}),
    OpSpec(Store, Engine.STORE, timing.store_cycles, timing.store_cycles_fields,
           work={"dram_write_beats": timing.store_dram_beats_fields}),
    OpSpec(Gemm, Engine.COMPUTE, timing.gemm_cycles, timing.gemm_cycles_fields,
           work={"mac_cycles": timing.mac_cycles_fields}),
    OpSpec(Sync, None, timing.sync_cycles, timing.sync_cycles_fields, sync=True),
    OpSpec(Vec, Engine.VECTOR, timing.vec_cycles, timing.vec_cycles_fields,
           work={"vector_elements": timing.vec_elements_fields}),
)


def _checked() -> tuple[Mapping[Engine, EngineSpec], Mapping[Opcode, OpSpec]]:
    """The table's consistency, checked once on import (each error names the entry)."""
    if [s.engine for s in ENGINES] != list(Engine):
        raise ContractError(f"hw.engines.ENGINES lists {[s.engine.name for s in ENGINES]}, "
                            f"not every hw.isa.Engine in value order {[e.name for e in Engine]}")
    engines = {s.engine: s for s in ENGINES}
    queued = [o for o in Opcode if o not in FETCH_ONLY]
    if [op.opcode for op in OPS] != queued:
        raise ContractError(f"hw.engines.OPS lists {[op.opcode.name for op in OPS]}, not every "
                            f"queued opcode in value order {[o.name for o in queued]}")
    bodies = {name: dict(f.shape) for name, f in InstrLayout["body"].shape}
    for s in ENGINES:
        if s.body not in bodies:
            raise ContractError(f"engine {s.engine.name}: body {s.body!r} is not in the "
                                f"instruction's body union {sorted(bodies)}")
    work: set[str] = set()
    for op in OPS:
        if op.engine is None and "engine" not in bodies.get(op.body, {}):
            raise ContractError(f"{op.opcode.name} has no fixed engine and its body "
                                f"{op.body!r} has no engine field")
        if not op.sync and op.body != engines[op.engine].body:
            raise ContractError(f"{op.opcode.name} has body {op.body!r}, its engine "
                                f"{op.engine.name} carries {engines[op.engine].body!r}")
        if work & set(op.work):
            raise ContractError(f"{op.opcode.name}: work counters {sorted(work & set(op.work))} "
                                f"belong to another opcode")
        work |= set(op.work)
    return MappingProxyType(engines), MappingProxyType({op.opcode: op for op in OPS})


#: :data:`ENGINES` and :data:`OPS` by engine and by opcode.
ENGINE, OP = _checked()

#: The engine whose queue receives each opcode that has a fixed one (SYNC names its engine).
ENGINE_OF_OPCODE: Mapping[Opcode, Engine] = MappingProxyType(
    {op.opcode: op.engine for op in OPS if op.engine is not None})

#: The counters the opcodes' work adds to, in the order of :data:`OPS`.
WORK_COUNTERS: tuple[str, ...] = tuple(name for op in OPS for name in op.work)


def engine_of(ins: Instr) -> Engine | None:
    """The engine whose queue receives ``ins`` (None for END and REPEAT)."""
    op = OP.get(ins.opcode)
    if op is None:
        return None
    return op.engine if op.engine is not None else ins.engine


def engines_fields(f: Mapping[str, np.ndarray]) -> np.ndarray:
    """:func:`engine_of` for many instructions at once, from :func:`hw.isa.decode_fields`:
    each instruction's engine value (``int64``), -1 for END, REPEAT and undefined opcodes."""
    op = f["opcode"]
    out = np.full(op.shape, -1, dtype=np.int64)
    for spec in OPS:
        engine = spec.engine.value if spec.engine is not None else f[f"{spec.body}.engine"]
        out = np.where(op == spec.opcode.value, engine, out)
    return out


def exec_cycles(ins: Instr, cfg: AcceleratorConfig) -> int:
    """Execution cycles ``D`` of one queued instruction (its :class:`OpSpec`'s ``cycles``)."""
    op = OP.get(ins.opcode)
    if op is None:
        raise TypeError(f"{type(ins).__name__} does not execute on an engine")
    return op.cycles(ins, cfg)


def exec_cycles_fields(f: dict, cfg: AcceleratorConfig) -> np.ndarray:
    """:func:`exec_cycles` for many instructions at once, from :func:`hw.isa.decode_fields`
    (each :class:`OpSpec`'s ``cycles_fields``; 0 for END, REPEAT and illegal words)."""
    op = f["opcode"]
    out = np.zeros(op.shape, dtype=np.int64)
    for spec in OPS:
        out = np.where(op == spec.opcode.value, spec.cycles_fields(f, cfg), out)
    return out.astype(np.int64)


def completion_delay(engine: Engine, cfg: AcceleratorConfig) -> int:
    """Cycles ``X`` from the end ``e`` of an instruction on ``engine`` to its completion ``c``
    (its last effect and its signal event; :mod:`hw.timing`, "Engines"): the engine's
    :attr:`EngineSpec.completion`, 0 without one."""
    spec = ENGINE[Engine(engine)]
    return 0 if spec.completion is None else spec.completion(cfg)


def work_fields(f: Mapping[str, np.ndarray]) -> np.ndarray:
    """Each instruction's work totals, ``int64 [n, len(WORK_COUNTERS)]`` in the order of
    :data:`WORK_COUNTERS` (0 where the opcode adds nothing to a counter), from
    :func:`hw.isa.decode_fields`."""
    op = f["opcode"]
    out = np.zeros((op.size, len(WORK_COUNTERS)), dtype=np.int64)
    column = {name: j for j, name in enumerate(WORK_COUNTERS)}
    for spec in OPS:
        for name, total in spec.work.items():
            out[:, column[name]] = np.where(op == spec.opcode.value, total(f), 0)
    return out


def engines_of(cfg: AcceleratorConfig) -> tuple[EngineSpec, ...]:
    """The engines ``cfg`` has (:attr:`EngineSpec.present`), in the order of their values."""
    return tuple(e for e in ENGINES if e.present(cfg))
