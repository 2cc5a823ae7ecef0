"""Fused programs (sw/compile/fusion.py): the REQUANT part writes the host's INT8 rows, and
parts joined by :func:`fuse_words` run as they would one after the other."""

import numpy as np
import pytest
from compile_testutil import SMALL, compressed, tiny_lm

from hw.config import MemoryModel
from hw.isa import Engine, Sync, VecFunc, check, decode_program
from hw.numerics import (
    dequant_channels,
    norm_eps,
    norm_weight,
    to_fixed,
    vec_argmax,
    vec_dequant,
    vec_requant,
    vec_rmsnorm,
)
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model
from sw.compile.errors import LoweringError
from sw.compile.fusion import (
    SCORES_AMAX,
    VECTOR_EVENTS,
    fuse_parts,
    fuse_words,
    row_aliases,
    vector_events,
)
from sw.compile.ir import Graph, Node, TensorType
from sw.compile.relocation import (
    lower_argmax_template,
    lower_dequant_template,
    lower_requant_template,
    lower_vector_template,
    relocate,
)
from sw.compile.schedule import amax_place
from sw.compile.vector import vector_op

CFG = SMALL.replace(vin_spad_bytes=2048, vout_spad_bytes=1024,
                    memory=MemoryModel(size_bytes=1 << 16))


class _Op:
    """Operand symbols named as themselves (placed by ``relocate``'s bases)."""

    x, y, b, w, w_tile_stride = "x", "y", None, "w", None


def _row_bytes(length: int) -> int:
    return -(-4 * length // CFG.beat_bytes) * CFG.beat_bytes


@pytest.mark.parametrize("seed", range(4))
def test_a_norm_then_requant_fused_writes_the_hosts_int8_rows(seed):
    """RMSNorm then REQUANT of random rows (several tasks, a padded INT8 row), fused, through
    the fast model: the INT8 rows are vec_requant of vec_rmsnorm, row by row."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(8, 120))
    rows = int(rng.integers(1, 12))
    act_row = -(-(length + int(rng.integers(0, 40))) // CFG.beat_bytes) * CFG.beat_bytes
    row = _row_bytes(length)
    base = {"x": 0, "w": rows * row, "y": rows * row + row, "q": 2 * rows * row + row}
    eps = norm_eps(1e-5, length)
    norm = relocate(lower_vector_template(CFG, VecFunc.RMSNORM, rows, length, const=True,
                                          imm=eps), base, [_Op], CFG.beat_bytes)

    class _Req:
        x, y, b, w, w_tile_stride = "y", "q", None, None, None
    req = relocate(lower_requant_template(CFG, rows, length, act_row), base, [_Req],
                   CFG.beat_bytes)
    words = fuse_words(CFG, [vector_events(norm), vector_events(req)])
    program = decode_program(words.astype("<u8").view(np.uint8).reshape(-1))
    for ins in program:
        check(ins, CFG)
    syncs = [i for i in program if isinstance(i, Sync)]
    assert syncs and all(s.engine == Engine.LOAD for s in syncs)
    assert not {i.wait for i in program} & set(VECTOR_EVENTS)  # renamed
    x = to_fixed(rng.standard_normal((rows, length)) * float(rng.choice([0.1, 10.0])))
    w = norm_weight(rng.standard_normal(length), length)
    dram = np.zeros(CFG.memory.size_bytes, np.uint8)
    padded = np.zeros((rows, row // 4), "<i4")
    padded[:, :length] = x
    dram[:padded.nbytes] = padded.view(np.uint8).reshape(-1)
    dram[base["w"]:base["w"] + 4 * length] = w.astype("<i4").view(np.uint8)
    r = make_backend("model", CFG).run(words, dram)
    assert r.ok, r.error
    got = r.dram[base["q"]:base["q"] + rows * act_row].view(np.int8).reshape(rows, act_row)
    for i in range(rows):
        want, _ = vec_requant(vec_rmsnorm(x[i], w, eps))
        assert np.array_equal(got[i, :length], want), i


def test_a_part_must_end_with_end_and_fit():
    t = lower_requant_template(CFG, 2, 16, 16)
    with pytest.raises(LoweringError, match="does not end with END"):
        fuse_words(CFG, [t.words[:-1], t.words])
    with pytest.raises(LoweringError, match="instruction memory"):
        # the smallest instruction memory holding one part holds less than two
        fuse_words(CFG.replace(imem_depth=1 << (t.instructions - 1).bit_length()),
                   [t.words, t.words])


@pytest.mark.parametrize("seed", range(6))
def test_requant_leaves_amax_for_a_dequant_part(seed):
    """REQUANT (``amax``) then DEQUANT of random accumulator rows, fused, through the fast
    model: the Q15.16 rows are vec_dequant with the amax vec_requant found, whether the INT8
    rows hold the amax words or a buffer of their own does (both placements are drawn)."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(8, 100))
    rows = int(rng.integers(1, 6))
    n = int(rng.integers(4, 60))
    beat = CFG.beat_bytes
    act_row = -(-(length + int(rng.integers(0, 2 * beat))) // beat) * beat
    if seed % 2:  # whole beats of codes: the rows hold no amax word
        length = act_row = beat * int(rng.integers(1, 7))
    acc_row = -(-(4 * n + int(rng.integers(0, 2)) * beat) // beat) * beat
    place = amax_place(CFG, length, act_row)
    assert place.separate == bool(seed % 2)
    row = _row_bytes(length)
    base = {"x": 0, "q": rows * row, "a": rows * row + rows * act_row}
    base["acc"] = base["a"] + rows * beat
    base["w"] = base["acc"] + rows * acc_row
    base["y"] = base["w"] + _row_bytes(n)

    class _Req:
        x, y, b, w, w_tile_stride = "x", "q", "a", None, None

    class _Deq:
        x, y, b, w, w_tile_stride = "acc", "y", ("a" if place.separate else "q"), "w", None
    req = relocate(lower_requant_template(CFG, rows, length, act_row, amax=True), base,
                   [_Req], CFG.beat_bytes)
    deq = relocate(lower_dequant_template(CFG, rows, n, acc_row, place), base, [_Deq],
                   CFG.beat_bytes)
    words = fuse_words(CFG, [vector_events(req), vector_events(deq)])
    for ins in decode_program(words.astype("<u8").view(np.uint8).reshape(-1)):
        check(ins, CFG)
    x = to_fixed(rng.standard_normal((rows, length)) * float(rng.choice([0.01, 1.0, 30.0])))
    if rows > 1:
        x[-1] = 0  # an all-zero row: amax 0
    acc = rng.integers(-(1 << 20), 1 << 20, (rows, n))
    chan = dequant_channels(rng.uniform(1e-4, 1e-1, n).astype(np.float32))
    dram = np.zeros(CFG.memory.size_bytes, np.uint8)
    for i in range(rows):
        dram[i * row:i * row + 4 * length] = x[i].astype("<i4").view(np.uint8)
        at = base["acc"] + i * acc_row
        dram[at:at + 4 * n] = acc[i].astype("<i4").view(np.uint8)
    dram[base["w"]:base["w"] + 4 * n] = chan.astype("<i4").view(np.uint8)
    r = make_backend("model", CFG).run(words, dram)
    assert r.ok, r.error
    out = _row_bytes(n)
    got = r.dram[base["y"]:base["y"] + rows * out].view("<i4").reshape(rows, -1)[:, :n]
    codes = r.dram[base["q"]:base["q"] + rows * act_row].view(np.int8).reshape(rows, act_row)
    for i in range(rows):
        want_codes, amax = vec_requant(x[i])
        assert np.array_equal(codes[i, :length], want_codes), i
        assert np.array_equal(got[i], vec_dequant(acc[i], chan, amax)), i


@pytest.mark.parametrize("seed", range(3))
def test_argmax_part_writes_each_rows_first_maximum(seed):
    """ARGMAX of random rows with ties (several tasks) through the fast model: one beat per
    row holding vec_argmax's index (the lowest of a tie) and the maximum."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(2, 200))
    rows = int(rng.integers(1, 9))
    row = _row_bytes(length)
    base = {"x": 0, "y": rows * row}

    class _Arg:
        x, y, b, w, w_tile_stride = "x", "y", None, None, None
    words = relocate(lower_argmax_template(CFG, rows, length), base, [_Arg], CFG.beat_bytes)
    for ins in decode_program(words.astype("<u8").view(np.uint8).reshape(-1)):
        check(ins, CFG)
    x = rng.integers(-5, 5, (rows, length)) * (1 << 14)  # few values: ties
    dram = np.zeros(CFG.memory.size_bytes, np.uint8)
    for i in range(rows):
        dram[i * row:i * row + 4 * length] = x[i].astype("<i4").view(np.uint8)
    r = make_backend("model", CFG).run(vector_events(words), dram)
    assert r.ok, r.error
    got = r.dram[base["y"]:base["y"] + rows * CFG.beat_bytes].view("<i4").reshape(rows, -1)
    for i in range(rows):
        assert got[i, 0] == int(vec_argmax(x[i])) == int(np.argmax(x[i])), i
        assert got[i, 1] == x[i].max(), i


@pytest.mark.parametrize("seed", range(4))
def test_fuse_parts_gives_each_parts_first_word(seed):
    """Random vector parts fused: word ``i`` of part ``k`` (END aside) is word
    ``starts[k] + i`` of the program, whatever SYNCs lie between the parts."""
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(int(rng.integers(1, 4))):
        rows, length = int(rng.integers(1, 9)), int(rng.integers(1, 40))
        t = lower_vector_template(CFG, VecFunc.ADD, rows, length, second=True)
        parts.append(vector_events(t.words))
    words, starts = fuse_parts(CFG, parts)
    assert np.array_equal(words, fuse_words(CFG, parts)) and len(starts) == len(parts)
    for p, s in zip(parts, starts, strict=True):
        assert np.array_equal(words[s:s + p.shape[0] - 1], p[:-1])


def _qkv_rope_graph(layout: list[tuple[str, dict, tuple]]) -> tuple[Graph, list]:
    """A q linear's output ``[1, 3, 8]`` (3 tokens, 2 heads of 4) through the ``layout``
    nodes (``(op, attrs, output shape)``) into a rope node; and its work entry."""
    t, d = 3, 4
    values = {"q": TensorType((1, t, 8)), "cos": TensorType((t, d)), "sin": TensorType((t, d))}
    nodes, x = [], "q"
    for k, (op, attrs, shape) in enumerate(layout):
        values[f"l{k}"] = TensorType(shape)
        nodes.append(Node(f"l{k}", op, (x,), (f"l{k}",), attrs))
        x = f"l{k}"
    values["y"] = values[x]
    nodes.append(Node("q.rope", "rope", (x, "cos", "sin"), ("y",)))
    g = Graph(tuple(nodes), values, ("q", "cos", "sin"), ("y",), {"phase": "decode"})
    return g, [("decode", nodes[-1], None, [vector_op(nodes[-1], g, CFG)])]


def test_a_rope_reads_the_rows_of_the_linear_its_layout_nodes_view():
    """q viewed as ``[1, T, heads, d]`` and transposed to ``[1, heads, T, d]``: ROPE's rows
    are the linear's rows, so the rope's input aliases the linear's output; viewed as
    ``[1, heads, T, d]`` at once (the same shape, other elements), it does not."""
    g, work = _qkv_rope_graph([("view", {"shape": [1, 3, 2, 4]}, (1, 3, 2, 4)),
                               ("transpose", {"dims": [1, 2]}, (1, 2, 3, 4))])
    assert row_aliases(g, work) == {"l1": "q"}
    g, work = _qkv_rope_graph([("view", {"shape": [1, 2, 3, 4]}, (1, 2, 3, 4))])
    assert (work[0][3][0].rows, work[0][3][0].length) == (3, 8)
    assert row_aliases(g, work) == {}


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_scores_and_softmax_are_one_program_per_layer_and_bucket(kv_heads):
    """Each attention scores node's program per context bucket and the softmax's of the same
    bucket are parts of one fused program (its VECs: in a decode step a REQUANT of each query
    head's row of the rope's results, then a DEQUANT per row of each operand head, then a
    SOFTMAX per row, whose ``imm`` the host sets); each member's DEQUANT writes its rows of
    the softmax's input, in order, and reads its kv head's channel words and the ``amax``
    words of REQUANT (decode) or of the host (prefill: a beat per row)."""
    lm = tiny_lm(layers=2, heads=4, kv_heads=kv_heads)
    ws = compressed(lm)
    opts = CompileOptions(6, 40)
    exe = compile_model(lm, CFG.replace(memory=MemoryModel(size_bytes=1 << 22)), opts,
                        weights=ws)
    fused = [p for p in exe.programs if p.parts and p.imm_rows]
    scores = [p for p in exe.programs if p.node.endswith(".scores") and p.fused_into is None
              and not p.parts]
    assert fused and not scores   # every scores program is fused with its softmax
    buckets = {(p.phase, p.bucket) for p in fused}
    assert len(fused) == 2 * len(buckets) and len(buckets) > 2   # 2 layers, every bucket
    for p in fused:
        first, soft = (exe.programs[i] for i in p.parts)
        assert first.node.endswith(".scores") and soft.node.endswith(".softmax")
        assert first.bucket == soft.bucket == p.bucket
        op = soft.vector
        vecs = [i for i in decode_program(p.words.view(np.uint8)) if hasattr(i, "func")]
        requant = [VecFunc.REQUANT] * (4 if p.phase == "decode" else 0)  # a row per head
        assert [v.func for v in vecs] == \
            requant + [VecFunc.DEQUANT] * op.rows + [VecFunc.SOFTMAX] * op.rows
        words = p.words[list(p.imm_rows)]
        assert len(p.imm_rows) == op.rows and all(
            i.func == VecFunc.SOFTMAX for i in decode_program(words.view(np.uint8)))
        at = exe.symbols[op.x].addr
        layer = int(p.node.split(".")[1])
        for j, m in enumerate(first.members):   # operand heads in order: the softmax's rows
            r = exe.symbols[m.dequant]
            assert r.addr == at and m.dequant_row_bytes == op.row_bytes
            at += m.tokens * op.row_bytes
            if p.phase == "decode":   # REQUANT leaves them
                assert m.amax is None
            else:
                assert exe.symbols[m.amax].nbytes >= m.tokens * CFG.beat_bytes
            assert m.channels == f"sc:{layer}:{j // (len(first.members) // kv_heads)}"
            assert exe.symbols[m.channels].nbytes >= op.row_bytes
        assert at == exe.symbols[op.x].addr + op.data_bytes
    assert SCORES_AMAX.separate and SCORES_AMAX.stride == 1
    # per decode step: the chain of the final norm, a block's MLP + next block's q/k/v, and
    # each block's scores -> softmax
    assert exe.report["phases"]["decode"]["fused_programs_per_step"] == 1 + 2 * 2
