"""Driving the vector unit's function units in simulation: stream elements in, collect results
and the cycles they took."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth.sim import Simulator


@dataclass
class Run:
    """What a unit gave for a stream of elements."""

    #: Output payloads, in order, as ``{field: int}``.
    out: list[dict]
    #: Cycle each input element was accepted in.
    accepted: list[int]
    #: Cycle each output was taken in.
    produced: list[int]

    def field(self, name: str) -> np.ndarray:
        return np.array([o[name] for o in self.out], dtype=object).astype(np.int64)


def _payload(value) -> dict:
    return {name: int(getattr(value, name)) for name in value.shape().members}


def run_unit(unit, elements: list[dict], *, seed: int | None = None,
             max_cycles: int = 100_000) -> Run:
    """Stream ``elements`` (payload dicts) through ``unit`` and collect every result.

    Without ``seed`` the input is offered every cycle and the output always taken; with one,
    both the input's valid and the output's ready are random (half the cycles each), which
    checks the stall protocol.
    """
    return run_ports(unit, [(None, e) for e in elements], seed=seed,
                     max_cycles=max_cycles)[None]


def run_ports(unit, elements: list[tuple[str | None, dict]], *, seed: int | None = None,
              max_cycles: int = 100_000) -> dict[str | None, Run]:
    """:func:`run_unit` of a unit with ports (:class:`hw.vector.base.UnitPort`): each element
    ``(port, payload)`` goes to the input of ``unit.ports[port]``, or to ``unit.i`` for
    ``None``, one element a cycle over them all, in order; an element ``None`` is a cycle in
    which the unit advances with no element. Returns each port's :class:`Run` (its
    ``accepted`` and ``produced`` its own elements'). With ``seed``, every output's ready is
    random, each independently."""
    rng = np.random.default_rng(seed) if seed is not None else None
    ios = {None: (unit.i, unit.o), **{k: (p.i, p.o) for k, p in unit.ports.items()}}
    latency = max([unit.latency, *(p.latency for p in unit.ports.values())])
    runs = {k: Run([], [], []) for k in ios}

    async def bench(ctx):
        k = 0
        cycle = 0
        idle = 0
        while k < len(elements) or idle <= latency + 2:
            offer = k < len(elements) and (rng is None or rng.random() < 0.5)
            gap = offer and elements[k] is None
            name = elements[k][0] if offer and not gap else None
            for port, (i, o) in ios.items():
                ctx.set(o.ready, int(rng is None or rng.random() < 0.5))
                ctx.set(i.valid, int(offer and not gap and port == name))
            if gap:   # taken in a cycle the unit advances in
                k += bool(ctx.get(unit.i.ready))
            elif offer:
                i = ios[name][0]
                for f in i.payload.shape().members:
                    v = elements[k][1][f]   # a list: a laned unit's lanes
                    ctx.set(getattr(i.payload, f), v if isinstance(v, list) else int(v))
                if ctx.get(i.ready):
                    runs[name].accepted.append(cycle)
                    k += 1
            busy = False
            for port, (_, o) in ios.items():
                valid = ctx.get(o.valid)
                busy |= bool(valid)
                if valid and ctx.get(o.ready):
                    runs[port].out.append(_payload(ctx.get(o.payload)))
                    runs[port].produced.append(cycle)
            # Every cycle without a result advances the pipeline: latency + 1 such cycles
            # after the last element, it is empty.
            idle = idle + 1 if k == len(elements) and not busy else 0
            await ctx.tick()
            cycle += 1
            assert cycle < max_cycles, f"{type(unit).__name__}: no progress"

    sim = Simulator(unit)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return runs


def rows(elements: list[list[dict]]) -> list[dict]:
    """Rows of element payloads as one stream, ``last`` set on each row's final element."""
    out = []
    for row in elements:
        for j, e in enumerate(row):
            out.append({**e, "last": int(j == len(row) - 1)})
    return out


def check_latency(run: Run, latency: int, ends: list[int] | None = None) -> None:
    """Every result came exactly ``latency`` cycles after its element (``ends``: the indices
    of the elements the results belong to; default one result per element)."""
    ends = list(range(len(run.accepted))) if ends is None else ends
    assert len(run.produced) == len(ends)
    got = [p - run.accepted[e] for p, e in zip(run.produced, ends, strict=True)]
    assert got == [latency] * len(ends), got
