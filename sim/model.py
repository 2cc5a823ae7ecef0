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

from collections import OrderedDict
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from threadpoolctl import ThreadpoolController

from hw import timing
from hw.config import AcceleratorConfig
from hw.counters import counters
from hw.engines import (
    ENGINES,
    WORK_COUNTERS,
    completion_delay,
    engines_fields,
    exec_cycles_fields,
    work_fields,
)
from hw.isa import (
    NO_EVENT,
    Engine,
    ErrorCode,
    Instr,
    LoopStream,
    Opcode,
    Spad,
    decode,
    decode_fields,
    dispatch_errors,
    is_move,
    loop_instruction,
    loop_stream,
    program_words,
    relative_instruction,
    relative_words,
)
from sim.errors import SimulationError
from sim.functional import MachineState, Step, WeightCache, prepare
from sim.result import RunResult

__all__ = ["ProgramError", "InstrTiming", "Schedule", "schedule", "FastModel"]

#: The engines, by value (one column of the schedule each): :data:`hw.engines.ENGINES`.
_ENGINES = tuple(e.engine for e in ENGINES)


class ProgramError(SimulationError, ValueError):
    """A program the model cannot execute faithfully (e.g. an event with two producers)."""


@dataclass
class InstrTiming:
    """When one instruction moved through the machine (cycles, see hw/timing.py): ``index``
    is its program index (a loop body's instructions appear once per iteration), ``end`` the
    last execution cycle, ``done`` the completion (its signal; later than ``end`` on the
    LOAD engine, :func:`hw.engines.completion_delay`)."""

    index: int
    engine: Engine | None
    available: int
    dispatch: int
    pop: int = -1
    grant: int = -1
    end: int = -1
    done: int = -1


@dataclass
class Schedule:
    """Timing of a whole program run.

    ``times`` is an ``int64 [dispatched, 7]`` array of (engine, available, dispatch, pop,
    grant, end, done) per dispatched instruction, in dispatch order (engine -1 for END, -3
    for REPEAT; -1 where never reached); ``stream`` says which instruction each row is
    (:class:`hw.isa.LoopStream`: with REPEATs, a body's instructions once per iteration).
    """

    cycles: int
    error: ErrorCode
    error_pc: int
    times: np.ndarray
    counters: dict[str, int]
    detail: str = ""
    stream: LoopStream | None = None

    def instruction(self, program, words: np.ndarray, i: int) -> Instr:
        """Row ``i`` of ``times`` as an instruction, as dispatched: that of its program
        index (:func:`_instruction`), its DRAM address advanced in a loop."""
        if self.stream is None:
            return _instruction(program, words, i)
        return loop_instruction(_instruction(program, words, int(self.stream.pcs[i])),
                                int(self.stream.offsets[i]))

    @property
    def timings(self) -> list[InstrTiming]:
        """Per-instruction :class:`InstrTiming` records (built on demand)."""
        pcs = range(len(self.times)) if self.stream is None else self.stream.pcs.tolist()
        return [InstrTiming(pc, None if e < 0 else _ENGINES[e], a, d, p, g, n, c)
                for pc, (e, a, d, p, g, n, c) in zip(pcs, self.times.tolist(), strict=False)]


def _instruction(program, words: np.ndarray, i: int) -> Instr:
    """Instruction ``i`` as an object (given objects are used as they are)."""
    if isinstance(program, list) and not isinstance(program[i], int):
        return program[i]
    return decode(int(words[i, 0]) | (int(words[i, 1]) << 64))


@dataclass
class _Table:
    """The program as the fetch unit sees it, decoded once with array operations: one entry
    per dispatch slot of its :class:`hw.isa.LoopStream` (REPEATs expanded)."""

    stream: LoopStream
    engines: list[int]      # Engine value, -1 END, -3 REPEAT, -2 illegal
    waits: list[int]        # event id or -1
    signals: list[int]      # event id or -1
    durs: list[int]         # execution cycles D
    errs: list[int]         # ErrorCode value of the dispatch checks
    work: np.ndarray        # [n, len(WORK_COUNTERS)]: totals of hw.engines.WORK_COUNTERS
    vin_writes: np.ndarray  # 1 a move (hw.isa.is_move), 2 a LOAD into VIN, 0 else


def _decode_table(words: np.ndarray, cfg: AcceleratorConfig) -> _Table:
    """Decode ``uint64 [n, 2]`` instruction words (see :func:`hw.isa.program_words`)."""
    f = decode_fields(words)
    errs = dispatch_errors(f, cfg)
    stream = loop_stream(f, errs)
    if stream.looped:
        f = stream.fields(f)
        errs = dispatch_errors(f, cfg)
        np.putmask(errs, stream.bad_repeat & (errs == 0), ErrorCode.BAD_REPEAT.value)
    durs = exec_cycles_fields(f, cfg)
    # engine per instruction (SYNC names its engine; -1 END, -3 REPEAT, -2 illegal)
    engines = engines_fields(f)
    engines = np.where(f["opcode"] == Opcode.REPEAT.value, -3, engines)
    engines = np.where(errs == ErrorCode.ILLEGAL_OPCODE.value, -2, engines)
    work = work_fields(f)
    waits = np.where((f["wait"] == NO_EVENT) | (engines < 0), -1, f["wait"])
    signals = np.where((f["signal"] == NO_EVENT) | (engines < 0), -1, f["signal"])
    n_eng = len(_ENGINES)
    for kind, ev in (("consumer", waits), ("producer", signals)):
        used = ev >= 0
        # distinct (event, engine) pairs as one integer each: an event listed twice has two
        pairs = np.unique(ev[used] * n_eng + engines[used])
        evs = pairs // n_eng
        twice = np.flatnonzero(evs[1:] == evs[:-1])
        if twice.size:
            j = int(twice[0])
            raise ProgramError(_two_engines(int(evs[j]), kind, int(pairs[j] % n_eng),
                                            int(pairs[j + 1] % n_eng)))
    vin_writes = np.where(is_move(f["opcode"], f["dma.spad"]), 1,
                          np.where((f["opcode"] == Opcode.LOAD.value)
                                   & (f["dma.spad"] == Spad.VIN.value), 2, 0))
    return _Table(stream, engines.tolist(), waits.tolist(), signals.tolist(), durs.tolist(),
                  errs.tolist(), work, vin_writes)


def _vin_port(kinds: np.ndarray, times: np.ndarray, pcs: np.ndarray,
              cfg: AcceleratorConfig) -> None:
    """Raise :class:`ProgramError` where a move (:func:`hw.isa.is_move`) and a LOAD write VIN
    in one cycle: VIN has one DMA write port (hw/top.py), so a program orders them (with
    events, or by the STORE engine's order). A move writes in ``g + 1 + STORE_OVERHEAD ..
    e``; a LOAD writes request ``r``'s beat in ``r + X`` (``X`` its completion delay), in
    ``g + 1 + X .. e + X``. ``kinds``: :attr:`_Table.vin_writes` of the dispatched entries,
    ``times`` their timing rows (:class:`Schedule`), ``pcs`` their program indices."""
    ran = times[:, 4] >= 0
    moves = np.flatnonzero(ran & (kinds == 1))
    loads = np.flatnonzero(ran & (kinds == 2))
    if not moves.size or not loads.size:
        return
    x = completion_delay(Engine.LOAD, cfg)
    m_first, m_last = times[moves, 4] + 1 + timing.STORE_OVERHEAD, times[moves, 5]
    l_first, l_last = times[loads, 4] + 1 + x, times[loads, 5] + x  # in order, disjoint
    j = np.searchsorted(l_last, m_first)   # the first LOAD still writing when a move starts
    hit = np.flatnonzero((j < loads.size) & (l_first[np.minimum(j, loads.size - 1)] <= m_last))
    if hit.size:
        k, jk = int(hit[0]), int(j[hit[0]])
        raise ProgramError(
            f"the move at pc {int(pcs[moves[k]])} writes VIN in cycles "
            f"[{int(m_first[k])}, {int(m_last[k])}] and the LOAD at pc {int(pcs[loads[jk]])} "
            f"in [{int(l_first[jk])}, {int(l_last[jk])}]: VIN has one DMA write port, so the "
            "program must order them")


def _two_engines(ev: int, kind: str, a: int, b: int) -> str:
    names = sorted({"END" if x < 0 else _ENGINES[x].name for x in (a, b)})
    return (f"event {ev} has more than one {kind} engine ({names}); the programming model "
            f"needs one producer and one consumer engine per event")


def schedule(program, cfg: AcceleratorConfig) -> Schedule:
    """Resolve the timing of ``program`` on ``cfg`` exactly as the RTL executes it.

    ``program``: instructions, raw 128-bit words or encoded bytes (fastest: no encoding).
    """
    words = program_words(program)
    table = _decode_table(words, cfg)
    engines, waits, signals, durs, errs, work = (table.engines, table.waits, table.signals,
                                                 table.durs, table.errs, table.work)
    n_prog = len(words)
    n_stream = len(engines)
    pcs = table.stream.pcs.tolist()
    gaps = np.where(table.stream.loop_back, timing.LOOP_BACK_LATENCY, 1).tolist()
    Q = cfg.queue_depth
    depth = cfg.imem_depth
    NONE = ErrorCode.NONE.value
    n_eng = len(_ENGINES)
    order: list[list[int]] = [[] for _ in range(n_eng)]  # instruction indices per engine queue
    pos = [0] * n_eng                           # next instruction each engine pops
    free = [0] * n_eng                          # first cycle each engine is idle
    settled = [0] * n_eng                       # ... and has nothing left to complete
    late = [completion_delay(e, cfg) for e in _ENGINES]
    sig: dict[int, list[int]] = {}              # event -> end cycles of its signals
    waits_done: dict[int, int] = {}             # event -> grants so far
    avail: list[int] = []                       # per dispatched instruction
    disp: list[int] = []
    pops = [-1] * n_stream
    grants = [-1] * n_stream
    ends = [-1] * n_stream
    dones = [-1] * n_stream

    fetch_i = 0              # the next entry of the stream
    last_d = None
    stop = None              # (cycle, error, pc) of a fetch-side error
    end_dispatch = None

    while True:
        progressed = False
        # Fetch: dispatch in order while queue space is known.
        while stop is None and end_dispatch is None:
            if fetch_i < n_stream:
                pc = pcs[fetch_i]
                a = timing.FETCH_LATENCY if last_d is None else last_d + gaps[fetch_i]
            else:
                pc = pcs[-1] + 1 if n_stream else 0
                a = timing.FETCH_LATENCY if last_d is None else last_d + 1
            if pc >= depth:
                stop = (a, ErrorCode.PC_OVERFLOW, depth)
                break
            if pc >= n_prog:  # unwritten instruction memory reads as opcode 0
                stop = (a, ErrorCode.ILLEGAL_OPCODE, pc)
                break
            err = errs[fetch_i]
            if err != NONE:
                stop = (a, ErrorCode(err), pc)
                break
            e = engines[fetch_i]
            if e == -3:  # REPEAT: dispatched, enters no queue, fetching goes on
                avail.append(a)
                disp.append(a)
                last_d = a
                fetch_i += 1
                progressed = True
                continue
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
        for e in range(n_eng):
            q = order[e]
            n_q = len(q)
            i_pos = pos[e]
            f = free[e]
            x = late[e]
            while i_pos < n_q:
                i = q[i_pos]
                p = disp[i] + 1
                if f > p:
                    p = f
                pops[i] = p  # known even while the wait below is unresolved (fetch needs it)
                w = waits[i]
                if w < 0:
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
                done = end + x
                grants[i], ends[i], dones[i] = g, end, done
                f = end + 1
                sg = signals[i]
                if sg >= 0:
                    if sg in sig:
                        sig[sg].append(done)
                    else:
                        sig[sg] = [done]
                i_pos += 1
                progressed = True
            pos[e] = i_pos
            free[e] = f
            if i_pos:
                settled[e] = dones[q[i_pos - 1]] + 1
        if not progressed:
            break

    # the available cycle of the entry fetch holds, if it holds one (a full queue)
    held_at = timing.FETCH_LATENCY if last_d is None else last_d + (
        gaps[fetch_i] if fetch_i < n_stream else 1)
    nd = len(disp)
    times = np.empty((nd, 7), dtype=np.int64)
    times[:, 0] = engines[:nd]
    times[:, 1] = avail
    times[:, 2] = disp
    times[:, 3] = pops[:nd]
    times[:, 4] = grants[:nd]
    times[:, 5] = ends[:nd]
    times[:, 6] = dones[:nd]
    # ---- how the run ended
    error, error_pc, detail = ErrorCode.NONE, 0, ""
    all_popped = all(pos[e] == len(order[e]) for e in range(n_eng))
    if stop is not None:
        cycles, error, error_pc = stop
    elif end_dispatch is not None and all_popped:
        cycles = max([end_dispatch + 1] + settled)
    else:
        cycles, detail = _deadlock(waits, times, order, pos, settled, fetch_i, end_dispatch,
                                   held_at, sig, waits_done, Q)
        error = ErrorCode.DEADLOCK
    _vin_port(table.vin_writes[:nd], times, table.stream.pcs[:nd], cfg)
    limit = (1 << cfg.event_bits) - 1
    if any(len(v) > limit for v in sig.values()):
        cycles, error, error_pc, detail = _event_overflow(cfg, waits, signals, times, cycles,
                                                          error, error_pc, detail)
    held = None  # available cycle of an instruction fetch holds for a full queue
    if stop is None and end_dispatch is None:
        held = held_at
    return Schedule(cycles, error, error_pc, times,
                    _counters(times, work[:nd], cycles, held, cfg), detail,
                    table.stream if table.stream.looped else None)


def _deadlock(waits, times, order, pos, settled, fetch_i, end_dispatch, held_at, sig,
              waits_done, Q) -> tuple[int, str]:
    """First cycle in which every engine and fetch are blocked for good, and why
    (``settled``: the cycle after each engine's last completion)."""
    blocked_since = []
    states = []
    for e, name in enumerate(eng.name for eng in _ENGINES):
        q = order[e]
        if pos[e] < len(q):
            i = q[pos[e]]
            p = int(times[i, 3])
            ev = waits[i]
            have = len(sig.get(ev, ()))
            blocked_since.append(max(p + 1, settled[e]))
            states.append(f"{name} waits on event {ev} at instruction {i} (needs signal "
                          f"#{waits_done.get(ev, 0) + 1}, {have} ever signalled)")
        else:
            blocked_since.append(settled[e])
            states.append(f"{name} idle, queue empty")
    if end_dispatch is not None:
        blocked_since.append(end_dispatch + 1)
        states.append("fetch ended")
    else:
        blocked_since.append(held_at)
        states.append(f"fetch holds instruction {fetch_i}, its queue is full (depth {Q})")
    return max(blocked_since), "deadlock: " + "; ".join(states)


def _event_overflow(cfg, waits, signals, times, cycles, error, error_pc, detail):
    """Stop at the first counter overflow if one happens before the run ends.

    A counter after cycle ``c`` is (signals completing at or before ``c``) - (grants at or
    before ``c``); it overflows in the first signal cycle where that exceeds its maximum.
    """
    limit = (1 << cfg.event_bits) - 1
    eng, grant, end = times[:, 0], times[:, 4], times[:, 6]
    n = len(times)
    sig_ev = np.asarray(signals[:n])
    wait_ev = np.asarray(waits[:n])
    first = None
    for ev in np.unique(sig_ev[sig_ev >= 0]).tolist():
        s = np.sort(end[(sig_ev == ev) & (eng >= 0) & (end >= 0)])
        if s.size <= limit:
            continue
        g = np.sort(grant[(wait_ev == ev) & (eng >= 0) & (grant >= 0)])
        value = np.searchsorted(s, s, "right") - np.searchsorted(g, s, "right")
        over = np.flatnonzero(value > limit)
        if over.size and (first is None or s[over[0]] < first[0]):
            first = (int(s[over[0]]), ev)
    if first is not None and first[0] < cycles:
        return first[0], ErrorCode.EVENT_OVERFLOW, 0, f"event {first[1]} overflowed"
    return cycles, error, error_pc, detail


def _counters(times: np.ndarray, work: np.ndarray, cycles: int, held,
              cfg: AcceleratorConfig) -> dict[str, int]:
    """Counter values at the end of the run (cycles before ``cycles``), vectorised: those of
    :func:`hw.counters.counters` (an absent engine's have no instruction to count)."""
    names = counters(cfg)
    c = dict.fromkeys(names, 0)
    eng, avail, disp, pop, grant, end, _ = times.T
    if held is not None and held < cycles:
        c["fetch_stall"] += cycles - held
    c["fetch_stall"] += int((np.minimum(disp, cycles) - avail)[avail < cycles].sum())
    c["instructions"] = int((disp < cycles).sum())
    on_engine = (eng >= 0) & (pop >= 0) & (pop < cycles)
    granted = grant >= 0
    wait = np.maximum(0, np.minimum(np.where(granted, grant, cycles), cycles) - (pop + 1))
    busy = np.where(granted, np.maximum(0, np.minimum(end + 1, cycles) - (grant + 1)), 0)
    finished = on_engine & granted & (end < cycles)
    for e, spec in enumerate(ENGINES):
        if spec.exec_counter in c:
            mine = on_engine & (eng == e)
            c[spec.wait_counter] = int(wait[mine].sum())
            c[spec.exec_counter] = int(busy[mine].sum())
    for name, total in zip(WORK_COUNTERS, work[finished].sum(axis=0), strict=True):
        if name in c:
            c[name] = int(total)
    return c


def _timing_constants() -> tuple:
    """The cycle contract's integer constants as they are now (tests patch them; a schedule
    depends on them as on the program)."""
    return tuple((k, v) for k, v in vars(timing).items() if k.isupper() and type(v) is int)


_BLAS: list[list] = []


@contextmanager
def _one_blas_thread():
    """Hold the process's BLAS libraries to one thread, restoring their counts after.

    The libraries are found once (``threadpool_limits`` scans the loaded libraries on every
    call, and its limiter reads every pool's full description, which costs more than a small
    program's values); only their thread counts are read and set per run.
    """
    if not _BLAS:
        _BLAS.append(ThreadpoolController().select(user_api="blas").lib_controllers)
    libs = [(lib, lib.num_threads) for lib in _BLAS[0]]
    for lib, n in libs:
        if n != 1:
            lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib, n in libs:
            if n != 1:
                lib.set_num_threads(n)


class FastModel:
    """Run programs on the fast model.

    Parameters
    ----------
    cfg:
        The accelerator configuration.

    Examples
    --------
    A program of one END takes ``FETCH_LATENCY + 1`` cycles (hw/timing.py: END is available,
    and dispatched, at ``FETCH_LATENCY``, and the run is done the cycle after):

    >>> from hw.config import AcceleratorConfig
    >>> from hw.isa import End
    >>> from hw.timing import FETCH_LATENCY
    >>> cycles = FastModel(AcceleratorConfig()).run([End()], timing_only=True).cycles
    >>> cycles, cycles == FETCH_LATENCY + 1
    (6, True)
    """

    #: Programs whose schedule and decoded instructions are kept (least recently used go).
    PROGRAM_CACHE = 1024

    def __init__(self, cfg: AcceleratorConfig, *, weight_cache_bytes: int = 2 << 30):
        self.cfg = cfg
        #: Decoded weight streams, shared by every run (keyed by their bytes: never stale).
        self.weights = WeightCache(cfg, weight_cache_bytes) if weight_cache_bytes > 0 else None
        self._programs: OrderedDict[tuple, _Cached] = OrderedDict()

    def run(self, program, dram: np.ndarray | None = None, *, timing_only: bool = False,
            trace: bool = False, regs: Mapping[int, int] | None = None,
            in_place: bool = False) -> RunResult:
        """Execute ``program`` (instructions or encoded bytes) on a DRAM image.

        With ``timing_only`` no values are computed and ``dram`` may be omitted (LLaMA-7B
        shapes need no memory). Returns a :class:`sim.result.RunResult`; its ``trace`` holds
        the per-instruction :class:`InstrTiming` list when ``trace`` is set.

        ``dram`` is copied and left as it was unless ``in_place`` is set: then the run works
        on ``dram`` itself (``uint8``, the memory's size; no copy of the memory per program)
        and the result's ``dram`` *is* that array. Either way the final image holds every
        instruction that completed before the machine stopped, so a program that stops with
        an error (``ok`` false) has, in place, applied what it completed up to the error, as
        the hardware's memory would hold it; whoever runs in place and then wants the image
        of before the program must keep a copy (the runtime raises
        :class:`sw.runtime.RuntimeFault` and the sequence must be ``reset``).

        ``regs`` are the run-time registers (``{register: value}``, :func:`hw.isa.reg_values`;
        missing ones 0): the program runs as its words with them applied
        (:func:`hw.isa.relative_words`), which is what the fetch unit dispatches; without
        ``regs`` every register is 0, and a word relative to one runs as its fields are.

        A schedule is a function of the program words, the configuration and the contract's
        constants only (the timing contract ignores values), so a program run again reuses
        its schedule and its values steps (:func:`sim.functional.prepare` of its completed
        instructions, in completion order); weight streams are decoded once per distinct
        bytes (:class:`sim.functional.WeightCache`).
        """
        if not isinstance(program, (bytes, bytearray, np.ndarray)):
            program = list(program)
        words = program_words(program)
        objects = isinstance(program, list) and any(not isinstance(x, int) for x in program)
        if regs is not None:
            words = relative_words(words, regs)
            if objects:
                program = [x if isinstance(x, int) else relative_instruction(x, regs)
                           for x in program]
        entry = self._schedule(words)
        sched = entry.sched
        out_dram = None
        if not timing_only:
            if objects:  # the given objects, as they are: steps of their own
                steps = _steps(sched, lambda i: sched.instruction(program, words, i),
                               self.cfg)
            else:
                if entry.steps is None:
                    entry.steps = _steps(sched, lambda i: sched.instruction(None, words, i),
                                         self.cfg)
                steps = entry.steps
            with _one_blas_thread():
                out_dram = self._values(steps, dram, in_place)
        return RunResult(cycles=sched.cycles, error=sched.error, error_pc=sched.error_pc,
                         counters=dict(sched.counters), dram=out_dram,
                         trace=sched.timings if trace else None, detail=sched.detail)

    def _schedule(self, words: np.ndarray) -> _Cached:
        """The program's schedule (a pure function of its words, the configuration and the
        contract's constants) and its values steps once built, from the program cache."""
        key = (np.ascontiguousarray(words).tobytes(), _timing_constants())
        hit = self._programs.get(key)
        if hit is not None:
            self._programs.move_to_end(key)
            return hit
        sched = schedule(words, self.cfg)
        sched.times.flags.writeable = False
        hit = self._programs[key] = _Cached(sched)
        if len(self._programs) > self.PROGRAM_CACHE:
            self._programs.popitem(last=False)
        return hit

    def _values(self, steps: tuple[Step, ...], dram, in_place):
        """Apply every completed instruction's semantics in completion order.

        BLAS is held to one thread: the per-GEMM products are small, and multithreaded
        OpenBLAS spends far longer synchronising than computing on them (on a busy machine,
        by orders of magnitude; ``python -m bench.simspeed`` measures the fast model).
        """
        if dram is not None and not in_place:
            dram = np.array(dram)
        state = MachineState(self.cfg, dram=dram, weights=self.weights)
        for step in steps:
            step(state)
        return state.dram


@dataclass
class _Cached:
    """A program in :class:`FastModel`'s cache: its schedule, and its values steps once a
    values run has built them."""

    sched: Schedule
    steps: tuple[Step, ...] | None = None


def _steps(sched: Schedule, instruction, cfg: AcceleratorConfig) -> tuple[Step, ...]:
    """The values steps of a run: :func:`sim.functional.prepare` of every instruction that
    completed before the machine stopped (``instruction(i)``: instruction ``i``), in
    completion order, ties by index (exact for race-free programs)."""
    t = sched.times
    done = np.flatnonzero((t[:, 0] >= 0) & (t[:, 6] >= 0) & (t[:, 6] < sched.cycles))
    done = done[np.lexsort((done, t[done, 6]))]
    steps = (prepare(instruction(i), cfg) for i in done.tolist())
    return tuple(s for s in steps if s is not None)
