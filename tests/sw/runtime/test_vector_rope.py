"""RoPE on the vector engine: a ``rope`` node is one program of one ROPE VEC per token
(sw/compile/vector.py), its table rows loaded from a constant table of every position, the
LOADs' addresses pointed by the host at the step's first position; its outputs equal the host
kernel's (``rope_vector``) bit for bit."""

import numpy as np
import pytest
import torch
from compile_testutil import VSMALL, compressed, tiny_lm

from hw.config import MemoryModel
from hw.isa import Load, Spad, Vec, VecFunc, check, decode_program, reg_table_values, rope_imm
from hw.numerics import (
    from_fixed,
    rope_pairs,
    rope_table,
    rope_vector,
    to_fixed,
    vec_rope_pairs,
)
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model, symbols
from sw.compile.compiler import _rope_table
from sw.compile.errors import LoweringError
from sw.compile.ir import Graph, Node, TensorType
from sw.compile.registers import POS as PENDING_POS
from sw.compile.registers import RegisterFile, allocate_words
from sw.compile.relocation import lower_vector_template, relocate
from sw.compile.schedule import rope_table_beats, vector_tasks
from sw.compile.vector import row_bytes, vector_op
from sw.models import LlamaConfig
from sw.models.llama import rotary_tables
from sw.runtime import Runtime
from sw.runtime import runtime as runtime_module

PROMPT, STEPS = 6, 4


def _rope_programs(exe):
    return [p for p in exe.programs if p.vector is not None and p.vector.func == VecFunc.ROPE]


# ---------------------------------------------------------------------- numerics
@pytest.mark.parametrize("head_dim, theta, positions", [
    (64, 10000.0, 256),       # the reference model's shape (sw/models/reference_model.py)
    (64, 100000.0, 8192),     # SmolLM2-135M: head_dim 64, rope_theta 1e5, 8192 positions
    (64, 10000.0, 8192),
    (16, 10000.0, 64),        # the tiny test models
])
def test_vec_rope_pairs_on_the_model_tables_equals_rope_vector(head_dim, theta, positions):
    """The engine's one-word-per-pair table (``rope_pairs``) loses nothing of the models'
    tables: ``vec_rope_pairs`` on it equals the twin's ``rope_vector`` bit for bit, at every
    tabulated position (and so does the packing itself: it unpacks to the tables' halves)."""
    cos, sin = rotary_tables(head_dim, positions, theta)
    words = rope_pairs(rope_table(cos.numpy()), rope_table(sin.numpy()))
    assert words.shape == (positions, head_dim // 2)
    rng = np.random.default_rng(positions)
    heads = 3
    # magnitudes up to the Q15.16 range: rounding and saturation both exercised
    x = (rng.standard_normal((positions, heads * head_dim))
         * rng.choice([1e-3, 1.0, 300.0, 40000.0], size=(positions, 1))).astype(np.float32)
    got = np.stack([vec_rope_pairs(to_fixed(x[p]), words[p], head_dim)
                    for p in range(positions)])
    want = rope_vector(torch.from_numpy(x).reshape(positions, heads, head_dim).transpose(0, 1),
                       cos, sin).transpose(0, 1).reshape(positions, -1)
    assert np.array_equal(from_fixed(got), want.numpy())


# ---------------------------------------------------------------------- lowering
def _rope_graph(x_shape, table_shape) -> Graph:
    values = {"x": TensorType(x_shape), "cos": TensorType(table_shape),
              "sin": TensorType(table_shape), "y": TensorType(x_shape)}
    return Graph((Node("q.rope", "rope", ("x", "cos", "sin"), ("y",)),), values,
                 ("x", "cos", "sin"), ("y",), {"phase": "decode"})


def test_rope_lowers_to_one_rope_vec_per_token_with_its_table_row():
    g = _rope_graph((1, 4, 3, 16), (3, 16))
    op = vector_op(g.nodes[0], g, VSMALL)
    assert (op.func, op.rows, op.length, op.imm) == (VecFunc.ROPE, 3, 64, rope_imm(16, 4))
    assert (op.table_rows, op.w, op.b) == (3, symbols.rope_table(), None)
    assert op.table_row_bytes == row_bytes(VSMALL, 8)
    assert op.const_bytes(40) == 40 * op.table_row_bytes
    assert op.read_bytes == 3 * 64 * 4 + 3 * 8 * 4


@pytest.mark.parametrize("x, table, match", [
    ((1, 2, 3, 5), (3, 5), "head_dim=5 must be even"),
    ((2, 3, 6), (3, 6), r"\[batch, heads, tokens, head_dim\]"),
    ((2, 2, 3, 6), (3, 6), "batch 1"),
])
def test_bad_rope_nodes_are_a_clear_lowering_error(x, table, match):
    g = _rope_graph(x, table)
    with pytest.raises(LoweringError, match=match):
        vector_op(g.nodes[0], g, VSMALL)


def test_a_context_beyond_the_model_tables_is_a_lowering_error():
    cfg = LlamaConfig(max_position_embeddings=32)
    with pytest.raises(LoweringError, match="rotary table has 32 rows"):
        _rope_table(cfg, 40, 64)


def test_only_a_rope_reads_a_table():
    with pytest.raises(LoweringError, match="only a ROPE reads a rotary table"):
        lower_vector_template(VSMALL, VecFunc.ADD, 2, 16, second=True, table=True)


def _run_rope(cfg, tmpl, rows, length, head_dim, rng) -> int:
    """Run ROPE template ``tmpl`` on random rows and a random table of 48 positions, its
    table LOADs pointed at a random position; assert every row equals ``vec_rope_pairs`` with
    its position's table row; return the cycles."""
    imm = rope_imm(head_dim, length // head_dim)
    beats = rope_table_beats(cfg, imm)
    per = cfg.beat_bytes // 4
    row = -(-length // per) * per
    positions = 48
    base = {"x": 0, "y": rows * row, "w": 2 * rows * row}   # elements

    class _Op:
        x, y, w, b = "x", "y", "w", None
    words = relocate(tmpl, {k: 4 * v for k, v in base.items()}, [_Op], cfg.beat_bytes)
    x = to_fixed(rng.standard_normal((rows, length)) * float(rng.choice([0.01, 1.0, 100.0])))
    c = rng.integers(-(1 << 14), 1 << 14, size=(positions, head_dim // 2), endpoint=True)
    s = rng.integers(-(1 << 14), 1 << 14, size=(positions, head_dim // 2), endpoint=True)
    table = rope_pairs(np.concatenate((c, c), -1), np.concatenate((s, s), -1))
    dram = np.zeros(cfg.memory.size_bytes, np.uint8)
    padded = np.zeros((rows, row), "<i4")
    padded[:, :length] = x
    dram[:padded.nbytes] = padded.view(np.uint8).reshape(-1)
    tab = np.zeros((positions, beats * per), "<i4")
    tab[:, :head_dim // 2] = table
    dram[4 * base["w"]:4 * base["w"] + tab.nbytes] = tab.view(np.uint8).reshape(-1)
    past = int(rng.integers(0, positions - rows + 1))
    regs = RegisterFile()
    words = allocate_words(words, regs)
    r = make_backend("model", cfg).run(words, dram, regs=reg_table_values(regs.table, past))
    assert r.ok, r.error
    got = r.dram[4 * base["y"]:4 * base["y"] + rows * row * 4].view("<i4").reshape(rows, row)
    for i in range(rows):
        want = vec_rope_pairs(x[i], table[past + i], head_dim)
        assert np.array_equal(got[i, :length], want), i
    return r.cycles


@pytest.mark.parametrize("seed", range(6))
def test_rope_programs_compute_their_rows_at_any_position(seed):
    """Random rows (some programs of several tasks), a random table of ``positions`` rows in
    DRAM, the table LOADs relative to the run-time register ``pos``, run at a random
    position: through the fast model each row equals ``vec_rope_pairs`` with its position's
    table row."""
    rng = np.random.default_rng(seed)
    cfg = VSMALL.replace(memory=MemoryModel(size_bytes=1 << 16))
    head_dim = int(rng.choice([2, 6, 16, 32]))
    heads = int(rng.integers(1, 5))
    rows, length = int(rng.integers(1, 40)), heads * head_dim
    imm = rope_imm(head_dim, heads)
    tmpl = lower_vector_template(cfg, VecFunc.ROPE, rows, length, imm=imm, table=True)
    program = decode_program(tmpl.words.view(np.uint8))
    for ins in program:
        check(ins, cfg)
    beats = rope_table_beats(cfg, imm)
    per = cfg.beat_bytes // 4
    row = -(-length // per) * per
    tasks, half, _ = vector_tasks(cfg, VecFunc.ROPE, rows, length, 1, False, beats)
    # per task: its rows, then their table rows, in one VIN half
    table_loads = [program[i] for i in tmpl.position_rows]
    assert len(table_loads) == len(tasks)
    for i, (task, ld) in enumerate(zip(tasks, table_loads, strict=True)):
        assert isinstance(ld, Load) and ld.spad == Spad.VIN
        assert (ld.rows, ld.row_beats, ld.dram_addr, ld.dram_stride, ld.reg) == \
            (task.rows, beats, task.row * beats, beats, PENDING_POS)
        assert ld.spad_addr == i % 2 * half + task.rows * row // per
    vecs = [i for i in program if isinstance(i, Vec)]
    assert [v.b_addr for v in vecs] == [
        (i % 2 * half + task.rows * row // per + j * beats) * per
        for i, task in enumerate(tasks) for j in range(task.rows)]
    assert {(v.func, v.imm, v.length) for v in vecs} == {(VecFunc.ROPE, imm, length)}
    assert _run_rope(cfg, tmpl, rows, length, head_dim, rng)


# ---------------------------------------------------------------------- compiled and run
def test_compiled_rope_programs_and_their_constant_table():
    lm = tiny_lm()
    # the chains' own programs (a decode step joined: tests/sw/runtime/test_one_program.py)
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + STEPS, one_program=False),
                        weights=compressed(lm))
    mcfg = lm.config
    d, rope = mcfg.head_dim, _rope_programs(exe)
    # q and k of every block, in both phases; one VEC per token, heads side by side
    assert len(rope) == 2 * 2 * mcfg.num_hidden_layers
    for p in rope:
        op, t = p.vector, PROMPT if p.phase == "prefill" else 1
        heads = mcfg.num_attention_heads if "q_proj" in p.node else mcfg.num_key_value_heads
        assert (op.rows, op.length, op.table_rows) == (t, heads * d, t)
        assert op.imm == rope_imm(d, heads) and op.w == symbols.rope_table()
        assert len(p.position_rows) >= 1
    # each a part of the chain of its block's q/k/v linear, whose program lists the table
    # LOADs of both: LOADs into VIN from the table, at the rope programs' own offsets
    table = exe.symbols[symbols.rope_table()]
    for p in rope:
        fused = exe.programs[p.fused_into]
        parts = [exe.programs[i] for i in fused.parts]
        assert [q.node for q in parts if q.position_rows] == [
            p.node.replace("k_proj", "q_proj"), p.node.replace("q_proj", "k_proj")]
        loads = [decode_program(fused.words[i:i + 1].view(np.uint8))[0]
                 for i in fused.position_rows]
        assert len(loads) == sum(len(q.position_rows) for q in parts)
        assert all(isinstance(ld, Load) and ld.spad == Spad.VIN for ld in loads)
        assert all(table.addr <= ld.dram_addr * VSMALL.beat_bytes < table.addr + table.nbytes
                   for ld in loads)
    # one table for the model: max_context rows of rope_pairs words of the host's tables
    table = exe.image[symbols.rope_table()].view("<i4").reshape(PROMPT + STEPS, -1)
    assert exe.symbols[symbols.rope_table()].nbytes == table.nbytes
    cos, sin = rotary_tables(d, mcfg.max_position_embeddings, mcfg.rope_theta)
    want = rope_pairs(rope_table(cos[:PROMPT + STEPS].numpy()),
                      rope_table(sin[:PROMPT + STEPS].numpy()))
    assert np.array_equal(table[:, :d // 2], want) and not table[:, d // 2:].any()


def test_rope_programs_equal_the_host_kernel_bit_for_bit(monkeypatch):
    """Every rope node's output, read back from its program at every step (prefill, then
    decode positions), equals ``rope_vector`` of its inputs, as the host would compute it:
    the rope nodes run as parts of the chain of their q/k/v linear (reading its DEQUANT rows
    on chip), whose table LOADs are relative to the run-time register ``pos``."""
    lm = tiny_lm()
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + STEPS),
                        weights=compressed(lm))
    assert all(p.fused_into is not None for p in _rope_programs(exe))
    prologue, epilogue = runtime_module._IO["vector"]
    seen = []

    def check_out(rt, node, args, env, program, state):
        outs, cycles = epilogue(rt, node, args, env, program, state)
        if node.op == "rope":
            want = rope_vector(*args)
            assert outs[0].shape == want.shape and outs[0].is_contiguous()
            assert torch.equal(outs[0], want), node.name
            seen.append((node.name, env.past))
        return outs, cycles
    monkeypatch.setitem(runtime_module._IO, "vector", (prologue, check_out))
    # read_back_all: every node's results on the host (else the rotated rows stay on chip)
    rt = Runtime(exe, make_backend("model", VSMALL), vector=True, read_back_all=True)
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT + STEPS),
                        generator=torch.Generator().manual_seed(3))
    _, st = rt.step(ids[:, :PROMPT])
    assert not any(h.op == "rope" for h in st.host)
    assert sum(h.op == "rope:io" for h in st.host) == 2 * lm.config.num_hidden_layers
    for p in range(PROMPT, PROMPT + STEPS):
        rt.step(ids[:, p:p + 1])
    blocks = lm.config.num_hidden_layers
    assert len(seen) == 2 * blocks * (1 + STEPS)
    assert {past for _, past in seen} == {0, *range(PROMPT, PROMPT + STEPS)}


@pytest.mark.parametrize("chain", [False, True], ids=["alone", "chained"])
@pytest.mark.parametrize("memo", [False, True], ids=["plain", "memo"])
def test_timing_only_runs_the_rope_programs_with_the_same_cycles(memo, chain):
    """Without values (a timing-only executable: no image, so no table) the rope programs
    (alone, or parts of the chain of the q/k/v linear) still run, and cost what they cost
    with values (addresses do not change timing)."""
    lm = tiny_lm(layers=1)
    ws = compressed(lm)
    opts = CompileOptions(PROMPT, PROMPT + 2, chain_programs=chain)
    full = compile_model(lm, VSMALL, opts, weights=ws)
    timing = compile_model(lm, VSMALL, opts, formats={k: w.fmt for k, w in ws.items()})
    assert symbols.rope_table() not in timing.image
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT + 2),
                        generator=torch.Generator().manual_seed(5))
    cycles = []
    for exe, backend, kw in ((full, "model", {}),
                             (timing, "model-timing", {"memo_timing": memo})):
        rt = Runtime(exe, make_backend(backend, VSMALL), vector=True, **kw)
        steps = [rt.step(ids[:, :PROMPT])[1]] + [rt.step(ids[:, p:p + 1])[1]
                                                 for p in range(PROMPT, PROMPT + 2)]
        # with chains, the program of the input norm runs the rope nodes: every one counts
        cycles.append([[(p.node, p.cycles) for p in st.programs
                        if "rope" in p.node or (chain and "input_layernorm" in p.node)]
                       for st in steps])
        rope = [p for p in exe.programs if p.position_rows and p.fused_into is None]
        assert len(rope) == (2 * 2 if not chain else 2) and all(
            bool(p.parts) == chain for p in rope)
    assert cycles[0] == cycles[1] and all(len(c) == (1 if chain else 2) for c in cycles[0])
