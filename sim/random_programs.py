"""Random valid programs and configurations for the equivalence harness.

A program is a set of independent *chains*, each owning a disjoint slice of every scratchpad and
of the DRAM output area. A chain repeats tasks -- load ACT/WGT/PARAM data, run 1-3 GEMMs with
random fields, store OUT to DRAM -- linked by three events (loads -> compute -> store -> next
loads); on a configuration with a vector engine some tasks are vector tasks instead -- load VIN
rows, run 1-3 VECs with random sub-ops, rows and addresses, store VOUT to DRAM -- linked by
three events of their own. Every instruction that touches data another one touches is ordered
by events or by its engine's order: programs are race-free, and their result is defined bit
for bit. Chains
interleave in program order and run concurrently on the engines. With ``loops`` > 0 a task
may be a hardware loop (:class:`hw.isa.Repeat`): its instructions repeated 2-4 times, every
iteration's loads and store moved by a random DRAM stride that keeps them in their areas, the
first load waiting on the previous iteration's store (the first iteration's signal seeded by a
SYNC when the chain has no earlier task of the kind). Random SYNCs add extra
cross-engine dependencies. Every wait refers to a signal earlier in program order, so valid
programs never deadlock; :func:`break_program` makes the invalid variants (illegal words, bad
fields, missing END, deadlocks, event overflows); :func:`relative_program` makes words
relative to the run-time registers and gives the registers to run them with.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from hw.config import AcceleratorConfig, MemoryModel
from hw.engines import engines_of
from hw.isa import (
    ARGMAX_BASE_BITS,
    MOVE_SOURCES,
    MOVE_SPAD,
    NO_EVENT,
    NUM_REGS,
    OUT_MOVE_SPAD,
    REG_BITS,
    REG_VEC_FUNCS,
    RTL_VEC_FUNCS,
    VEC_FUNC_VALUES,
    End,
    Engine,
    EpilogueMode,
    Gemm,
    Instr,
    ISAError,
    Load,
    Repeat,
    Spad,
    SpadMove,
    Store,
    Sync,
    Vec,
    VecFunc,
    argmax_imm,
    check,
    dequant_imm,
    dispatch_limits,
    encode,
    field_location,
    gemm_extents,
    insert_imm,
    kv4_imm,
    laned_vec_funcs,
    rope_imm,
    vec_out_words,
    vec_reads_b,
)
from hw.numerics import DEQUANT_EXP_MAX, DEQUANT_MANT_BITS, norm_eps

__all__ = ["RandomProgram", "random_config", "random_program", "break_program",
           "random_channel_word",
           "EQUIVALENCE_CONFIGS", "VECTOR_NETLIST_CONFIG", "random_insert_imm",
           "random_kv4_imm", "random_argmax_imm"]

#: Two array shapes (8 and 16 lanes) with different memories, queues and pattern sets, the
#: second with a vector engine (the first, without one, checks its absence); small buffers and
#: DRAM keep RTL runs fast.
EQUIVALENCE_CONFIGS = {
    "2x4": AcceleratorConfig(
        rows=2, cols=4, max_tokens=4, act_spad_bytes=1024, wgt_spad_bytes=4096,
        out_spad_bytes=1024, param_spad_bytes=512, queue_depth=2, num_events=12,
        event_bits=4, imem_depth=512, memory=MemoryModel(latency=5, size_bytes=1 << 15)),
    "4x4": AcceleratorConfig(
        rows=4, cols=4, max_tokens=8, patterns=("1:4", "2:4", "3:4", "2:8", "1:16"),
        act_spad_bytes=2048, wgt_spad_bytes=4096, out_spad_bytes=2048, param_spad_bytes=512,
        queue_depth=3, num_events=16, event_bits=3, imem_depth=512,
        memory=MemoryModel(bytes_per_cycle=16, latency=11, size_bytes=1 << 15),
        vin_spad_bytes=1024, vout_spad_bytes=512),
}


#: The vector engine's shape for the netlist rung (level 4): the 2x4 shape with the 4x4 shape's
#: VIN and VOUT scratchpads and the events two chains of vector tasks need. The vector engine
#: does not depend on the array, so this is the smallest netlist that holds it (its size and
#: build time: docs/architecture.md, section 6).
VECTOR_NETLIST_CONFIG = replace(
    EQUIVALENCE_CONFIGS["2x4"], num_events=16,
    vin_spad_bytes=EQUIVALENCE_CONFIGS["4x4"].vin_spad_bytes,
    vout_spad_bytes=EQUIVALENCE_CONFIGS["4x4"].vout_spad_bytes)


def random_config(name: str) -> AcceleratorConfig:
    return EQUIVALENCE_CONFIGS[name]


@dataclass
class RandomProgram:
    """A generated program, its DRAM image and what it exercises."""

    program: list[Instr | int]
    dram: np.ndarray
    notes: list[str] = field(default_factory=list)
    #: The run-time registers it runs with (``{register: value}``, :func:`hw.isa.reg_values`;
    #: None: all 0).
    regs: dict[int, int] | None = None

    def words(self) -> list[int]:
        return [w if isinstance(w, int) else encode(w) for w in self.program]


def _region(cfg: AcceleratorConfig, spad: str, chain: int, chains: int) -> tuple[int, int]:
    """Beat range [start, end) of a chain's slice of a scratchpad (word aligned)."""
    beats = cfg.spad_beats(spad)
    word = max(1, getattr(cfg, f"{spad}_word_bytes") // cfg.beat_bytes)
    size = beats // chains // word * word
    return chain * size, (chain + 1) * size


def _random_gemm(cfg: AcceleratorConfig, rng: np.random.Generator, regions) -> Gemm:
    """A GEMM whose every access stays inside the chain's regions (rejection sampling)."""
    beat = cfg.beat_bytes
    for _ in range(200):
        pidx = int(rng.integers(len(cfg.pattern_table)))
        pat = cfg.pattern_table[pidx]
        int8 = pat.dense and 8 in cfg.weight_bits and rng.random() < 0.4
        raw = rng.random() < 0.2
        k_steps = int(rng.integers(1, 48))
        group_steps = 0 if raw else int(rng.integers(1, k_steps + 4))
        asym = not raw and rng.random() < 0.4
        tokens = int(rng.integers(1, cfg.max_tokens + 1))
        epi = EpilogueMode(int(rng.integers(len(EpilogueMode))))
        ws, we = regions["wgt"]
        aw, ae = regions["act"]
        os_, oe = regions["out"]
        ps, pe = regions["param"]
        wwords = max(1, cfg.wgt_word_bytes // beat)
        owords = max(1, cfg.out_word_bytes // beat)
        pwords = max(1, cfg.param_word_bytes // beat)
        g = Gemm(k_steps=k_steps, group_steps=group_steps, tokens=tokens, pattern=pidx,
                 int8=bool(int8), asym=bool(asym), epilogue=epi,
                 accumulate=bool(rng.random() < 0.3), shift=int(rng.integers(32)),
                 wgt_addr=ws + int(rng.integers(0, max(1, (we - ws) // 2))) // wwords * wwords,
                 act_addr=aw + int(rng.integers(0, max(1, (ae - aw) // 2))),
                 act_stride=int(rng.integers(0, 6)),
                 out_addr=os_ + int(rng.integers(0, max(1, (oe - os_) // 2))) // owords * owords,
                 param_addr=ps + int(rng.integers(0, max(1, (pe - ps) // 2))) // pwords * pwords)
        try:
            check(g, cfg)
        except ISAError:
            continue
        if _inside(g, cfg, regions):
            return g
    # Fallback that always fits: one dense step, one token, WIDE at the region start.
    return Gemm(k_steps=1, group_steps=0, tokens=1, epilogue=EpilogueMode.WIDE,
                wgt_addr=regions["wgt"][0], act_addr=regions["act"][0],
                out_addr=regions["out"][0], param_addr=regions["param"][0])


def _inside(g: Gemm, cfg: AcceleratorConfig, regions) -> bool:
    """Every scratchpad range of ``g`` lies inside its chain's region of that scratchpad."""
    return all(end <= regions[spad.name.lower()][1] * cfg.beat_bytes
               for spad, end in gemm_extents(g, cfg).items())


def _random_vec(cfg: AcceleratorConfig, rng: np.random.Generator, regions) -> Vec:
    """A VEC with a random sub-op whose rows lie inside the chain's VIN and VOUT regions
    (element addresses; VIN and VOUT words are one element)."""
    per_beat = cfg.beat_bytes // cfg.vin_word_bytes
    i0, i1 = (b * per_beat for b in regions["vin"])
    o0, o1 = (b * per_beat for b in regions["vout"])
    func = VecFunc(int(rng.choice([f.value for f in RTL_VEC_FUNCS])))
    if func == VecFunc.ROPE:
        return _random_rope(rng, (i0, i1), (o0, o1), cfg.vector_lanes,
                            cfg.vector_laned_rope_heads)
    length = int(rng.integers(1, min(i1 - i0, o1 - o0) + 1))
    if rng.random() < 0.4:  # short rows, where the pipeline's fill and drain overlap most
        length = int(rng.integers(1, 4))
    out = int(vec_out_words(func.value, length))
    imm = 0
    if func == VecFunc.SOFTMAX:    # valid positions: none, some, all
        imm = int(rng.choice([0, length, int(rng.integers(0, length + 1))]))
    elif func == VecFunc.RMSNORM:  # epsilon: none, a model's, a large one
        imm = int(rng.choice([0, norm_eps(1e-5, length), int(rng.integers(0, 1 << 40))]))
    elif func == VecFunc.DEQUANT:  # the amax word: any element of the chain's VIN region,
        imm = dequant_imm(int(rng.integers(i0, i1)), bool(rng.random() < 0.5))  # or FOLD's
    elif func in (VecFunc.INSERT, VecFunc.INSERT4):
        imm = random_insert_imm(rng, length, func == VecFunc.INSERT4)
    elif func == VecFunc.CHANNEL:  # a normalised channel word, or any imm (bits 24.. ignored)
        imm = random_channel_word(rng)
    elif func == VecFunc.KV4:      # a value row, or a key row's group dividing it
        imm = random_kv4_imm(rng, length)
    elif func == VecFunc.ARGMAX:   # an index base, over pairs where the row is even
        imm = random_argmax_imm(rng, length)
    # A laned sub-op's rows start on a multiple of its lanes, an INSERT's but its code
    # words' too, and a KV4's (hw.isa.vec_unaligned): the draws rounded down (the regions
    # start on beats), the same draws as with one lane.
    lanes = cfg.vector_lanes
    laned = laned_vec_funcs(cfg)
    rows = (*laned, VecFunc.INSERT, VecFunc.INSERT4, VecFunc.KV4)
    mask = ~(lanes - 1) if func in rows else -1
    b_mask = ~(lanes - 1) if func in laned else -1
    return Vec(func=func, length=length, imm=imm,
               a_addr=i0 + int(rng.integers(0, i1 - i0 - length + 1)) & mask,
               b_addr=i0 + int(rng.integers(0, i1 - i0 - length + 1)) & b_mask
               if vec_reads_b(func.value) else 0,
               dst_addr=o0 + int(rng.integers(0, o1 - o0 - out + 1)) & mask)


def random_kv4_imm(rng: np.random.Generator, length: int) -> int:
    """A KV4's imm for a row of ``length``: a value row's, or a key row's with a random
    power-of-two group dividing ``length`` (one element up to the whole row)."""
    if rng.random() < 0.3:
        return kv4_imm(None)
    top = (length & -length).bit_length() - 1    # the largest power of two dividing it
    return kv4_imm(1 << int(rng.integers(0, top + 1)))


def random_argmax_imm(rng: np.random.Generator, length: int) -> int:
    """An ARGMAX's imm for a row of ``length`` (:func:`hw.isa.argmax_imm`): no base, a random
    one or the largest, over pairs half the time where ``length`` is even (an odd one is
    BAD_ADDRESS), sometimes with the ignored bits above set."""
    base = int(rng.choice([0, int(rng.integers(0, 1 << ARGMAX_BASE_BITS)),
                           (1 << ARGMAX_BASE_BITS) - 1]))
    imm = argmax_imm(base, length % 2 == 0 and rng.random() < 0.5)
    return imm | (int(rng.integers(1, 1 << 8)) << (ARGMAX_BASE_BITS + 1)
                  if rng.random() < 0.2 else 0)


def random_insert_imm(rng: np.random.Generator, length: int, nibbles: bool = False) -> int:
    """A valid INSERT ``imm`` (:func:`hw.isa.insert_imm`) for a row of ``length`` words:
    whole code words (stride 1: a value cache's records, a value code word) or one code per
    word (stride >= 4: a key cache's records), one group or several, codes inside the row or
    running past its end (dropped), often the largest fields. With ``nibbles``, an INSERT4's
    (the same counted in nibbles: 8 to a word)."""
    per = 8 if nibbles else 4
    row = per * length
    if rng.random() < 0.4:   # stride 1: base, group and skip multiples of a word's codes
        group = per * int(rng.choice([1, 2, int(rng.integers(1, 512 // per + 1))]))
        skip = per * int(rng.choice([0, int(rng.integers(0, 256 // per))]))
        base = per * int(rng.integers(0, min(1023 // per, max(1, row // per)) + 1))
        stride = 1
    else:
        group = int(rng.choice([1, 2, int(rng.integers(1, 513))]))
        skip = int(rng.choice([0, 255, int(rng.integers(0, 256))]))
        base = int(rng.integers(0, min(1023, row) + 1))
        stride = int(rng.choice([per, 255, int(rng.integers(per, 256))]))
    groups = int(rng.choice([1, 32, int(rng.integers(1, 33))]))
    return insert_imm(base, group, groups, stride, skip)


def random_channel_word(rng: np.random.Generator) -> int:
    """A CHANNEL's ``imm``: mostly a normalised channel word (mantissa in [2**16, 2**17), any
    exponent: small ones make large amax words saturate), else any 40-bit ``imm``."""
    if rng.random() < 0.8:
        return (int(rng.integers(1 << (DEQUANT_MANT_BITS - 1), 1 << DEQUANT_MANT_BITS))
                | int(rng.integers(0, DEQUANT_EXP_MAX + 1)) << DEQUANT_MANT_BITS)
    return int(rng.integers(0, 1 << 40))


def _random_rope(rng: np.random.Generator, vin: tuple[int, int], vout: tuple[int, int],
                 lanes: int = 1, heads: bool = False) -> Vec:
    """A ROPE over random heads (small ones often: one pair per head, the table's wrap every
    two elements) with its row, its table and its results inside the element ranges ``vin``
    and ``vout`` (which start on beats); the table words are whatever VIN holds. With
    ``lanes > 1`` its rows start on multiples of them (:func:`hw.isa.vec_unaligned`) and a
    half head of ``lanes`` pairs, or a multiple, is drawn too (:func:`hw.isa.rope_laned`);
    with ``heads`` (the configuration's ``vector_laned_rope_heads``) a power-of-two one
    below the lanes too, heads the lanes hold whole (:func:`hw.isa.rope_heads_laned`)."""
    (i0, i1), (o0, o1) = vin, vout
    room = min(i1 - i0, o1 - o0)
    halves = [1, 2, int(rng.integers(1, room // 2 + 1))]
    if lanes > 1 and room >= 2 * lanes:
        halves.append(lanes * int(rng.integers(1, room // (2 * lanes) + 1)))
    if heads and room >= lanes:
        halves.append(1 << int(rng.integers(0, lanes.bit_length() - 1)))
    head_dim = 2 * int(rng.choice(halves))
    heads = int(rng.integers(1, room // head_dim + 1))
    length = heads * head_dim
    mask = ~(lanes - 1)
    return Vec(func=VecFunc.ROPE, length=length, imm=rope_imm(head_dim, heads),
               a_addr=i0 + int(rng.integers(0, i1 - i0 - length + 1)) & mask,
               b_addr=i0 + int(rng.integers(0, i1 - i0 - head_dim // 2 + 1)) & mask,
               dst_addr=o0 + int(rng.integers(0, o1 - o0 - length + 1)) & mask)


def _random_loads(cfg, rng, regions, spads, half, wait) -> list[Load]:
    """A LOAD into the chain's region of each of ``spads`` (random rows, strides, DRAM
    addresses in the lower half); the first waits on ``wait``."""
    loads = []
    for k, spad in enumerate(spads):
        s0, s1 = regions[spad.name.lower()]
        span = s1 - s0
        start = s0 + int(rng.integers(0, max(1, span // 4)))
        beats = int(rng.integers(1, s1 - start + 1))
        rows = int(rng.integers(1, 4))
        row_beats = max(1, beats // rows)
        rows = min(rows, (s1 - start) // row_beats)
        stride = row_beats + int(rng.integers(0, 3))
        dmax = half - ((rows - 1) * stride + row_beats)
        loads.append(Load(spad=spad, spad_addr=start, rows=rows, row_beats=row_beats,
                          dram_stride=stride, dram_addr=int(rng.integers(0, dmax)),
                          wait=wait if k == 0 else None))
    return loads


def _random_store(cfg, rng, regions, spad: Spad, base: int, out_span: int, wait, signal
                  ) -> Store:
    """A STORE of the chain's region of ``spad`` to its DRAM output area from ``base``."""
    o0, o1 = regions[spad.name.lower()]
    rows = int(rng.integers(1, 3))
    row_beats = max(1, int(rng.integers(1, o1 - o0 + 1)) // rows)
    dmax = out_span - ((rows - 1) * row_beats * 2 + row_beats)
    return Store(spad=spad, spad_addr=o0, rows=rows, row_beats=row_beats,
                 dram_stride=row_beats * 2, dram_addr=base + int(rng.integers(0, max(1, dmax))),
                 wait=wait, signal=signal)


def _random_move(rng: np.random.Generator, regions, wait: int, signal: int,
                 spad: Spad | SpadMove = MOVE_SPAD) -> Store:
    """A move (:data:`hw.isa.MOVE_SOURCES`: ``spad``, from VOUT by default) of rows of the
    chain's region of its source into its VIN region (rows ``dram_stride`` beats apart,
    overlapping when the stride is below the row)."""
    o0, o1 = regions[MOVE_SOURCES[spad].name.lower()]
    i0, i1 = regions["vin"]
    rows = int(rng.integers(1, 4))
    row_beats = max(1, int(rng.integers(1, min(o1 - o0, i1 - i0) + 1)) // rows)
    stride = int(rng.integers(0, 2 * row_beats + 1))
    span = (rows - 1) * stride + row_beats
    if span > i1 - i0:
        rows, span = 1, row_beats
    return Store(spad=spad, spad_addr=o0 + int(rng.integers(0, o1 - o0 - rows * row_beats
                                                                     + 1)),
                 dram_addr=i0 + int(rng.integers(0, i1 - i0 - span + 1)), rows=rows,
                 row_beats=row_beats, dram_stride=stride, wait=wait, signal=signal)


def _dram_end(ins: Load | Store) -> int:
    return ins.dram_addr + (ins.rows - 1) * ins.dram_stride + ins.row_beats


def _loop(rng: np.random.Generator, task: list[Instr], half: int, store_end: int,
          seed: Sync | None) -> list[Instr]:
    """``task`` (loads, ops, a store whose signal its first load waits on) as a REPEAT of
    2-4 iterations, with a DRAM stride that keeps the loads below ``half`` and the store
    below ``store_end``; ``seed`` (a SYNC that gives the first iteration its signal) first."""
    count = int(rng.integers(2, 5))
    rooms = {"wgt_stride": [half - _dram_end(i) for i in task
                            if isinstance(i, Load) and i.spad == Spad.WGT],
             "load_stride": [half - _dram_end(i) for i in task
                             if isinstance(i, Load) and i.spad != Spad.WGT],
             "store_stride": [store_end - _dram_end(task[-1])]}
    strides = {k: int(rng.integers(0, max(0, min(r, default=1 << 20)) // (count - 1) + 1))
               for k, r in rooms.items()}
    return ([seed] if seed else []) + [Repeat(length=len(task), count=count, **strides)] \
        + task


def random_program(cfg: AcceleratorConfig, rng: np.random.Generator, *, chains: int = 2,
                   tasks: int = 3, syncs: float = 0.3, vector: float = 0.4,
                   loops: float = 0.0, moves: float = 0.5) -> RandomProgram:
    """A race-free, deadlock-free program with ``chains`` concurrent chains of ``tasks``; on a
    configuration with a vector engine, each task is a vector task with probability
    ``vector``; each task is a hardware loop with probability ``loops``. With one chain, a
    vector task moves some of its VOUT rows into VIN with probability ``moves`` (where the
    configuration has an event for it), and one more VEC follows the move; so does a GEMM task
    (not a loop) with its OUT rows (:data:`hw.isa.OUT_MOVE_SPAD`), its STORE of OUT after the
    move, and the VEC's results stored as a vector task's: the STORE engine is in order, so
    every earlier vector task is done when the move writes VIN, and the next vector task's
    LOADs wait on that STORE."""
    dram = rng.integers(0, 256, size=cfg.memory.size_bytes, dtype=np.uint8)
    half = cfg.dram_beats // 2          # inputs below, chain outputs above
    out_span = (cfg.dram_beats - half) // chains
    kinds = 6 if cfg.has_vector else 3  # events per chain
    if cfg.num_events < kinds * chains + 2:
        raise ValueError(f"need {kinds * chains + 2} events for {chains} chains")
    ev = [(3 * c, 3 * c + 1, 3 * c + 2) for c in range(chains)]  # loads->gemm->store->loads
    # loads->vec->store->loads
    vev = [(3 * (chains + c), 3 * (chains + c) + 1, 3 * (chains + c) + 2) for c in range(chains)]
    next_event = kinds * chains
    # a move's signal to the VEC after it (STORE -> VECTOR), one per chain, where they fit;
    # with one chain only: VIN has one DMA write port, and another chain's VIN LOADs are not
    # ordered with the moves (sim.model rejects a program whose writes meet)
    move_ev = None
    if cfg.has_vector and chains == 1 and cfg.num_events >= (kinds + 1) * chains + 2:
        move_ev = [next_event + c for c in range(chains)]
        next_event += chains
    sync_events: dict[tuple[Engine, Engine], int] = {}
    pending_sync: list[tuple[Engine, int]] = []
    per_chain: list[list[list[Instr]]] = []
    spads = ("act", "wgt", "out", "param") + (("vin", "vout") if cfg.has_vector else ())
    for c in range(chains):
        regions = {s: _region(cfg, s, c, chains) for s in spads}
        # The chain's DRAM output area: GEMM tasks store to its first half, vector tasks to
        # its second.
        base = half + c * out_span
        span = out_span // 2 if cfg.has_vector else out_span
        chain_tasks = []
        started = {"gemm": False, "vec": False}
        for _t in range(tasks):
            loop = loops > 0 and rng.random() < loops
            if cfg.has_vector and rng.random() < vector:
                e, kind = vev[c], "vec"
                task: list[Instr] = _random_loads(cfg, rng, regions, (Spad.VIN,), half,
                                                  e[2] if started["vec"] or loop else None)
                ops: list[Instr] = [_random_vec(cfg, rng, regions)
                                    for _ in range(int(rng.integers(1, 4)))]
                store = (Spad.VOUT, base + span)
            else:
                e, kind = ev[c], "gemm"
                task = _random_loads(cfg, rng, regions, (Spad.WGT, Spad.ACT, Spad.PARAM), half,
                                     e[2] if started["gemm"] or loop else None)
                ops = [_random_gemm(cfg, rng, regions) for _ in range(int(rng.integers(1, 4)))]
                store = (Spad.OUT, base)
            out_move = (kind == "gemm" and not loop and move_ev is not None
                        and rng.random() < moves)
            seed = None if started[kind] else Sync(engine=Engine.STORE, signal=e[2])
            started[kind] = True
            task[-1] = Load(**{**task[-1].__dict__, "signal": e[0]})
            ops[0] = type(ops[0])(**{**ops[0].__dict__, "wait": e[0]})
            ops[-1] = type(ops[-1])(**{**ops[-1].__dict__, "signal": e[1]})
            if kind == "vec" and move_ev is not None and rng.random() < moves:
                ops += [_random_move(rng, regions, e[1], move_ev[c]),
                        replace(_random_vec(cfg, rng, regions), wait=move_ev[c], signal=e[1])]
            task += ops
            if out_move:  # the move takes e[1]; the STORE of OUT follows it in order
                v = vev[c]
                if started["vec"]:  # the last vector task's credit: the next one waits on ours
                    task.insert(0, Sync(engine=Engine.LOAD, wait=v[2]))
                task += [_random_move(rng, regions, e[1], move_ev[c], OUT_MOVE_SPAD),
                         _random_store(cfg, rng, regions, store[0], store[1], span,
                                       wait=None, signal=e[2]),
                         replace(_random_vec(cfg, rng, regions), wait=move_ev[c], signal=v[1]),
                         _random_store(cfg, rng, regions, Spad.VOUT, base + span, span,
                                       wait=v[1], signal=v[2])]
                started["vec"] = True
            else:
                task.append(_random_store(cfg, rng, regions, store[0], store[1], span,
                                          wait=e[1], signal=e[2]))
            if loop:
                task = _loop(rng, task, half, store[1] + span, seed)
            chain_tasks.append(task)
        per_chain.append(chain_tasks)
    # Interleave chains task by task, sprinkle matched SYNC pairs between them.
    program: list[Instr] = []
    engines = [e.engine for e in engines_of(cfg)]
    for t in range(tasks):
        for c in rng.permutation(chains):
            program += per_chain[c][t]
            if rng.random() < syncs:
                if pending_sync and rng.random() < 0.5:
                    eng, e = pending_sync.pop(0)
                    program.append(Sync(engine=eng, wait=e))
                else:
                    src, dst = (engines[i] for i in rng.integers(0, len(engines), size=2))
                    if (src, dst) not in sync_events:
                        if next_event >= cfg.num_events:
                            continue
                        sync_events[(src, dst)] = next_event
                        next_event += 1
                    e = sync_events[(src, dst)]
                    program.append(Sync(engine=src, signal=e))
                    pending_sync.append((dst, e))
    for eng, e in pending_sync:  # consume what was signalled: counters return to zero
        program.append(Sync(engine=eng, wait=e))
    program.append(End())
    return RandomProgram(program, dram, [f"{chains} chains x {tasks} tasks"])


def relative_program(rp: RandomProgram, rng: np.random.Generator, share: float = 0.5,
                     broken: bool = False) -> RandomProgram:
    """``rp`` with about ``share`` of its LOADs, STOREs and VECs (of :data:`hw.isa.REG_VEC_FUNCS`)
    relative to a random run-time register (:func:`hw.isa.relative_fields`), with random
    registers: each such word's ``dram_addr`` (``imm``) less the register's value, so that it
    runs as before (a word whose field is too small for that stays as it was). ``broken``:
    then a register some LOAD or STORE names is set to its largest value, which takes the
    words relative to it out of DRAM: BAD_ADDRESS."""
    regs = {r: int(rng.integers(0, 64)) for r in range(1, NUM_REGS + 1)}
    out, dma_regs = [], []
    for ins in rp.program:
        if isinstance(ins, (Load, Store, Vec)) and rng.random() < share:
            reg = int(rng.integers(1, NUM_REGS + 1))
            r = regs[reg]
            if isinstance(ins, Vec) and ins.func.value in REG_VEC_FUNCS and ins.imm >= r:
                ins = replace(ins, imm=ins.imm - r, reg=reg)
            elif isinstance(ins, (Load, Store)) and ins.dram_addr >= r:
                ins = replace(ins, dram_addr=ins.dram_addr - r, reg=reg)
                dma_regs.append(reg)
        out.append(ins)
    if broken and dma_regs:
        regs[int(rng.choice(dma_regs))] = (1 << REG_BITS) - 1
    return RandomProgram(out, rp.dram, rp.notes + [f"registers {regs}"], regs)


def break_program(rp: RandomProgram, cfg: AcceleratorConfig, rng: np.random.Generator,
                  kind: str) -> RandomProgram:
    """An invalid variant of a valid program: the machine must stop with an error."""
    prog = list(rp.program)
    pos = int(rng.integers(0, len(prog)))
    if kind == "illegal":
        if rng.random() < 0.75:  # an opcode this configuration does not run
            rest = int.from_bytes(rng.bytes(16), "little") >> 3  # random bits above the opcode
            absent = [o for o in range(1 << 3) if o not in dispatch_limits(cfg).opcodes]
            word = int(rng.choice(absent)) | (rest << 3)
        elif not cfg.has_vector or rng.random() < 0.5:  # a GEMM naming no epilogue mode
            offset, width = field_location("gemm.epilogue")
            undefined = int(rng.integers(len(EpilogueMode), 1 << width))
            word = encode(Gemm()) & ~(((1 << width) - 1) << offset) | (undefined << offset)
        else:  # a VEC naming no sub-op
            offset, width = field_location("vec.func")
            undefined = int(rng.choice([v for v in range(1 << width)
                                        if v not in VEC_FUNC_VALUES]))
            word = encode(Vec()) & ~(((1 << width) - 1) << offset) | (undefined << offset)
        prog.insert(pos, word)
    elif kind == "bad_field":
        choices = [Gemm(pattern=len(cfg.pattern_table)), Load(spad=Spad.OUT),
                   Sync(engine=Engine.LOAD, signal=cfg.num_events),
                   Load(spad=Spad.ACT, spad_addr=cfg.spad_beats("act")),
                   Gemm(tokens=cfg.max_tokens + 1), Store(spad=Spad.WGT),
                   Load(spad=Spad.VOUT), Store(spad=Spad.VIN, dram_addr=cfg.spad_beats("vin"))]
        vin = cfg.vin_spad_bytes // cfg.vin_word_bytes
        if cfg.has_vector:  # fields out of range
            choices += [Vec(length=0), Vec(func=VecFunc.ARGMAX, a_addr=vin - 1, length=2),
                        Vec(b_addr=vin, length=1),
                        Vec(dst_addr=cfg.vout_spad_bytes // cfg.vout_word_bytes - 1, length=2),
                        Vec(func=VecFunc.ROPE, length=4, imm=rope_imm(4, 2)),
                        Vec(func=VecFunc.ROPE, length=3, imm=rope_imm(3, 1)),
                        Vec(func=VecFunc.ROPE, b_addr=vin - 1, length=4, imm=rope_imm(4, 1)),
                        Vec(func=VecFunc.ARGMAX, length=3, imm=argmax_imm(pairs=True))]
        else:               # the absent engine, its opcode and its scratchpads
            choices += [Vec(), Sync(engine=Engine.VECTOR), Load(spad=Spad.VIN),
                        Store(spad=Spad.VOUT)]
        prog.insert(pos, choices[int(rng.integers(len(choices)))])
    elif kind == "no_end":
        prog = prog[:-1]
    elif kind == "deadlock":
        used = {i.wait for i in prog if not isinstance(i, int)} | \
            {i.signal for i in prog if not isinstance(i, int)}
        free = [e for e in range(cfg.num_events) if e not in used]
        if not free:
            free = [cfg.num_events - 1]
        engines = engines_of(cfg)
        prog.insert(pos, Sync(engine=engines[int(rng.integers(len(engines)))].engine,
                              wait=free[0]))
    elif kind == "overflow":
        used = {i.wait for i in prog if not isinstance(i, int)} | \
            {i.signal for i in prog if not isinstance(i, int)}
        e = next((e for e in range(cfg.num_events) if e not in used), NO_EVENT - 1)
        engines = engines_of(cfg)
        eng = engines[int(rng.integers(len(engines)))].engine
        prog[pos:pos] = [Sync(engine=eng, signal=e)] * (1 << cfg.event_bits)
    elif kind == "bad_repeat":  # an empty REPEAT, or a body holding a REPEAT or the END
        choice = int(rng.integers(4))
        if choice < 2:
            prog.insert(pos, Repeat(length=choice, count=1 - choice))
        else:
            end = len(prog) - 1 if isinstance(prog[-1], End) else len(prog)
            pos = min(pos, end)
            inner = [Repeat(length=1, count=2)] if choice == 2 else []
            prog[pos:pos] = [Repeat(length=end - pos + len(inner) + 1, count=2)] + inner
    elif kind == "loop_dram":  # a loop whose second iteration's transfers leave DRAM
        big = {k: int(rng.integers(cfg.dram_beats, 1 << 27))
               for k in ("wgt_stride", "load_stride", "store_stride")}
        loops = [i for i, x in enumerate(prog) if isinstance(x, Repeat)]
        if loops:
            at = loops[int(rng.integers(len(loops)))]
            prog[at] = Repeat(length=prog[at].length, count=prog[at].count, **big)
        else:
            at = [i for i, x in enumerate(prog) if isinstance(x, (Load, Store))]
            prog.insert(at[int(rng.integers(len(at)))],
                        Repeat(length=1, count=int(rng.integers(2, 4)), **big))
    else:
        raise ValueError(f"unknown breakage {kind!r}")
    return RandomProgram(prog, rp.dram, rp.notes + [kind])
