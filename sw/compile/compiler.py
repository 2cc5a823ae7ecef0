"""``compile_model``: a LLaMA-style model to one :class:`~sw.compile.executable.Executable`.

The pipeline, each stage a small pure function::

    capture (torch.export -> IR)      sw/compile/capture.py    prefill of T tokens, decode
    passes  (DCE, GQA, grouping,      sw/compile/passes.py     to a fixpoint, reported
             epilogue fusion)
    partition                          here                     each node: accelerator or host
    plan    (DRAM: weights, KV cache,  sw/compile/plan.py       arena by liveness vs. its
             activation arena)                                   lower bound
    lower   (programs, relocated)      sw/compile/lower.py      one per accelerator node
                                                                 (and context bucket)
    fusion  (vector node + linear,     sw/compile/fusion.py     one program for each
             and chains of them)                                 pair or chain

A node runs on the accelerator when the hardware can compute it: a linear whose layer has a
format (compressed weights, or a format for timing-only compilation), the attention
products (INT8 KV cache) and, on a configuration with a vector engine, the ops with a VEC
sub-op (``OPS[op].vector``: RMSNorm, RoPE, softmax, SiLU-gate, addition; :mod:`sw.compile.vector`).
Everything else runs on the host; each accelerator node is one program, i.e. one host ->
accelerator -> host round trip (two *transitions*), except the pairs and chains
``CompileOptions.fuse_programs`` and ``chain_programs`` run as one (:mod:`sw.compile.fusion`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from torch import nn
from tqdm.auto import tqdm

from hw.config import AcceleratorConfig
from hw.format import QuantizedWeight, WeightFormat, stream_layout
from hw.isa import (
    NO_EVENT,
    Opcode,
    Spad,
    VecFunc,
    decode,
    decode_fields,
    is_move,
    program_words,
)
from hw.numerics import (
    ACT_MAX,
    dequant_channels,
    norm_weight,
    rope_pairs,
    rope_table,
    scores_scale_word,
    to_fixed,
    values_channel,
)
from sw.compile import symbols as sym
from sw.compile.blockloop import (
    FramePlan,
    block_period,
    copy_row,
    frame_plan,
    frame_symbols,
    instructions,
    roll_blocks,
)
from sw.compile.capture import CaptureResult, capture
from sw.compile.errors import CompileError, LoweringError, PlanError
from sw.compile.executable import (
    Executable,
    IOBinding,
    KVCachePlan,
    Program,
    ProgramMember,
    ProgramTable,
)
from sw.compile.fusion import (
    AHEAD_FILLS,
    AHEAD_ROUNDS,
    HOIST_FILL,
    ArgmaxOp,
    DequantOp,
    FusedGroup,
    RequantOp,
    all_groups,
    attention_chains,
    dram_extent,
    fuse_parts,
    fusion_groups,
    kv_appends,
    load_idle,
    loads_ahead,
    overlapping,
    part_aliases,
    part_buffers,
    part_constants,
    row_aliases,
    rows_left,
    scores_groups,
    timeline,
    vector_events,
)
from sw.compile.ir import OPS, Graph, Node, linear_layers
from sw.compile.ir.types import SYMBOL
from sw.compile.kvappend import KVAppendOp, kv_append_words
from sw.compile.lower import KVLayout, Member, context_bucket, node_members, value_residue
from sw.compile.memo import fuse_parts_cached, moves_cached
from sw.compile.onchip import (
    moved_waits,
    onchip_moves,
    out_moves,
    quiet_stores,
    quieten,
    vout_moves,
)
from sw.compile.passes import PassReport, default_passes, last_token_logits, run_passes
from sw.compile.plan import (
    ArenaPlan,
    Buffer,
    DramLayout,
    Region,
    buffer_regions,
    layout_dram,
    plan_arena,
)
from sw.compile.registers import TOK, RegisterFile, allocate
from sw.compile.relocation import (
    OPERANDS,
    Template,
    lower_argmax_template,
    lower_dequant_template,
    lower_requant_template,
    lower_template,
    lower_vector_template,
    relocate,
)
from sw.compile.roll import roll_words
from sw.compile.tiling import stream_bytes, weight_image
from sw.compile.vector import VectorOp, row_bytes, vector_op
from sw.models.llama import LlamaLM, rotary_tables

_log = logging.getLogger(__name__)

__all__ = ["CompileOptions", "capture_model", "compile_model", "accelerator_nodes", "vector_ops",
           "static_dram_bytes", "fuses_programs"]


@dataclass(frozen=True)
class CompileOptions:
    """What to compile.

    Parameters
    ----------
    prompt_tokens : int
        Tokens of the prefill step.
    max_context : int
        KV-cache capacity: the longest context a decode step attends to.
    decode_contexts : iterable of int, optional
        Contexts (key positions, the new token included) to build decode attention programs
        for; default every one from ``prompt_tokens + 1`` to ``max_context``.
    fuse : bool
        Run the GQA, grouping and epilogue-fusion passes (off: the unfused baseline).
    attention : bool
        Attention products on the accelerator (INT8 KV cache); off: on the host in float.
    kv_bits : int
        Width of the KV cache's elements on the accelerator: 8, or 4 (group-quantised keys,
        per-position values: :func:`hw.numerics.kv4_rows`, :func:`sw.compile.lower.key_format`).
    phases : tuple of str
        Which steps to compile.
    logits : str
        ``"all"``: the logits of every position of a step (what the model returns);
        ``"last"``: only the last position's, all that generation needs (the LM head then
        runs on one row in prefill too).
    vector : bool
        On a configuration with a vector engine (``cfg.has_vector``), run the ops with a VEC
        sub-op on it (off: on the host, as without the engine). The runtime must then compute
        with the vector unit's numerics (``Runtime(vector=True)``).
    loops : bool or None
        Roll each program's periodic runs into hardware loops (REPEAT,
        :func:`sw.compile.roll.roll`): fewer instruction words, the same instructions
        dispatched. False: fully unrolled programs; None (the default): only the programs
        that would not fit the instruction memory unrolled are rolled.
    fuse_programs : bool, optional
        Run a vector node and the linear node that reads its rows as one program, the
        requantisation between them and the dequantisation after on chip
        (:mod:`sw.compile.fusion`); default (None): on when ``vector`` runs ops on a vector
        engine (:func:`fuses_programs`).
    chain_programs : bool
        With ``fuse_programs``, run consecutive fused programs whose boundary values stay on
        chip as one (:func:`sw.compile.fusion.fusion_groups`).
    argmax : bool
        With ``fuse_programs``, end a fused program whose linear computes the logits (an
        accelerated LM head after the final norm) with an ARGMAX of each row: the runtime
        takes the last row's index as the next greedy token (``Runtime.argmax``).
    one_program : bool
        With ``chain_programs``, join a decode step's fused programs into one program per
        context bucket (:func:`_join_step`) where every value between them stays on chip and
        it fits the instruction memory; the step's buffers then live through the whole step.
    block_loop : bool or None
        With ``one_program``, run the joined step's decoder blocks as one REPEAT of one
        block (:mod:`sw.compile.blockloop`): the symbols the blocks address are laid out in
        one frame per layer after the rest of the DRAM, where the DRAM holds them; the step
        first copies the token's embedding row from the table into frame 0
        (:func:`sw.compile.blockloop.copy_row`) where the DRAM holds the table too, else
        the host writes the row. True: wherever the blocks roll; None (the default): where
        a step joins only so (it does not fit the instruction memory unrolled); False:
        never.
    """

    prompt_tokens: int
    max_context: int
    decode_contexts: tuple[int, ...] | None = None
    fuse: bool = True
    attention: bool = True
    kv_bits: int = 8
    phases: tuple[str, ...] = ("prefill", "decode")
    logits: str = "all"
    vector: bool = True
    loops: bool | None = None
    fuse_programs: bool | None = None
    chain_programs: bool = True
    argmax: bool = False
    one_program: bool = True
    block_loop: bool | None = None


def fuses_programs(cfg: AcceleratorConfig, opts: CompileOptions) -> bool:
    """Whether a compilation for ``cfg`` fuses programs (:mod:`sw.compile.fusion`):
    ``opts.fuse_programs``, by default on where the vector engine runs host ops."""
    if opts.fuse_programs is not None:
        return opts.fuse_programs
    return cfg.has_vector and opts.vector


def accelerator_nodes(g: Graph, accelerated: Iterable[str], attention: bool = True,
                      vector: Iterable[str] = ()) -> list[Node]:
    """The nodes of ``g`` that run on the accelerator, in order (the partition): ops that may
    (``OPS[op].streams``) whose weight operand is there -- every layer compressed (or given
    a format) for ``"weights"``, the INT8 KV cache (``attention``) for ``"kv"`` -- and the
    ops named in ``vector`` that have a VEC sub-op (``OPS[op].vector``; a configuration with
    a vector engine: :func:`vector_ops`)."""
    acc, vec = set(accelerated), set(vector)
    out = []
    for n in g.nodes:
        streams = OPS[n.op].streams
        if streams == "kv" and attention:
            out.append(n)
        elif n.op in vec and OPS[n.op].vector is not None:
            out.append(n)
        elif streams == "weights":
            on = [layer.layer in acc for layer in linear_layers(n)]
            if all(on):
                out.append(n)
            elif any(on):
                raise CompileError(f"node {n.name!r} groups layers that do not all run on "
                                   "the accelerator")
    return out


def vector_ops(model: LlamaLM, cfg: AcceleratorConfig, opts: CompileOptions) -> frozenset[str]:
    """The ops that run on ``cfg``'s vector engine: every op with a VEC sub-op, if it has one
    and ``opts.vector``; but the softmax stays on the host when a sliding window shorter than
    the context makes a row's valid positions other than its first ones (SOFTMAX's ``imm``
    counts from the start of the row)."""
    if not (cfg.has_vector and opts.vector):
        return frozenset()
    ops = {name for name, d in OPS.items() if d.vector is not None}
    window = model.config.sliding_window
    if window is not None and window < opts.max_context:
        ops.discard("softmax")
    return frozenset(ops)


def _linear_layers(model: LlamaLM) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def capture_model(model: LlamaLM, options: CompileOptions) -> dict[str, CaptureResult]:
    """The captured graph of every phase of ``options`` (reusable across compilations)."""
    return {phase: capture(model, phase, options.prompt_tokens) for phase in options.phases}


def compile_model(model: LlamaLM, cfg: AcceleratorConfig, options: CompileOptions, *,
                  weights: Mapping[str, QuantizedWeight] | None = None,
                  formats: Mapping[str, WeightFormat] | None = None,
                  captured: Mapping[str, CaptureResult] | None = None,
                  progress: bool = False) -> Executable:
    """Compile ``model`` for ``cfg``.

    Parameters
    ----------
    model : LlamaLM
        The model (on the ``meta`` device for timing-only compilation of large shapes).
    cfg : AcceleratorConfig
        The accelerator.
    options : CompileOptions
        Prompt length, context, passes.
    weights : mapping, optional
        Compressed layers (module name -> QuantizedWeight): they run on the accelerator and
        their packed streams form the DRAM image.
    formats : mapping, optional
        Instead of ``weights``: the format of each accelerated layer, for a timing-only
        executable (no DRAM image, no values).
    captured : mapping, optional
        :func:`capture_model` of the same model and options, to skip the capture.
    progress : bool
        A progress bar (tqdm) over the nodes each lowering lowers.

    Raises
    ------
    CompileError
        Unsupported ops (:class:`~sw.compile.capture.CaptureError`), layers that do not fit
        (:class:`~sw.compile.errors.LoweringError`), a model larger than the DRAM
        (:class:`~sw.compile.errors.PlanError`), bad options.
    """
    fmt_map = _formats(model, cfg, options, weights, formats)
    captured = captured or capture_model(model, options)
    graphs, report, passes_s = _optimise(captured, fmt_map, options)
    t0 = time.perf_counter()
    work, buffers, kv, pairs = _partition(model, cfg, graphs, fmt_map, options, report)
    embedding = _embedding_reads(graphs, work)
    regions = _constant_regions(work, options.max_context, pairs)
    try:
        placed, layout, arenas = _place(model, cfg, fmt_map, buffers, kv, options,
                                        regions + _embedding_region(model, embedding))
    except PlanError:  # the embedding table does not fit: the host writes the rows
        if not embedding:
            raise
        embedding = {}
        placed, layout, arenas = _place(model, cfg, fmt_map, buffers, kv, options, regions)
    bar = "compile: lower" if progress else None
    symbols, programs, table, templates, joined = _lower_join(
        cfg, work, placed, options, pairs, graphs, frozenset(embedding), kv=kv, progress=bar)
    frames = None
    if options.one_program and options.chain_programs and "decode" in table.entries and (
            options.block_loop or options.block_loop is None
            and _step_programs(programs, table, "decode")[0] > 1):
        # joined whatever their length, the blocks' symbols in frames, the blocks one loop
        plain = (_place(model, cfg, fmt_map, buffers, kv, options, regions) if embedding
                 else (placed, layout, arenas))
        _, wide, _, wide_templates, wide_joined = _lower_join(
            cfg, work, plain[0], options, pairs, graphs, wide=True,
            progress=bar and "compile: lower (blocks joined)")
        if wide_joined:
            frames = _frame_step(cfg, model, plain[0], wide, wide_templates)
    framed, served = None, {}
    if frames is not None:
        # the embedding table beside the frames where the DRAM holds both (else the host
        # writes the token's row) and the vector engine's scratchpads hold a row's copy
        for served in ([embedding, {}] if _copies_row(cfg, embedding) else [{}]):
            try:
                framed = _place(model, cfg, fmt_map, buffers, kv, options,
                                regions + _embedding_region(model, served), frames)
                break
            except PlanError:  # the copies (and the table) do not fit the DRAM
                continue
        if framed is None:
            frames = None
    if frames is not None:
        rolled = _lower_join(cfg, work, framed[0], options, pairs, graphs, frozenset(served),
                             wide=True, kv=kv, blocks=model.config.num_hidden_layers,
                             progress=bar and "compile: lower (blocks in frames)")
        looped = _roll_step(cfg, rolled[1], model.config.num_hidden_layers, rolled[3],
                            rolled[0], frames, served)
        # every program that runs fits (a group fused for the wider memory runs joined)
        if any(p.instructions > cfg.imem_depth for p in looped if p.fused_into is None):
            frames = None
        else:
            symbols, programs, table, templates, joined = (rolled[0], looped, *rolled[2:])
            (placed, layout, arenas), embedding = framed, served
    if "decode" in graphs:  # the joined steps' STOREs of rows only moves carry on
        programs = [_with_quiet_stores(cfg, p, programs, graphs["decode"], symbols)
                    if i in _joined(programs, templates) else p
                    for i, p in enumerate(programs)]
    if embedding:
        programs = [token_relative(cfg, p, symbols, embedding) for p in programs]
    registers = RegisterFile()
    programs = allocate(programs, registers, lambda p: {
        i: kv.append_terms(kind)[field == "imm"] for i, kind, field, _ in p.append_rows})
    compile_s = passes_s + time.perf_counter() - t0
    for phase, arena in arenas.items():
        # a step runs one program per set of nodes (of its context bucket's, the most)
        steps, fused = _step_programs(programs, table, phase)
        report["phases"][phase].update(
            programs_per_step=steps, host_transitions_per_step=2 * steps,
            **({"fused_programs_per_step": fused} if fused else {}),
            **({"joined_programs": joined} if phase == "decode" and joined else {}))
        report["phases"][phase].update(arena_bytes=arena.size,
                                       arena_lower_bound_bytes=arena.lower_bound)
    image = {}
    if weights is not None:
        for layer, qw in weights.items():
            image[sym.weights(layer)] = weight_image(qw, cfg.lanes, cfg.beat_bytes)
        image.update(_vector_constants(model, work, options.max_context))
        image.update(_dequant_constants(weights, pairs))
        image.update(_embedding_table(model, graphs, embedding))
        image.update({c: image[orig] for c, orig in (frames.copies if frames else {}).items()
                      if orig in image})
    host, host_shapes = _host_tensors(model, graphs, fmt_map, weights)
    mcfg = model.config
    report.update({
        "capture_s": sum(captured[p].seconds for p in options.phases),
        "compile_s": compile_s,
        "programs": sum(p.fused_into is None for p in programs),
        "templates": templates + joined,
        "instructions": int(sum(p.instructions for p in programs)),
        "dram": {"weights": layout.weight_bytes, "kv_cache": layout.kv_bytes,
                 "arena": layout.arena_bytes,
                 **({"frames": frames.total_bytes} if frames else {}),
                 "total": layout.total_bytes,
                 "size": cfg.memory.size_bytes},
        "arena_bytes": layout.arena_bytes,
        "arena_lower_bound_bytes": max(a.lower_bound for a in arenas.values()),
        "fuse": options.fuse, "loops": options.loops,
        **({"fused_programs": sum(bool(p.parts) for p in programs)} if pairs else {}),
        **({"block_loop": _block_loop_report(programs, frames, templates)} if frames else {}),
        "accelerated_layers": len(fmt_map), "kv_bits": options.kv_bits})
    return Executable(
        cfg=cfg, model=mcfg, graphs=graphs, programs=programs, table=table,
        symbols=symbols, image=image, host=host, host_shapes=host_shapes,
        kv=_kv_plan(mcfg, kv, options.attention),
        io=IOBinding(options.prompt_tokens, options.max_context, mcfg.vocab_size,
                     _decode_contexts(options)),
        report=report, registers=tuple(registers.table))


def _kv_plan(mcfg, layout: KVLayout, on_accelerator: bool) -> KVCachePlan:
    """The cache's layout and, when attention runs on the accelerator, its symbols."""
    heads = range(mcfg.num_key_value_heads) if on_accelerator else range(0)
    layers = range(mcfg.num_hidden_layers)
    return KVCachePlan(layout, mcfg.num_hidden_layers, mcfg.num_key_value_heads, on_accelerator,
                       tuple(tuple(sym.cache("k", L, h) for h in heads) for L in layers),
                       tuple(tuple(sym.cache("v", L, h) for h in heads) for L in layers))


def _formats(model: LlamaLM, cfg: AcceleratorConfig, opts: CompileOptions, weights, formats
             ) -> dict[str, WeightFormat]:
    """Check the options; the format of every accelerated layer."""
    if (weights is None) == (formats is None):
        raise CompileError("give either compressed weights or formats (timing-only)")
    mcfg = model.config
    if opts.logits not in ("all", "last"):
        raise CompileError(f"logits must be 'all' or 'last', got {opts.logits!r}")
    if not 1 <= opts.prompt_tokens <= opts.max_context <= mcfg.max_position_embeddings:
        raise CompileError(f"need 1 <= prompt_tokens ({opts.prompt_tokens}) <= max_context "
                           f"({opts.max_context}) <= the model's max_position_embeddings "
                           f"({mcfg.max_position_embeddings})")
    fmt_map = {k: w.fmt for k, w in weights.items()} if weights is not None else dict(formats)
    unknown = sorted(set(fmt_map) - set(_linear_layers(model)))
    if unknown:
        raise CompileError(f"formats given for layers the model does not have: {unknown[:5]}")
    for layer, fmt in fmt_map.items():
        try:
            fmt.check_supported(cfg)
        except ValueError as e:
            raise CompileError(f"layer {layer}: {e}") from None
    return fmt_map


def _optimise(captured: Mapping[str, CaptureResult], fmt_map, opts: CompileOptions
              ) -> tuple[dict[str, Graph], dict, float]:
    """The passes on every phase's graph: the graphs, the report they start, their seconds."""
    graphs, report, seconds = {}, {"phases": {}}, 0.0
    for phase in opts.phases:
        cap = captured[phase]
        t0 = time.perf_counter()
        passes = default_passes(fmt_map, fuse=opts.fuse)
        if opts.logits == "last":
            passes.append(("last_token_logits", last_token_logits))
        g, reports = run_passes(cap.graph, passes)
        seconds += time.perf_counter() - t0
        graphs[phase] = g
        report["phases"][phase] = {
            "capture_s": cap.seconds, "export_s": cap.export_s, "aten_nodes": cap.aten_nodes,
            "nodes_captured": len(cap.graph.nodes), "nodes": len(g.nodes),
            "passes": _summarise(reports)}
    return graphs, report, seconds


def _partition(model: LlamaLM, cfg: AcceleratorConfig, graphs: Mapping[str, Graph], fmt_map,
               opts: CompileOptions, report: dict):
    """The accelerator's nodes and their members, per phase and context bucket, and every
    activation buffer with its lifetime (host stage before a program to the one after)."""
    kv = _kv_layout(model, cfg, opts)
    contexts = _decode_contexts(opts)
    vector = vector_ops(model, cfg, opts)
    work: list[tuple[str, Node, int | None, list[Member] | list[VectorOp]]] = []
    buffers: dict[str, list[Buffer]] = {}
    pairs: dict[int, FusedGroup] = {}
    for phase, g in graphs.items():
        acc = accelerator_nodes(g, fmt_map, opts.attention, vector)
        buckets = ([context_bucket(opts.prompt_tokens)] if phase == "prefill"
                   else sorted({context_bucket(s) for s in contexts}))
        live: dict[str, Buffer] = {}
        first = len(work)
        step: list[int] = []  # per work entry of the phase: its node's index in acc
        for p, node in enumerate(acc):
            # the cache grows with the context, and so do the operands sized by it (scores)
            per_context = OPS[node.op].streams == "kv" or any(
                SYMBOL in g.values[v].shape for v in node.inputs)
            for bucket in (buckets if per_context else [None]):
                if OPS[node.op].streams:
                    members = node_members(node, g, cfg, fmt_map.get, bucket, kv)
                else:
                    members = [vector_op(node, g, cfg, bucket)]
                work.append((phase, node, bucket, members))
                step.append(p)
                for m in members:  # the largest bucket sizes the buffers
                    for name, size, before in m.buffers():
                        t = 2 * p if before else 2 * p + 1
                        old = live.get(name)
                        live[name] = Buffer(name, max(size, old.size if old else 0), t, t + 1)
        heads = frozenset(g.outputs if opts.argmax else ())
        aliases = row_aliases(g, work[first:])
        appends = _kv_appends(model, cfg, g, kv, opts) if phase == "decode" else {}
        groups = (fusion_groups(cfg, work[first:], opts.chain_programs, heads, aliases,
                                appends)
                  + scores_groups(cfg, work[first:])) if fuses_programs(cfg, opts) else []
        merged = attention_chains(cfg, g, work[first:], groups) if opts.chain_programs \
            else []
        groups = [_shift(x, first) for x in _attach(groups, merged)]
        # every buffer of a fused program lives through all of it: from the host stage
        # before its first node to the one after its last, which reads the last results back
        # (a buffer a later program reads on chip lives through that one too: its name's);
        # a decode step that may run as one program (_join_step): through all of the step
        span = None
        if phase == "decode" and opts.one_program and opts.chain_programs and groups:
            span = (min(2 * step[x.entries[0] - first] for x in all_groups(groups)),
                    max(2 * step[x.entries[-1] - first] + 1 for x in all_groups(groups)))
        for g in all_groups(groups):
            t0, t1 = span or (2 * step[g.entries[0] - first],
                              2 * step[g.entries[-1] - first] + 1)
            names = [(name, size) for e in g.entries for m in work[e][3]
                     for name, size, _ in m.buffers()] + part_buffers(cfg, g.parts)
            for name, size in names:
                old = live.get(name)
                live[name] = Buffer(name, max(size, old.size), min(old.start, t0),
                                    max(old.end, t1)) if old else Buffer(name, size, t0, t1)
        for g in groups:
            pairs[g.entries[-1]] = g
        buffers[phase] = list(live.values())
        report["phases"][phase].update({
            "accelerator_nodes": len(acc),
            "vector_nodes": sum(OPS[n.op].vector is not None for n in acc)})
    return work, buffers, kv, pairs


def _kv_appends(model: LlamaLM, cfg: AcceleratorConfig, graph: Graph, kv: KVLayout,
                opts: CompileOptions) -> dict[str, tuple[str, KVAppendOp]]:
    """The KV appends a decode chain may run on chip (:func:`sw.compile.fusion.kv_appends`):
    with the cache on the accelerator (INT8 or INT4), a vector engine and chained programs;
    per key row value, its value row's value and the part (its rows' symbols set by the
    chain). Where the part cannot be on chip (:meth:`KVAppendOp.refusal`), a warning says
    why: each chain then leaves the append to the host, a program boundary at each layer."""
    if not _appends_on_chip(cfg, opts):
        return {}
    scales = {n.attrs["layer"]: n.attrs["scale"] for n in graph.nodes if n.op == "attn_scores"}
    appends = {k: (v, _append_op(model, kv, layer, scores_scale_word(scales[layer], kv.bits)
                                 if layer in scales else 0))
               for k, (layer, v) in kv_appends(graph).items()}
    # every layer's append has the same geometry: one check says it for all (values split by
    # residue: why the unsplit cache's append is refused, which is why they are split)
    why = dataclasses.replace(next(iter(appends.values()))[1], layout=dataclasses.replace(
        kv, residue=1)).refusal(cfg) if appends else None
    if why:
        _log.warning("decode: the KV append runs on the host, so a decode step splits before "
                     "each layer's attention: %s", why)
    return appends


def _appends_on_chip(cfg: AcceleratorConfig, opts: CompileOptions) -> bool:
    """Whether a decode chain may append the KV cache on chip: the cache on the accelerator,
    a vector engine and chained programs (:func:`_kv_appends`)."""
    return opts.attention and cfg.has_vector and opts.chain_programs and \
        fuses_programs(cfg, opts)


def _append_op(model: LlamaLM, kv: KVLayout, layer: int, scale_word: int) -> KVAppendOp:
    """The on-chip append of ``layer``'s kv heads (every region named, its rows' symbols
    set by the chain)."""
    heads = range(model.config.num_key_value_heads)
    return KVAppendOp(layer, len(heads), kv, "", "",
                      sym.buffer("kv", "decode", f"layer{layer}"),
                      tuple(sym.cache("k", layer, h) for h in heads),
                      tuple(sym.cache("v", layer, h) for h in heads),
                      tuple(sym.value_codes(layer, h) for h in heads),
                      tuple(sym.score_channels(layer, h) for h in heads), scale_word)


def _shift(g: FusedGroup, d: int) -> FusedGroup:
    """``g`` with its entries (and its fallback's and attention groups') ``d`` further on in
    ``work``."""
    return dataclasses.replace(g, entries=tuple(e + d for e in g.entries),
                               fallback=tuple(_shift(f, d) for f in g.fallback),
                               attention=tuple(_shift(f, d) for f in g.attention))


def _attach(groups: Sequence[FusedGroup], merged: Sequence[tuple[FusedGroup, FusedGroup]]
            ) -> list[FusedGroup]:
    """``groups`` without the attention groups of ``merged``
    (:func:`sw.compile.fusion.attention_chains`), each merged group attached to the chain
    it ends with (:attr:`sw.compile.fusion.FusedGroup.attention`): the compiler builds them
    when it reaches the chain's last entry (:func:`_fuse_attention`)."""
    gone = {id(a) for a, _ in merged}
    by_last: dict[int, list[FusedGroup]] = {}
    for _, m in merged:
        by_last.setdefault(m.entries[-1], []).append(m)
    return [dataclasses.replace(g, attention=tuple(by_last.get(g.entries[-1], ())))
            if g.entries[-1] in by_last else g for g in groups if id(g) not in gone]


def _place(model: LlamaLM, cfg: AcceleratorConfig, fmt_map, buffers: Mapping[str, list[Buffer]],
           kv: KVLayout, opts: CompileOptions, constants: list[tuple[str, int]],
           frames: FramePlan | None = None
           ) -> tuple[dict[str, Region], DramLayout, dict[str, ArenaPlan]]:
    """DRAM regions of the weights (and the vector programs' constant rows after them), the
    KV cache and every buffer (arena per phase); with ``frames``, the symbols they place
    in frames (:func:`sw.compile.blockloop.frame_symbols`) after the weights and constants
    (counted with the weights) and not among the others."""
    framed = frames.slots if frames is not None else {}
    weights, kv_regions = _static_regions(model, cfg, fmt_map, kv, opts)
    weights = [w for w in weights + constants if w[0] not in framed]
    kv_regions = [r for r in kv_regions if r[0] not in framed]
    buffers = {ph: [b for b in bufs if b.name not in framed] for ph, bufs in buffers.items()}
    arenas = {phase: plan_arena(bufs, cfg.beat_bytes) for phase, bufs in buffers.items()}
    if frames is not None:
        weights.append((_FRAMES, frames.total_bytes))
    layout = layout_dram(cfg, weights, kv_regions, list(arenas.values()))
    symbols = dict(layout.regions)
    for phase, bufs in buffers.items():
        symbols.update(buffer_regions(layout, arenas[phase], bufs))
    if frames is not None:
        symbols = frame_symbols(symbols, frames, symbols.pop(_FRAMES).addr)
    return symbols, layout, arenas


#: The DRAM region of a block loop's frames (:func:`_place`).
_FRAMES = "frames"


def _kv_layout(model: LlamaLM, cfg: AcceleratorConfig, opts: CompileOptions) -> KVLayout:
    """The KV cache's layout: ``max_context`` positions rounded up to their bucket; where
    the host appends it (no on-chip append, or one its layout refuses), its values split by
    :func:`sw.compile.lower.value_residue`."""
    try:
        kv = KVLayout(model.config.head_dim, context_bucket(opts.max_context), cfg.lanes,
                      cfg.beat_bytes, opts.kv_bits)
    except ValueError as e:
        raise CompileError(str(e)) from None
    if opts.attention and (not _appends_on_chip(cfg, opts)
                           or _append_op(model, kv, 0, 0).refusal(cfg) is not None):
        kv = dataclasses.replace(kv, residue=value_residue(cfg, kv.head_dim, kv.bits,
                                                           kv.max_context))
    return kv


def _static_regions(model: LlamaLM, cfg: AcceleratorConfig, fmt_map, kv: KVLayout,
                    opts: CompileOptions
                    ) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The (symbol, bytes) of every packed weight stream and KV-cache region: what the model's
    shapes and formats fix, before any graph is captured."""
    mcfg = model.config
    weights = [(sym.weights(layer), _stream_bytes(fmt_map[layer], model, layer, cfg))
               for layer in _linear_layers(model) if layer in fmt_map]
    kv_regions = []
    if opts.attention:
        for L in range(mcfg.num_hidden_layers):
            for h in range(mcfg.num_key_value_heads):
                kv_regions += [(sym.cache("k", L, h), kv.key_bytes),
                               (sym.cache("v", L, h), kv.value_bytes)]
    return weights, kv_regions


def static_dram_bytes(model: LlamaLM, cfg: AcceleratorConfig, options: CompileOptions,
                      formats: Mapping[str, WeightFormat]) -> int:
    """DRAM bytes of the packed weights and the KV cache that :func:`compile_model` would lay
    out for these formats: a lower bound of its ``report["dram"]["total"]`` (the activation
    arena needs the captured graph), from the shapes alone -- nothing captured or compressed.

    Raises
    ------
    CompileError
        Bad options, or formats the configuration does not support.
    """
    fmt_map = _formats(model, cfg, options, None, formats)
    weights, kv = _static_regions(model, cfg, fmt_map, _kv_layout(model, cfg, options),
                                  options)
    layout = layout_dram(cfg.timing_only(), weights, kv, [])
    return layout.weight_bytes + layout.kv_bytes


def _lower(cfg: AcceleratorConfig, work, symbols: Mapping[str, Region], max_context: int,
           groups: Mapping[int, FusedGroup] | None = None, loops: bool | None = None,
           embedding: frozenset[str] = frozenset(), spread: bool = True,
           progress: str | None = None, wider: AcceleratorConfig | None = None
           ) -> tuple[list[Program], ProgramTable, int]:
    """One program per (node, bucket): each distinct one lowered once (``loops``: rolled,
    :class:`CompileOptions`), relocated; and the table that finds them for every context.
    Each of ``groups`` (by the index of its last entry in ``work``:
    :func:`sw.compile.fusion.fusion_groups`) becomes one fused program after its entries'
    programs (:func:`_fuse`); a group whose program would not fit the instruction memory
    falls back to its pairs, and a pair that does not fit stays two programs; a chain with
    attention groups is fused after each bucket's attention program where that fits
    (:func:`_fuse_attention`). A group's residual rows (:attr:`FusedGroup.residual`) are
    the host's to write unless an earlier group left them on chip in every context (its
    programs each hold that group's parts: ``onchip``, :func:`sw.compile.fusion.rows_left`);
    ``spread``: how far the fused programs hoist LOADs (:func:`sw.compile.fusion.fuse_parts`).
    A compilation that fuses programs (``groups``) keeps its linears' weights in a ring
    (:func:`sw.compile.relocation.lower_template`), one that does not in the double buffers.
    A decode program's LOADs of the ``embedding`` buffers (the token's embedding rows) are
    its ``embed_rows``. ``progress``: a progress bar's description (None: no bar).
    ``wider``: a larger instruction memory a decode group that does not fit is fused for,
    its node parts unrolled (a step whose blocks one loop runs, and whose tail
    :func:`_roll_tail` rolls: :func:`_roll_step`)."""
    templates: dict[tuple, tuple[int, Template | None]] = {}
    programs: list[Program] = []
    table: dict[str, dict[str, list[tuple[int, int, int]]]] = {}
    addr = {k: r.addr for k, r in symbols.items()}
    groups = groups or {}
    pos: dict[int, int] = {}  # work entry -> its program
    onchip: set[str] = set()  # the rows of the groups every context runs whole
    for i, (phase, node, bucket, members) in enumerate(tqdm(
            work, desc=progress, disable=progress is None, leave=False, unit="node")):
        key = tuple(m.signature for m in members)
        vec = members[0] if isinstance(members[0], VectorOp) else None
        if key not in templates:
            try:
                templates[key] = (len(templates),
                                  lower_template(cfg, members, loops=loops,
                                                 ring=bool(groups)) if vec is None
                                  else lower_vector_template(
                                      cfg, vec.func, vec.rows, vec.length,
                                      second=vec.b is not None,
                                      const=vec.w is not None and not vec.table_rows,
                                      imm=vec.imm, table=vec.table_rows > 0,
                                      positions=vec.positions, loops=loops))
            except LoweringError as e:  # name the node: the message alone does not
                raise LoweringError(f"{phase} node {node.name!r}: {e}") from None
        index, t = templates[key]
        first, last = (1, max_context) if bucket is None else _bucket_contexts(bucket)
        table.setdefault(phase, {}).setdefault(node.name, []).append(
            (first, last, len(programs)))
        pos[i] = len(programs)
        words = relocate(t, addr, members, cfg.beat_bytes)
        embed = _reads_of(t, members, embedding) if phase == "decode" else ()
        if vec is None:
            programs.append(Program(phase, node.name, bucket, words,
                                    tuple(_program_member(m) for m in members), index,
                                    embed_rows=embed))
        else:
            programs.append(Program(phase, node.name, bucket, words, (), index, vec,
                                    t.imm_rows, position_rows=t.position_rows,
                                    embed_rows=embed))
        if i in groups and groups[i].attention:
            whole = _fuse_attention(cfg, programs, pos, groups[i], templates, addr,
                                    table[phase], work, onchip, embedding, spread,
                                    wider if phase == "decode" else None)
        elif i in groups:
            whole = _fuse_or_fall_back(cfg, programs, pos, groups[i], templates, addr, onchip,
                                       embedding, spread,
                                       wider if phase == "decode" else None)
        if i in groups and whole:
            onchip |= rows_left(groups[i])
    return programs, ProgramTable({ph: {n: tuple(rows) for n, rows in nodes.items()}
                                   for ph, nodes in table.items()}), len(templates)


def _fuse_or_fall_back(cfg: AcceleratorConfig, programs: list[Program],
                       pos: Mapping[int, int], group: FusedGroup, templates: dict,
                       addr: Mapping[str, int], onchip: Collection[str] = frozenset(),
                       embedding: frozenset[str] = frozenset(), spread: bool = True,
                       wider: AcceleratorConfig | None = None) -> bool:
    """:func:`_fuse` ``group``, or where it does not fit ``cfg``'s instruction memory, for
    ``wider``'s with its node parts unrolled (``unroll``), or else each of its fallbacks
    (logged: which group, and why); whether ``group`` itself fused."""
    why: list[str] = []
    if _fuse(cfg, programs, pos, group, templates, addr, onchip, embedding, spread, why=why):
        return True
    if wider is not None and _fuse(wider, programs, pos, group, templates, addr, onchip,
                                   embedding, spread, unroll=True, why=why):
        return True
    nodes = [programs[pos[e]].node for e in group.entries]
    _log.log(logging.WARNING if wider is not None else logging.INFO,
             "fused group %s..%s (%d nodes) falls back to %d smaller groups: %s",
             nodes[0], nodes[-1], len(nodes), len(group.fallback), "; ".join(why))
    for g in group.fallback:
        _fuse(cfg, programs, pos, g, templates, addr, onchip, embedding, spread)
    return False


def _rolled(t: Template | None) -> bool:
    """Whether template ``t`` holds a REPEAT (a hardware loop: it cannot be a fused part)."""
    return t is not None and bool(
        (decode_fields(t.words)["opcode"] == Opcode.REPEAT.value).any())


def _fuse_attention(cfg: AcceleratorConfig, programs: list[Program], pos: dict[int, int],
                    chain: FusedGroup, templates: dict, addr: Mapping[str, int],
                    table: dict[str, list[tuple[int, int, int]]], work,
                    onchip: Collection[str] = frozenset(),
                    embedding: frozenset[str] = frozenset(), spread: bool = True,
                    wider: AcceleratorConfig | None = None) -> bool:
    """Fuse ``chain`` after each context bucket's attention program
    (:attr:`sw.compile.fusion.FusedGroup.attention`): the chain's nodes then have a program
    per bucket (the first merged bucket's their own programs, the others' copies of them),
    each a part of that bucket's merged program, and ``table`` (the phase's) finds them per
    context. A bucket whose merged program does not fit the instruction memory keeps its
    attention program (or that one's fallbacks) and the chain its own fused program, which
    every context of such a bucket runs. Whether every context's programs hold the chain's
    parts (the chain's own program fused where a bucket needs it). ``wider``: as for
    :func:`_fuse_or_fall_back`, a merged program that does not fit ``cfg`` is fused for it."""
    fits, how = [], {}
    for m in chain.attention:
        for c, unroll in ((cfg, False), (wider, True)) if wider is not None else ((cfg, False),):
            if _fuse(c, list(programs), pos, m, dict(templates), addr, onchip, embedding,
                     spread, unroll=unroll):
                fits.append(m)
                how[id(m)] = (c, unroll)
                break
    merged = {id(m) for m in fits}
    own = len(fits) < len(chain.attention)  # the chain runs alone in some bucket
    rows: dict[str, list[tuple[int, int, int]]] = {}
    where = []  # per merged group: the programs of its entries
    for k, m in enumerate(fits):
        at = dict(pos)
        if own or k:  # copies of the chain's programs (still unfused: its parts to be)
            for e in chain.entries:
                at[e] = len(programs)
                programs.append(programs[pos[e]])
        first, last = _bucket_contexts(work[m.entries[0]][2])
        for e in chain.entries:
            rows.setdefault(work[e][1].name, []).append((first, last, at[e]))
        where.append(at)
    for m, at in zip(fits, where, strict=True):
        c, unroll = how[id(m)]
        if not _fuse(c, programs, at, m, templates, addr, onchip, embedding, spread,
                     unroll=unroll):  # pragma: no cover
            raise LoweringError(f"the merged program of {programs[at[m.entries[0]]].node!r} "
                                "fitted once and no longer does")
    for m in chain.attention:
        if id(m) not in merged:
            for a in m.fallback:
                _fuse_or_fall_back(cfg, programs, pos, a, templates, addr, onchip, embedding,
                                   spread, wider)
    whole = not own or _fuse_or_fall_back(cfg, programs, pos, chain, templates, addr, onchip,
                                          embedding, spread, wider)
    for name, r in rows.items():  # each merged bucket's first, the chain's own last
        table[name] = r + (table[name] if own else [])
    return whole


def _part_template(cfg: AcceleratorConfig, part) -> Template:
    """The relocatable program of a REQUANT, DEQUANT, (vector) ADD or SOFTMAX slice part."""
    if isinstance(part, RequantOp):
        return lower_requant_template(cfg, part.rows, part.length, part.act_row_bytes,
                                      amax=part.amax, fold=part.fold,
                                      x_stride=part.x_row_bytes // cfg.beat_bytes)
    if isinstance(part, ArgmaxOp):
        return lower_argmax_template(cfg, part.rows, part.length)
    if isinstance(part, VectorOp):
        return lower_vector_template(cfg, part.func, part.rows, part.length,
                                     second=part.b is not None, const=part.w is not None,
                                     imm=part.imm, positions=part.positions,
                                     halves=part.halves,
                                     stride=part.row_bytes // cfg.beat_bytes if part.halves
                                     else 0)
    return lower_dequant_template(cfg, part.rows, part.length, part.acc_row_bytes, part.place,
                                  fold=bool(part.fold_qmax),
                                  y_stride=part.row_bytes // cfg.beat_bytes)


def _fuse(cfg: AcceleratorConfig, programs: list[Program], pos: Mapping[int, int],
          group: FusedGroup, templates: dict, addr: Mapping[str, int],
          onchip: Collection[str] = frozenset(),
          embedding: frozenset[str] = frozenset(), spread: bool = True, *,
          unroll: bool = False, why: list[str] | None = None) -> bool:
    """Append the fused program of ``group`` and make its entries' programs (at ``pos``) its
    parts; False, and nothing changed, if it does not fit the instruction memory.

    Each part is relocated from its template: a node's (lowered with it; a values member
    alone, where attention is woven a head at a time, lowered once per signature, unrolled:
    False where it does not fit) or a REQUANT's, DEQUANT's or ADD's (lowered once per
    signature); vector parts get the events of
    :func:`sw.compile.fusion.vector_events`, and :func:`sw.compile.fusion.fuse_parts` joins
    them. The linear entries' members name the Q15.16 rows their DEQUANT parts write; the
    fused program's ``position_rows`` are its ROPE parts' table LOADs, its ``imm_rows`` its
    SOFTMAX parts' VECs; a scores member names the ``amax`` and channel words the host
    writes for its DEQUANT part; a residual linear's member the residual rows the host writes
    (``residual``), unless an earlier program left them on chip (``onchip``). ``unroll``: a
    node's part is lowered unrolled even where its own program rolled (its template has a
    REPEAT). ``why``: where it does not fit, the reason is appended."""
    why = why if why is not None else []
    nodes = [programs[pos[e]] for e in group.entries]
    words, key, work = [], ["fused"], [0, 0, 0]
    dequant, argmax, tables, imms = {}, {}, [], []
    folded: dict[str, str] = {}  # a values fold's rows -> the accumulators they fold
    appends, embeds, counted = [], [], set()
    for part, owner in zip(group.parts, group.owners, strict=True):
        if isinstance(part, KVAppendOp):
            if not all(c in addr for c in part.codes or ()):  # no FOLD reads value codes
                part = dataclasses.replace(part, codes=None)
            if not all(c in addr for c in part.channels or ()) or not part.scale_word:
                part = dataclasses.replace(part, channels=None)  # no DEQUANT reads them
            try:
                w, sites = kv_append_words(cfg, part, addr)
            except LoweringError:  # it does not fit: the host appends
                continue
            words.append(vector_events(w))
            appends.append((len(words) - 1, sites, part.layer))
            key.append(part.signature)
            rows = 2 * part.kv_heads * part.layout.head_dim
            work = [work[0] + 4 * rows, work[1] + rows, work[2]]
            continue
        if owner is not None and isinstance(part, VectorOp):
            t = templates[(part.signature,)][1]
        elif owner is not None:
            sig = tuple(m.signature for m in part)
            if unroll and sig in templates and _rolled(templates[sig][1]):
                sig = ("unrolled", *sig)  # beside the node's own rolled program
            if sig not in templates:  # a member alone, or a node's part unrolled
                try:  # unrolled, as a part must be (a node's too long one rolls: no part);
                    # one a tail loop rolls: in the double buffers, whose period is 2 GEMMs
                    t = lower_template(cfg, part, ring=sig[0] != "unrolled")
                except LoweringError as e:
                    why.append(f"part {nodes[owner].node!r} unrolled: {e}")
                    return False
                templates[sig] = (len(templates), t)
            t = templates[sig][1]
            if _rolled(t):
                why.append(f"part {nodes[owner].node!r} is rolled (a REPEAT) unrolled too long")
                return False
        else:
            if part.signature not in templates:
                try:  # unrolled: a vocabulary's segments of many rows may not fit
                    t = _part_template(cfg, part)
                except LoweringError as e:
                    why.append(f"{type(part).__name__} part: {e}")
                    return False
                templates[part.signature] = (len(templates), t)
            t = templates[part.signature][1]
        layers = list(part) if isinstance(part, tuple) else [part]
        w = relocate(t, addr, layers, cfg.beat_bytes)
        words.append(w if isinstance(part, tuple) else vector_events(w))
        if nodes[0].phase == "decode":
            embeds.append((len(words) - 1, _reads_of(t, layers, embedding)))
        if isinstance(part, VectorOp) and part.table_rows:
            tables.append((len(words) - 1, t.position_rows))
        if isinstance(part, VectorOp) and t.imm_rows:
            imms.append((len(words) - 1, t.imm_rows))
        key.append(tuple(m.signature for m in layers))
        if owner is not None:  # a node's program, counted once (values: a part per member)
            p = nodes[owner]
            if owner not in counted:
                work = [work[0] + p.read_bytes, work[1] + p.write_bytes, work[2] + p.macs]
            counted.add(owner)
        elif isinstance(part, RequantOp):
            codes = part.rows * part.length
            work = [work[0] + 4 * codes + 4 * part.length * part.fold, work[1] + codes,
                    work[2]]
        elif isinstance(part, VectorOp):
            work = [work[0] + part.read_bytes, work[1] + part.write_bytes, work[2]]
            if part.halves:
                folded[part.y] = folded.get(part.x, part.x)
        elif isinstance(part, ArgmaxOp):
            argmax[part.x] = part.y
            work = [work[0] + 4 * part.rows * part.length, work[1] + 8 * part.rows, work[2]]
        else:  # a column segment's rows are its whole row's, whose amax words it reads once
            whole, offset = part.columns or (part, 0)
            dequant[folded.get(whole.x, whole.x)] = whole
            acc = 4 * part.rows * part.length
            work = [work[0] + acc + 4 * part.length + 4 * part.rows * (offset == 0),
                    work[1] + acc, work[2]]
    try:
        fused, places = fuse_parts_cached(cfg, words, spread or nodes[0].phase != "decode",
                                          fuse_parts)
    except LoweringError as e:
        why.append(f"fused: {e}")
        return False
    # a ROPE part's table LOADs, as words of the fused program: the runtime sets them per step
    position_rows = tuple(places[k][i] for k, rows in tables for i in rows)
    # a SOFTMAX part's VECs, likewise: the runtime sets each row's valid positions per step
    imm_rows = tuple(places[k][i] for k, rows in imms for i in rows)
    # a KV append part's cache LOADs and STOREs and INSERTs: the runtime moves them per step
    append_rows = tuple((places[k][a.index], a.kind, a.field, layer)
                        for k, sites, layer in appends for a in sites)
    # LOADs of the token's embedding rows: the runtime points them at its table row
    embed_rows = tuple(places[k][i] for k, rows in embeds for i in rows)
    key = tuple(key)
    if key not in templates:
        templates[key] = (len(templates), None)
    n = len(programs)
    empty = np.zeros((0, 2), dtype=np.uint64)
    members = []
    requantised = {p.writes for p in group.parts if isinstance(p, RequantOp)}  # on chip
    host_rows = {p.y: p for p in group.parts if isinstance(p, RequantOp) and p.host}
    codes = {p.y: p.w for p in group.parts if isinstance(p, RequantOp) and p.fold}
    # the DEQUANT rows an ADD adds the host's residual rows to
    added = {p.x for p in group.parts if isinstance(p, VectorOp) and p.func == VecFunc.ADD
             and group.residual is not None and group.residual not in onchip
             and p.b == group.residual}
    for e, p in zip(group.entries, nodes, strict=True):
        ms = tuple(dataclasses.replace(m, dequant=dequant[m.y].y,
                                       dequant_row_bytes=dequant[m.y].row_bytes,
                                       argmax=argmax.get(dequant[m.y].y),
                                       codes=codes.get(m.x),
                                       **_host_words(m, dequant[m.y], requantised),
                                       residual=group.residual
                                       if dequant[m.y].y in added else None,
                                       **_host_rows(cfg, m, host_rows))
                   if m.y in dequant else m for m in p.members)
        programs[pos[e]] = dataclasses.replace(p, words=empty, fused_into=n, members=ms)
        members += ms
    programs.append(Program(nodes[0].phase, nodes[0].node, nodes[0].bucket, fused,
                            tuple(members), templates[key][0], imm_rows=imm_rows,
                            parts=tuple(pos[e] for e in group.entries),
                            work=tuple(work), position_rows=position_rows,
                            append_rows=append_rows, embed_rows=embed_rows))
    return True


#: The instruction memory a step is joined for before its blocks are rolled (the largest
#: a configuration may have).
_WIDE_IMEM = 1 << 20


def _lower_join(cfg: AcceleratorConfig, work, placed: Mapping[str, Region],
                options: CompileOptions, pairs: Mapping[int, FusedGroup],
                graphs: Mapping[str, Graph], embedding: frozenset[str] = frozenset(),
                wide: bool = False, kv: KVLayout | None = None,
                blocks: int | None = None, progress: str | None = None) -> tuple:
    """The symbols (``placed`` and the fused parts' aliases), programs, table, templates and
    joined decode steps (:func:`_join_step`) of ``work`` lowered with ``placed`` (the
    ``embedding`` buffers read from the embedding table: :func:`_lower`); ``wide``: steps
    joined whatever their length, each part's LOADs hoisted no further than its own boundary
    (a block loop may make them fit: ``spread`` of :func:`_join_step`); ``kv``: the KV
    cache's layout, whose tiles a step does not append to load early in a joined step
    (:func:`_kv_ahead`; ``wide``, with ``blocks``, the decoder blocks its steps roll into
    one loop, alike in every block). Every program that
    runs then has its round trips of vector rows as moves (:func:`_with_moves`).
    ``progress``: the description of a progress bar over the lowering (None: none)."""
    symbols = dict(placed)
    for g in all_groups(pairs.values()):  # a part's results inside another's rows
        for name, parent, offset, size in part_aliases(cfg, g.parts):
            r = symbols[parent]
            symbols[name] = Region(r.addr + offset, size, r.kind)
    programs, table, templates = _lower(cfg, work, symbols, options.max_context, pairs,
                                        options.loops, embedding, not wide, progress=progress,
                                        wider=cfg.replace(imem_depth=_WIDE_IMEM) if wide
                                        else None)
    joined = 0
    if options.one_program and options.chain_programs and "decode" in table.entries:
        programs, table, joined = _join_step(cfg.replace(imem_depth=_WIDE_IMEM) if wide else cfg,
                                             programs, table, graphs["decode"], templates,
                                             spread=not wide, kv=None if kv is None
                                             or wide and blocks is None else (kv, symbols),
                                             blocks=blocks if wide else None)
    # the round trips of a vector part's rows to the next one's VIN become moves (a program
    # that runs: not a fused one's part), once its LOADs are where the fusion put them
    wider = cfg.replace(imem_depth=_WIDE_IMEM) if wide else cfg
    programs = [p if p.fused_into is not None or not p.instructions
                else _with_moves(wider if p.template >= templates else cfg, p)
                for p in tqdm(programs, desc=progress and f"{progress}: moves",
                              disable=progress is None, leave=False, unit="program")]
    return symbols, programs, table, templates, joined


def _joined(programs: Sequence[Program], templates: int) -> list[int]:
    """The joined decode programs (:func:`_join_step`: numbered from ``templates`` on)."""
    return [i for i, p in enumerate(programs) if p.template >= templates]


def _frame_step(cfg: AcceleratorConfig, model: LlamaLM, placed: Mapping[str, Region],
                programs: Sequence[Program], templates: int) -> FramePlan | None:
    """The frames (:func:`sw.compile.blockloop.frame_plan`) of the largest joined decode
    program's blocks over ``placed`` (the decode arena's buffers, constants, weights and KV
    cache), None where it has none."""
    joined = _joined(programs, templates)
    blocks = model.config.num_hidden_layers
    if not joined or blocks < 2:
        return None
    p = max((programs[i] for i in joined), key=lambda q: len(q.parts))
    cand = {n: r for n, r in placed.items()
            if r.kind != "arena" or n.split(":")[1:2] == ["decode"]}
    plan = frame_plan(p.words, cand, blocks, cfg.beat_bytes,
                      {n: r.kind == "weight" for n, r in cand.items()})
    return plan


def _roll_step(cfg: AcceleratorConfig, programs: list[Program], blocks: int, templates: int,
               symbols: Mapping[str, Region], frames: FramePlan,
               embedding: Mapping[str, int] | None = None) -> list[Program]:
    """``programs`` with each joined decode program's blocks rolled into one REPEAT where
    they are periodic (:func:`sw.compile.blockloop.roll_blocks`; the constants with a copy
    per frame in ``symbols``). A rolled program that reads the token's embedding rows
    (``embed_rows``, of the ``embedding`` buffer: :func:`_embedding_reads`) first copies
    them into the buffer (:func:`sw.compile.blockloop.copy_row`, its LOAD the program's
    one ``embed_rows`` word): every block reads its input rows from its own frame."""
    beat = cfg.beat_bytes
    shared = [(symbols[o].addr // beat, -(-symbols[o].end // beat))
              for o in set(frames.copies.values())]
    first = []
    if embedding:
        ((served, row),) = embedding.items()
        at = symbols[served].addr // beat
        first = copy_row(at, at, row // beat, beat)
    for i in _joined(programs, templates):
        p = programs[i]
        copy = first if p.embed_rows else []
        rolled = roll_blocks(p.words, blocks, shared=shared, position_rows=p.position_rows,
                             imm_rows=p.imm_rows, append_rows=p.append_rows, first=copy)
        if rolled is not None:
            programs[i] = _roll_tail(cfg, dataclasses.replace(
                p, words=rolled["words"], position_rows=rolled["position_rows"],
                imm_rows=rolled["imm_rows"], append_rows=rolled["append_rows"],
                embed_rows=(0,) if copy else ()))
    return programs


def _roll_tail(cfg: AcceleratorConfig, p: Program) -> Program:
    """Block-looped step ``p`` (``[prologue | REPEAT | block 0 | epilogue]``) with its
    epilogue's periodic runs as REPEATs too (:func:`sw.compile.roll.roll_words`: loops one
    after the other, none nested) where ``p`` does not fit ``cfg``'s instruction memory (a
    head too long unrolled: its output tiles' GEMMs); its run-time words stay unrolled, moved
    to where they land. ``p`` itself where it fits, or has no block loop."""
    if p.instructions <= cfg.imem_depth:
        return p
    f = decode_fields(p.words)
    reps = np.flatnonzero(f["opcode"] == Opcode.REPEAT.value)
    if reps.size != 1:
        return p
    start = int(reps[0]) + 1 + int(f["repeat.length"][reps[0]])  # the epilogue's first word
    end = len(p.words) - 1  # END
    keep = {i - start for i in (*p.position_rows, *p.imm_rows, *p.embed_rows,
                                *(r for r, *_ in p.append_rows)) if start <= i < end}
    tail, where = roll_words(instructions(p.words[start:end]), keep)

    def moved(i: int) -> int:
        return i if i < start else start + where[i - start]
    return dataclasses.replace(
        p, words=np.concatenate([p.words[:start], program_words(tail), p.words[end:]]),
        position_rows=tuple(moved(i) for i in p.position_rows),
        imm_rows=tuple(moved(i) for i in p.imm_rows),
        embed_rows=tuple(moved(i) for i in p.embed_rows),
        append_rows=tuple((moved(i), *rest) for i, *rest in p.append_rows))


def _copies_row(cfg: AcceleratorConfig, embedding: Mapping[str, int]) -> bool:
    """Whether a block loop can copy the token's embedding row (``embedding``: its buffer's
    row bytes, :func:`_embedding_reads`) through the vector engine's scratchpads
    (:func:`sw.compile.blockloop.copy_row`): there is one, and the row fits VIN and VOUT."""
    return bool(embedding) and all(row <= min(cfg.vin_spad_bytes, cfg.vout_spad_bytes)
                                   for row in embedding.values())


def _block_loop_report(programs: Sequence[Program], frames: FramePlan, templates: int
                       ) -> dict:
    """The block loop's frames and the joined programs that run one."""
    looped = [programs[i] for i in _joined(programs, templates)
              if any(op == Opcode.REPEAT.value for op in decode_fields(programs[i].words)
                     ["opcode"].tolist())]
    return {"frame_bytes": frames.frame_bytes, "frames": frames.frames,
            "copies": len(frames.copies), "looped_programs": len(looped)}


def _segments(rows: Iterable[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """The context ranges on which every one of ``rows`` (``(first, last, program)``, a
    phase's table) runs one program: cut at each row's first context."""
    rows = list(rows)
    cuts = sorted({a for a, _, _ in rows})
    end = max(b for _, b, _ in rows)
    return [(a, (cuts[k + 1] - 1) if k + 1 < len(cuts) else end) for k, a in enumerate(cuts)]


def _step_runs(programs: Sequence[Program], entries: Mapping[str, tuple], s: int) -> list[int]:
    """The programs a step attending to ``s`` positions runs, in node order (a part's: the
    program it is fused into)."""
    runs: list[int] = []
    for rows in entries.values():
        pid = next((p for a, b, p in rows if a <= s <= b), None)
        if pid is None:
            continue
        run = programs[pid].fused_into if programs[pid].fused_into is not None else pid
        if run not in runs:
            runs.append(run)
    return runs


def _step_programs(programs: Sequence[Program], table: ProgramTable, phase: str
                   ) -> tuple[int, int]:
    """The most programs a step of ``phase`` runs (over its context ranges) and how many of
    those are fused."""
    entries = table.entries.get(phase, {})
    if not entries:
        return 0, 0
    runs = [_step_runs(programs, entries, a)
            for a, _ in _segments(r for rows in entries.values() for r in rows)]
    most = max(runs, key=len)
    return len(most), sum(bool(programs[r].parts) for r in most)


def _joinable(graph: Graph, programs: Sequence[Program], runs: Sequence[int]) -> bool:
    """Whether the fused programs ``runs`` of one step can run as one: every one after the
    first starts with an attention's scores whose query rows a REQUANT part writes on chip
    (its prologue writes nothing), none of their members reads rows the host writes
    (``residual``, ``amax``, ``requant``), and each such attention's layer's keys and values
    (value codes, scores' channel words, where read) are appended on chip by an earlier one
    (``append_rows``): nothing the host computes is read between them."""
    ops = {n.name: n.op for n in graph.nodes}
    appended: dict[int, set[str]] = {}
    for k, r in enumerate(runs):
        p = programs[r]
        if not p.parts:
            return False
        if k:
            head = programs[p.parts[0]]
            if ops.get(head.node) != "attn_scores" or not head.members or any(
                    m.channels is None or m.amax is not None for m in head.members):
                return False
            if any(m.residual or m.amax or m.requant for m in p.members):
                return False
            for i in p.parts:
                part = programs[i]
                if ops.get(part.node) not in ("attn_scores", "attn_values"):
                    continue
                layer = int(part.node.split(".")[1]) if part.node.startswith("layers.") \
                    else None
                need = {"k", "v"} | {"c" for m in part.members if m.codes} | {
                    "s" for m in part.members if m.channels}
                if layer is None or not need <= appended.get(layer, set()):
                    return False
        for _, kind, _, layer in p.append_rows:
            appended.setdefault(layer, set()).add(kind)
    return True


def _with_moves(cfg: AcceleratorConfig, p: Program) -> Program:
    """``p`` with its round trips of vector rows through DRAM as moves
    (:func:`sw.compile.onchip.onchip_moves`), then those of GEMM results (OUT rows,
    :func:`sw.compile.onchip.out_moves`), then those of rows several STOREs of VOUT write
    (:func:`sw.compile.onchip.vout_moves`; the words the runtime sets per step stay as they
    are, the others' rows follow), where the moves still fit ``cfg``'s instruction memory
    (else fewer: ``p`` without the later passes' moves, or ``p``)."""
    keep = (*p.position_rows, *p.imm_rows, *p.embed_rows, *(i for i, *_ in p.append_rows))
    words, where = moves_cached(cfg, p.words, keep,
                                 (onchip_moves, out_moves, vout_moves, moved_waits))
    if where is None:
        return p
    return dataclasses.replace(
        p, words=words, position_rows=tuple(where[i] for i in p.position_rows),
        imm_rows=tuple(where[i] for i in p.imm_rows),
        embed_rows=tuple(where[i] for i in p.embed_rows),
        append_rows=tuple((where[i], *rest) for i, *rest in p.append_rows))


def _outside_beats(cfg: AcceleratorConfig, p: Program, programs: Sequence[Program],
               graph: Graph, symbols: Mapping[str, Region]) -> list[tuple[int, int]]:
    """The DRAM beats (``[lo, hi)`` ranges) joined step ``p``'s rows may be read or written
    outside its words: every region but the arena's (weights, the KV cache the next step
    reads, the constants its run-time words address) and the results of the parts that
    compute ``graph``'s outputs (the logits, the greedy token: what the host reads back;
    a joined step's other rows it reads only with ``Runtime(read_back_all=True)``, which
    puts the STOREs back, ``Program.quiet_rows``)."""
    beat = cfg.beat_bytes
    out = {node.name for node in graph.nodes if set(node.outputs) & set(graph.outputs)}
    names = {s for i in p.parts if programs[i].node in out for m in programs[i].members
             for s in (m.y, m.dequant, m.argmax) if s is not None}
    return [(r.addr // beat, -(-r.end // beat)) for n, r in symbols.items()
            if r.kind != "arena" or n in names]


def _with_quiet_stores(cfg: AcceleratorConfig, p: Program, programs: Sequence[Program],
                       graph: Graph, symbols: Mapping[str, Region]) -> Program:
    """Joined decode step ``p`` with its STOREs of rows that only a move carries on and
    nobody reads (:func:`sw.compile.onchip.quiet_stores`; the host's rows,
    :func:`_outside_beats`, stay) as SYNCs (:func:`sw.compile.onchip.quieten`), each listed in
    ``quiet_rows`` with its STORE's words."""
    keep = (*p.position_rows, *p.imm_rows, *p.embed_rows, *(i for i, *_ in p.append_rows))
    rows = quiet_stores(p.words, keep, _outside_beats(cfg, p, programs, graph, symbols), cfg)
    if not rows:
        return p
    return dataclasses.replace(p, words=quieten(p.words, rows), quiet_rows=tuple(
        (i, int(p.words[i, 0]), int(p.words[i, 1])) for i in rows))


def _join_step(cfg: AcceleratorConfig, programs: list[Program], table: ProgramTable,
               graph: Graph, templates: int, spread: bool = True,
               kv: tuple[KVLayout, Mapping[str, Region]] | None = None,
               blocks: int | None = None) -> tuple[list[Program], ProgramTable, int]:
    """One program per decode step and context range: the fused programs a step runs
    (:func:`_step_runs`) joined by :func:`sw.compile.fusion.fuse_parts` where
    :func:`_joinable` and it fits the instruction memory. The joined program's parts are
    copies of every part (each range has its own, ``fused_into`` the joined one) and its
    run-time words (``position_rows``, ``imm_rows``, ``append_rows``) are the fused
    programs', moved to where they land; a range that does not join keeps its programs. The
    table is rebuilt per range (``spread``: :func:`sw.compile.fusion.fuse_parts`'s). With
    ``kv`` (the KV cache's layout and the symbols) and ``spread`` or ``blocks`` (the decoder
    blocks, for a step whose blocks roll into one loop), the LOADs into WGT no STORE of the
    range's steps writes go up where the LOAD engine idles (:func:`_kv_ahead`). Returns
    the programs, the table and how many joined (their templates numbered from
    ``templates``)."""
    phase = "decode"
    entries = table.entries[phase]
    rows: dict[str, list[tuple[int, int, int]]] = {n: [] for n in entries}
    joined = 0
    for first, last in _segments(r for rs in entries.values() for r in rs):
        runs = _step_runs(programs, entries, first)
        pids = {n: next((p for a, b, p in rs if a <= first <= b), None)
                for n, rs in entries.items()}
        fused = None
        if len(runs) > 1 and _joinable(graph, programs, runs):
            try:
                fused = fuse_parts_cached(cfg, [programs[r].words for r in runs], spread,
                                          fuse_parts)
            except LoweringError:  # it does not fit: the fused programs run
                fused = None
        if fused is not None and (spread or blocks) and kv is not None:
            ps = [programs[r] for r in runs]
            fused = _kv_ahead(cfg, *fused, ps, first, last, *kv, None if spread else blocks,
                              functools.partial(_as_run, cfg, programs, graph, kv[1], ps))
        if fused is not None:
            words, places = fused
            n = len(programs)
            parts = [i for r in runs for i in programs[r].parts]
            copies = {i: n + 1 + k for k, i in enumerate(parts)}
            programs.append(_joined_program(phase, [programs[r] for r in runs], words, places,
                                            templates + joined,
                                            tuple(copies[i] for i in parts)))
            programs += [dataclasses.replace(programs[i], fused_into=n) for i in parts]
            pids = {name: copies.get(p, p) for name, p in pids.items()}
            joined += 1
        for name, p in pids.items():
            if p is not None:
                rows[name].append((first, last, p))
    entries = {ph: dict(e) for ph, e in table.entries.items()}
    entries[phase] = {n: tuple(r) for n, r in rows.items()}
    return (*_compact(programs, entries), joined) if joined else (programs, table, 0)


def _joined_program(phase: str, ps: Sequence[Program], words: np.ndarray,
                    places: Sequence[Sequence[int]], template: int, parts: tuple[int, ...]
                    ) -> Program:
    """The program of the joined ``words`` of the programs ``ps`` (``places``: where each
    word of each lies): their members, work and run-time words, moved to where they land;
    ``parts`` its parts, ``template`` its number."""
    return Program(
        phase, ps[0].node, ps[0].bucket, words, tuple(m for p in ps for m in p.members),
        template,
        imm_rows=tuple(places[k][i] for k, p in enumerate(ps) for i in p.imm_rows),
        parts=parts, work=tuple(sum(p.work[j] for p in ps) for j in range(3)),
        position_rows=tuple(places[k][i] for k, p in enumerate(ps) for i in p.position_rows),
        append_rows=tuple((places[k][i], *rest) for k, p in enumerate(ps)
                          for i, *rest in p.append_rows),
        embed_rows=tuple(places[k][i] for k, p in enumerate(ps) for i in p.embed_rows))


def _as_run(cfg: AcceleratorConfig, programs: Sequence[Program], graph: Graph,
            symbols: Mapping[str, Region], ps: Sequence[Program], words: np.ndarray,
            places: Sequence[Sequence[int]]) -> np.ndarray:
    """The joined ``words`` of the programs ``ps`` of ``programs`` (``places``: where each
    word of each lies) as the decode step of ``graph`` runs them: with the moves
    (:func:`_with_moves`) and quiet STOREs (:func:`_with_quiet_stores`) the passes after the
    join give them."""
    p = _joined_program(ps[0].phase, ps, words, places, -1,
                        tuple(i for q in ps for i in q.parts))
    return _with_quiet_stores(cfg, _with_moves(cfg, p), programs, graph, symbols).words


def _kv_ahead(cfg: AcceleratorConfig, words: np.ndarray, places: Sequence[Sequence[int]],
              ps: Sequence[Program], first: int, last: int, kv: KVLayout,
              symbols: Mapping[str, Region], blocks: int | None = None,
              ran: Callable[[np.ndarray, Sequence[Sequence[int]]], np.ndarray] | None = None
              ) -> tuple[np.ndarray, tuple[tuple[int, ...], ...]]:
    """A joined step's ``words`` (``places``: where each word of the programs ``ps`` lies)
    with LOADs into WGT that no STORE writes at any position the contexts ``first`` to
    ``last`` append (:meth:`KVLayout.append_site`: the append's words,
    ``Program.append_rows``, are built for position 0) moved up where the LOAD engine idles
    (:func:`sw.compile.fusion.loads_ahead`, the idle :func:`sw.compile.fusion.load_idle`
    estimates from ``words``): the KV cache tiles only (a head's key tiles before the
    appended one load while the KV append and the query's REQUANTs run, where they queued
    behind the SYNCs waiting for them), or every such LOAD, weights too, with each fill of
    :data:`sw.compile.fusion.AHEAD_FILLS` (the o_proj's weights stream while the vector
    engine runs the softmax and the folds); of these and ``words`` as they are, the one
    :func:`sw.compile.fusion.timeline` estimates to end first that fits the instruction
    memory (the first of equals: ``words`` first), each estimated as the step runs it:
    ``ran(words, places)`` (:func:`_as_run`: with the moves and quiet STOREs the passes after
    the join give it, which change when it ends; without ``ran``, as it is). That in
    :data:`sw.compile.fusion.AHEAD_ROUNDS` rounds, each from the last one's placement and
    the LOAD engine's idle in it, while the estimate ends earlier. With ``blocks`` (a step
    whose decoder blocks roll into one loop, :func:`_roll_step`) the moves keep the blocks
    alike (``period`` of :func:`sw.compile.fusion.loads_ahead`, the blocks
    :func:`sw.compile.blockloop.block_period` finds), and ``words`` stay as they are where it
    finds none."""
    f = decode_fields(words)
    beat = cfg.beat_bytes
    sites = {places[k][i]: kind for k, p in enumerate(ps)
             for i, kind, field, _ in p.append_rows if field == "dram_addr"}
    written = []
    for i in np.flatnonzero((f["opcode"] == Opcode.STORE.value)
                            & ~is_move(f["opcode"], f["dma.spad"])).tolist():
        lo, hi = dram_extent(f, i)
        shifts = {0} if i not in sites else {
            kv.append_site(sites[i], pos)[0] for pos in range(first - 1, last)}
        written += [(lo + d, hi + d) for d in shifts]
    caches = [(r.addr // beat, -(-r.end // beat)) for r in symbols.values() if r.kind == "kv"]
    spans = np.array(written, np.int64).reshape(-1, 2)
    constant = [(i, src) for i in np.flatnonzero(
        (f["opcode"] == Opcode.LOAD.value) & (f["dma.spad"] == Spad.WGT.value)
        & (f["wait"] == NO_EVENT) & (f["dma.reg"] == 0)).tolist()
        if not overlapping(spans, src := dram_extent(f, i)).any()]
    cached = [i for i, src in constant
              if any(a <= src[0] and src[1] <= b for a, b in caches)]
    period = None
    if blocks is not None:
        found = block_period(instructions(words), blocks) if blocks > 1 else None
        if found is None:
            return words, places
        period = (*found, blocks)
    if not constant:
        return words, places
    sets = [(cached, HOIST_FILL)] + [([i for i, _ in constant], fill) for fill in AHEAD_FILLS]

    def as_run(moved: np.ndarray, where: Sequence[int]) -> int:
        """When ``moved`` (``where``: the place of each word of ``words``) ends as it runs."""
        return timeline(cfg, moved if ran is None else ran(
            moved, tuple(tuple(where[i] for i in ps_) for ps_ in places))).total
    best, where = words, list(range(words.shape[0]))
    end, runs = timeline(cfg, words).total, as_run(words, where)
    for _ in range(AHEAD_ROUNDS):  # each round from the last's placement and its idle
        idle = load_idle(cfg, best)
        gains = []  # (estimate, order, placement, where) of those estimated to end earlier
        for k, (movable, fill) in enumerate(sets):
            ahead = loads_ahead(cfg, best, sorted(where[i] for i in movable), idle, fill,
                                period) if movable else None
            if ahead is None or ahead[0].shape[0] > cfg.imem_depth:
                continue
            total = timeline(cfg, ahead[0]).total
            if total < end:
                gains.append((total, k, ahead[0], [ahead[1][i] for i in where]))
        # the earliest that also ends earlier as it runs (the passes after the join are
        # slow: estimated as run only in this order, until one gains)
        found = next(((total, moved, at, run) for total, _, moved, at in sorted(
            gains, key=lambda g: g[:2]) if (run := as_run(moved, at)) < runs), None)
        if found is None:
            break
        if period is not None:  # each block's moved LOADs left a SYNC behind
            period = (period[0], period[1] + (found[1].shape[0] - best.shape[0]) // blocks,
                      blocks)
        end, best, where, runs = found
    if best is words:
        return words, places
    return best, tuple(tuple(where[i] for i in ps_) for ps_ in places)


def _compact(programs: Sequence[Program], entries: Mapping[str, Mapping[str, tuple]]
             ) -> tuple[list[Program], ProgramTable]:
    """``programs`` without those no table row runs (the fused programs a joined one
    replaced, and their parts), renumbered, and the table with the new numbers."""
    used = {p for nodes in entries.values() for rows in nodes.values() for _, _, p in rows}
    used |= {programs[p].fused_into for p in used if programs[p].fused_into is not None}
    keep = sorted(used)
    new = {old: k for k, old in enumerate(keep)}
    out = [dataclasses.replace(programs[old], parts=tuple(new[i] for i in programs[old].parts),
                               fused_into=None if programs[old].fused_into is None
                               else new[programs[old].fused_into]) for old in keep]
    return out, ProgramTable({ph: {n: tuple((a, b, new[p]) for a, b, p in rows)
                                   for n, rows in nodes.items()}
                              for ph, nodes in entries.items()})


def _host_words(m: Member, d: DequantOp, requantised: set[str]) -> dict:
    """A member's fields naming what the host writes for its DEQUANT part ``d``: channel
    words where they are the host's, and ``amax`` words where no REQUANT part writes its
    input rows (``requantised``: the rows REQUANT parts write)."""
    if not d.host:
        return {}
    return {"channels": d.w, "amax": None if m.x in requantised else d.b}


def _host_rows(cfg: AcceleratorConfig, m: ProgramMember, host_rows: Mapping[str, RequantOp]
               ) -> dict:
    """A member's fields naming the Q15.16 input rows the host writes for a fused program
    that starts with a REQUANT of its input (``host_rows``: such REQUANT parts, only ever
    the first, by the INT8 rows they write)."""
    req = host_rows.get(m.x)
    if req is None:
        return {}
    return {"requant": req.x, "requant_row_bytes": row_bytes(cfg, req.length)}


def _embedding_reads(graphs: Mapping[str, Graph], work) -> dict[str, int]:
    """The buffer the decode programs read the token's embedding rows from (the input rows
    of the first vector node that reads the embedding lookup's result) and its row bytes:
    served from the embedding table on chip (:func:`_embedding_table`); empty if none."""
    g = graphs.get("decode")
    if g is None or g.meta.get("tokens", 1) != 1:
        return {}
    for phase, node, _, members in work:
        producer = g.producer(node.inputs[0]) if phase == "decode" else None
        if producer is not None and producer.op == "embed" and isinstance(members[0],
                                                                          VectorOp):
            return {members[0].x: members[0].row_bytes}
    return {}


def token_relative(cfg: AcceleratorConfig, program: Program, symbols: Mapping[str, Region],
                   embedding: Mapping[str, int]) -> Program:
    """``program`` with its LOADs of the token's embedding rows (``embed_rows``, which read
    the ``embedding`` buffer, one row) relative to the run-time register ``tok``: row ``tok``
    of the embedding table (a row of the buffer's row bytes per token,
    :func:`hw.isa.relative_fields`), so the host writes the token, not the words.

    Raises
    ------
    LoweringError
        Such a LOAD moves more than one row (the register would pick the table's row ``tok``
        of each).
    """
    if not program.embed_rows or not program.instructions:  # (a part: its program's words)
        return program
    ((served, row),) = embedding.items()
    beat = cfg.beat_bytes
    delta = (symbols[sym.embedding_table()].addr - symbols[served].addr) // beat
    words = program.words.copy()
    for i in program.embed_rows:
        ins = decode(int(words[i, 0]) | (int(words[i, 1]) << 64))
        if ins.rows != 1:
            raise LoweringError(f"node {program.node!r}: its LOAD {i} of the token's embedding "
                                f"rows moves {ins.rows} rows; one row per token is relative "
                                "to the register tok")
        words[i] = program_words([dataclasses.replace(
            ins, dram_addr=ins.dram_addr + delta, dram_stride=row // beat, reg=TOK)])[0]
    return dataclasses.replace(program, words=words)


def _embedding_region(model: LlamaLM, embedding: Mapping[str, int]) -> list[tuple[str, int]]:
    """The embedding table's (symbol, bytes): a row of the embedding buffers' per token."""
    if not embedding:
        return []
    (row,) = set(embedding.values())
    return [(sym.embedding_table(), model.config.vocab_size * row)]


def _embedding_table(model: LlamaLM, graphs: Mapping[str, Graph],
                     embedding: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The embedding table's DRAM image: each token's embedding row as the host writes it,
    Q15.16 words (:func:`hw.numerics.to_fixed`, little-endian int32), zero padded to the
    row bytes of the buffers it serves."""
    if not embedding:
        return {}
    (row,) = set(embedding.values())
    node = next(n for n in graphs["decode"].nodes if n.op == "embed")
    w = model.get_parameter(node.attrs["weight"]).detach().to("cpu").float().numpy()
    table = np.zeros((w.shape[0], row), dtype=np.uint8)
    words = to_fixed(w).astype("<i4").view(np.uint8)
    table[:, :words.shape[1]] = words
    return {sym.embedding_table(): table.reshape(-1)}


def _reads_of(t: Template, layers, symbols: Collection[str]) -> tuple[int, ...]:
    """The rows of template ``t`` (relocated for ``layers``) whose ``dram_addr`` is relative
    to one of ``symbols``."""
    if not symbols:
        return ()
    names = [getattr(m, op, None) for m in layers for op in OPERANDS]
    return tuple(int(r) for r, k in zip(t.reloc_rows, t.reloc_keys, strict=True)
                 if names[int(k)] in symbols)


def _constant_regions(work, max_context: int,
                      pairs: Mapping[int, FusedGroup] | None = None
                      ) -> list[tuple[str, int]]:
    """The (symbol, bytes) of every constant a vector program or a fused program's
    DEQUANT part reads (RMSNorm weights, channel words: one row each, shared by the
    phases; the rotary table of ``max_context`` positions, shared by every rope node)."""
    out: dict[str, int] = {}
    for _, _, _, members in work:
        for m in members:
            if isinstance(m, VectorOp) and m.w is not None:
                out[m.w] = m.const_bytes(max_context)
    for g in all_groups((pairs or {}).values()):
        for name, size, _ in part_constants(g.parts):  # the scores': the largest bucket's
            out[name] = max(size, out.get(name, 0))
    return list(out.items())


def _dequant_constants(weights: Mapping[str, QuantizedWeight],
                       pairs: Mapping[int, FusedGroup]) -> dict[str, np.ndarray]:
    """The DRAM image of every DEQUANT part's channel words: :func:`hw.numerics.
    dequant_channels` of its layer's row scales, little-endian int32 words."""
    out: dict[str, np.ndarray] = {}
    for g in all_groups(pairs.values()):
        for name, _, d in part_constants(g.parts):
            if name in out or not isinstance(d, DequantOp) or d.host:
                continue  # the host's words (the scores' channels, FOLD's value codes)
            if d.fold_qmax:  # the values epilogue: one constant word
                chan = np.full(d.length, values_channel(d.fold_qmax), np.int64)
            else:
                chan = dequant_channels(weights[d.layer].row_scale)[:d.length]
            out[name] = chan.astype("<i4").view(np.uint8)
    return out


def _vector_constants(model: LlamaLM, work, max_context: int) -> dict[str, np.ndarray]:
    """The DRAM image of every constant: an RMSNorm weight as the vector unit reads it,
    :func:`hw.numerics.norm_weight` in little-endian int32 words; the rotary table
    (:func:`_rope_table`).

    Raises
    ------
    LoweringError
        A weight element does not fit an int32 word, or the rotary table is not the engine's.
    """
    out: dict[str, np.ndarray] = {}
    for _, node, _, members in work:
        for m in members:
            if isinstance(m, VectorOp) and m.table_rows and m.w not in out:
                out[m.w] = _rope_table(model.config, max_context, m.table_row_bytes)
            elif isinstance(m, VectorOp) and m.w is not None and m.w not in out:
                w = model.get_parameter(node.attrs["weight"]).detach().to("cpu").float()
                q = norm_weight(w.numpy(), m.length)
                if np.abs(q).max(initial=0) > ACT_MAX:
                    raise LoweringError(f"node {node.name!r}: the RMSNorm weight "
                                        f"{node.attrs['weight']} times sqrt({m.length}) "
                                        "exceeds the vector engine's int32 words")
                out[m.w] = q.astype("<i4").view(np.uint8)
    return out


def _rope_table(mcfg, positions: int, row_bytes: int) -> np.ndarray:
    """The rotary table of the first ``positions`` positions as ROPE reads it: per position
    one row of ``row_bytes``, the ``head_dim / 2`` little-endian int32 words of
    :func:`hw.numerics.rope_pairs` of the fixed-point tables (:func:`hw.numerics.rope_table`
    of the float32 cos and sin the host's rope kernels receive:
    :func:`sw.models.llama.rotary_tables`), zero padded.

    Raises
    ------
    LoweringError
        The model tabulates fewer positions, or its tables are not the engine's (halves that
        differ, values that do not fit).
    """
    if positions > mcfg.max_position_embeddings:
        raise LoweringError(f"the rotary table has {mcfg.max_position_embeddings} rows "
                            f"(max_position_embeddings), a context of {positions} needs "
                            f"{positions}")
    # the interpreter's very tables (sliced: a shorter one need not round alike)
    cos, sin = rotary_tables(mcfg.head_dim, mcfg.max_position_embeddings, mcfg.rope_theta)
    try:
        words = rope_pairs(rope_table(cos[:positions].float().numpy()),
                           rope_table(sin[:positions].float().numpy()))
    except ValueError as e:
        raise LoweringError(f"rope on the vector engine: {e}") from None
    raw = words.astype("<i4").view(np.uint8)
    out = np.zeros((positions, row_bytes), dtype=np.uint8)
    out[:, :raw.shape[1]] = raw
    return out.reshape(-1)


def _bucket_contexts(bucket: int) -> tuple[int, int]:
    """The contexts (key positions) whose attention programs are ``bucket``'s."""
    first = bucket
    while first > 1 and context_bucket(first - 1) == bucket:
        first -= 1
    return first, bucket


def _decode_contexts(opts: CompileOptions) -> tuple[int, ...]:
    if opts.decode_contexts is None:
        return tuple(range(opts.prompt_tokens + 1, opts.max_context + 1))
    bad = [s for s in opts.decode_contexts if not 1 <= s <= opts.max_context]
    if bad:
        raise CompileError(f"decode contexts {bad} outside [1, max_context={opts.max_context}]")
    return tuple(sorted(set(opts.decode_contexts)))


def _stream_bytes(fmt: WeightFormat, model: LlamaLM, layer: str, cfg: AcceleratorConfig) -> int:
    """DRAM bytes of a layer's packed stream, tiles on beats (:func:`tiling.weight_image`)."""
    w = model.get_parameter(f"{layer}.weight")
    return stream_bytes(stream_layout(fmt, int(w.shape[0]), int(w.shape[1]), cfg.lanes),
                        cfg.beat_bytes)


def _program_member(m: Member) -> ProgramMember:
    p, layer = m.plan, m.source
    return ProgramMember(
        w=m.w, x=m.x, y=m.y, b=m.b, tokens=p.tokens, n=p.n, k=p.k_padded,
        act_row_bytes=p.act_row_bytes, out_row_bytes=p.out_row_bytes,
        stream_bytes=p.n_tiles * p.layout.tile_bytes, macs=p.tokens * p.n * p.fmt.steps(p.k_padded),
        row_scale=None if layer is None else _row_scale(layer.layer),
        bias=None if layer is None else layer.bias)


def _row_scale(layer: str) -> str:
    """The host tensor of a compressed layer's row scales."""
    return f"row_scale:{layer}"


def _host_tensors(model: LlamaLM, graphs: Mapping[str, Graph], fmt_map, weights
                  ) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, ...]]]:
    """Parameters the host reads (the weights of its nodes; every bias: the host converts it
    to bias rows for the WIDE_BIAS epilogue, or adds it to a host layer) and the row scales of
    compressed layers."""
    names = set()
    for g in graphs.values():
        for n in g.nodes:
            if OPS[n.op].streams == "weights":
                for layer in linear_layers(n):
                    if layer.layer not in fmt_map:
                        names.add(layer.weight)
                    if layer.bias:
                        names.add(layer.bias)
            elif "weight" in n.attrs:
                names.add(n.attrs["weight"])
    shapes = {n: tuple(model.get_parameter(n).shape) for n in sorted(names)}
    meta = model.model.embed_tokens.weight.device.type == "meta"
    host = {} if meta else {
        n: model.get_parameter(n).detach().to("cpu").float().numpy().copy() for n in shapes}
    if weights is not None:
        for layer, qw in weights.items():
            host[_row_scale(layer)] = qw.row_scale.astype(np.float32)
            shapes[_row_scale(layer)] = (qw.n_out,)
    return host, shapes


def _summarise(reports: list[PassReport]) -> list[dict]:
    """Every application of every pass, with its round (the last round matches nothing)."""
    per_round = len({r.name for r in reports})
    return [{"round": i // per_round + 1, **r.to_dict()} for i, r in enumerate(reports)]
