"""The compiler's output: one typed :class:`Executable` that every backend runs.

It is the whole contract between the compiler and the runtime; the runtime reads every
decision from it and imports nothing else of the compiler but the IR:

==================  ===========================================================================
field               what it holds
==================  ===========================================================================
``cfg``             the accelerator configuration it was compiled for
``model``           the model's :class:`~sw.models.config.LlamaConfig`
``graphs``          per phase (``prefill`` of the prompt, ``decode`` of one token) the optimised
                    graph whose host nodes the runtime executes
``programs``        every encoded :class:`Program` with its :class:`ProgramMember` s (the DRAM
                    symbols of its operands, their geometry and the host tensors around them),
                    or, for a host op on the vector engine, its
                    :class:`~sw.compile.vector.VectorOp`
``table``           the per-context :class:`ProgramTable`: which program runs an accelerator
                    node for a step attending to ``S`` positions
``symbols``         the DRAM :class:`~sw.compile.plan.Region` of every tensor (by symbol)
``image``           the initial bytes of the packed weights (by symbol); empty: timing-only
``host``            host tensors: parameters of host nodes, biases, the row scales of
                    compressed layers (``host_shapes`` has every shape, data or not)
``kv``              the :class:`KVCachePlan`: the cache's stream layout and its symbols
``io``              the :class:`IOBinding`: prompt length, context, vocabulary
``report``          what the compiler measured (times, pass counts, memory), for people
==================  ===========================================================================

:func:`save` / :func:`load` write it as one checksummed safetensors file (:mod:`sw.artifact`,
every byte covered by a SHA-256) of format :data:`FORMAT_VERSION`; a file of another version is
refused with one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from hw.config import AcceleratorConfig
from hw.isa import RegTerm
from sw.artifact import ArtifactError, load_artifact, save_artifact
from sw.compile.errors import ExecutableError, IRError
from sw.compile.ir import Graph
from sw.compile.lower import KVLayout
from sw.compile.plan import Region
from sw.compile.vector import VectorOp
from sw.models.config import LlamaConfig

__all__ = ["Executable", "Program", "ProgramMember", "ProgramTable", "KVCachePlan",
           "IOBinding", "FORMAT_VERSION", "save", "load"]

#: The file format's version: a new one whenever a field is added, dropped or changes
#: meaning (a reader refuses every other version, naming both).
FORMAT_VERSION = 7
_KEY = "nmfpga-executable"


#: The symbol of the embedding table a decode program's ``embed_rows`` read (every token's
#: embedding row as Q15.16 words).
EMBEDDING_TABLE = "embedding"


@dataclass(frozen=True)
class ProgramMember:
    """One GEMM of a program: ``y[tokens, n] = x[tokens, k] @ w[n, k]^T`` over DRAM symbols.

    ``b``: the int32 bias rows of a biased layer (as many bytes as its outputs);
    ``act_row_bytes`` / ``out_row_bytes``: DRAM bytes per row of ``x`` / ``y``;
    ``stream_bytes`` and ``macs``: the minimal work (weight bytes read, kept-weight MACs);
    ``row_scale``: the host tensor of a compressed layer's row scales, ``bias`` the parameter
    its bias rows come from (None for attention members); ``dequant``: where a fused
    program's DEQUANT part left its outputs as Q15.16 rows, ``dequant_row_bytes`` apart
    (None: the host dequantises ``y``); ``argmax``: where an ARGMAX part left each row's
    first maximum, its index and value in one beat per row (None: none); ``amax`` and
    ``channels``: where the host writes the ``amax`` words of the input rows (word 0 of a
    beat per row) and the channel words of the outputs (one int32 per output column) for a
    DEQUANT part that reads the host's (attention's scores; None: none; ``amax`` None with
    ``channels``: a REQUANT part writes the input rows and their ``amax`` on chip);
    ``requant``: where the host writes the input rows as Q15.16 words (``to_fixed``),
    ``requant_row_bytes`` apart, for a fused program's REQUANT part that writes ``x`` on chip
    (None: the host writes ``x``); ``residual``: where it writes a residual linear's residual
    rows likewise, ``dequant_row_bytes`` apart, for a part that reads them, before the fused
    program runs (without ``requant`` too: its input rows are on chip; None: none, or an
    earlier program left them on chip where the part reads them);
    ``codes``: where the host writes the value codes (one int32 per cached position,
    :func:`hw.numerics.value_codes`) a FOLD part reads to write the input rows on chip
    (attention's values; None: none).
    """

    w: str
    x: str
    y: str
    tokens: int
    n: int
    k: int
    act_row_bytes: int
    out_row_bytes: int
    stream_bytes: int
    macs: int
    b: str | None = None
    row_scale: str | None = None
    bias: str | None = None
    dequant: str | None = None
    dequant_row_bytes: int = 0
    argmax: str | None = None
    amax: str | None = None
    channels: str | None = None
    requant: str | None = None
    requant_row_bytes: int = 0
    residual: str | None = None
    codes: str | None = None


@dataclass(frozen=True, eq=False)
class Program:
    """One encoded program (``words``: uint64 ``[n, 2]``, END included) of node ``node`` in
    ``phase`` (``bucket``: the key positions an attention program covers). Programs of one
    ``template`` differ only in DRAM addresses, so their timing is identical.

    A vector program (a host op on the vector engine) has no members but its ``vector``
    operation, and ``imm_rows``: the index of each row's SOFTMAX VEC, whose ``imm`` (the
    row's valid positions) counts from a run-time register holding ``pos`` (the step's first
    position, :attr:`Executable.registers`, :func:`hw.isa.relative_fields`) for a causal
    mask (the host sets it in a copy of ``words`` for another mask), and ``position_rows``:
    a ROPE's LOADs of its rotary table rows, relative to a register holding ``pos`` times
    the table's row beats.

    Fused programs (:mod:`sw.compile.fusion`): a program that runs several accelerator nodes
    lists their programs in ``parts`` (node order) and its minimal work ``(read bytes, write
    bytes, MACs)`` in ``work``; each part keeps its node's operands (members or vector
    operation) for the host's prologue and epilogue, has no words and names the program
    that runs it in ``fused_into``. A fused decode program that appends a layer's keys and
    values on chip (:mod:`sw.compile.kvappend`, built for position 0) lists in
    ``append_rows`` each word the step's position moves, ``(index, kind, field, layer)``:
    a LOAD's or STORE's ``dram_addr`` (``field`` "dram_addr") or an INSERT's ``imm`` base
    ("imm") in the key ("k"), value ("v") or value code ("c") region, each relative to a
    run-time register holding its :meth:`~sw.compile.lower.KVLayout.append_terms`. A
    decode program's LOADs of the token's embedding rows (a buffer the embedding lookup
    computes) are its ``embed_rows``: LOADs of the constant embedding table
    (``symbols.embedding_table()``) relative to a run-time register holding ``tok`` (the
    step's token) times the table's row beats, so the host writes neither the rows nor the
    words. A joined decode step's STOREs of rows that only a move carries on and nobody reads
    (:func:`sw.compile.onchip.quiet_stores`) are SYNCs of the STORE engine in ``words``;
    ``quiet_rows`` lists each as ``(index, low word, high word)`` of the STORE, which
    ``Runtime(read_back_all=True)`` puts back to read every node's rows."""

    phase: str
    node: str
    bucket: int | None
    words: np.ndarray
    members: tuple[ProgramMember, ...]
    template: int = 0
    vector: VectorOp | None = None
    imm_rows: tuple[int, ...] = ()
    fused_into: int | None = None
    parts: tuple[int, ...] = ()
    work: tuple[int, int, int] | None = None
    position_rows: tuple[int, ...] = ()
    append_rows: tuple[tuple[int, str, str, int], ...] = ()
    embed_rows: tuple[int, ...] = ()
    quiet_rows: tuple[tuple[int, int, int], ...] = ()

    @property
    def instructions(self) -> int:
        return int(self.words.shape[0])

    @property
    def read_bytes(self) -> int:
        """Bytes the program must read at least: weights, int8 inputs (shared ones once) and
        bias rows."""
        if self.work is not None:
            return self.work[0]
        if self.vector is not None:
            return self.vector.read_bytes
        inputs = {m.x: m.tokens * m.k for m in self.members}
        bias = sum(m.tokens * m.n * 4 for m in self.members if m.b)
        return sum(m.stream_bytes for m in self.members) + sum(inputs.values()) + bias

    @property
    def write_bytes(self) -> int:
        if self.work is not None:
            return self.work[1]
        if self.vector is not None:
            return self.vector.write_bytes
        return sum(m.tokens * m.n * 4 for m in self.members)

    @property
    def macs(self) -> int:
        if self.work is not None:
            return self.work[2]
        return sum(m.macs for m in self.members)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Program):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self)
                   if f.name != "words") and np.array_equal(self.words, other.words)


@dataclass(frozen=True)
class ProgramTable:
    """Which program runs each accelerator node, per phase and context.

    ``entries[phase][node]`` is a tuple of ``(first, last, program index)``: a step attending
    to ``S`` key positions, ``first <= S <= last``, runs that program. A program that does not
    depend on the context covers every one (``first = 1``, ``last`` the executable's
    ``max_context``); an attention program covers the contexts of its bucket.

    Example
    -------
    >>> t = ProgramTable({"decode": {"attn": ((17, 32, 0), (33, 48, 1)), "mlp": ((1, 48, 2),)}})
    >>> t.lookup("decode", "attn", 33), t.lookup("decode", "mlp", 33), t.lookup("decode", "x", 1)
    (1, 2, None)
    >>> t.lookup("decode", "attn", 16) is None
    True
    """

    entries: Mapping[str, Mapping[str, tuple[tuple[int, int, int], ...]]]

    def nodes(self, phase: str) -> frozenset[str]:
        """The accelerator nodes of ``phase``."""
        return frozenset(self.entries.get(phase, {}))

    def lookup(self, phase: str, node: str, positions: int) -> int | None:
        """The program index of ``node`` for a step attending to ``positions`` key positions;
        None if ``node`` does not run on the accelerator or no program covers them."""
        for first, last, pid in self.entries.get(phase, {}).get(node, ()):
            if first <= positions <= last:
                return pid
        return None


@dataclass(frozen=True)
class KVCachePlan:
    """The KV cache in accelerator memory: the stream layout of every kv head's keys and
    values, and their DRAM symbols ``keys[layer][head]`` / ``values[layer][head]`` (empty
    when attention runs on the host)."""

    layout: KVLayout
    layers: int
    kv_heads: int
    on_accelerator: bool
    keys: tuple[tuple[str, ...], ...] = ()
    values: tuple[tuple[str, ...], ...] = ()

    def symbol(self, kind: str, layer: int, head: int) -> str:
        """The symbol of the keys (``kind="k"``) or values (``"v"``) of one head."""
        return (self.keys if kind == "k" else self.values)[layer][head]


@dataclass(frozen=True)
class IOBinding:
    """What a step takes and gives: ``prompt_tokens`` ids in the prefill, one in each decode
    step, up to ``max_context`` positions; token ids below ``vocab_size``; decode programs
    exist for ``decode_contexts`` (key positions)."""

    prompt_tokens: int
    max_context: int
    vocab_size: int
    decode_contexts: tuple[int, ...]


@dataclass
class Executable:
    """A compiled model (see the module docstring)."""

    cfg: AcceleratorConfig
    model: LlamaConfig
    graphs: dict[str, Graph]
    programs: list[Program]
    table: ProgramTable
    symbols: dict[str, Region]
    image: dict[str, np.ndarray]
    host: dict[str, np.ndarray]
    host_shapes: dict[str, tuple[int, ...]]
    kv: KVCachePlan
    io: IOBinding
    report: dict = field(default_factory=dict)
    #: The run-time register table: register ``i + 1`` holds the sum of ``registers[i]``
    #: (:class:`hw.isa.RegTerm`) of the step's position and token, which the host evaluates
    #: as it starts a step (:func:`hw.isa.reg_table_values`; :mod:`sw.compile.registers`).
    registers: tuple[tuple[RegTerm, ...], ...] = ()

    def program_index(self, phase: str, node: str, positions: int) -> int:
        """The index in :attr:`programs` of accelerator node ``node``'s program for a
        ``phase`` step attending to ``positions`` key positions.

        Raises
        ------
        ExecutableError
            No program was compiled for that node and context.
        """
        pid = self.table.lookup(phase, node, positions)
        if pid is None:
            raise ExecutableError(
                f"no program for node {node!r} of {phase} at {positions} key positions: the "
                f"executable was compiled for prompt_tokens={self.io.prompt_tokens}, "
                f"max_context={self.io.max_context}")
        return pid

    @property
    def timing_only(self) -> bool:
        """Compiled without weights: programs and timing, no values."""
        return not self.image

    @property
    def instructions(self) -> int:
        return sum(p.instructions for p in self.programs)

    def dram_image(self) -> np.ndarray:
        """The initial DRAM: zeros with the packed weights in place."""
        dram = np.zeros(self.cfg.memory.size_bytes, dtype=np.uint8)
        for name, data in self.image.items():
            r = self.symbols[name]
            dram[r.addr:r.addr + data.size] = data
        return dram


# ---------------------------------------------------------------------- file format
def _program_doc(p: Program) -> dict:
    doc = {"phase": p.phase, "node": p.node, "bucket": p.bucket, "template": p.template,
           "instructions": p.instructions, "members": [asdict(m) for m in p.members]}
    if p.vector is not None:  # absent for the others: their documents are as before
        doc.update(vector=p.vector.to_dict(), imm_rows=list(p.imm_rows),
                   position_rows=list(p.position_rows))
    if p.fused_into is not None:
        doc.update(fused_into=p.fused_into)
    if p.parts:
        doc.update(parts=list(p.parts), work=list(p.work))
        if p.position_rows:  # its ROPE parts' table LOADs
            doc.update(position_rows=list(p.position_rows))
        if p.imm_rows:  # its SOFTMAX parts' VECs
            doc.update(imm_rows=list(p.imm_rows))
        if p.append_rows:  # its KV append's words
            doc.update(append_rows=[list(r) for r in p.append_rows])
    if p.embed_rows:  # its LOADs of the token's embedding rows
        doc.update(embed_rows=list(p.embed_rows))
    if p.quiet_rows:  # its STOREs nobody reads, as SYNCs
        doc.update(quiet_rows=[list(r) for r in p.quiet_rows])
    return doc


def _kv_doc(kv: KVCachePlan) -> dict:
    return {**asdict(kv), "layout": asdict(kv.layout)}


def save(exe: Executable, path: str | Path) -> Path:
    """Write ``exe`` to ``path`` (one checksummed safetensors file, written atomically)."""
    words = [p.words for p in exe.programs]
    tensors = {"programs": (np.concatenate(words) if words
                            else np.zeros((0, 2), np.uint64)).view(np.uint8).reshape(-1)}
    tensors.update({f"image/{k}": v for k, v in exe.image.items()})
    tensors.update({f"host/{k}": v for k, v in exe.host.items()})
    doc = {"version": FORMAT_VERSION, "config": exe.cfg.to_dict(), "model": exe.model.to_dict(),
           "graphs": {k: g.to_dict() for k, g in exe.graphs.items()},
           "programs": [_program_doc(p) for p in exe.programs],
           "table": {ph: {n: [list(r) for r in rows] for n, rows in nodes.items()}
                     for ph, nodes in exe.table.entries.items()},
           "symbols": {k: asdict(r) for k, r in exe.symbols.items()},
           "host_shapes": {k: list(v) for k, v in exe.host_shapes.items()},
           "kv": _kv_doc(exe.kv), "io": asdict(exe.io), "report": exe.report,
           "registers": [[t.to_list() for t in terms] for terms in exe.registers]}
    return save_artifact(path, _KEY, tensors, doc)


def load(path: str | Path) -> Executable:
    """Read and verify a file written by :func:`save`.

    Raises
    ------
    ExecutableError
        Missing, corrupted (any checksum), of another version, or inconsistent.
    """
    try:
        tensors, doc = load_artifact(path, _KEY)
    except ArtifactError as e:
        raise ExecutableError(str(e)) from None
    if doc.get("version") != FORMAT_VERSION:
        raise ExecutableError(f"{path}: executable format version {doc.get('version')!r}, "
                              f"this toolkit reads version {FORMAT_VERSION}; compile the model "
                              "again")
    try:
        return _from_doc(tensors, doc)
    except ExecutableError:
        raise
    except (KeyError, TypeError, IRError, ValueError) as e:
        raise ExecutableError(f"{path}: inconsistent executable ({e!r})") from None


def _from_doc(tensors: dict[str, np.ndarray], doc: dict) -> Executable:
    words = tensors["programs"].view(np.uint64).reshape(-1, 2)
    lengths = [p["instructions"] for p in doc["programs"]]
    if sum(lengths) != words.shape[0]:
        raise ExecutableError("the program table does not match the program words")
    starts = np.cumsum([0] + lengths)
    programs = [
        Program(p["phase"], p["node"], p["bucket"], words[a:b].copy(),
                tuple(ProgramMember(**m) for m in p["members"]), p["template"],
                VectorOp.from_dict(p["vector"]) if p.get("vector") else None,
                tuple(p.get("imm_rows", ())), p.get("fused_into"), tuple(p.get("parts", ())),
                tuple(p["work"]) if p.get("work") else None,
                tuple(p.get("position_rows", ())),
                tuple(tuple(r) for r in p.get("append_rows", ())),
                tuple(p.get("embed_rows", ())),
                tuple(tuple(r) for r in p.get("quiet_rows", ())))
        for p, a, b in zip(doc["programs"], starts[:-1], starts[1:], strict=True)]
    kv = doc["kv"]
    return Executable(
        cfg=AcceleratorConfig.from_dict(doc["config"]),
        model=LlamaConfig.from_dict(doc["model"]),
        graphs={k: Graph.from_dict(g) for k, g in doc["graphs"].items()},
        programs=programs,
        table=ProgramTable({ph: {n: tuple(tuple(r) for r in rows)
                                 for n, rows in nodes.items()}
                            for ph, nodes in doc["table"].items()}),
        symbols={k: Region(**r) for k, r in doc["symbols"].items()},
        image={k.removeprefix("image/"): v for k, v in tensors.items()
               if k.startswith("image/")},
        host={k.removeprefix("host/"): v for k, v in tensors.items() if k.startswith("host/")},
        host_shapes={k: tuple(v) for k, v in doc["host_shapes"].items()},
        kv=KVCachePlan(KVLayout(**kv["layout"]), kv["layers"], kv["kv_heads"],
                       kv["on_accelerator"], tuple(tuple(h) for h in kv["keys"]),
                       tuple(tuple(h) for h in kv["values"])),
        io=IOBinding(**{**doc["io"], "decode_contexts": tuple(doc["io"]["decode_contexts"])}),
        report=doc["report"],
        registers=tuple(tuple(RegTerm.from_list(t) for t in terms)
                        for terms in doc["registers"]))
