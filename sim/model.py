"""The fast cycle-accurate model of the accelerator (level 2 of the verification ladder).

It executes the same programs (instructions + DRAM image) as the RTL and reports the same cycle
count and counters, without simulating cycles one by one: every instruction's duration is a
closed form (:mod:`hw.timing`), so the model only resolves *when* each instruction is dispatched,
popped, granted and finished -- a handful of integer operations per instruction, in the order
the dependencies allow. Values come from :mod:`sim.functional` (vectorised numpy, exact
integers), applied in order of completion, which is exact for race-free programs.

Programming-model rule the model relies on: every event connects one producer engine to one
consumer engine (the lowering in :mod:`sw.compile` follows it); other programs are rejected
with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hw import timing
from hw.config import AcceleratorConfig
from hw.isa import (
    INSTR_BYTES,
    End,
    Engine,
    ErrorCode,
    Gemm,
    Instr,
    ISAError,
    Load,
    Store,
    Sync,
    decode,
    dispatch_error,
    engine_of,
)
from sim.functional import MachineState, exec_gemm, exec_load, exec_store
from sim.result import COUNTERS, RunResult

__all__ = ["ProgramError", "InstrTiming", "Schedule", "schedule", "FastModel"]

_ENGINES = (Engine.LOAD, Engine.COMPUTE, Engine.STORE)


class ProgramError(ValueError):
    """A program the model cannot execute faithfully (e.g. an event with two producers)."""


@dataclass
class InstrTiming:
    """When one instruction moved through the machine (cycles, see hw/timing.py)."""

    index: int
    engine: Engine | None
    available: int
    dispatch: int
    pop: int = -1
    grant: int = -1
    end: int = -1


@dataclass
class Schedule:
    """Timing of a whole program run."""

    cycles: int
    error: ErrorCode
    error_pc: int
    timings: list[InstrTiming]
    counters: dict[str, int]
    detail: str = ""


def _as_instructions(program) -> list[Instr | None]:
    """Accept instruction objects or encoded bytes; undecodable words become None (illegal)."""
    if isinstance(program, (bytes, bytearray, np.ndarray)):
        raw = bytes(np.asarray(program, dtype=np.uint8)) if not isinstance(program, bytes) \
            else program
        if len(raw) % INSTR_BYTES:
            raise ProgramError(f"program of {len(raw)} bytes is not whole instructions")
        out = []
        for i in range(0, len(raw), INSTR_BYTES):
            try:
                out.append(decode(int.from_bytes(raw[i:i + INSTR_BYTES], "little")))
            except ISAError:
                out.append(None)
        return out
    return list(program)


def _check_events(program: list[Instr | None]) -> None:
    producers: dict[int, set] = {}
    consumers: dict[int, set] = {}
    for ins in program:
        if ins is None or isinstance(ins, End):
            continue
        eng = engine_of(ins)
        if ins.signal is not None:
            producers.setdefault(ins.signal, set()).add(eng)
        if ins.wait is not None:
            consumers.setdefault(ins.wait, set()).add(eng)
    for kind, table in (("producer", producers), ("consumer", consumers)):
        for ev, engs in table.items():
            if len(engs) > 1:
                names = sorted(e.name for e in engs)
                raise ProgramError(f"event {ev} has more than one {kind} engine ({names}); "
                                   f"the programming model needs one producer and one "
                                   f"consumer engine per event")


def _decode_table(prog: list[Instr | None], cfg: AcceleratorConfig):
    """Per instruction: engine index (-1 END, -2 illegal), wait, signal, duration, error."""
    eng_of = {Load: 0, Gemm: 1, Store: 2}
    engines, waits, signals, durs, errs = [], [], [], [], []
    for ins in prog:
        if ins is None:
            engines.append(-2)
            waits.append(None)
            signals.append(None)
            durs.append(0)
            errs.append(ErrorCode.ILLEGAL_OPCODE)
            continue
        kind = type(ins)
        engines.append(-1 if kind is End else eng_of.get(kind, None)
                       if kind is not Sync else ins.engine.value)
        waits.append(ins.wait)
        signals.append(ins.signal)
        durs.append(0 if kind is End else timing.exec_cycles(ins, cfg))
        errs.append(dispatch_error(ins, cfg))
    return engines, waits, signals, durs, errs


def schedule(program, cfg: AcceleratorConfig) -> Schedule:
    """Resolve the timing of ``program`` on ``cfg`` exactly as the RTL executes it."""
    prog = _as_instructions(program)
    _check_events(prog)
    engines, waits, signals, durs, errs = _decode_table(prog, cfg)
    n_prog = len(prog)
    Q = cfg.queue_depth
    depth = cfg.imem_depth
    NONE = ErrorCode.NONE
    order: list[list[int]] = [[], [], []]      # instruction indices per engine queue
    pos = [0, 0, 0]                             # next instruction each engine pops
    free = [0, 0, 0]                            # first cycle each engine is idle
    sig: dict[int, list[int]] = {}              # event -> end cycles of its signals
    waits_done: dict[int, int] = {}             # event -> grants so far
    avail: list[int] = []                       # per dispatched instruction
    disp: list[int] = []
    pops = [-1] * n_prog
    grants = [-1] * n_prog
    ends = [-1] * n_prog

    fetch_i = 0
    last_d = None
    stop = None              # (cycle, error, pc) of a fetch-side error
    end_dispatch = None

    while True:
        progressed = False
        # Fetch: dispatch in order while queue space is known.
        while stop is None and end_dispatch is None:
            a = timing.FETCH_LATENCY if last_d is None else last_d + 1
            if fetch_i >= depth:
                stop = (a, ErrorCode.PC_OVERFLOW, fetch_i)
                break
            if fetch_i >= n_prog:  # unwritten instruction memory reads as opcode 0
                stop = (a, ErrorCode.ILLEGAL_OPCODE, fetch_i)
                break
            err = errs[fetch_i]
            if err != NONE:
                stop = (a, err, fetch_i)
                break
            e = engines[fetch_i]
            if e == -1:  # END: dispatched, enters no queue, fetching stops
                avail.append(a)
                disp.append(a)
                end_dispatch = last_d = a
                fetch_i += 1
                progressed = True
                break
            q = order[e]
            k = len(q)
            d = a
            if k >= Q:
                older = pops[q[k - Q]]
                if older < 0:
                    break  # queue full until that pop is known
                if older + 1 > d:
                    d = older + 1
            avail.append(a)
            disp.append(d)
            q.append(fetch_i)
            last_d = d
            fetch_i += 1
            progressed = True
        # Engines: pop, wait, execute in order while dependencies are known.
        for e in range(3):
            q = order[e]
            n_q = len(q)
            i_pos = pos[e]
            f = free[e]
            while i_pos < n_q:
                i = q[i_pos]
                p = disp[i] + 1
                if f > p:
                    p = f
                pops[i] = p  # known even while the wait below is unresolved (fetch needs it)
                w = waits[i]
                if w is None:
                    g = p + 1
                else:
                    k = waits_done.get(w, 0)
                    s = sig.get(w)
                    if s is None or len(s) <= k:
                        break  # the k-th signal is not known yet
                    g = s[k] + 1
                    if g < p + 1:
                        g = p + 1
                    waits_done[w] = k + 1
                end = g + durs[i]
                grants[i], ends[i] = g, end
                f = end + 1
                sg = signals[i]
                if sg is not None:
                    if sg in sig:
                        sig[sg].append(end)
                    else:
                        sig[sg] = [end]
                i_pos += 1
                progressed = True
            pos[e] = i_pos
            free[e] = f
        if not progressed:
            break

    timings = [InstrTiming(i, None if engines[i] < 0 else _ENGINES[engines[i]], avail[i],
                           disp[i], pops[i], grants[i], ends[i]) for i in range(len(disp))]
    # ---- how the run ended
    error, error_pc, detail = ErrorCode.NONE, 0, ""
    all_popped = all(pos[e] == len(order[e]) for e in range(3))
    if stop is not None:
        cycles, error, error_pc = stop
    elif end_dispatch is not None and all_popped:
        cycles = max([end_dispatch + 1] + free)
    else:
        cycles, detail = _deadlock(prog, timings, order, pos, free, fetch_i, end_dispatch,
                                   last_d, sig, waits_done, Q)
        error = ErrorCode.DEADLOCK
    limit = (1 << cfg.event_bits) - 1
    if any(len(s) > limit for s in sig.values()):
        cycles, error, error_pc, detail = _event_overflow(cfg, prog, timings, cycles, error,
                                                          error_pc, detail)
    held = None  # available cycle of an instruction fetch holds for a full queue
    if stop is None and end_dispatch is None:
        held = timing.FETCH_LATENCY if last_d is None else last_d + 1
    return Schedule(cycles, error, error_pc, timings,
                    _counters(prog, timings, cycles, held), detail)


def _deadlock(prog, timings, order, pos, free, fetch_i, end_dispatch, last_d, sig, waits_done,
              Q) -> tuple[int, str]:
    """First cycle in which every engine and fetch are blocked for good, and why."""
    blocked_since = []
    states = []
    for e, name in enumerate(("LOAD", "COMPUTE", "STORE")):
        q = order[e]
        if pos[e] < len(q):
            i = q[pos[e]]
            t = timings[i]
            p = max(t.dispatch + 1, free[e])
            ev = prog[i].wait
            have = len(sig.get(ev, ()))
            blocked_since.append(p + 1)
            states.append(f"{name} waits on event {ev} at instruction {i} (needs signal "
                          f"#{waits_done.get(ev, 0) + 1}, {have} ever signalled)")
        else:
            blocked_since.append(free[e])
            states.append(f"{name} idle, queue empty")
    if end_dispatch is not None:
        blocked_since.append(end_dispatch + 1)
        states.append("fetch ended")
    else:
        a = timing.FETCH_LATENCY if last_d is None else last_d + 1
        blocked_since.append(a)
        states.append(f"fetch holds instruction {fetch_i}, its queue is full (depth {Q})")
    return max(blocked_since), "deadlock: " + "; ".join(states)


def _event_overflow(cfg, prog, timings, cycles, error, error_pc, detail):
    """Stop at the first counter overflow if one happens before the run ends."""
    limit = (1 << cfg.event_bits) - 1
    changes: dict[int, list[tuple[int, int]]] = {}
    for t in timings:
        if t.engine is None or t.end < 0:
            continue
        ins = prog[t.index]
        if ins.signal is not None:
            changes.setdefault(ins.signal, []).append((t.end, +1))
        if ins.wait is not None:
            changes.setdefault(ins.wait, []).append((t.grant, -1))
    first = None
    for ev, ch in changes.items():
        if sum(1 for _, d in ch if d > 0) <= limit:
            continue  # never enough signals to overflow
        by_cycle: dict[int, int] = {}
        for c, d in ch:
            by_cycle[c] = by_cycle.get(c, 0) + d
        count = 0
        for c in sorted(by_cycle):
            if count + by_cycle[c] > limit:
                if first is None or c < first[0]:
                    first = (c, ev)
                break
            count += by_cycle[c]
    if first is not None and first[0] < cycles:
        return first[0], ErrorCode.EVENT_OVERFLOW, 0, f"event {first[1]} overflowed"
    return cycles, error, error_pc, detail


def _counters(prog, timings, cycles, held) -> dict[str, int]:
    """Counter values at the end of the run (cycles before ``cycles``)."""
    c = dict.fromkeys(COUNTERS, 0)
    names = {Engine.LOAD: "load", Engine.COMPUTE: "compute", Engine.STORE: "store"}
    if held is not None and held < cycles:
        c["fetch_stall"] += cycles - held
    for t in timings:
        if t.available < cycles:
            c["fetch_stall"] += min(t.dispatch, cycles) - t.available
        if t.dispatch >= cycles:
            continue
        c["instructions"] += 1
        if t.engine is None or t.pop < 0 or t.pop >= cycles:
            continue
        ins = prog[t.index]
        n = names[t.engine]
        granted = t.grant >= 0
        c[f"{n}_wait"] += max(0, min(t.grant if granted else cycles, cycles) - (t.pop + 1))
        if granted:
            c[f"{n}_exec"] += max(0, min(t.end + 1, cycles) - (t.grant + 1))
        if t.end < cycles:  # completed instructions only
            if isinstance(ins, Store):
                c["dram_write_beats"] += timing.dma_beats(ins)
            elif isinstance(ins, Load):
                c["dram_read_beats"] += timing.dma_beats(ins)
            elif isinstance(ins, Gemm):
                c["mac_cycles"] += ins.k_steps * ins.tokens
    return c


class FastModel:
    """Run programs on the fast model.

    Parameters
    ----------
    cfg:
        The accelerator configuration.

    Examples
    --------
    >>> from hw.config import AcceleratorConfig
    >>> from hw.isa import End
    >>> FastModel(AcceleratorConfig()).run([End()], timing_only=True).cycles
    2
    """

    def __init__(self, cfg: AcceleratorConfig):
        self.cfg = cfg

    def run(self, program, dram: np.ndarray | None = None, *, timing_only: bool = False,
            trace: bool = False) -> RunResult:
        """Execute ``program`` (instructions or encoded bytes) on a DRAM image.

        With ``timing_only`` no values are computed and ``dram`` may be omitted (LLaMA-7B
        shapes need no memory). Returns a :class:`sim.result.RunResult`; its ``trace`` holds
        the per-instruction :class:`InstrTiming` list when ``trace`` is set.
        """
        prog = _as_instructions(program)
        sched = schedule(prog, self.cfg)
        out_dram = None
        if not timing_only:
            state = MachineState(self.cfg, dram=None if dram is None else np.array(dram))
            done = [t for t in sched.timings
                    if t.engine is not None and 0 <= t.end < sched.cycles]
            done.sort(key=lambda t: (t.end, t.index))
            for t in done:
                ins = prog[t.index]
                if isinstance(ins, Store):
                    exec_store(state, ins)
                elif isinstance(ins, Load):
                    exec_load(state, ins)
                elif isinstance(ins, Gemm):
                    exec_gemm(state, ins)
            out_dram = state.dram
        return RunResult(cycles=sched.cycles, error=sched.error, error_pc=sched.error_pc,
                         counters=sched.counters, dram=out_dram,
                         trace=sched.timings if trace else None, detail=sched.detail)
