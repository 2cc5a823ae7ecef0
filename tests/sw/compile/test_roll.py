"""The loop-rolling pass (sw.compile.roll): a rolled program dispatches exactly the unrolled
schedule's instructions (hw.isa.loop_stream), runs to the same results, and is shorter; with
the option off, compile output is unchanged."""

import numpy as np
import pytest
import torch
from compile_testutil import SMALL, compressed, tiny_lm

from hw.config import AcceleratorConfig
from hw.format import WeightFormat
from hw.isa import (
    Load,
    Repeat,
    Spad,
    Store,
    Vec,
    VecFunc,
    decode,
    decode_fields,
    dispatch_errors,
    loop_instruction,
    loop_stream,
    program_words,
)
from sim.backends import make_backend
from sw.compile import CompileError, CompileOptions, compile_model
from sw.compile.lower import Member
from sw.compile.relocation import lower_template
from sw.compile.roll import roll, roll_words
from sw.compile.schedule import PlacedLayer, schedule_layers
from sw.compile.tiling import plan_linear
from sw.runtime import Runtime


def _dispatched(words: np.ndarray, cfg: AcceleratorConfig) -> list:
    """The instructions the fetch unit dispatches from ``words`` (REPEATs expanded, not
    listed)."""
    f = decode_fields(words)
    s = loop_stream(f, dispatch_errors(f, cfg))
    ins = [decode(int(w[0]) | (int(w[1]) << 64)) for w in words.tolist()]
    return [loop_instruction(ins[p], int(o)) for p, o in zip(s.pcs, s.offsets, strict=True)
            if not isinstance(ins[p], Repeat)]


@pytest.mark.parametrize("n,k,tokens", [(512, 1024, 1), (256, 256, 4), (64, 256, 1)])
def test_rolled_schedule_dispatches_the_unrolled_one(n, k, tokens):
    cfg = AcceleratorConfig()
    plan = plan_linear(cfg, WeightFormat.parse("dense-int4-g64"), n, k, tokens)
    prog, relocs = schedule_layers(cfg, [PlacedLayer(plan)])
    rolled, rrelocs = roll(prog, relocs)
    assert len(rolled) == len(rrelocs) <= len(prog)
    assert _dispatched(program_words(rolled), cfg) == prog
    # relocations stay with their instructions
    f = decode_fields(program_words(rolled))
    pcs = loop_stream(f, dispatch_errors(f, cfg)).pcs.tolist()
    assert [rrelocs[p] for p in pcs if not isinstance(rolled[p], Repeat)] == list(relocs)
    if len(prog) >= 40:  # many output tiles: their periods roll
        assert len(rolled) < len(prog) // 3


def test_relocated_words_roll_but_the_kept_ones_and_say_where_those_are():
    """``roll_words``: a relocated schedule (every address final) rolls as :func:`roll`
    does and dispatches the same instructions, except the words kept (the runtime sets
    them per step), which no loop holds; the map says where each kept word lies."""
    cfg = AcceleratorConfig()
    plan = plan_linear(cfg, WeightFormat.parse("dense-int4-g64"), 512, 1024, 1)
    prog, _ = schedule_layers(cfg, [PlacedLayer(plan)])
    loads = [j for j, ins in enumerate(prog) if isinstance(ins, Load) and ins.spad == Spad.WGT]
    keep = {loads[5], loads[len(loads) // 2]}
    rolled, where = roll_words(prog, keep)
    assert _dispatched(program_words(rolled), cfg) == prog
    assert len(rolled) < len(prog)
    assert set(where) == keep and all(rolled[where[j]] == prog[j] for j in keep)
    f = decode_fields(program_words(rolled))
    pcs = loop_stream(f, dispatch_errors(f, cfg)).pcs.tolist()
    assert all(pcs.count(where[j]) == 1 for j in keep)  # dispatched once: in no loop
    assert len(roll_words(prog)[0]) < len(rolled)  # without them: longer loops


def test_roll_keeps_what_must_not_repeat():
    softmax = [Vec(func=VecFunc.SOFTMAX, length=4, imm=4)] * 4
    assert roll(softmax, [None] * 4)[0] == softmax  # the host sets each row's imm
    mixed = [Load(spad=Spad.WGT, dram_addr=a) for a in (0, 8, 16, 20)]
    assert _dispatched(program_words(roll(mixed, [None] * 4)[0]), AcceleratorConfig()) == mixed
    back = [Store(dram_addr=a) for a in (40, 30, 20)]  # strides are unsigned
    assert roll(back, [None] * 3)[0] == back
    other = [Load(spad=Spad.ACT, dram_addr=0), Load(spad=Spad.ACT, dram_addr=4)] * 2
    assert roll(other, [(0, "x"), (0, "b")] * 2)[0][0] == Repeat(length=2, count=2)


def test_templates_roll_only_when_asked():
    cfg = AcceleratorConfig()
    plan = plan_linear(cfg, WeightFormat.parse("dense-int4-g64"), 512, 1024, 1)
    members = [Member(plan, "w:0", "x:0", "y:0", None)]
    plain = lower_template(cfg, members)
    rolled = lower_template(cfg, members, loops=True)
    assert plain.instructions > 3 * rolled.instructions
    assert np.array_equal(plain.words, lower_template(cfg, members, loops=False).words)


def test_compiled_model_with_loops_runs_to_the_same_logits():
    lm = tiny_lm(layers=1)
    ws = compressed(lm)
    off = compile_model(lm, SMALL, CompileOptions(4, 6), weights=ws)
    on = compile_model(lm, SMALL, CompileOptions(4, 6, loops=True), weights=ws)
    assert on.report["loops"] and not off.report["loops"]
    assert on.instructions < off.instructions
    ids = torch.randint(0, lm.config.vocab_size, (1, 6),
                        generator=torch.Generator().manual_seed(3))
    outs = []
    for exe in (off, on):
        rt = Runtime(exe, make_backend("model", SMALL))
        outs.append([rt.step(ids[:, :4])] + [rt.step(ids[:, p:p + 1]) for p in (4, 5)])
    for (a, sa), (b, sb) in zip(*outs, strict=True):
        assert torch.equal(a, b)  # bit for bit: the same instructions run
        assert sb.cycles > 0 and abs(sb.cycles - sa.cycles) <= 0.05 * sa.cycles, (sa, sb)


def test_a_program_too_long_unrolled_is_rolled_by_default():
    """``CompileOptions(loops=None)``, the default: only the programs that would not fit the
    instruction memory unrolled are rolled; the rest stay as ``loops=False`` lowers them, and
    the logits are those of the unrolled compilation on a memory that holds it."""
    lm = tiny_lm(layers=1)
    ws = compressed(lm)
    unrolled = compile_model(lm, SMALL, CompileOptions(4, 6, loops=False), weights=ws)
    rolled = compile_model(lm, SMALL, CompileOptions(4, 6, loops=True), weights=ws)
    longest = max(p.instructions for p in unrolled.programs)
    depth = 1 << (max(p.instructions for p in rolled.programs) - 1).bit_length()
    assert depth < longest  # some program fits only rolled
    small = SMALL.replace(imem_depth=depth)
    with pytest.raises(CompileError, match="instruction memory holds"):
        compile_model(lm, small, CompileOptions(4, 6, loops=False), weights=ws)
    auto = compile_model(lm, small, CompileOptions(4, 6), weights=ws)
    assert all(p.instructions <= depth for p in auto.programs)
    fits = [a for a, u in zip(auto.programs, unrolled.programs, strict=True)
            if u.instructions <= depth]
    assert fits and all(np.array_equal(a.words, u.words) for a, u in zip(
        fits, [u for u in unrolled.programs if u.instructions <= depth], strict=True))
    ids = torch.randint(0, lm.config.vocab_size, (1, 6),
                        generator=torch.Generator().manual_seed(5))
    outs = []
    for exe, cfg in ((unrolled, SMALL), (auto, small)):
        rt = Runtime(exe, make_backend("model", cfg))
        outs.append([rt.step(ids[:, :4])[0]] + [rt.step(ids[:, p:p + 1])[0] for p in (4, 5)])
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
