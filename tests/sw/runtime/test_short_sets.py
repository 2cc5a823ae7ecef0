"""Attention's heads as short activation sets (``sw.compile.schedule.act_buffers``): a tiny
model on VSMALL, whose scores rings are array-bound with a head's query row a set of a
36-cycle GEMM against a 25-cycle LOAD completion delay, alternates those sets between the ACT
halves; its decode steps (one program each) run to the twin's logits in fewer cycles than
with one buffer (15,899 against 16,013 a step)."""

import copy

import torch
from compile_testutil import VSMALL, compressed, runtime_steps, tiny_lm, twin_step_logits

from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model, schedule
from sw.compress.model import use_hardware_numerics
from sw.runtime import Runtime

PROMPT, STEPS = 6, 3


def test_short_attention_sets_keep_the_logits_in_fewer_cycles(monkeypatch):
    lm = tiny_lm(heads=4, kv_heads=4)
    ws = compressed(lm)
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT + STEPS),
                        generator=torch.Generator().manual_seed(3))
    want = twin_step_logits(use_hardware_numerics(copy.deepcopy(lm), ws, vector=True), ids,
                            PROMPT)
    cycles, short = {}, schedule.SHORT_SET_DELAYS
    for delays in (short, 0):  # 0: memory-bound rings alone alternate (one buffer here)
        monkeypatch.setattr(schedule, "SHORT_SET_DELAYS", delays)
        exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + STEPS), weights=ws)
        runs = runtime_steps(Runtime(exe, make_backend("model", VSMALL), vector=True), ids,
                             PROMPT)
        for (logits, _), w in zip(runs, want, strict=True):
            assert torch.equal(logits, w)
        cycles[delays] = sum(p.cycles for _, stats in runs[1:] for p in stats.programs)
    assert cycles[short] < cycles[0]
