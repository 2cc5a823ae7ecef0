"""A VEC that reads rows a move carried on chip waits on that move (``sw.compile.onchip
.moved_waits``), not on a LOAD-engine SYNC a LOAD completion delay later: a small HBM-like
configuration (a 64-byte beat as wide as the engine's 16 lanes, a 65-cycle delay) whose
attention program weaves eight heads' vector parts with their values GEMMs."""

import copy

import numpy as np
import torch
from compile_testutil import compressed, runtime_steps, tiny_lm, twin_step_logits

from hw.config import AcceleratorConfig, MemoryModel
from hw.engines import Engine
from hw.isa import MOVE_SOURCES, Store, Sync, Vec, decode, decode_fields
from hw.timing import load_completion_delay
from sim.backends import make_backend
from sim.model import FastModel
from sw.compile import CompileOptions, compile_model, compiler
from sw.compile.onchip import _matches
from sw.compress.model import use_hardware_numerics
from sw.runtime import Runtime

PROMPT, STEPS, HEADS = 15, 1, 8
#: 16 lanes, a beat of their 16 int32 words and an HBM-like memory latency.
WIDE = AcceleratorConfig(rows=2, cols=8, memory=MemoryModel(
    bytes_per_cycle=64, latency=64, size_bytes=1 << 24), vin_spad_bytes=1 << 15,
    vout_spad_bytes=1 << 13, act_spad_bytes=1 << 15, wgt_spad_bytes=1 << 16)
WIDE = WIDE.replace(vector_lanes=WIDE.vector_lanes_max)


def _attention(exe) -> np.ndarray:
    """The words of the decode step's attention program."""
    (p,) = [p for p in exe.programs if p.phase == "decode" and p.words.shape[0]
            and p.node.endswith("self_attn.scores")]
    return p.words


def _handoffs(words: np.ndarray) -> list[tuple[int, int]]:
    """``(move, VEC)`` per VEC whose wait a STORE-engine SYNC right after a move grants."""
    ins = [decode(int(lo) | int(hi) << 64) for lo, hi in words.tolist()]
    match = _matches(decode_fields(words))
    return [(int(match[v]) - 1, v) for v, x in enumerate(ins) if isinstance(x, Vec)
            and match[v] > 0 and isinstance(ins[match[v]], Sync)
            and ins[match[v]].engine == Engine.STORE
            and isinstance(ins[match[v] - 1], Store) and ins[match[v] - 1].spad in MOVE_SOURCES]


def test_vector_parts_wait_on_their_moves(monkeypatch):
    """Each SOFTMAX and FOLD of a head woven with the values GEMMs (every head but the
    first, whose parts run beside the scores GEMMs) reads the rows the part before moved
    into VIN and
    starts less than a LOAD completion delay after that move (or the VEC before it) ends,
    where a LOAD-engine SYNC after the move raised its FULL a delay later; the program takes
    at least a delay a head fewer cycles than with those SYNCs, and the decode step's logits
    are the vector twin's bit for bit."""
    lm = tiny_lm(layers=1, heads=HEADS, kv_heads=HEADS, hidden=512, vocab=64)
    ws = compressed(lm, "2:4", 32)
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT + STEPS),
                        generator=torch.Generator().manual_seed(4))
    want = twin_step_logits(use_hardware_numerics(copy.deepcopy(lm), ws, vector=True), ids,
                            PROMPT)
    opts = CompileOptions(PROMPT, PROMPT + STEPS, one_program=False, chain_programs=False)
    exe = compile_model(lm, WIDE, opts, weights=ws)
    for (logits, _), w in zip(runtime_steps(Runtime(exe, make_backend("model", WIDE),
                                                    vector=True), ids, PROMPT), want,
                              strict=True):
        assert torch.equal(logits, w)
    words, delay = _attention(exe), load_completion_delay(WIDE)
    run = FastModel(WIDE).run(words, timing_only=True, trace=True)
    t = {x.index: x for x in run.trace}
    vecs = sorted(i for i, x in t.items() if x.engine == Engine.VECTOR)
    pairs = _handoffs(words)
    assert len(pairs) >= 2 * (HEADS - 1)  # each woven head's SOFTMAX and FOLD at least
    for m, v in pairs:
        before = max([t[m].end] + [t[u].end for u in vecs if u < v])
        assert t[v].grant - before < delay
    monkeypatch.setattr(compiler, "moved_waits",
                        lambda cfg, w, keep=(): (w, tuple(range(w.shape[0]))))
    plain = _attention(compile_model(lm, WIDE, opts, weights=ws))
    assert not _handoffs(plain)
    assert run.cycles + HEADS * delay <= FastModel(WIDE).run(plain, timing_only=True).cycles
