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
    """Timing of a whole program run.

    ``times`` is an ``int64 [dispatched, 6]`` array of (engine, available, dispatch, pop,
    grant, end) per dispatched instruction (engine -1 for END; -1 where never reached).
    """

    cycles: int
    error: ErrorCode
    error_pc: int
    times: np.ndarray
    counters: dict[str, int]
    detail: str = ""

    @property
    def timings(self) -> list[InstrTiming]:
        """Per-instruction :class:`InstrTiming` records (built on demand)."""
        return [InstrTiming(i, None if e < 0 else _ENGINES[e], a, d, p, g, n)
                for i, (e, a, d, p, g, n) in enumerate(self.times.tolist())]


def _as_instructions(program) -> list[Instr | None]:
    """Accept instruction objects, raw 128-bit words (ints) or encoded bytes; undecodable
    words become None (an illegal instruction, as the hardware sees them)."""
    if isinstance(program, (bytes, bytearray, np.ndarray)):
        raw = bytes(np.asarray(program, dtype=np.uint8)) if not isinstance(program, bytes) \
            else program
        if len(raw) % INSTR_BYTES:
            raise ProgramError(f"program of {len(raw)} bytes is not whole instructions")
        program = [int.from_bytes(raw[i:i + INSTR_BYTES], "little")
                   for i in range(0, len(raw), INSTR_BYTES)]
    out = []
    for ins in program:
        if isinstance(ins, int):
            try:
                ins = decode(ins)
            except ISAError:
                ins = None
        out.append(ins)
    return out


def _decode_table(prog: list[Instr | None], cfg: AcceleratorConfig):
    """Per instruction: engine (-1 END, -2 illegal), wait, signal, duration, dispatch error and
    the work it does (DRAM beats read and written, MAC cycles); checks the event rule."""
    eng_of = {Load: 0, Gemm: 1, Store: 2}
    engines, waits, signals, durs, errs = [], [], [], [], []
    work = np.zeros((len(prog), 3), dtype=np.int64)  # read beats, write beats, mac cycles
    producers: dict[int, int] = {}
    consumers: dict[int, int] = {}
    exec_cycles, check = timing.exec_cycles, dispatch_error
    for i, ins in enumerate(prog):
        if ins is None:
            engines.append(-2)
            waits.append(None)
            signals.append(None)
            durs.append(0)
            errs.append(ErrorCode.ILLEGAL_OPCODE)
            continue
        kind = type(ins)
        if kind is End:
            e = -1
        else:
            e = ins.engine.value if kind is Sync else eng_of[kind]
            if kind is Gemm:
                work[i, 2] = ins.k_steps * ins.tokens
            elif kind is Load:
                work[i, 0] = ins.rows * ins.row_beats
            elif kind is Store:
                work[i, 1] = ins.rows * ins.row_beats
        w, sg = ins.wait, ins.signal
        if w is not None and consumers.setdefault(w, e) != e:
            raise ProgramError(_two_engines(w, "consumer", consumers[w], e))
        if sg is not None and producers.setdefault(sg, e) != e:
            raise ProgramError(_two_engines(sg, "producer", producers[sg], e))
        engines.append(e)
        waits.append(w)
        signals.append(sg)
        durs.append(0 if e < 0 else exec_cycles(ins, cfg))
        errs.append(check(ins, cfg))
    return engines, waits, signals, durs, errs, work


def _two_engines(ev: int, kind: str, a: int, b: int) -> str:
    names = sorted({"END" if x < 0 else _ENGINES[x].name for x in (a, b)})
    return (f"event {ev} has more than one {kind} engine ({names}); the programming model "
            f"needs one producer and one consumer engine per event")


def schedule(program, cfg: AcceleratorConfig) -> Schedule:
    """Resolve the timing of ``program`` on ``cfg`` exactly as the RTL executes it."""
    prog = _as_instructions(program)
    engines, waits, signals, durs, errs, work = _decode_table(prog, cfg)
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

    nd = len(disp)
    times = np.empty((nd, 6), dtype=np.int64)
    times[:, 0] = engines[:nd]
    times[:, 1] = avail
    times[:, 2] = disp
    times[:, 3] = pops[:nd]
    times[:, 4] = grants[:nd]
    times[:, 5] = ends[:nd]
    # ---- how the run ended
    error, error_pc, detail = ErrorCode.NONE, 0, ""
    all_popped = all(pos[e] == len(order[e]) for e in range(3))
    if stop is not None:
        cycles, error, error_pc = stop
    elif end_dispatch is not None and all_popped:
        cycles = max([end_dispatch + 1] + free)
    else:
        cycles, detail = _deadlock(prog, times, order, pos, free, fetch_i, end_dispatch,
                                   last_d, sig, waits_done, Q)
        error = ErrorCode.DEADLOCK
    limit = (1 << cfg.event_bits) - 1
    if any(len(v) > limit for v in sig.values()):
        cycles, error, error_pc, detail = _event_overflow(cfg, prog, times, cycles, error,
                                                          error_pc, detail)
    held = None  # available cycle of an instruction fetch holds for a full queue
    if stop is None and end_dispatch is None:
        held = timing.FETCH_LATENCY if last_d is None else last_d + 1
    return Schedule(cycles, error, error_pc, times,
                    _counters(times, work[:nd], cycles, held), detail)


def _deadlock(prog, times, order, pos, free, fetch_i, end_dispatch, last_d, sig, waits_done,
              Q) -> tuple[int, str]:
    """First cycle in which every engine and fetch are blocked for good, and why."""
    blocked_since = []
    states = []
    for e, name in enumerate(("LOAD", "COMPUTE", "STORE")):
        q = order[e]
        if pos[e] < len(q):
            i = q[pos[e]]
            p = int(times[i, 3])
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


def _event_overflow(cfg, prog, times, cycles, error, error_pc, detail):
    """Stop at the first counter overflow if one happens before the run ends."""
    limit = (1 << cfg.event_bits) - 1
    changes: dict[int, list[tuple[int, int]]] = {}
    for i, (eng, _, _, _, grant, end) in enumerate(times.tolist()):
        if eng < 0 or end < 0:
            continue
        ins = prog[i]
        if ins.signal is not None:
            changes.setdefault(ins.signal, []).append((end, +1))
        if ins.wait is not None:
            changes.setdefault(ins.wait, []).append((grant, -1))
    first = None
    for ev, ch in changes.items():
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


def _counters(times: np.ndarray, work: np.ndarray, cycles: int, held) -> dict[str, int]:
    """Counter values at the end of the run (cycles before ``cycles``), vectorised."""
    c = dict.fromkeys(COUNTERS, 0)
    eng, avail, disp, pop, grant, end = times.T
    if held is not None and held < cycles:
        c["fetch_stall"] += cycles - held
    c["fetch_stall"] += int((np.minimum(disp, cycles) - avail)[avail < cycles].sum())
    c["instructions"] = int((disp < cycles).sum())
    on_engine = (eng >= 0) & (pop >= 0) & (pop < cycles)
    granted = grant >= 0
    wait = np.maximum(0, np.minimum(np.where(granted, grant, cycles), cycles) - (pop + 1))
    busy = np.where(granted, np.maximum(0, np.minimum(end + 1, cycles) - (grant + 1)), 0)
    finished = on_engine & granted & (end < cycles)
    for e, name in enumerate(("load", "compute", "store")):
        mine = on_engine & (eng == e)
        c[f"{name}_wait"] = int(wait[mine].sum())
        c[f"{name}_exec"] = int(busy[mine].sum())
    c["dram_read_beats"], c["dram_write_beats"], c["mac_cycles"] = (
        int(x) for x in work[finished].sum(axis=0))
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
            t = sched.times
            done = np.flatnonzero((t[:, 0] >= 0) & (t[:, 5] >= 0) & (t[:, 5] < sched.cycles))
            done = done[np.lexsort((done, t[done, 5]))]  # completion order, ties by index
            for i in done.tolist():
                ins = prog[i]
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
