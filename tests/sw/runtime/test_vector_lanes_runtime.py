"""The compiler on a laned vector engine (``AcceleratorConfig.vector_lanes``): its programs
place every laned VEC's rows on the lanes (hw.isa.vec_unaligned never fires), and a model runs
to the same logits as on one lane, in fewer cycles (the lanes change when, never what)."""

import copy

import torch
from compile_testutil import SMALL, compressed, runtime_steps, tiny_lm, twin_step_logits

from hw.isa import Opcode, VecFunc, decode_fields, program_words, vec_unaligned
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model
from sw.compress.model import use_hardware_numerics
from sw.runtime import Runtime

PROMPT, STEPS = 6, 3
VSMALL = SMALL.replace(vin_spad_bytes=2048, vout_spad_bytes=1024)


def test_lanes_change_cycles_not_logits():
    lm = tiny_lm()
    ws = compressed(lm)
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT + STEPS),
                        generator=torch.Generator().manual_seed(3))
    runs = {}
    for lanes in (1, VSMALL.vector_lanes_max):
        cfg = VSMALL.replace(vector_lanes=lanes)
        exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + STEPS), weights=ws)
        laned = 0
        for p in exe.programs:   # every laned VEC's rows on the lanes
            if p.instructions:
                f = decode_fields(program_words(p.words))
                vec = f["opcode"] == Opcode.VEC.value
                assert not (vec & vec_unaligned(f["vec.func"], f["vec.a_addr"], f["vec.b_addr"],
                                                f["vec.dst_addr"], lanes)).any()
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
