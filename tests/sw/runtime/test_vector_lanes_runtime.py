"""The compiler on a laned vector engine (``AcceleratorConfig.vector_lanes``): its programs
place every laned VEC's rows on the lanes (hw.isa.vec_unaligned never fires), and a model runs
to the same logits as on one lane, in fewer cycles (the lanes change when, never what)."""

import copy

import pytest
import torch
from compile_testutil import (
    VSMALL,
    backends_agree,
    compressed,
    runtime_steps,
    tiny_lm,
    twin_step_logits,
)

from hw.isa import Opcode, VecFunc, decode_fields, program_words, vec_unaligned
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model
from sw.compress.model import use_hardware_numerics
from sw.runtime import Runtime

PROMPT, STEPS = 6, 3


def test_lanes_change_cycles_not_logits():
    lm = tiny_lm()
    ws = compressed(lm)
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT + STEPS),
                        generator=torch.Generator().manual_seed(3))
    runs = {}
    for lanes in (1, VSMALL.vector_lanes_max):
        cfg = VSMALL.replace(vector_lanes=lanes, vector_laned_silu=lanes > 1)
        exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + STEPS), weights=ws)
        laned = 0
        for p in exe.programs:   # every laned VEC's rows on the lanes
            if p.instructions:
                f = decode_fields(program_words(p.words))
                vec = f["opcode"] == Opcode.VEC.value
                assert not (vec & vec_unaligned(f["vec.func"], f["vec.a_addr"], f["vec.b_addr"],
                                                f["vec.dst_addr"], lanes,
                                                cfg.vector_laned_silu)).any()
                laned += int((vec & (f["vec.func"] == VecFunc.DEQUANT.value)).sum())
        assert laned > 0
        runs[lanes] = runtime_steps(Runtime(exe, make_backend("model", cfg), vector=True),
                                    ids, PROMPT)
    want = twin_step_logits(use_hardware_numerics(copy.deepcopy(lm), ws, vector=True), ids,
                            PROMPT)
    one, four = runs[1], runs[VSMALL.vector_lanes_max]
    for (a, sa), (b, sb), w in zip(one, four, want, strict=True):
        assert torch.equal(a, w) and torch.equal(b, w)
        assert sum(p.cycles for p in sb.programs) < sum(p.cycles for p in sa.programs)


@pytest.mark.rtl
def test_rtl_runs_a_laned_engine_as_the_fast_model():
    """A one-layer model compiled for the equivalence harness's vector shape with four lanes
    (its beat's elements) runs on the RTL to the fast model's logits and cycles, step by
    step, and to the twin's logits: the laned RTL engine on the compiler's programs (RMSNORM,
    REQUANT, DEQUANT, FOLD, ADD, SOFTMAX, ROPE (half heads of 8) and SILU_GATE
    (``vector_laned_silu``) on the lanes beside the one-lane sub-ops)."""
    from sim.random_programs import EQUIVALENCE_CONFIGS
    cfg = EQUIVALENCE_CONFIGS["4x4"].replace(vector_lanes=4, vector_laned_silu=True)
    lm = tiny_lm(layers=1, heads=2, kv_heads=1, hidden=32, vocab=32)
    ws = compressed(lm, "2:4", 32)
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + 2), weights=ws)
    funcs = set()
    for p in exe.programs:
        if p.instructions:
            f = decode_fields(program_words(p.words))
            funcs |= {VecFunc(int(v)) for v in f["vec.func"][f["opcode"] == Opcode.VEC.value]}
    assert {VecFunc.RMSNORM, VecFunc.REQUANT, VecFunc.DEQUANT, VecFunc.FOLD, VecFunc.SOFTMAX,
            VecFunc.SILU_GATE, VecFunc.ROPE} <= funcs
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT + 2),
                        generator=torch.Generator().manual_seed(5))
    runs = backends_agree(exe, cfg, ids, PROMPT)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True)
    for (a, _), w in zip(runs[1], twin_step_logits(twin, ids, PROMPT), strict=True):
        assert torch.equal(a, w)
