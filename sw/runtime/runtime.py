"""The runtime: runs a compiled model (:class:`~sw.compile.executable.Executable`) token by
token on a backend, and accounts for every cycle.

A step walks its graph in order. Host nodes run with their op's kernel from the registry
(:data:`sw.compile.ir.OPS`: the same functions the model's modules call). Each accelerator node
(the executable's :class:`~sw.compile.executable.ProgramTable` says which, and which program for
the step's context) is one program: the runtime quantises its inputs into their DRAM buffers
(the prologue), runs the program on the backend, and dequantises the outputs it reads back (the
epilogue; a fused residual is added there); which prologue and epilogue follows from the
weight operand the op streams (``OPS[op].streams``), or, for a host op lowered to the
vector engine (``OPS[op].vector``: :mod:`sw.compile.vector`), from its sub-op: the
prologue writes the float inputs as Q15.16 int32 rows (``to_fixed``; softmax: ``scores +
mask`` of the scaled scores, masked positions 0, and each row's valid positions into its
VEC's ``imm``, a run-time parameter set in a copy of the program's words before the
start; rope: q or k with a token's heads side by side, and the step's first position into
the addresses of the LOADs that read the rows of the constant rotary table, likewise) and the
epilogue reads the results back (``from_fixed``: float64, the exact words), so they equal
the host kernels with the vector unit's numerics bit for bit. The parts of a fused program
(:mod:`sw.compile.fusion`) keep their prologues and epilogues, but the program runs once, at
its first part's node (a linear whose REQUANT part is on chip: its input rows, and residual
rows no program left on chip, as Q15.16 words), and the later parts' inputs are what it wrote on
chip. The KV cache lives in accelerator memory: the op that appends to it
(``OPS[op].kv_state``) writes the step's INT8 (or INT4) keys and values into their stream
layout (:class:`~sw.compile.executable.KVCachePlan`) and keeps their scales on the host,
unless the step's program appends them on chip and no decode program reads the host's
scales (then it does nothing).
Everything the runtime needs to know of the compilation it reads from the
:class:`~sw.compile.executable.Executable`.

A step reads back only what the host uses (:meth:`Runtime._step_plan`, once per phase and
context): the logits (none where the program picks the greedy token on chip and the caller
asks for the token only, ``step(..., logits=False)``: then the token id is the one word
read back), the results a host node or a program's prologue computes with; an epilogue
nothing reads does not run, nor does a host node whose results nothing reads (the rotary
positions, the layout ops between on-chip parts). ``Runtime(read_back_all=True)`` reads
every node's results back and keeps the KV state on the host (to compare per-node values).

Accounting per step (:class:`StepStats`): every program's cycles and counters, its minimal
DRAM traffic and MACs (for the roofline), every host operation's wall time on this machine and
its estimated cycles on an on-chip vector unit (the op's ``cost`` in the registry: one
streaming pass through DRAM, free for layout ops), the bytes the host read back from and
wrote into accelerator memory, and the host <-> accelerator transitions (two per program).
The wall time is split in two (:class:`HostRun`): the host's *work* (``wall_s``: a host op's
kernel, and the prologues and epilogues that compute or move data: quantising input rows,
writing rows or words into accelerator memory, reading results back and dequantising them,
the KV append's host side) and the *transfer* of a program's run-time parameters (``io_s``:
evaluating the register table and setting the registers, the words a step sets, and reading
back the token id an ARGMAX part picked), which a step whose every op is on chip still does,
once per program. A prologue or epilogue with nothing to compute or move does not run and
counts neither; the runtime's own bookkeeping (the step plan, the shapes of values the host
does not hold) counts in neither.

With a timing-only backend or executable the programs run timing-only and the host nodes run
on zeros of the right shapes (their wall time is still measured); outputs are meaningless.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from hw.isa import RegTable, field_location
from hw.numerics import (
    add_vector,
    bias_to_acc,
    dequant_channels,
    dequant_output,
    dequant_output_vector,
    from_fixed_torch,
    kv4_rows_torch,
    kv4_rows_vector_torch,
    kv_rows,
    quantize_activations,
    quantize_activations_vector,
    requant_amax,
    requant_amax_torch,
    scores_channels_vector,
    scores_epilogue,
    scores_prologue,
    scores_prologue_vector,
    scores_vector,
    to_fixed_torch,
    ungroup_rows,
    value_amax_torch,
    values_epilogue,
    values_prologue,
)
from sim.backends import Backend, runs_in_place
from sim.roofline import LayerPoint, bound_cycles
from sw.compile.executable import Executable, Program, ProgramMember
from sw.compile.ir import (
    OPS,
    Interpreter,
    Kernel,
    Node,
    Numerics,
    rope_rows,
    run_node,
    stream_cycles,
)
from sw.models.generate import sample_next
from sw.models.llama import causal_mask

__all__ = ["Runtime", "RuntimeFault", "StepStats", "ProgramRun", "HostRun", "Generation",
           "to_dict"]


class RuntimeFault(RuntimeError):
    """A program stopped with an error (deadlock, overflow, bad instruction) or an input
    does not match the executable; the message names the step, node and engine states.

    After a program's fault the accelerator memory holds what the program completed before
    it stopped (the fast model runs on the runtime's image in place, as the hardware would
    leave it), so the sequence cannot continue: :meth:`Runtime.reset` starts a new one."""


@dataclass
class ProgramRun:
    """One accelerator program of a step."""

    node: str
    program: int
    bucket: int | None
    cycles: int
    counters: dict
    read_bytes: int
    write_bytes: int
    macs: int
    bound_cycles: float
    trace: list | None = None


@dataclass
class HostRun:
    """One host operation of a step (``op`` ends in ``:io`` for a program's prologue and
    epilogue): ``wall_s`` the wall time of its work (a host op's kernel; a prologue or
    epilogue that computes or moves data), ``io_s`` that of a program's run-time parameters
    (the registers and words set as it starts, the token id read back: the module
    docstring), ``unit_cycles`` the work's estimated cycles on chip."""

    node: str
    op: str
    wall_s: float
    unit_cycles: int
    io_s: float = 0.0


@dataclass
class StepStats:
    """Everything one step cost."""

    phase: str
    past: int
    tokens: int
    programs: list[ProgramRun] = field(default_factory=list)
    host: list[HostRun] = field(default_factory=list)
    #: Bytes the host read back from / wrote into accelerator memory over the step.
    read_back_bytes: int = 0
    written_bytes: int = 0

    @property
    def cycles(self) -> int:
        """Simulated accelerator cycles (programs run back to back)."""
        return sum(p.cycles for p in self.programs)

    @property
    def host_unit_cycles(self) -> int:
        """Estimated cycles of the host's work on an on-chip vector unit."""
        return sum(h.unit_cycles for h in self.host)

    @property
    def host_wall_s(self) -> float:
        """Wall time of the host's work (:attr:`HostRun.wall_s`): 0 where a step's every op
        runs on chip and the host only starts the program and reads its token back."""
        return sum(h.wall_s for h in self.host)

    @property
    def host_io_s(self) -> float:
        """Wall time of the run-time parameters' transfer (:attr:`HostRun.io_s`): the
        registers, the words a step sets and the token id read back."""
        return sum(h.io_s for h in self.host)

    @property
    def transitions(self) -> int:
        """Host <-> accelerator transitions: each program is a round trip."""
        return 2 * len(self.programs)

    def counter(self, name: str) -> int:
        return sum(p.counters.get(name, 0) for p in self.programs)

    @property
    def roofline_fraction(self) -> float:
        """Sum of the programs' roofline bounds over their simulated cycles."""
        return sum(p.bound_cycles for p in self.programs) / self.cycles if self.cycles else 0.0

    @property
    def roofline_fraction_end_to_end(self) -> float:
        """The programs' roofline bounds over the step's cycles with the host's work at its
        estimated on-chip cycles added (:attr:`host_unit_cycles`): the fraction a step reaches
        when every op, not only the programs, is counted."""
        total = self.cycles + self.host_unit_cycles
        return sum(p.bound_cycles for p in self.programs) / total if total else 0.0

    def roofline_points(self) -> list[LayerPoint]:
        """One point per kind of program (the blocks' ``layers.N.`` prefix dropped), its work
        and cycles summed over the step."""
        points: dict[str, LayerPoint] = {}
        for p in self.programs:
            parts = p.node.split(".")
            kind = ".".join(parts[2:]) if parts[0] == "layers" and len(parts) > 2 else p.node
            q = points.setdefault(kind, LayerPoint(kind, 0, 0, 0, 0))
            q.read_bytes += p.read_bytes
            q.write_bytes += p.write_bytes
            q.macs += p.macs
            q.cycles += p.cycles
        return list(points.values())

    def summary(self) -> dict:
        return {"phase": self.phase, "past": self.past, "tokens": self.tokens,
                "cycles": self.cycles, "programs": len(self.programs),
                "transitions": self.transitions, "host_unit_cycles": self.host_unit_cycles,
                "host_wall_s": self.host_wall_s, "host_io_s": self.host_io_s,
                "read_back_bytes": self.read_back_bytes,
                "written_bytes": self.written_bytes, "mac_cycles": self.counter("mac_cycles"),
                "dram_read_beats": self.counter("dram_read_beats"),
                "roofline_fraction": self.roofline_fraction,
                "roofline_fraction_end_to_end": self.roofline_fraction_end_to_end}


@dataclass
class Generation:
    """Tokens generated and what each step cost."""

    prompt: list[int]
    tokens: list[int]
    steps: list[StepStats]
    logits: list[torch.Tensor | None]


@dataclass(frozen=True)
class _KVRef:
    """The keys or values of one layer as they live in accelerator memory."""

    layer: int
    kind: str  # "k" or "v"


class Runtime:
    """Run ``exe`` on ``backend``, keeping the KV cache in the backend's memory.

    Parameters
    ----------
    exe : Executable
        The compiled model.
    backend : Backend
        From :func:`sim.backends.make_backend` (its configuration must be ``exe.cfg``).
    trace : bool
        Keep the per-instruction timeline of every program (fast model only).
    memo_timing : bool
        Without values, simulate each template once: relocated copies of a program differ only
        in DRAM addresses, which the timing contract ignores (``hw/timing.py``), so their
        cycles and counters are the same; likewise a host operation repeated with the same
        shapes (the next decoder block's) is timed once (the benchmarks of large models).
    vector : bool
        Host ops, prologues (INT8 requantisation of activations, keys, values and the folded
        probabilities) and the fused residual compute with the vector unit's exact numerics
        (:class:`~sw.compile.ir.Numerics` ``vector``), as the model-level twin of
        ``use_hardware_numerics(..., vector=True)`` does; else in float. Required by an
        executable with vector programs (compiled for a configuration with a vector engine).
    read_back_all : bool
        Read back every accelerator node's results (debug: each node's value on the host, as
        the graph's order gives it) and keep the KV state (scales, amax) on the host. Else
        a step reads back only what the host uses
        (:meth:`_step_plan`): a value computed on chip and consumed only on chip stays there,
        and a host node whose results nothing reads does not run.

    Raises
    ------
    RuntimeFault
        The backend's configuration is not the executable's, or the executable has vector
        programs and ``vector`` is off.
    """

    def __init__(self, exe: Executable, backend: Backend, *, trace: bool = False,
                 memo_timing: bool = False, vector: bool = False,
                 read_back_all: bool = False) -> None:
        if backend.cfg != exe.cfg:
            raise RuntimeFault("the backend's accelerator configuration differs from the one "
                               "the executable was compiled for")
        vec = [p.node for p in exe.programs if p.vector is not None]
        if vec and not vector:
            raise RuntimeFault(f"the executable runs {len(vec)} host-op programs (e.g. "
                               f"{vec[0]!r}) on the vector engine: run it with vector=True "
                               "(the vector unit's numerics on the host too)")
        self.exe, self.backend = exe, backend
        #: The accelerator nodes of each phase (the table is immutable: looked up once).
        self._accelerated = {phase: exe.table.nodes(phase) for phase in exe.graphs}
        self._nodes = {phase: {n.name: n for n in g.nodes} for phase, g in exe.graphs.items()}
        self._producers = {phase: {v: n.name for n in g.nodes for v in n.outputs}
                           for phase, g in exe.graphs.items()}
        #: Each layer's softmax scale (its attention scores' ``scale``): the channel words'.
        self._scores_scale = {n.attrs["layer"]: n.attrs["scale"] for g in exe.graphs.values()
                              for n in g.nodes if n.op == "attn_scores"}
        self._position_words = _position_words(exe, self._nodes)
        #: The register table, flattened once: evaluated as each program starts.
        self._reg_table = RegTable(exe.registers)
        #: Per (phase, fused program): the residual rows its first part writes.
        self._residual_plans: dict[tuple[str, int], tuple[tuple[str, str, int], ...]] = {}
        self.read_back_all = read_back_all
        self._plans: dict[tuple[str, int, bool], _StepPlan] = {}
        #: Whether a decode program reads the host's KV state (an attention prologue: the
        #: cached rows' scales or amax): else a step whose append is on chip keeps none.
        self._kv_history = any(
            self._prologue_runs("decode", name, pid)
            for name, entries in exe.table.entries.get("decode", {}).items()
            if self._nodes["decode"][name].op in ("attn_scores", "attn_values")
            for _, _, pid in entries)
        #: The phases whose output's programs all pick the greedy token on chip (ARGMAX).
        self._argmax_phases = frozenset(
            phase for phase, g in exe.graphs.items()
            if (entries := exe.table.entries.get(phase, {}).get(
                g.producer(g.outputs[0]).name if g.producer(g.outputs[0]) else ""))
            and all(any(m.argmax for m in exe.programs[pid].members) for *_, pid in entries))
        self._stats: StepStats | None = None
        self._plan: _StepPlan | None = None
        #: The buffers of the token's embedding rows the decode programs read from the
        #: embedding table on chip (``Program.embed_rows``), and their row bytes: the host
        #: writes none of them, nor computes the lookup for them.
        self._served, reader = _embedding_served(exe)
        self._embed_reader = {"decode": reader} if reader else {}
        self._vals: dict = {}
        self._program_work: dict[int, tuple[int, int, int, float]] = {}
        self._offsets: dict[tuple[str, int, int], np.ndarray] = {}
        self.values = backend.values and not exe.timing_only
        self.trace = trace and backend.traces
        self.config = exe.model
        self.kv = exe.kv.layout
        params = {k: torch.from_numpy(v) for k, v in exe.host.items()}
        for name, shape in exe.host_shapes.items():
            params.setdefault(name, torch.zeros(shape))
        self.params = params
        self.vector = vector
        #: The last step's greedy token as an ARGMAX part computed it on chip (the index of
        #: the last logits row's first maximum), or None (``CompileOptions.argmax``).
        self.argmax: int | None = None
        self.interp = Interpreter(params, self.config, Numerics(vector=vector),
                                  exe.io.max_context)
        self.memo: dict[tuple, object] | None = {} if memo_timing and not self.values else None
        # The fast model runs on self.dram itself (no copy of the memory per program); after
        # a program that faults (RuntimeFault) the image holds what it completed: reset().
        self._in_place = {"in_place": True} if self.values and runs_in_place(backend) else {}
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Forget the sequence: fresh DRAM image (weights only) and an empty cache."""
        self.dram = self.exe.dram_image() if self.values else None
        self.past = 0
        shape = (1, self.exe.kv.kv_heads, self.exe.io.max_context)
        self.scales = {(L, kind): torch.ones(shape) for L in range(self.exe.kv.layers)
                       for kind in "kv"}
        # With ``vector``: the key rows' integer amax, CHANNEL's input (the scores' channels)
        self.key_amax = {L: torch.zeros(shape, dtype=torch.int64)
                         for L in range(self.exe.kv.layers)}
        # and the value rows' (:func:`~hw.numerics.value_amax_torch`): FOLD's value codes
        self.value_amax = {L: torch.zeros(shape, dtype=torch.int64)
                           for L in range(self.exe.kv.layers)}
        self.interp.cache.reset()

    def seek(self, past: int) -> None:
        """Continue as if ``past`` positions were cached (for timing: the cache holds whatever
        the memory holds, so values after a seek are meaningless)."""
        if not 0 <= past < self.exe.io.max_context:
            raise RuntimeFault(f"position {past} outside [0, {self.exe.io.max_context})")
        self.past = past

    # ------------------------------------------------------------------ steps
    @torch.no_grad()
    def step(self, ids: torch.Tensor, *, logits: bool = True
             ) -> tuple[torch.Tensor | None, StepStats]:
        """Run one step on token ids ``[1, T]``: the prefill (first call, ``T`` the prompt
        length the executable was compiled for) or one decode token. Returns the logits
        ``[1, T, vocab]`` and the step's costs; with ``logits`` False, where the step's
        program picks the greedy token on chip (:attr:`argmax`), None: the logits are not
        read back.

        Raises
        ------
        RuntimeFault
            A program faulted, the ids do not fit the executable, or ``logits`` is False and
            the step's phase has no ARGMAX on chip."""
        ids = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)
        t = ids.shape[1]
        io = self.exe.io
        if self.past == 0:
            phase = "prefill"
            if t != io.prompt_tokens:
                raise RuntimeFault(f"the executable was compiled for prompts of "
                                   f"{io.prompt_tokens} tokens, got {t}")
        else:
            phase = "decode"
            if t != 1:
                raise RuntimeFault(f"decode steps take one token, got {t}")
        if self.past + t > io.max_context:
            raise RuntimeFault(f"context of {self.past + t} positions exceeds the executable's "
                               f"max_context={io.max_context}")
        if int(ids.min()) < 0 or int(ids.max()) >= io.vocab_size:
            raise RuntimeFault(f"token ids must be in [0, {io.vocab_size}), got "
                               f"{ids.min().item()}..{ids.max().item()}")
        if not logits and not self.argmax_on_chip(phase):
            raise RuntimeFault(f"the {phase} step's program picks no greedy token on chip "
                               "(compile with CompileOptions(argmax=True) and the head on the "
                               "accelerator): its logits must be read back")
        graph = self.exe.graphs[phase]
        # the step's first token id: the register source "tok" of a program reading its row
        self._token = int(ids[0, 0])
        stats = self._stats = StepStats(phase, self.past, t)
        self.argmax = None
        env = self.interp.env(graph, self.past)
        positions = self.past + t
        plan = self._plan = self._step_plan(phase, positions, logits)
        vals: dict = {graph.inputs[0]: ids}
        self._vals = vals  # a fused program's first part writes later parts' residual rows
        for i, node in enumerate(graph.nodes):
            if node.name not in plan.runs:
                for v in graph.dead_after(i):
                    vals.pop(v, None)
                continue
            for v in node.inputs:  # what the host does not compute: its shape only
                if v not in vals:
                    vals[v] = _placeholder(graph.values[v], positions)
            if not (self.memo is not None and self._replay(phase, node, vals, env, stats)):
                kernel = self._device_kernel(phase, node, stats)
                if kernel is not None:
                    run_node(node, vals, env, kernel)
                else:
                    t0 = time.perf_counter()
                    run_node(node, vals, env)
                    wall = time.perf_counter() - t0
                    stats.host.append(HostRun(node.name, node.op, wall, OPS[node.op].cost(
                        _nbytes([vals[v] for v in node.inputs]),
                        _nbytes([vals[o] for o in node.outputs]), self.exe.cfg)))
                if self.memo is not None:
                    self._remember(phase, node, vals, env, stats)
            for v in graph.dead_after(i):  # free what no later node reads
                vals.pop(v, None)
        self.past += t
        return (vals[graph.outputs[0]] if logits else None), stats

    # ------------------------------------------------------------------ read-backs
    def argmax_on_chip(self, phase: str) -> bool:
        """Whether a ``phase`` step's program picks the greedy token on chip (ARGMAX after
        the head): then ``step(..., logits=False)`` reads back only that token."""
        return phase in self._argmax_phases

    def _step_plan(self, phase: str, positions: int, logits: bool) -> _StepPlan:
        """What a ``phase`` step attending to ``positions`` key positions runs and which
        values the host needs (backward over the graph, from the logits when ``logits``):
        an accelerator node runs where its program starts (its prologue writes its inputs:
        they are needed), its results are needed, or it reads the greedy token (ARGMAX); its
        epilogue reads back only needed results and needs its inputs' values only where it
        computes with them (:meth:`_epilogue_reads`; else their shapes); a KV append runs
        where the host keeps the KV state (:meth:`_kv_free`) or its references are needed;
        any other host node where its results are needed or it has side effects. Worked out
        once per phase, context and ``logits``."""
        key = (phase, positions, logits)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        graph = self.exe.graphs[phase]
        if self.read_back_all:
            plan = _StepPlan(frozenset(n.name for n in graph.nodes), frozenset(graph.values))
            self._plans[key] = plan
            return plan
        live = set(graph.outputs) if logits else set()
        runs = set()
        on_chip = self.exe.kv.on_accelerator
        for node in reversed(graph.nodes):
            needed = any(o in live for o in node.outputs)
            state = OPS[node.op].kv_state if on_chip else None
            if node.name in self._accelerated[phase]:
                pid = self.exe.program_index(phase, node.name, positions)
                program = self.exe.programs[pid]
                first = self._prologue_runs(phase, node.name, pid)
                if first or needed or any(m.argmax for m in program.members):
                    runs.add(node.name)
                if first:  # (the token's embedding rows: the table's, on chip)
                    live.update(node.inputs[node.name == self._embed_reader.get(phase):])
                    if program.fused_into is not None:
                        live.update(self._residual_inputs(phase, program.fused_into))
                if needed:
                    live.update(self._epilogue_reads(node, program))
            elif state == "append":
                if not self._kv_free(phase, node, positions):
                    runs.add(node.name)
                    live.update(node.inputs)
                elif needed:
                    runs.add(node.name)
            elif needed or OPS[node.op].side_effect:
                runs.add(node.name)
                live.update(node.inputs)
        plan = self._plans[key] = _StepPlan(frozenset(runs), frozenset(live))
        return plan

    def _prologue_runs(self, phase: str, name: str, pid: int) -> bool:
        """Whether accelerator node ``name``'s program ``pid`` starts there (unfused, or a
        fused program's first part): its prologue writes the node's inputs."""
        program = self.exe.programs[pid]
        return program.fused_into is None or self.exe.programs[program.fused_into].parts[0] == pid

    def _residual_inputs(self, phase: str, run: int) -> list[str]:
        """The values whose rows fused program ``run``'s first part writes for its later
        parts (:meth:`_residual_rows`)."""
        return [value for _, value, _ in self._residual_plan(phase, run)]

    def _residual_plan(self, phase: str, run: int) -> tuple[tuple[str, str, int], ...]:
        """``(symbol, value, row bytes)`` of each residual row buffer fused program ``run``'s
        first part writes for a later part whose prologue does not run (a residual linear
        whose input rows are on chip: a member's ``residual`` without ``requant``), but
        those the embedding table serves in a decode step (:meth:`_table_serves`): a
        function of the executable, worked out once per phase and program."""
        key = (phase, run)
        plan = self._residual_plans.get(key)
        if plan is None:
            plan = self._residual_plans[key] = tuple(
                (m.residual, self._nodes[phase][p.node].inputs[1], m.dequant_row_bytes)
                for p in (self.exe.programs[pid] for pid in self.exe.programs[run].parts[1:])
                for m in p.members
                if m.residual is not None and m.requant is None
                and not (phase == "decode" and m.residual in self._served))
        return plan

    @staticmethod
    def _epilogue_reads(node: Node, program: Program) -> tuple[str, ...]:
        """The inputs accelerator ``node``'s epilogue computes with (the others: their shapes
        only): a member the host dequantises, its inputs; a fused residual, the residual."""
        kind = _io_kind(node.op)
        if kind == "vector":
            return ()
        if not all(m.dequant for m in program.members):
            return node.inputs
        return node.inputs[1:] if kind == "weights" else ()

    def _kv_free(self, phase: str, node: Node, positions: int) -> bool:
        """Whether KV append ``node`` needs no host work in a step attending to
        ``positions``: its program appends everything on chip (keys, values and, where the
        executable has them, value codes and scores' channel words) and no decode program
        reads the host's KV state (:attr:`_kv_history`), nor does ``read_back_all``."""
        if self._kv_history or self.read_back_all:
            return False
        layer = node.attrs["layer"]
        want = {"k", "v"} | {kind for kind in "cs" if self._position_words.get((layer, kind))}
        return want <= self._appended_on_chip(phase, node, positions)

    # ------------------------------------------------------------------ timing memo
    def _key(self, phase: str, node: Node, vals: dict, env) -> tuple | None:
        """Nodes of one op, attributes (names aside), input shapes and -- on the accelerator
        -- program template cost the same (a part of a fused program: that program's, and
        whether it runs there, at its first part); without values their outputs are
        placeholders, so a repeat is replayed, not recomputed."""
        if OPS[node.op].kv_state:
            return None
        attrs = {k: v for k, v in node.attrs.items()
                 if k not in ("weight", "weights", "bias", "biases", "layer")}
        shapes = tuple(tuple(vals[v].shape) if isinstance(vals[v], torch.Tensor) else
                       getattr(vals[v], "kind", None) for v in node.inputs)
        template = None
        if node.name in self._accelerated[phase]:
            pid, program = self._program(phase, node, env)
            template = program.template
            if program.fused_into is not None:
                fused = self.exe.programs[program.fused_into]
                template = (fused.template, fused.parts[0] == pid)
        return (node.op, json.dumps(attrs, sort_keys=True), shapes, env.past, env.t,
                len(node.outputs), template, any(o in self._plan.live for o in node.outputs))

    def _replay(self, phase: str, node: Node, vals: dict, env, stats: StepStats) -> bool:
        hit = self.memo.get(("node", self._key(phase, node, vals, env)))
        if hit is None:
            return False
        outs, programs, host = hit
        vals.update(zip(node.outputs, outs, strict=True))
        stats.programs += [dataclasses.replace(p, node=node.name) for p in programs]
        stats.host += [dataclasses.replace(h, node=node.name) for h in host]
        return True

    def _remember(self, phase: str, node: Node, vals: dict, env, stats: StepStats) -> None:
        key = self._key(phase, node, vals, env)
        if key is None:
            return
        programs = [p for p in stats.programs if p.node == node.name]
        host = [h for h in stats.host if h.node == node.name]
        self.memo[("node", key)] = ([vals[o] for o in node.outputs], programs, host)

    def _device_kernel(self, phase: str, node: Node, stats: StepStats) -> Kernel | None:
        """The kernel of a node the accelerator runs or whose state it holds (None: a host
        node, run with its op's kernel)."""
        if node.name in self._accelerated[phase]:
            return self._accelerator_kernel(phase, stats)
        state = OPS[node.op].kv_state if self.exe.kv.on_accelerator else None
        if state == "append":
            return self._kv_append(stats, phase)
        if state == "alias":  # members read their kv head's cache: nothing to materialise
            return lambda n, a, e: (a[0],)
        return None

    def _program(self, phase: str, node: Node, env) -> tuple[int, Program]:
        """The index and program of an accelerator node for this step's context."""
        pid = self.exe.program_index(phase, node.name, env.past + env.t)
        return pid, self.exe.programs[pid]

    def _accelerator_kernel(self, phase: str, stats: StepStats) -> Kernel:
        """Prologue (host), program (backend), epilogue (host) of an accelerator node."""
        def kernel(node: Node, args: list, env):
            pid, program = self._program(phase, node, env)
            prologue, epilogue = _IO[_io_kind(node.op)]
            run, first = pid, True
            if program.fused_into is not None:  # a part: the fused program runs at the first
                run = program.fused_into
                first = self.exe.programs[run].parts[0] == pid
            work = io = 0.0   # what runs is timed: the work, the run-time parameters
            state, cycles_in, cycles_out = None, 0, 0
            if first and self._prologue_writes(program):
                t0 = time.perf_counter()
                state, cycles_in = prologue(self, node, args, env, program)
                work += time.perf_counter() - t0
            if first and run != pid and self._residual_plan(phase, run):
                t0 = time.perf_counter()
                cycles_in += self._residual_rows(phase, run)
                work += time.perf_counter() - t0
            if first:  # the run-time parameters: words the step sets, the registers
                t0 = time.perf_counter()
                words = (self._fused_words(run, env) if run != pid
                         else state.words if isinstance(state, _VectorState) else None)
                regs = self._registers(run, env)
                io += time.perf_counter() - t0
                self._run(phase, node, run, stats, words, regs)
            if any(o in self._plan.live for o in node.outputs):
                t0 = time.perf_counter()
                outs, cycles_out = epilogue(self, node, args, env, program, state)
                work += time.perf_counter() - t0
            else:  # nothing the host reads: the values' shapes only (bookkeeping)
                types = self.exe.graphs[phase].values
                outs = tuple(_placeholder(types[o], env.past + env.t) for o in node.outputs)
            argmax = next((m for m in program.members if m.argmax), None)
            if argmax is not None:  # the greedy token ARGMAX picked: its id read back
                t0 = time.perf_counter()
                cycles_out += self._read_argmax(argmax, args[0])
                io += time.perf_counter() - t0
            stats.host.append(HostRun(node.name, f"{node.op}:io", work, cycles_in + cycles_out,
                                      io))
            return outs
        return kernel

    def _prologue_writes(self, program: Program) -> bool:
        """Whether the prologue of ``program`` (its node's own, or a fused program's first
        part's) has anything to write: all but a vector program whose operand rows are the
        token's embedding rows the table serves on chip (:meth:`_table_serves`)."""
        return program.vector is None or not self._table_serves(program.vector.x)

    def _registers(self, run: int, env) -> dict[int, int]:
        """The run-time registers of program ``run`` in this step: the executable's register
        table (:attr:`~sw.compile.executable.Executable.registers`) at the step's first
        position ``pos`` and, for a program that reads the embedding table's row of the
        step's token (``embed_rows``; decode: one token), that token ``tok`` (else 0)."""
        return self._reg_table.values(env.past, self._token if self.exe.programs[run].embed_rows
                                      else 0)

    def _fused_words(self, run: int, env) -> np.ndarray | None:
        """The words of fused program ``run`` with its SOFTMAX parts' VECs (``imm_rows``)
        given each row's valid positions where a sliding window makes them other than the
        causal ones the words count from ``pos``, and with ``read_back_all`` its STOREs of
        rows nobody reads put back (``quiet_rows``: the host reads every node's rows; None:
        the program's words; its KV append's words are relative to run-time registers,
        :meth:`_registers`)."""
        program = self.exe.programs[run]
        words = None
        if program.imm_rows and env.window is not None:
            n = len(program.imm_rows)
            counts = _causal_counts(env, n)
            if not torch.equal(counts, (env.past + torch.arange(1, env.t + 1)).repeat(n // env.t)):
                words = _set_imm(program, counts.numpy())
        if self.read_back_all and program.quiet_rows:
            words = (program.words if words is None else words).copy()
            for i, lo, hi in program.quiet_rows:
                words[i] = (lo, hi)
        return words

    def _appended_on_chip(self, phase: str, node: Node, positions: int) -> frozenset[str]:
        """What the step's program that computes KV append ``node``'s key rows (a fused decode
        program's part) appended to the cache on chip: the kinds of its layer's
        ``Program.append_rows`` (keys and values, value codes, scores' channel words:
        :data:`sw.compile.kvappend.APPEND_KINDS`; empty: nothing)."""
        producer = self._producers[phase].get(node.inputs[0])
        if producer is None or producer not in self._accelerated[phase]:
            return frozenset()
        program = self.exe.programs[self.exe.program_index(phase, producer, positions)]
        if program.fused_into is None:
            return frozenset()
        layer = node.attrs["layer"]
        return frozenset(r[1] for r in self.exe.programs[program.fused_into].append_rows
                         if r[3] == layer)

    def _residual_rows(self, phase: str, run: int) -> int:
        """Write, as Q15.16 rows (``to_fixed``), the residual rows of every later part of
        fused program ``run`` whose prologue does not run (a residual linear whose input
        rows are on chip: a member's ``residual`` without ``requant``; none where an earlier
        program left them on chip), from the step's values; returns the cycles of the bytes
        streamed."""
        written = 0
        for symbol, value, row in self._residual_plan(phase, run):
            res = self._vals[value]
            written += self._write_fixed(symbol, res.reshape(-1, res.shape[-1]), row)
        return stream_cycles(written, written, self.exe.cfg) if written else 0

    # ------------------------------------------------------------------ DRAM I/O
    def _write_fixed(self, symbol: str, rows: torch.Tensor, row_bytes: int) -> int:
        """Write ``rows`` as Q15.16 words (``to_fixed``), ``row_bytes`` apart, where the
        values are carried; returns the bytes streamed (none: a buffer of the token's
        embedding rows, :meth:`_table_serves`)."""
        if self._table_serves(symbol):
            return 0
        if self.values:
            self._write_rows(symbol, to_fixed_torch(rows).numpy().astype("<i4"), row_bytes)
        return 4 * rows.numel()

    def _table_serves(self, symbol: str) -> bool:
        """Whether the step's programs read ``symbol``'s rows from the embedding table (a
        decode step's embedding rows): the host writes nothing there."""
        return symbol in self._served and self._stats.phase == "decode"

    def _write_rows(self, symbol: str, rows: np.ndarray, row_bytes: int) -> None:
        """Integer ``rows [R, K]`` (int8, or little-endian int32) into a buffer of
        ``row_bytes`` per row (zero padded)."""
        raw = np.ascontiguousarray(rows).view(np.uint8).reshape(rows.shape[0], -1)
        buf = np.zeros((rows.shape[0], row_bytes), dtype=np.uint8)
        buf[:, :raw.shape[1]] = raw
        addr = self.exe.symbols[symbol].addr
        self.dram[addr:addr + buf.size] = buf.reshape(-1)
        self._stats.written_bytes += buf.size

    def _read_rows(self, symbol: str, rows: int, row_bytes: int, n: int, at: int = 0
                   ) -> np.ndarray:
        """Int32 outputs ``[rows, n]`` (as int64) from a buffer of ``row_bytes`` per row
        (from byte ``at`` of it)."""
        addr = self.exe.symbols[symbol].addr + at
        y = self.dram[addr:addr + rows * row_bytes].view("<i4").reshape(rows, -1)
        self._stats.read_back_bytes += rows * row_bytes
        return y[:, :n].astype(np.int64)

    def _read_word(self, symbol: str, at: int) -> int:
        """One little-endian int32 word at byte ``at`` of buffer ``symbol``."""
        addr = self.exe.symbols[symbol].addr + at
        self._stats.read_back_bytes += 4
        return int(self.dram[addr:addr + 4].view("<i4")[0])

    def _run(self, phase: str, node: Node, pid: int, stats: StepStats,
             words: np.ndarray | None = None, regs: dict[int, int] | None = None) -> None:
        """Run program ``pid`` (``words``: its words with run-time parameters set) with the
        run-time registers ``regs``."""
        program = self.exe.programs[pid]
        key = ("template", program.template)
        if self.memo is not None and key in self.memo:
            r = self.memo[key]
        else:
            r = self.backend.run(program.words if words is None else words, self.dram,
                                 trace=self.trace, regs=regs, **self._in_place)
            if self.memo is not None:
                self.memo[key] = r
        if not r.ok:
            raise RuntimeFault(
                f"{phase} step at position {self.past}: the program of node {node.name!r}"
                + (f" (context bucket {program.bucket})" if program.bucket else "")
                + f" stopped with {r.error.name} at cycle {r.cycles}, instruction "
                f"{r.error_pc}" + (f": {r.detail}" if r.detail else ""))
        if self.values:
            self.dram = r.dram
        stats.programs.append(ProgramRun(node.name, pid, program.bucket, r.cycles,
                                         dict(r.counters), *self._work(pid), r.trace))

    def _work(self, pid: int) -> tuple[int, int, int, float]:
        """Program ``pid``'s minimal DRAM reads and writes, MACs and their roofline bound
        (functions of the immutable executable: worked out once per program)."""
        work = self._program_work.get(pid)
        if work is None:
            p = self.exe.programs[pid]
            work = (p.read_bytes, p.write_bytes, p.macs)
            work = self._program_work[pid] = (*work, bound_cycles(self.exe.cfg, *work))
        return work

    def _read_argmax(self, m: ProgramMember, x: torch.Tensor) -> int:
        """Read the greedy token the ARGMAX part of member ``m`` left (``x``: the head's
        input, for its rows; the last row's index) into :attr:`argmax`; returns the cycles
        of the word read."""
        if self.values:  # (index, maximum) of each row, a beat apart: the last row's index
            rows = x.numel() // x.shape[-1]
            self.argmax = self._read_word(m.argmax, (rows - 1) * self.exe.cfg.beat_bytes)
        return stream_cycles(4, 4, self.exe.cfg)

    # ------------------------------------------------------------------ accelerator nodes
    def _linear_in(self, node: Node, args: list, env, program: Program) -> tuple:
        """Quantise the input rows (one buffer shared by every member); convert each biased
        member's bias to accumulator units, one int32 row per token (WIDE_BIAS). For a fused
        program whose REQUANT part requantises them on chip (``requant``), write them as
        Q15.16 rows instead (``to_fixed``), and the residual rows a part of it reads
        (``residual``) likewise."""
        rows = args[0].reshape(-1, args[0].shape[-1])
        s_x = None
        biased = [m for m in program.members if m.b]
        m0 = program.members[0]
        if m0.requant:
            written = self._write_fixed(m0.requant, rows, m0.requant_row_bytes)
            if m0.residual:
                written += self._write_fixed(m0.residual, args[1].reshape(rows.shape[0], -1),
                                             m0.dequant_row_bytes)
            return None, stream_cycles(written, written, self.exe.cfg)
        if self.values:
            quantize = quantize_activations_vector if self.vector else quantize_activations
            a, s_x = quantize(rows.numpy())
            self._write_rows(m0.x, a, m0.act_row_bytes)
            for m in biased:
                bias = self.params[m.bias].numpy()
                scale = self.exe.host[m.row_scale]
                self._write_rows(m.b, bias_to_acc(bias, scale, s_x).astype("<i4"),
                                 m.out_row_bytes)
        written = rows.numel() + sum(rows.shape[0] * m.n * 4 for m in biased)
        return s_x, stream_cycles(rows.numel() * 4, written, self.exe.cfg)

    def _linear_out(self, node: Node, args: list, env, program: Program, s_x) -> tuple:
        """Dequantise every member's outputs; a fused residual is added as they are read.
        With ``vector``, as the vector unit's DEQUANT does it: the channel words of the
        member's row scales and the ``amax`` of each input row (what REQUANT wrote). A member
        a fused program dequantised on chip (``dequant``) has its Q15.16 rows read back
        (``from_fixed``) instead."""
        x = args[0]
        rows = x.numel() // x.shape[-1]
        outs, nbytes = [], 0
        amax = requant_amax(x.reshape(rows, -1).numpy()) if self.vector and self.values \
            and not all(m.dequant for m in program.members) else None
        for m in program.members:
            shape = (*x.shape[:-1], m.n)
            if self.values and m.dequant:
                y = from_fixed_torch(torch.from_numpy(self._read_rows(
                    m.dequant, rows, m.dequant_row_bytes, m.n))).reshape(shape)
            elif self.values:
                acc = self._read_rows(m.y, rows, m.out_row_bytes, m.n)
                scale = self.exe.host[m.row_scale]
                y = (dequant_output_vector(acc, dequant_channels(scale), amax)
                     if self.vector else dequant_output(acc, scale, s_x))
                y = torch.from_numpy(y).reshape(shape)
            else:
                y = torch.zeros(shape)
            outs.append(y)
            nbytes += y.numel() * 4
        read = nbytes
        if len(args) == 2:  # fused residual epilogue
            outs[0] = (add_vector if self.vector else torch.add)(args[1], outs[0])
            read += args[1].numel() * 4
        return tuple(outs), stream_cycles(read, nbytes, self.exe.cfg)

    def _attention_scale(self, node: Node, ref: _KVRef, s: int, operand_heads: int):
        """The cached rows' scales ``[1, operand_heads, s]`` (with ``vector``, their integer
        amax: the keys' the scores' CHANNEL input, the values' FOLD's codes)."""
        if self.vector:
            scale = (self.key_amax if ref.kind == "k" else self.value_amax)[
                node.attrs["layer"]][:, :, :s]
        else:
            scale = self.scales[(node.attrs["layer"], ref.kind)][:, :, :s]
        if operand_heads != scale.shape[1]:  # per query head against repeated K/V
            scale = scale.repeat_interleave(operand_heads // scale.shape[1], dim=1)
        return scale

    def _attention_in(self, node: Node, args: list, env, program: Program) -> tuple:
        """Quantise the query (or probability) rows of every operand head (with ``vector``,
        the query rows' ``amax`` words are the scores' dequantisation state)."""
        x, ref = args
        operand_heads = len(program.members)
        scale = self._attention_scale(node, ref, env.past + env.t, operand_heads)
        if node.op == "attn_scores" and self.vector:
            x8, s_x = scores_prologue_vector(x, operand_heads)
        elif node.op == "attn_scores":
            x8, s_x = scores_prologue(x, operand_heads)
        else:
            x8, s_x = values_prologue(x, scale, operand_heads, self.vector)
        written = 0
        for j, m in enumerate(program.members):
            if m.channels is None or m.amax is not None:  # else a REQUANT part reads x on chip
                written += x8[0, j].numel()
                if self.values:
                    self._write_rows(m.x, x8[0, j].numpy(), m.act_row_bytes)
            if m.channels is not None and m.amax is not None:  # the host's query amax words
                written += self._scores_amax(m, s_x[0, j])
        return (x8.shape[2], s_x, scale), stream_cycles(x.numel() * 4, written, self.exe.cfg)

    def _scores_amax(self, m, amax: torch.Tensor) -> int:
        """Write each query row's ``amax`` a scores member's DEQUANT part reads (word 0 of a
        beat per row; where no REQUANT part writes them); returns the bytes written. Its
        channel words are written as the cache grows (:meth:`_append_words`)."""
        if self.values:
            beat = self.exe.cfg.beat_bytes // 4
            words = np.zeros((amax.shape[0], beat), dtype="<i4")
            words[:, 0] = amax.numpy()
            self._write_rows(m.amax, words, self.exe.cfg.beat_bytes)
        return 4 * amax.shape[0]

    def _attention_out(self, node: Node, args: list, env, program: Program, state) -> tuple:
        """Dequantise the integer scores (key scales as row scales, times the softmax scale;
        with ``vector`` as the vector unit's DEQUANT: :func:`~hw.numerics.scores_vector`) or
        values (the partial rows of values split by position residue added first:
        :func:`~sw.compile.lower.value_residue`); the scores a fused program dequantised on
        chip (``dequant``) are read back as its Q15.16 rows instead."""
        s = env.past + env.t
        n = s if node.op == "attn_scores" else self.kv.head_dim
        heads = args[0].shape[1]
        if all(m.dequant for m in program.members):  # DEQUANT's rows: scores or outputs
            m0 = program.members[0]
            shape = (1, len(program.members), m0.tokens, n)
            out = torch.zeros(shape) if not self.values else from_fixed_torch(
                torch.from_numpy(np.stack([self._read_rows(m.dequant, m.tokens,
                                                           m.dequant_row_bytes, n)
                                           for m in program.members]))[None])
            out = ungroup_rows(out, heads)
            return (out,), stream_cycles(out.numel() * 4, out.numel() * 4, self.exe.cfg)
        rows, s_x, scale = state
        split = 1 if node.op == "attn_scores" else self.kv.residue
        if self.values:
            acc = torch.from_numpy(np.stack([
                self._read_rows(m.y, rows, m.out_row_bytes, split * n)
                for m in program.members]))[None]
        else:
            acc = torch.zeros((1, len(program.members), rows, split * n), dtype=torch.int64)
        if node.op != "attn_scores":
            acc = acc.reshape(*acc.shape[:-1], split, n).sum(-2)  # exact: value_residue
            out = values_epilogue(acc, s_x, heads, self.vector, self.kv.bits)
        elif self.vector:
            out = scores_vector(acc, s_x, scale, node.attrs["scale"], heads, self.kv.bits)
        else:
            out = scores_epilogue(acc, s_x, scale, heads) * node.attrs["scale"]
        return (out,), stream_cycles(acc.numel() * 4, out.numel() * 4, self.exe.cfg)

    def _vector_in(self, node: Node, args: list, env, program: Program) -> tuple:
        """The operands as Q15.16 int32 rows in their buffers (``to_fixed``); softmax's
        ``scores + mask`` (the scores scaled; as :func:`~hw.numerics.softmax_vector`: masked
        positions 0, rows zero-padded to the bucket) with each row's valid positions in its
        VEC; rope's q or k ``[1, heads, T, d]`` as one row of heads per token, its table LOADs
        pointed at the step's first position (the table itself is a constant in the image)."""
        op = program.vector
        words = None
        if node.op == "softmax":
            scores, mask = args
            z = scores + mask
            valid = torch.isfinite(z)
            counts = _softmax_counts(node.name, valid)
            rows = [to_fixed_torch(torch.where(valid, z, torch.zeros((), dtype=z.dtype)))]
            if not torch.equal(counts, _relative_counts(op, env.past)):
                words = _set_imm(program, counts.numpy())  # not causal: each row's count
        elif node.op == "rope":
            args = args[:1]  # cos and sin: the rows of the constant table the LOAD reads
            rows = [to_fixed_torch(_rope_rows(args[0]))]
        else:  # (not the token's embedding rows the table serves: no prologue runs)
            rows = [to_fixed_torch(a) for a in args]
        if self.values:
            for sym, r in zip((op.x, op.b), rows, strict=False):
                self._write_rows(sym, r.reshape(op.rows, -1).numpy().astype("<i4"),
                                 op.row_bytes)
        nbytes = sum(a.numel() for a in args if isinstance(a, torch.Tensor))
        return _VectorState(words), stream_cycles(4 * nbytes, 4 * sum(r.numel() for r in rows),
                                                  self.exe.cfg)

    def _vector_out(self, node: Node, args: list, env, program: Program, state) -> tuple:
        """The results' int32 rows back to float (``from_fixed``; rope's back to
        ``[B, heads, T, d]``)."""
        op = program.vector
        shape = args[0].shape
        rope = node.op == "rope"
        if node.op == "softmax" and state is None and not any(a.is_meta for a in args):
            # a part: the program set causal counts (checked where the host has the mask)
            counts = _softmax_counts(node.name, torch.isfinite(args[0] + args[1]))
            if not torch.equal(counts, _causal_counts(env, op.rows)):
                raise RuntimeFault(f"node {node.name!r}: the mask is not the causal one the "
                                   "fused scores -> softmax program assumed")
        if self.values:
            y = from_fixed_torch(torch.from_numpy(self._read_rows(
                op.y, op.rows, op.row_bytes, op.length if rope else shape[-1])))
            y = _rope_rows(y, shape) if rope else y.reshape(shape)
        else:
            y = torch.zeros(shape)
        return (y,), stream_cycles(4 * y.numel(), 4 * y.numel(), self.exe.cfg)

    def _kv_append(self, stats: StepStats, phase: str) -> Kernel:
        def kernel(node: Node, args: list, env):
            t0 = time.perf_counter()
            layer = node.attrs["layer"]
            past, t = env.past, env.t
            # the keys' integer amax (as REQUANT writes it): CHANNEL's input, the scores'
            self.key_amax[layer][:, :, past:past + t] = requant_amax_torch(args[0])
            # the values' (as the on-chip append writes them): FOLD's value codes
            self.value_amax[layer][:, :, past:past + t] = value_amax_torch(args[1],
                                                                           self.kv.bits)
            # what a fused program appended on chip: the host keeps the scales
            if self._kv_free(phase, node, past + t):  # on chip, and the host keeps nothing
                stats.host.append(HostRun(node.name, node.op, time.perf_counter() - t0, 0))
                return _KVRef(layer, "k"), _KVRef(layer, "v")
            kinds = self._appended_on_chip(phase, node, past + t)
            onchip = "k" in kinds
            for kind, x in zip("kv", args, strict=True):
                if self.kv.bits == 4:
                    group = self.kv.key_format.group if kind == "k" else None
                    self._kv4_append(kind, layer, past, x, group, onchip)
                    continue
                x8, sc = kv_rows(x, self.vector)         # [1, KV, T, d], [1, KV, T]
                self.scales[(layer, kind)][:, :, past:past + t] = sc
                if not self.values or onchip:
                    continue
                offsets = self._kv_offsets(kind, past, t)  # [T, d]
                for h in range(x8.shape[1]):
                    base = self.exe.symbols[self.exe.kv.symbol(kind, layer, h)].addr
                    self.dram[base + offsets] = x8[0, h].numpy().view(np.uint8)
                    stats.written_bytes += offsets.size
            nbytes = 0 if onchip else sum(a.numel() for a in args)
            nbytes += self._append_words(layer, past, t, kinds)
            stats.host.append(HostRun(node.name, node.op, time.perf_counter() - t0,
                                      stream_cycles(4 * nbytes, nbytes, self.exe.cfg)
                                      if nbytes else 0))
            return _KVRef(layer, "k"), _KVRef(layer, "v")
        return kernel

    def _append_words(self, layer: int, past: int, t: int, onchip: frozenset[str]) -> int:
        """Write the words a fused program reads per cached position of positions ``past ..
        past + t - 1`` of ``layer`` that the step's program did not append on chip
        (``onchip``: kinds of :data:`sw.compile.kvappend.APPEND_KINDS`): each kv head's value
        codes (the value rows' integer amax, :func:`~hw.numerics.value_amax_torch`, ``c``)
        and scores' channel words (:func:`~hw.numerics.scores_channels_vector` of the key
        rows' ``amax``, ``s``), where the executable has them (a FOLD or a scores DEQUANT
        reads them); returns the bytes written."""
        written = 0
        for kind, word in (("c", self._value_code_words), ("s", self._channel_words)):
            regions = self._position_words.get((layer, kind), {})
            if kind in onchip or not regions:
                continue
            words = word(layer, past, t)                   # [KV, t]
            for h, name in regions.items():
                if self.values:
                    addr = self.exe.symbols[name].addr + 4 * past
                    self.dram[addr:addr + 4 * t] = words[h].astype("<i4").view(np.uint8)
                    self._stats.written_bytes += 4 * t
                written += 4 * t
        return written

    def _value_code_words(self, layer: int, past: int, t: int) -> np.ndarray:
        """FOLD's value codes of positions ``past .. past + t - 1`` (``[KV, t]``)."""
        return self.value_amax[layer][0, :, past:past + t].numpy()

    def _channel_words(self, layer: int, past: int, t: int) -> np.ndarray:
        """The scores' channel words of positions ``past .. past + t - 1`` (``[KV, t]``), as
        CHANNEL computes them."""
        return scores_channels_vector(self.key_amax[layer][0, :, past:past + t].numpy(),
                                      self._scores_scale[layer], self.kv.bits)

    def _kv4_append(self, kind: str, layer: int, past: int, x: torch.Tensor,
                    group: int | None, onchip: bool = False) -> None:
        """Append INT4 keys (``group``: their scale codes' group) or values ``x [1, KV, T, d]``
        at ``past`` (quantised in float, or with ``vector`` as the vector unit does it): the
        row scales stay on the host, the nibbles and codes go to each kv head's region
        (:meth:`~sw.compile.lower.KVLayout.write`) unless the step's program appended them
        on chip (``onchip``)."""
        q, codes, sc = (kv4_rows_vector_torch if self.vector else kv4_rows_torch)(x, group)
        t = x.shape[2]
        self.scales[(layer, kind)][:, :, past:past + t] = sc
        if not self.values or onchip:
            return
        positions = np.arange(past, past + t)
        size = self.kv.key_bytes if kind == "k" else self.kv.value_bytes
        for h in range(q.shape[1]):
            base = self.exe.symbols[self.exe.kv.symbol(kind, layer, h)].addr
            self.kv.write(self.dram[base:base + size], kind, positions, q[0, h].numpy(),
                          None if codes is None else codes[0, h].numpy())
            self._stats.written_bytes += q[0, h].numel() // 2 + (
                0 if codes is None else codes[0, h].numel())

    def _kv_offsets(self, kind: str, past: int, t: int) -> np.ndarray:
        """Byte offsets ``[t, head_dim]`` of positions ``past..past+t-1`` in a kv head's key
        (``kind`` "k") or value stream: the same for every layer and head, so worked out once
        a step (the last step's are kept)."""
        key = (kind, past, t)
        offsets = self._offsets.get(key)
        if offsets is None:
            if len(self._offsets) >= 2:
                self._offsets.clear()
            offsets = (self.kv.key_offsets if kind == "k" else self.kv.value_offsets)(
                np.arange(past, past + t))
            offsets.flags.writeable = False
            self._offsets[key] = offsets
        return offsets

    # ------------------------------------------------------------------ generation
    def generate(self, prompt: list[int], max_new_tokens: int, *,
                 temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
                 eos_token_id: int | None = None,
                 on_token: Callable[[int], None] | None = None,
                 logits: bool = True) -> Generation:
        """Generate from ``prompt`` (the cache is reset first): greedy by default, else sampled
        with ``temperature`` / ``top_k`` (:func:`sw.models.generate.sample_next`, seeded).
        With ``logits`` False, a greedy step whose program picks the token on chip reads back
        only that token (its :attr:`Generation.logits` entry is None)."""
        self.reset()
        gen = torch.Generator().manual_seed(seed)

        def keep(phase: str) -> bool:
            return logits or temperature != 0 or not self.argmax_on_chip(phase)

        logits_, st = self.step(torch.tensor([prompt]), logits=keep("prefill"))
        steps, outs, all_logits = [st], [], [logits_]
        for i in range(max_new_tokens):
            # greedy: the chip's ARGMAX where the program has one (the first maximum, as
            # torch.argmax picks it from the same Q15.16 logits read back exactly)
            nxt = self.argmax if temperature == 0 and self.argmax is not None \
                else int(sample_next(logits_[:, -1], temperature, top_k, gen)[0])
            outs.append(nxt)
            if on_token:
                on_token(nxt)
            if (eos_token_id is not None and nxt == eos_token_id) or i == max_new_tokens - 1:
                break
            logits_, st = self.step(torch.tensor([[nxt]]), logits=keep("decode"))
            steps.append(st)
            all_logits.append(logits_)
        return Generation(list(prompt), outs, steps, all_logits)


#: Host side of an accelerator node by the weight operand its op streams (``OPS[op].streams``),
#: or ``"vector"`` for an op lowered to the vector engine (:func:`_io_kind`):
#: prologue(rt, node, args, env, program) -> (state, cycles) and
#: epilogue(rt, node, args, env, program, state) -> (outputs, cycles).
_IO = {"weights": (Runtime._linear_in, Runtime._linear_out),
       "kv": (Runtime._attention_in, Runtime._attention_out),
       "vector": (Runtime._vector_in, Runtime._vector_out)}


def _io_kind(op: str) -> str | None:
    """The :data:`_IO` entry of an accelerator node of ``op`` (None: it has none)."""
    d = OPS[op]
    return d.streams or ("vector" if d.vector is not None else None)


class _StepPlan(NamedTuple):
    """What a step runs (node names) and the values the host needs (their values; others
    it reads at most the shape of): :meth:`Runtime._step_plan`."""

    runs: frozenset[str]
    live: frozenset[str]


def _placeholder(ty, positions: int) -> torch.Tensor:
    """A value the host does not compute, of type ``ty`` for ``S = positions``: its shape
    only (a tensor without data, which no kernel can compute with)."""
    dtype = torch.int64 if ty.dtype == "i64" else torch.float32
    return torch.empty(ty.resolve(positions), dtype=dtype, device="meta")


class _VectorState(NamedTuple):
    """A vector prologue's state: the program's words with its run-time ``imm`` set (None:
    the program's own)."""

    words: np.ndarray | None


#: Where a VEC's ``imm`` lies in its two 64-bit words.
_IMM_AT, _IMM_BITS = field_location("vec.imm")
if _IMM_AT // 64 != (_IMM_AT + _IMM_BITS - 1) // 64:
    raise ImportError("vec.imm straddles the instruction's 64-bit halves")


def _set_imm(program: Program, values: np.ndarray) -> np.ndarray:
    """A copy of ``program``'s words with the ``imm`` of its ``imm_rows`` set to ``values``
    (one per row), relative to no run-time register."""
    rows = np.asarray(program.imm_rows, dtype=np.int64)
    if rows.size != values.size:
        raise RuntimeFault(f"program of node {program.node!r} has {rows.size} run-time "
                           f"parameters, the step gives {values.size}")
    words = program.words.copy()
    for (at, bits), value in ((field_location("vec.imm"), np.asarray(values, np.uint64)),
                              (field_location("vec.reg"), np.uint64(0))):
        half, off = divmod(at, 64)
        if (at + bits - 1) // 64 != half:
            raise RuntimeFault("a VEC field straddles the instruction's 64-bit halves")
        mask = np.uint64((1 << bits) - 1) << np.uint64(off)
        words[rows, half] = (words[rows, half] & ~mask) | (value << np.uint64(off))
    return words


def _relative_counts(op, past: int) -> torch.Tensor:
    """The valid positions a SOFTMAX program's VECs give its rows at first position ``past``
    (:attr:`~sw.compile.vector.VectorOp.positions`: relative to ``pos``, causal), or -1
    each where they are not relative (then the host sets them)."""
    if not op.positions:
        return torch.full((op.rows,), -1)
    return past + torch.arange(op.rows) % op.positions + 1


def _softmax_counts(node: str, valid: torch.Tensor) -> torch.Tensor:
    """Each row's valid positions of a softmax's ``valid [..., S]`` (finite ``scores +
    mask``), which must be a prefix of the row (the vector engine's SOFTMAX takes its first
    ``imm`` positions)."""
    s = valid.shape[-1]
    valid = valid.reshape(-1, s)
    counts = valid.sum(-1)
    if not torch.equal(valid, torch.arange(s) < counts[:, None]):
        raise RuntimeFault(f"node {node!r}: the vector engine's softmax takes the first "
                           "positions of a row as valid, the mask is not a prefix; compile "
                           "with CompileOptions(vector=False)")
    return counts


def _causal_counts(env, rows: int) -> torch.Tensor:
    """The valid positions of ``rows`` softmax rows (heads of the step's tokens, a head's
    tokens consecutive) under the step's causal mask."""
    if env.window is None:  # token i of the step sees the cached positions and i + 1 more
        return (env.past + torch.arange(1, env.t + 1)).repeat(rows // env.t)
    mask = causal_mask(env.t, env.past, torch.float32, torch.device("cpu"), env.window)
    counts = _softmax_counts("causal mask", torch.isfinite(mask))
    return counts.repeat(rows // env.t)


def _rope_rows(x: torch.Tensor, shape: torch.Size | None = None) -> torch.Tensor:
    """q or k ``[B, heads, T, d]`` as ROPE's rows ``[B * T, heads * d]`` (a token's heads
    side by side); with ``shape``, such rows back to a contiguous tensor of that shape."""
    if shape is None:
        return rope_rows(x)
    b, h, t, d = shape
    return x.reshape(b, t, h, d).transpose(1, 2).contiguous()


def _embedding_served(exe: Executable) -> tuple[dict[str, int], str | None]:
    """The buffer whose rows the decode programs' ``embed_rows`` read (the input rows of the
    first vector node that reads the embedding lookup's result) with its row bytes, and
    that node (None, and no buffer: the decode programs read no embedding table)."""
    g = exe.graphs.get("decode")
    if g is None or not any(p.embed_rows for p in exe.programs if p.phase == "decode"):
        return {}, None
    value = next(n.outputs[0] for n in g.nodes if n.op == "embed")
    vector = {p.node: p.vector for p in exe.programs
              if p.phase == "decode" and p.vector is not None}
    reader = next(n.name for n in g.nodes if n.inputs and n.inputs[0] == value
                  and n.name in vector)
    return {vector[reader].x: vector[reader].row_bytes}, reader


def _position_words(exe: Executable, nodes) -> dict[tuple[int, str], dict[int, str]]:
    """The regions of words per cached position the host writes as the cache grows, per
    ``(layer, kind)``: kv head -> symbol of its value codes (``"c"``, a values member's
    ``codes``) or scores' channel words (``"s"``, a scores member's ``channels``); a member
    ``j`` of ``n`` reads kv head ``j // (n / kv_heads)``'s (of a node's own program or part:
    a fused program lists every part's members)."""
    out: dict[tuple[int, str], dict[int, str]] = {}
    for p in exe.programs:
        node = nodes.get(p.phase, {}).get(p.node)
        if node is None or node.op not in ("attn_scores", "attn_values") or not p.members \
                or p.parts:
            continue
        per = max(1, len(p.members) // exe.kv.kv_heads)
        for j, m in enumerate(p.members):
            for kind, name in (("c", m.codes), ("s", m.channels)):
                if name:
                    out.setdefault((node.attrs["layer"], kind), {})[j // per] = name
    return out


def _nbytes(tensors) -> int:
    """Bytes of ``tensors`` on the host link: a float64 activation (the vector unit's exact
    Q15.16 word, :func:`hw.numerics.from_fixed`) is a 4-byte word there."""
    return sum(t.numel() * (4 if t.dtype == torch.float64 else t.element_size())
               for t in tensors if isinstance(t, torch.Tensor))


def to_dict(s: StepStats) -> dict:
    """A step's costs as JSON-serialisable data (traces dropped)."""
    d = asdict(s)
    for p in d["programs"]:
        p.pop("trace", None)
    return d

