"""Equivalence harness: fast model (level 2) == Verilator RTL (level 3), bit and cycle exact.

Random valid programs (every instruction, every N:M pattern of two array shapes, all
epilogues, INT4/INT8, symmetric/asymmetric/raw weights, every vector sub-op on the shape with a
vector engine, concurrent chains and SYNCs) and broken
ones (illegal words, bad fields, missing END, deadlocks, event overflows) run on both backends;
errors, error pcs, cycles, every counter and the final DRAM must be identical. A mismatch is
shrunk to a minimal program and saved under build/equivalence/ for replay.

Default run: 110 programs per configuration (220 in all); `-m slow` adds 1,000 more per
configuration. A paced DRAM port (MemoryModel.cycles_per_beat 2 on the 4x4 shape, 3 on the
2x4) runs 30 programs and two lowered rings of decode layers per configuration. The Yosys
netlist (level 4) runs 100 programs and the 36 loop programs (REPEAT) of the 2x4
configuration against the RTL by default; `-m slow` brings them to 1,000 programs per
configuration and 360 loop programs, and adds 1,000 programs with vector tasks on
VECTOR_NETLIST_CONFIG (the 2x4 shape with the vector engine): fast model, RTL and netlist.
"""

import dataclasses
import os

import numpy as np
import pytest

from hw.isa import (
    MOVE_SPAD,
    OUT_MOVE_SPAD,
    RTL_VEC_FUNCS,
    EpilogueMode,
    Repeat,
    Vec,
    VecFunc,
    argmax_base,
    argmax_pairs,
    insert_laned,
    laned_vec_funcs,
    rope_geometry,
)
from hw.numerics import add_bias_wide, gemm_acc, wrap
from sim.equivalence import compare_results, minimize, write_reproducer
from sim.model import FastModel
from sim.random_programs import (
    EQUIVALENCE_CONFIGS,
    VECTOR_NETLIST_CONFIG,
    break_program,
    random_program,
    relative_program,
)

pytestmark = [pytest.mark.equivalence, pytest.mark.rtl]

REPRO_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "build", "equivalence")
BROKEN = ["illegal", "bad_field", "no_end", "deadlock", "overflow"]


def _built(cfg):
    """``cfg``, its fast model and its RTL backend, built."""
    from sim.rtl import RTLBackend
    rtl = RTLBackend(cfg)
    rtl.build()
    return cfg, FastModel(cfg), rtl


@pytest.fixture(scope="module", params=sorted(EQUIVALENCE_CONFIGS))
def backends(request):
    return _built(EQUIVALENCE_CONFIGS[request.param])


def _check(cfg, model, rtl, program, dram, names=("model", "rtl"), regs=None):
    a = model.run(program, dram, regs=regs)
    b = rtl.run(program, dram, regs=regs)
    mismatch = compare_results(a, b, names)
    if mismatch is None:
        return a

    def fails(sub):
        return compare_results(model.run(sub, dram, regs=regs),
                               rtl.run(sub, dram, regs=regs)) is not None

    small = minimize(program, fails)
    path = write_reproducer(REPRO_DIR, cfg, small, dram,
                            compare_results(model.run(small, dram, regs=regs),
                                            rtl.run(small, dram, regs=regs), names))
    lines = "\n".join(f"  {i}: {ins!r}" for i, ins in enumerate(small))
    pytest.fail(f"{names[0]} and {names[1]} disagree (registers {regs}): {mismatch}\n"
                f"minimal reproducer ({len(small)} of {len(program)} instructions, saved in "
                f"{path}):\n{lines}")


def _programs(seed0, count, cfg):
    for seed in range(seed0, seed0 + count):
        rng = np.random.default_rng(seed)
        rp = random_program(cfg, rng, chains=int(rng.integers(1, 3)),
                            tasks=int(rng.integers(1, 4)))
        if seed % 5 == 4:  # one in five is broken on purpose
            rp = break_program(rp, cfg, rng, BROKEN[(seed // 5) % len(BROKEN)])
        yield seed, rp


@pytest.mark.parametrize("block", range(11))
def test_random_programs_agree(backends, block):
    cfg, model, rtl = backends
    outcomes = {}
    for _seed, rp in _programs(1000 * block, 10, cfg):
        r = _check(cfg, model, rtl, rp.program, rp.dram)
        outcomes[r.error.name] = outcomes.get(r.error.name, 0) + 1
    assert outcomes.get("NONE", 0) >= 6  # mostly valid programs, so values are compared too


LOOP_BROKEN = ["bad_repeat", "loop_dram"]


def _loop_programs(seed0, count, cfg):
    """Random programs in which about half the tasks are hardware loops (REPEAT); one in four
    is broken on purpose: an empty REPEAT, a REPEAT or END inside a body, or a stride that
    takes a body's transfers out of DRAM."""
    for seed in range(seed0, seed0 + count):
        rng = np.random.default_rng(seed)
        rp = random_program(cfg, rng, chains=int(rng.integers(1, 3)),
                            tasks=int(rng.integers(1, 4)), loops=0.5)
        if seed % 4 == 3:
            rp = break_program(rp, cfg, rng, LOOP_BROKEN[(seed // 4) % len(LOOP_BROKEN)])
        yield seed, rp


@pytest.mark.parametrize("block", range(3))
def test_loop_programs_agree(backends, block):
    """REPEAT: expanded by the fetch unit (hw/fetch.py) and by the model (hw.isa.loop_stream)
    alike -- iterations, DRAM offsets, loop-back cycles and the BAD_REPEAT rules."""
    cfg, model, rtl = backends
    outcomes, loops = {}, 0
    for _seed, rp in _loop_programs(50_000 + 1000 * block, 12, cfg):
        loops += sum(isinstance(i, Repeat) for i in rp.program)
        r = _check(cfg, model, rtl, rp.program, rp.dram)
        outcomes[r.error.name] = outcomes.get(r.error.name, 0) + 1
    assert loops >= 6 and outcomes.get("NONE", 0) >= 6, (loops, outcomes)
    assert outcomes.get("BAD_REPEAT", 0) + outcomes.get("BAD_ADDRESS", 0) >= 1, outcomes


@pytest.mark.parametrize("spad, vector, loops, seed0", [
    (MOVE_SPAD, 0.8, 0.5, 90_000), (OUT_MOVE_SPAD, 0.3, 0.2, 95_000)], ids=["vout", "out"])
@pytest.mark.parametrize("block", range(2))
def test_move_programs_agree(backends, block, spad, vector, loops, seed0):
    """Moves into VIN: from VOUT (hw.isa.MOVE_SPAD; one chain of mostly vector tasks, each
    with a move and a VEC after it, half of them hardware loops, where a move's VIN rows do
    not advance) and from OUT (hw.isa.OUT_MOVE_SPAD; mostly GEMM tasks, each moving OUT rows
    into VIN before its STORE of OUT, a VEC reading them after): the fetch checks, the STORE
    engine's reads and VIN writes and their cycles agree with the model."""
    cfg, model, rtl = backends
    if not cfg.has_vector:
        pytest.skip("no vector engine")
    outcomes, moves = {}, 0
    for seed in range(seed0 + 1000 * block, seed0 + 1000 * block + 10):
        rng = np.random.default_rng(seed)
        rp = random_program(cfg, rng, chains=1, tasks=int(rng.integers(2, 5)), vector=vector,
                            loops=loops, moves=1.0)
        moves += sum(getattr(i, "spad", None) == spad for i in rp.program)
        r = _check(cfg, model, rtl, rp.program, rp.dram)
        outcomes[r.error.name] = outcomes.get(r.error.name, 0) + 1
    assert moves >= 10 and outcomes.get("NONE", 0) >= 8, (moves, outcomes)


def _register_programs(seed0, count, cfg):
    """Random programs, half their tasks loops, with about half their LOADs, STOREs and VECs
    relative to the run-time registers (:func:`sim.random_programs.relative_program`); one in
    four run with a register at its largest value (words out of DRAM or past their row)."""
    for seed in range(seed0, seed0 + count):
        rng = np.random.default_rng(seed)
        rp = random_program(cfg, rng, chains=int(rng.integers(1, 3)),
                            tasks=int(rng.integers(1, 4)), loops=0.5)
        yield seed, relative_program(rp, rng, broken=seed % 4 == 3)


@pytest.mark.parametrize("block", range(2))
def test_register_programs_agree(backends, block):
    """Run-time registers (hw.isa.RunRegs, random values): the fetch unit (hw/fetch.py) and
    the model (hw.isa.relative_words) move a relative word's dram_addr or imm alike, loops
    included."""
    cfg, model, rtl = backends
    outcomes, relative = {}, 0
    for _seed, rp in _register_programs(70_000 + 1000 * block, 12, cfg):
        relative += sum(bool(getattr(i, "reg", 0)) for i in rp.program)
        r = _check(cfg, model, rtl, rp.program, rp.dram, regs=rp.regs)
        outcomes[r.error.name] = outcomes.get(r.error.name, 0) + 1
    assert relative >= 12 and outcomes.get("NONE", 0) >= 6, (relative, outcomes)


@pytest.mark.slow
@pytest.mark.parametrize("block", range(11, 111))
def test_random_programs_agree_more(backends, block):
    cfg, model, rtl = backends
    for _seed, rp in _programs(1000 * block, 10, cfg):
        _check(cfg, model, rtl, rp.program, rp.dram)


def test_every_pattern_and_instruction_is_covered(backends):
    """The generator really exercises what the harness claims."""
    cfg, _, _ = backends
    seen = set()
    for _, rp in _programs(0, 220, cfg):
        for ins in rp.program:
            if isinstance(ins, int):
                seen.add("illegal")
                continue
            seen.add(type(ins).__name__)
            if type(ins).__name__ == "Gemm":
                seen.add(("pattern", ins.pattern))
                seen.add(("epilogue", ins.epilogue.name))
                seen.add(("epilogue", ins.epilogue.name, ins.tokens > 1))
                seen.add(("int8", ins.int8))
                seen.add(("asym", ins.asym))
                seen.add(("raw", ins.group_steps == 0))
                seen.add(("accumulate", ins.accumulate))
            if type(ins).__name__ == "Vec":   # ROPE: several heads (its rows are >= 2)
                many = (rope_geometry(ins.imm)[1] > 1 if ins.func == VecFunc.ROPE
                        else ins.length > 1)
                seen.add(("vec", ins.func.name, many))
                if ins.func == VecFunc.ARGMAX:   # its imm: an index base, over pairs
                    seen |= {("argmax base", argmax_base(ins.imm) > 0),
                             ("argmax pairs", bool(argmax_pairs(ins.imm)) and many)}
            if type(ins).__name__ in ("Load", "Store"):
                seen.add((type(ins).__name__, ins.spad.name))
    need = {"Load", "Store", "Gemm", "Sync", "End", "illegal"}
    if cfg.has_vector:
        need |= {("vec", f.name, many) for f in RTL_VEC_FUNCS for many in (False, True)}
        need |= {("Load", "VIN"), ("Store", "VOUT"), ("argmax base", True),
                 ("argmax pairs", True)}
    need |= {("pattern", i) for i in range(len(cfg.pattern_table))}
    need |= {("epilogue", e.name, many) for e in EpilogueMode for many in (False, True)}
    need |= {(f, v) for f in ("int8", "asym", "raw", "accumulate") for v in (True, False)}
    assert need <= seen, need - seen


@pytest.mark.parametrize("seed", range(6))
def test_lowered_layers_agree(backends, seed):
    """Programs from the compiler's linear-layer lowering (double-buffered, several layers in
    one program) run identically on both backends, values included: this also shows the
    lowering is race-free, since the RTL really overlaps loads with compute."""
    from hw.format import WeightFormat, random_quantized
    from sw.compile.errors import LoweringError
    from sw.compile.layers import LayerSpec, build_layers
    cfg, model, rtl = backends
    rng = np.random.default_rng(seed)
    specs = []
    for _ in range(int(rng.integers(1, 4))):
        p = cfg.pattern_table[int(rng.integers(len(cfg.pattern_table)))]
        fmt = WeightFormat(p, 4, 32, symmetric=bool(rng.integers(2)))
        n, k, t = int(rng.integers(1, 20)), int(rng.integers(8, 160)), int(rng.integers(1, 7))
        # Biased layers (WIDE_BIAS) too, with more tokens than two PARAM buffers hold.
        bias = rng.integers(-2**31, 2**31, size=(t, n)).astype(np.int32) \
            if rng.random() < 0.5 else None
        specs.append(LayerSpec(fmt, n, k, t, random_quantized(fmt, (n, k), rng),
                               rng.integers(-127, 128, size=(t, k)).astype(np.int8), bias))
    try:
        lp = build_layers(cfg, specs)
    except LoweringError as e:
        pytest.skip(f"layer does not fit this small configuration: {e}")
    r = _check(cfg, model, rtl, lp.program, lp.dram)
    assert r.ok and r.counters["load_exec"] and r.counters["compute_exec"]
    for i, sp in enumerate(specs):  # and the values are the golden ones
        acc = gemm_acc(np.pad(sp.acts, ((0, 0), (0, sp.weight.k_padded - sp.k))),
                       sp.weight.int_weight(), cfg.acc_bits)
        want = acc if sp.bias is None else add_bias_wide(acc, sp.bias)
        assert np.array_equal(lp.read_output(r.dram, i), wrap(want, 32))


@pytest.mark.parametrize("seed", range(3))
def test_lowered_decode_layers_in_a_ring_agree(backends, seed):
    """Unbiased one-token layers (resident activations) keep a ring of weight chunks in
    flight (sw.compile.schedule.ring_slots, one counting event per role): they run
    identically on both backends, values the golden ones, so the ring is race-free too."""
    _ring_layers_agree(backends, seed)


def _ring_layers_agree(backends, seed):
    """:func:`test_lowered_decode_layers_in_a_ring_agree` on ``backends``."""
    from hw.format import WeightFormat, random_quantized
    from sw.compile.errors import LoweringError
    from sw.compile.layers import LayerSpec, build_layers
    cfg, model, rtl = backends
    rng = np.random.default_rng(seed)
    specs = []
    for _ in range(int(rng.integers(1, 3))):
        p = cfg.pattern_table[int(rng.integers(len(cfg.pattern_table)))]
        fmt = WeightFormat(p, 4, 32, symmetric=bool(rng.integers(2)))
        n, k = int(rng.integers(4, 9)) * cfg.lanes, int(rng.integers(8, 96))
        specs.append(LayerSpec(fmt, n, k, 1, random_quantized(fmt, (n, k), rng),
                               rng.integers(-127, 128, size=(1, k)).astype(np.int8)))
    try:
        lp = build_layers(cfg, specs, ring=True)
    except LoweringError as e:
        pytest.skip(f"layer does not fit this small configuration: {e}")
    assert len({i.spad_addr for i in lp.program
                if type(i).__name__ == "Load" and i.spad.name == "WGT"}) > 2
    r = _check(cfg, model, rtl, lp.program, lp.dram)
    assert r.ok
    for i, sp in enumerate(specs):
        acc = gemm_acc(np.pad(sp.acts, ((0, 0), (0, sp.weight.k_padded - sp.k))),
                       sp.weight.int_weight(), cfg.acc_bits)
        assert np.array_equal(lp.read_output(r.dram, i), wrap(acc, 32))


# ---- a laned vector engine (AcceleratorConfig.vector_lanes > 1) on the vector shape
#: The 4x4 shape's vector engine with 2 and 4 lanes (its beat's elements, vector_lanes_max).
#: Two lanes as the vector preset streams them; four with SILU_GATE laned too and a ROPE over
#: the heads the lanes hold (the wide systems' ``vector_laned_silu`` and
#: ``vector_laned_rope_heads``).
LANED_CONFIGS = {lanes: EQUIVALENCE_CONFIGS["4x4"].replace(
    vector_lanes=lanes, vector_laned_silu=lanes == 4, vector_laned_rope_heads=lanes == 4)
    for lanes in (2, 4)}


@pytest.fixture(scope="module", params=sorted(LANED_CONFIGS))
def laned_backends(request):
    return _built(LANED_CONFIGS[request.param])


@pytest.mark.parametrize("block", range(3))
def test_laned_vector_programs_agree(laned_backends, block):
    """Random programs of mostly vector tasks (the laned sub-ops' rows aligned to the lanes
    by the generator, lengths any; INSERTs laned where their codes lie a group of lanes
    apart), a quarter of them loops and one in five broken, give the
    same bits, cycles and counters on the fast model and the RTL of a laned engine."""
    cfg, model, rtl = laned_backends
    outcomes, laned = {}, 0
    for seed in range(80_000 + 10 * block, 80_010 + 10 * block):
        rng = np.random.default_rng(seed)
        rp = random_program(cfg, rng, chains=int(rng.integers(1, 3)),
                            tasks=int(rng.integers(1, 4)), vector=0.8, loops=0.25)
        if seed % 5 == 4:
            rp = break_program(rp, cfg, rng, BROKEN[(seed // 5) % len(BROKEN)])
        laned += sum(isinstance(i, Vec) and i.length > cfg.vector_lanes
                     and (i.func in laned_vec_funcs(cfg)
                          or bool(insert_laned(i.func.value, i.imm, cfg.vector_lanes)))
                     for i in rp.program)
        r = _check(cfg, model, rtl, rp.program, rp.dram, regs=rp.regs)
        outcomes[r.error.name] = outcomes.get(r.error.name, 0) + 1
    assert outcomes.get("NONE", 0) >= 6 and laned >= 10, (outcomes, laned)


# ---- a paced DRAM port (MemoryModel.cycles_per_beat > 1)
#: The 4x4 shape (vector engine, moves) with a beat every 2 cycles, the board's pace
#: (bench.board), and the 2x4 shape with a beat every 3 cycles (the LOAD engine's turnaround,
#: hw.timing.LOAD_TURNAROUND: back-to-back LOADs as far apart as the beats within one).
PACED_CONFIGS = {f"{name} k={k}": EQUIVALENCE_CONFIGS[name].replace(
    memory=dataclasses.replace(EQUIVALENCE_CONFIGS[name].memory, cycles_per_beat=k))
    for name, k in (("4x4", 2), ("2x4", 3))}


@pytest.fixture(scope="module", params=sorted(PACED_CONFIGS))
def paced_backends(request):
    return _built(PACED_CONFIGS[request.param])


@pytest.mark.parametrize("block", range(3))
def test_paced_programs_agree(paced_backends, block):
    """Random programs (moves too, which are not paced; a quarter of the tasks loops, one in
    five broken) give the same bits,
    cycles and counters on the fast model and the RTL of a paced DRAM port."""
    cfg, model, rtl = paced_backends
    outcomes, dma = {}, 0
    for seed in range(60_000 + 10 * block, 60_010 + 10 * block):
        rng = np.random.default_rng(seed)
        rp = random_program(cfg, rng, chains=int(rng.integers(1, 3)),
                            tasks=int(rng.integers(1, 4)), loops=0.25)
        if seed % 5 == 4:
            rp = break_program(rp, cfg, rng, BROKEN[(seed // 5) % len(BROKEN)])
        dma += sum(type(i).__name__ in ("Load", "Store") and i.rows * i.row_beats > 1
                   for i in rp.program)
        r = _check(cfg, model, rtl, rp.program, rp.dram, regs=rp.regs)
        outcomes[r.error.name] = outcomes.get(r.error.name, 0) + 1
    assert outcomes.get("NONE", 0) >= 6 and dma >= 10, (outcomes, dma)


@pytest.mark.slow  # minutes on 2 cores; the random paced programs above run by default
@pytest.mark.parametrize("seed", range(2))
def test_paced_lowered_decode_layers_in_a_ring_agree(paced_backends, seed):
    """The compiler's ring of weight chunks on a paced port: the same on both backends,
    values the golden ones (the paced LOADs shift every event, the ring stays race-free)."""
    _ring_layers_agree(paced_backends, seed)


# ---- level 4: the Yosys netlist against the RTL (sim/netlist.py)
NETLIST_CONFIG = "2x4"  # the default run's shape; the slow set adds the other
VECTOR_NETLIST = "2x4 + vector engine"  # VECTOR_NETLIST_CONFIG, in the slow set
LANED_NETLIST = "2x4 + vector engine of 2 lanes"  # the same with vector_lanes 2, slow set
_NETLISTS: dict = {}


def _netlist_pair(name):
    """(config, RTL, netlist) of an equivalence shape or of the vector netlist shape, built
    once per session."""
    if name not in _NETLISTS:
        from sim.netlist import NetlistBackend
        from sim.rtl import RTLBackend
        cfg = {VECTOR_NETLIST: VECTOR_NETLIST_CONFIG,
               LANED_NETLIST: VECTOR_NETLIST_CONFIG.replace(vector_lanes=2)}.get(name) \
            or EQUIVALENCE_CONFIGS[name]
        netlist = NetlistBackend(cfg)
        netlist.build()
        _NETLISTS[name] = cfg, RTLBackend(cfg), netlist
    return _NETLISTS[name]


def _netlist_check(cfg, rtl, netlist, rp):
    return _check(cfg, rtl, netlist, rp.program, rp.dram, ("rtl", "netlist"))


def _netlist_block(name, block):
    cfg, rtl, netlist = _netlist_pair(name)
    return {_netlist_check(cfg, rtl, netlist, rp).error
            for _seed, rp in _programs(50_000 + 10 * block, 10, cfg)}


@pytest.mark.netlist
@pytest.mark.parametrize("block", range(10))
def test_netlist_agrees_with_rtl(block):
    """Random programs, broken ones included, give the same bits, cycles and counters on the
    gate-level netlist as on the RTL (and so, by the tests above, as on the fast model)."""
    assert len(_netlist_block(NETLIST_CONFIG, block)) >= 2  # valid and broken programs both ran


def _netlist_loop_block(block):
    cfg, rtl, netlist = _netlist_pair(NETLIST_CONFIG)
    outcomes, loops = {}, 0
    for _seed, rp in _loop_programs(50_000 + 1000 * block, 12, cfg):
        loops += sum(isinstance(i, Repeat) for i in rp.program)
        r = _netlist_check(cfg, rtl, netlist, rp)
        outcomes[r.error.name] = outcomes.get(r.error.name, 0) + 1
    assert loops >= 6 and outcomes.get("NONE", 0) >= 6, (loops, outcomes)
    assert outcomes.get("BAD_REPEAT", 0) + outcomes.get("BAD_ADDRESS", 0) >= 1, outcomes


@pytest.mark.netlist
@pytest.mark.parametrize("block", range(3))
def test_netlist_loop_programs_agree(block):
    """The loop programs of test_loop_programs_agree (REPEAT, broken loops included) give the
    same bits, cycles and counters on the netlist as on the RTL: the fetch unit's loop
    expansion, in gates."""
    _netlist_loop_block(block)


@pytest.mark.netlist
@pytest.mark.slow
@pytest.mark.parametrize("block", range(3, 30))
def test_netlist_loop_programs_agree_more(block):
    _netlist_loop_block(block)


def _netlist_register_block(name, block, vector=0.0):
    """12 register programs (:func:`_register_programs`, with ``vector`` of their tasks
    vector tasks) on the netlist of ``name`` against its RTL, random registers included."""
    cfg, rtl, netlist = _netlist_pair(name)
    outcomes, relative = {}, 0
    for seed in range(90_000 + 100 * block, 90_012 + 100 * block):
        rng = np.random.default_rng(seed)
        rp = random_program(cfg, rng, chains=int(rng.integers(1, 3)),
                            tasks=int(rng.integers(1, 4)), loops=0.5, vector=vector)
        rp = relative_program(rp, rng, broken=seed % 4 == 3)
        relative += sum(bool(getattr(i, "reg", 0)) for i in rp.program)
        r = _check(cfg, rtl, netlist, rp.program, rp.dram, ("rtl", "netlist"), regs=rp.regs)
        outcomes[r.error.name] = outcomes.get(r.error.name, 0) + 1
    assert relative >= 12 and outcomes.get("NONE", 0) >= 6, (relative, outcomes)
    assert outcomes.get("BAD_ADDRESS", 0) >= 1, outcomes  # a register at its largest value


@pytest.mark.netlist
@pytest.mark.parametrize("block", range(2))
def test_netlist_register_programs_agree(block):
    """Programs relative to random run-time registers (test_register_programs_agree's kind)
    give the same bits, cycles and counters on the netlist as on the RTL: the register file
    and its adds in the fetch unit, in gates."""
    _netlist_register_block(NETLIST_CONFIG, block)


@pytest.mark.netlist
@pytest.mark.slow
@pytest.mark.parametrize("block", range(3))
def test_vector_netlist_register_programs_agree(block):
    """As test_netlist_register_programs_agree on the vector netlist shape, most tasks vector
    tasks: relative SOFTMAX and INSERT words' imm in gates too."""
    _netlist_register_block(VECTOR_NETLIST, block, vector=0.7)


#: Blocks of 10 programs of the vector netlist test (VECTOR_NETLIST_CONFIG).
VECTOR_NETLIST_BLOCKS = 100


def _vector_programs(block, cfg):
    """Block ``block`` of the vector netlist test: 10 random programs of ``cfg`` whose tasks
    are mostly vector tasks (every VEC sub-op), a quarter of them hardware loops; one in five
    broken on purpose."""
    for seed in range(70_000 + 10 * block, 70_010 + 10 * block):
        rng = np.random.default_rng(seed)
        rp = random_program(cfg, rng, chains=int(rng.integers(1, 3)),
                            tasks=int(rng.integers(1, 4)), vector=0.7, loops=0.25)
        if seed % 5 == 4:
            rp = break_program(rp, cfg, rng, BROKEN[(seed // 5) % len(BROKEN)])
        yield seed, rp


def test_vector_netlist_programs_cover_every_sub_op():
    """The vector netlist test's first 100 programs run every VEC sub-op, on one element and
    on several, and REPEAT loops of vector tasks."""
    seen = set()
    for block in range(10):
        for _seed, rp in _vector_programs(block, VECTOR_NETLIST_CONFIG):
            for i, ins in enumerate(rp.program):
                if isinstance(ins, Vec):
                    many = (rope_geometry(ins.imm)[1] > 1 if ins.func == VecFunc.ROPE
                            else ins.length > 1)
                    seen.add((ins.func.name, many))
                if isinstance(ins, Repeat) and any(
                        isinstance(x, Vec) for x in rp.program[i + 1:i + 1 + ins.length]):
                    seen.add("vector loop")
    need = {(f.name, many) for f in RTL_VEC_FUNCS for many in (False, True)} | {"vector loop"}
    assert need <= seen, need - seen


@pytest.mark.netlist
@pytest.mark.slow
@pytest.mark.parametrize("block", range(VECTOR_NETLIST_BLOCKS))
def test_netlist_vector_programs_agree(block):
    """Random programs with vector tasks give the same bits, cycles and counters on the fast
    model, the RTL and the netlist of the vector engine's shape (VECTOR_NETLIST_CONFIG)."""
    cfg, rtl, netlist = _netlist_pair(VECTOR_NETLIST)
    model = FastModel(cfg)
    errors = set()
    for _seed, rp in _vector_programs(block, cfg):
        _check(cfg, model, rtl, rp.program, rp.dram)
        errors.add(_netlist_check(cfg, rtl, netlist, rp).error)
    assert len(errors) >= 2  # valid and broken programs both ran


@pytest.mark.netlist
@pytest.mark.slow
@pytest.mark.parametrize("block", range(10))
def test_netlist_laned_vector_programs_agree(block):
    """As test_netlist_vector_programs_agree on the vector netlist shape with a 2-lane engine
    (LANED_NETLIST): the fast model, the RTL and the netlist agree on random vector programs
    whose laned sub-ops stream two elements a cycle."""
    cfg, rtl, netlist = _netlist_pair(LANED_NETLIST)
    model = FastModel(cfg)
    errors = set()
    for _seed, rp in _vector_programs(block, cfg):
        _check(cfg, model, rtl, rp.program, rp.dram)
        errors.add(_netlist_check(cfg, rtl, netlist, rp).error)
    assert len(errors) >= 2  # valid and broken programs both ran


#: The slow set: 1,000 programs per shape in all (the default run's 100 included).
SLOW_NETLIST_BLOCKS = [(name, block) for name in sorted(EQUIVALENCE_CONFIGS)
                       for block in range(10 if name == NETLIST_CONFIG else 0, 100)]


@pytest.mark.netlist
@pytest.mark.slow
@pytest.mark.parametrize("name,block", SLOW_NETLIST_BLOCKS)
def test_netlist_agrees_with_rtl_more(name, block):
    _netlist_block(name, block)
