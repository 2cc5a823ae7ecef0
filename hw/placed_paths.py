"""The longest register-to-register paths of a placed design, from nextpnr's SDF.

nextpnr names a critical path only after routing, and the whole vector design does not finish
routing in the flow's time limit. After placement it prints only the clock it estimates, from
its placement delay model: each cell's delay from the speed grade's tables and each connection's
delay predicted from the distance between the placed driver and sink
(``nextpnr-ecp5 --sdf``, which :func:`hw.synth.nextpnr_command` asks for with ``route=False``,
writes both, the connections' as ``INTERCONNECT`` entries, since no net is routed yet). This
module runs the same static timing analysis on that file (:func:`worst_paths`), so a placement
names the paths behind its estimate: the worst endpoint's arrival plus its setup time is the
period nextpnr reports (a placement of a small design agrees to the picosecond), and each path
is listed cell by cell with the estimated delay of every connection, which shows a long wire
(a driver placed far from its sink) apart from deep logic.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

__all__ = ["Sdf", "parse_sdf", "worst_paths", "format_path"]

_ESCAPED = re.compile(r"\\(.)")
_ENTRY = re.compile(r"\((INTERCONNECT|IOPATH|SETUPHOLD|INSTANCE|CELLTYPE)\s+(.*)")
_DELAY = re.compile(r"\(([-\d.e+]*):([-\d.e+]*):([-\d.e+]*)\)")
_EDGE = re.compile(r"\((posedge|negedge) ((?:\\.|[^)\\])*)\)")


class Sdf(NamedTuple):
    """What :func:`parse_sdf` reads from an SDF file (delays in ps, the maximum of each triple).

    ``interconnect``: ``((driver cell, port), (sink cell, port), delay)``; ``iopaths``: per cell,
    ``(from port, to port, delay)`` (combinational, or clock to output); ``setups``: per cell,
    ``(data port, clock port, setup time)`` of its rising-edge checks; ``celltypes``: per cell.
    """

    interconnect: list
    iopaths: dict
    setups: dict
    celltypes: dict


def _unescape(name: str) -> str:
    return _ESCAPED.sub(r"\1", name)


def _cell_port(text: str) -> tuple[str, str]:
    name = _unescape(text)
    cut = name.rfind("/")
    if cut < 0:
        raise ValueError(f"SDF connection end {text!r} has no '/' between cell and port")
    return name[:cut], name[cut + 1:]


def _max_delay(text: str, what: str) -> float:
    found = _DELAY.search(text)
    if not found:
        raise ValueError(f"SDF {what} without a (min:typ:max) delay: {text!r}")
    return float(found.group(3))


def parse_sdf(lines: Iterable[str]) -> Sdf:
    """Read nextpnr's SDF (one entry per line, as ``--sdf`` writes it).

    Raises ``ValueError`` naming the line of an entry it cannot read.
    """
    sdf = Sdf([], defaultdict(list), defaultdict(list), {})
    cell, celltype = None, None
    for line in lines:
        found = _ENTRY.search(line)
        if not found:
            continue
        kind, rest = found.groups()
        if kind == "CELLTYPE":
            celltype = rest.split('"')[1] if '"' in rest else rest.strip(" )")
        elif kind == "INSTANCE":
            cell = _unescape(rest.strip().rstrip(")").strip())
            sdf.celltypes[cell] = celltype
        elif kind == "INTERCONNECT":
            ends = rest.split()
            if len(ends) < 3:
                raise ValueError(f"SDF INTERCONNECT line unreadable: {line.strip()!r}")
            sdf.interconnect.append((_cell_port(ends[0]), _cell_port(ends[1]),
                                     _max_delay(rest, "INTERCONNECT")))
        elif kind == "IOPATH":
            ends = rest.split()
            if len(ends) < 3:
                raise ValueError(f"SDF IOPATH line unreadable: {line.strip()!r}")
            sdf.iopaths[cell].append((_unescape(ends[0]), _unescape(ends[1]),
                                      _max_delay(rest, "IOPATH")))
        elif kind == "SETUPHOLD":
            edges = _EDGE.findall(rest)
            if len(edges) != 2:
                raise ValueError(f"SDF SETUPHOLD line unreadable: {line.strip()!r}")
            if edges[0][0] == "posedge":  # nextpnr writes each check for both data edges
                sdf.setups[cell].append((_unescape(edges[0][1]), _unescape(edges[1][1]),
                                         _max_delay(rest, "SETUPHOLD")))
    return sdf


def worst_paths(sdf: Sdf, top: int = 10, name=lambda cell: cell) -> list[dict]:
    """The ``top`` worst register inputs by arrival plus setup, one per ``name(cell)`` (the
    Amaranth signal a cell maps: its bits' paths are alike), worst first.

    A path starts at a clock-to-output arc (an ``IOPATH`` from a cell's clock port: a port
    its setup checks name, or one named ``CLK...``) and ends at a port with a setup check;
    combinational cell arcs and connections add their delays; the latest arrival wins, as in
    nextpnr's analysis (one clock, every register on its rising edge). Each result is
    ``{"ps": arrival + setup, "to": (cell, port), "from": (cell, port), "steps": [(kind,
    delay ps, (cell, port) from, (cell, port) to)]}``, ``kind`` ``"launch"`` (clock to
    output), ``"cell"`` or ``"net"``, the setup time last (``"setup"``).
    """
    clocks = defaultdict(set)
    for cell, checks in sdf.setups.items():
        for _, clock, _ in checks:
            clocks[cell].add(clock)
    succ: dict = defaultdict(list)
    pending: dict = defaultdict(int)
    launch: dict = {}
    for cell, arcs in sdf.iopaths.items():
        for src, dst, d in arcs:
            if src in clocks[cell] or src.startswith("CLK"):
                launch[(cell, dst)] = max(launch.get((cell, dst), 0.0), d)
            else:
                succ[(cell, src)].append(((cell, dst), d, "cell"))
                pending[(cell, dst)] += 1
    for src, dst, d in sdf.interconnect:
        succ[src].append((dst, d, "net"))
        pending[dst] += 1
    arrival = dict(launch)
    via: dict = {}
    ready = [n for n in set(succ) | set(pending) if pending[n] == 0]
    while ready:  # topological order: a node's arrival is final when its inputs are
        node = ready.pop()
        t = arrival.get(node)
        for nxt, d, kind in succ.get(node, ()):
            if t is not None and t + d > arrival.get(nxt, float("-inf")):
                arrival[nxt] = t + d
                via[nxt] = (node, d, kind)
            pending[nxt] -= 1
            if pending[nxt] == 0:
                ready.append(nxt)
    ends = sorted(((arrival[(c, p)] + s, c, p) for c, checks in sdf.setups.items()
                   for p, _, s in checks if (c, p) in arrival), reverse=True)
    out, seen = [], set()
    for total, cell, port in ends:
        if name(cell) in seen:
            continue
        seen.add(name(cell))
        steps, node = [], (cell, port)
        while node in via:
            prev, d, kind = via[node]
            steps.append((kind, d, prev, node))
            node = prev
        steps.append(("launch", launch.get(node, 0.0), node, node))
        steps.reverse()
        steps.append(("setup", total - arrival[(cell, port)], (cell, port), (cell, port)))
        out.append({"ps": total, "to": (cell, port), "from": node, "steps": steps})
        if len(out) == top:
            break
    return out


def format_path(path: dict, name=lambda cell: cell) -> str:
    """One path of :func:`worst_paths` as text: a head line (total, logic and connection
    delays, start and end) and a line per step, a carry chain's ripple folded into one."""
    lines, logic, wire, ripple = [], 0.0, 0.0, [0, 0.0]
    for kind, d, src, dst in path["steps"]:
        if kind == "net":
            wire += d
        else:
            logic += d
        if (kind == "cell" and src[1] == "FCI") or (kind == "net" and dst[1] == "FCI"):
            ripple[0] += kind == "cell"
            ripple[1] += d
            continue
        if ripple[0]:
            lines.append(f"  {'carry':>6} {ripple[1] / 1000:5.2f}  {ripple[0]} carry cells")
            ripple = [0, 0.0]
        if kind == "net":
            what = f"{name(src[0])}.{src[1]} -> {name(dst[0])}.{dst[1]}"
        else:
            what = f"{name(src[0])}.{src[1]}" + ("" if src == dst else f" -> {dst[1]}")
        lines.append(f"  {kind:>6} {d / 1000:5.2f}  {what}")
    start, end = path["from"], path["to"]
    head = (f"{path['ps'] / 1000:.2f} ns ({logic / 1000:.2f} logic, {wire / 1000:.2f} "
            f"connections): {name(start[0])} -> {name(end[0])}.{end[1]}")
    return "\n".join([head, *lines])
