"""A deliberately naive, cycle-by-cycle implementation of the timing contract (hw/timing.py).

It steps every cycle and keeps the machine state of the RTL (fetch, queues, engine FSMs, event
counters) explicitly, so it is slow but easy to check against the docstring rule by rule. Tests
compare the fast model's per-instruction algebra with it on random programs.
"""

from __future__ import annotations

from collections import deque

from hw import timing
from hw.engines import ENGINES, completion_delay, engine_of, engines_of, exec_cycles
from hw.isa import End, ErrorCode, dispatch_error

IDLE, WAIT, EXEC = "idle", "wait", "exec"


def run_reference(prog, cfg, max_cycles=200_000):
    """Return ``(cycles, error, error_pc, counters)`` for a list of instructions."""
    Q = cfg.queue_depth
    limit = (1 << cfg.event_bits) - 1
    n_eng = len(ENGINES)
    queues = [deque() for _ in range(n_eng)]   # (index, written_cycle)
    state = [IDLE] * n_eng
    cur = [None] * n_eng
    left = [0] * n_eng
    cnt = [0] * 32
    late = [completion_delay(e.engine, cfg) for e in ENGINES]
    completing = []    # (cycle, signal event or None) of instructions ended, not completed
    pc, avail, ended = 0, timing.FETCH_LATENCY, None
    names = [e.name for e in ENGINES]
    ctr = {f"{e.name}_{k}": 0 for e in engines_of(cfg) for k in ("exec", "wait")}
    ctr.update(fetch_stall=0, instructions=0)
    for c in range(max_cycles):
        # ---- done / deadlock on the registered state of this cycle
        idle_empty = [state[e] == IDLE and not queues[e] for e in range(n_eng)]
        completing = [x for x in completing if x[0] >= c]
        if ended is not None and c > ended and all(idle_empty) and not completing:
            return c, ErrorCode.NONE, 0, ctr
        # ---- fetch
        fetch_blocked = ended is not None
        fetch_action = None
        if ended is None and c >= avail:
            if pc >= cfg.imem_depth:
                return c, ErrorCode.PC_OVERFLOW, pc, ctr
            ins = prog[pc] if pc < len(prog) else None
            if ins is None:
                return c, ErrorCode.ILLEGAL_OPCODE, pc, ctr
            err = dispatch_error(ins, cfg)
            if err != ErrorCode.NONE:
                return c, err, pc, ctr
            if isinstance(ins, End):
                fetch_action = "end"
            else:
                e = engine_of(ins).value
                if len(queues[e]) < Q:
                    fetch_action = e
                else:
                    fetch_blocked = True
        waiting_zero = [state[e] == WAIT and prog[cur[e]].wait is not None
                        and cnt[prog[cur[e]].wait] == 0 for e in range(n_eng)]
        if (not any(s == EXEC for s in state) and not completing and fetch_blocked
                and all(idle_empty[e] or waiting_zero[e] for e in range(n_eng))
                and any(waiting_zero)):
            return c, ErrorCode.DEADLOCK, 0, ctr
        if fetch_blocked and ended is None:
            ctr["fetch_stall"] += 1
        # ---- engines (decide on registered state, update at the edge)
        inc = [0] * 32
        dec = [0] * 32
        pops = []
        for e in range(n_eng):
            if state[e] == IDLE:
                if queues[e] and queues[e][0][1] < c:
                    i, _ = queues[e][0]
                    pops.append(e)
                    cur[e] = i
                    state[e] = "popped"  # becomes WAIT next cycle
            elif state[e] == WAIT:
                ins = prog[cur[e]]
                if ins.wait is None or cnt[ins.wait] >= 1:
                    if ins.wait is not None:
                        dec[ins.wait] += 1
                    state[e] = "granted"
                    left[e] = exec_cycles(ins, cfg)
                else:
                    ctr[f"{names[e]}_wait"] += 1
            elif state[e] == EXEC:
                ctr[f"{names[e]}_exec"] += 1
                left[e] -= 1
                if left[e] == 0:
                    completing.append((c + late[e], prog[cur[e]].signal))
                    state[e] = "finished"
        for when, ev in completing:
            if when == c and ev is not None:
                inc[ev] += 1
        for ev in range(32):
            if cnt[ev] + inc[ev] - dec[ev] > limit:
                return c, ErrorCode.EVENT_OVERFLOW, 0, ctr
            cnt[ev] += inc[ev] - dec[ev]
        for e in pops:
            queues[e].popleft()
        if fetch_action is not None:
            ctr["instructions"] += 1
            if fetch_action == "end":
                ended = c
            else:
                queues[fetch_action].append((pc, c))
            pc += 1
            avail = c + 1
        for e in range(n_eng):
            state[e] = {"popped": WAIT, "granted": EXEC, "finished": IDLE}.get(state[e],
                                                                               state[e])
    raise RuntimeError("reference simulation did not finish")
