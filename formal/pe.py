"""Proof: on every pattern of the configuration the PE equals the dense dot product of the
decompressed weights with the activations.

For each pattern N:M of ``cfg.pattern_table`` (dense is 1:1 inside the ``cfg.max_block``
activation word, section 1 of docs/architecture.md) the harness feeds one
:class:`hw.pe.PE` one M-block as the array does: N steps, each a kept (value, index) pair with
free values, strictly increasing free indices ``I_j < M`` (a valid N:M block) at a free block
offset ``sub`` inside the activation word (the decoder ORs it into the index), then ``T`` MAC
cycles (``T`` free in ``[1, max_tokens]``) for tokens ``0 .. T-1`` with ``first`` on the first
step unless the instruction accumulates. Token ``t``'s activation block is free and the same in
every step (one ACT word). The next step's load either shares the cycle of the last MAC or
follows it (free). After the pipeline drains, the harness reads every accumulator entry through
the epilogue port (``rd_addr`` one cycle ahead) and asserts, for every token ``t``::

    acc[t] == wrap(sum_k d[k] * a_t[sub + k], acc_bits)    d = the decompressed M-vector:
                                                             d[I_j] = w_j, 0 elsewhere

and ``acc[t] == 0`` for tokens the instruction does not touch.

The multiplier. Two bit-blasted multipliers of different structure cannot be proven equal by a
SAT/SMT solver in useful time (a 17 x 18 bit miter did not finish in 400 s). So the reference
takes the product of position ``k`` from the multiplier operands the PE registers (the
activation the index selects, sign-extended to ``MULT_BITS + 1`` bits, and the held weight,
sign-extended to the PE's weight operand width): Yosys merges the harness's operand registers
and product with the PE's, and the solver proves everything around the multiplier -- which
activation each step selects (index and block offset), the weight hold across steps and shared
load cycles, the token and ``first`` pipeline, the read-add-write of the accumulator file with
its registered read address, the wrap at ``acc_bits`` and the epilogue read port. That
``(act, w) -> act * w`` is a signed product of those widths is Yosys's ``$mul``. The reference
adds the terms in step order, as the PE does, and checks the entry the PE reads during each
accumulation against the partial sum: the solver then needs no re-association of 35-bit sums,
which made the 4:8 block take over ten minutes.
"""

from __future__ import annotations

from amaranth import Array, Mux, Signal, signed
from amaranth.hdl import Assert, Assume

from hw.config import AcceleratorConfig, NMPattern
from hw.pe import MULT_BITS, PE, SLICE_BITS, act_block_layout, index_bits

from .flow import Harness, Proof

__all__ = ["PEHarness", "proofs", "block_shape"]


def block_shape(pattern: NMPattern) -> tuple[int, int]:
    """``(N, M)`` of one block as the PE sees it: dense streams one position per step."""
    return (1, 1) if pattern.dense else (pattern.n, pattern.m)


class PEHarness(Harness):
    """One PE fed one N:M block of ``pattern`` (see the module docstring)."""

    def __init__(self, cfg: AcceleratorConfig, pattern: NMPattern):
        super().__init__()
        self.cfg, self.pattern = cfg, pattern
        self.w = self.free(signed(cfg.weight_operand_bits), "w")
        self.index = self.free(index_bits(cfg), "index")
        self.sub = self.free(index_bits(cfg), "sub")
        self.act = self.free(act_block_layout(cfg), "act")
        self.tokens_m1 = self.free(range(cfg.max_tokens), "tokens_m1")
        self.accumulate = self.free(1, "accumulate")
        self.share = self.free(1, "share")

    @staticmethod
    def depth(cfg: AcceleratorConfig, pattern: NMPattern) -> int:
        """Cycles of the longest schedule: start, N x (load + T MACs), drain, reads."""
        n, _ = block_shape(pattern)
        return 1 + n * (cfg.max_tokens + 1) + PE.LATENCY + cfg.max_tokens + 2

    def elaborate(self, platform):
        m = self.module()
        cfg = self.cfg
        n, mb = block_shape(self.pattern)
        T = cfg.max_tokens
        m.submodules.dut = dut = PE(cfg)

        # Instruction parameters, fixed in cycle 0.
        started = Signal()
        sub = Signal.like(self.sub)
        tm1 = Signal.like(self.tokens_m1)
        acc_mode = Signal()
        with m.If(~started):
            m.d.sync += [started.eq(1), sub.eq(self.sub), tm1.eq(self.tokens_m1),
                         acc_mode.eq(self.accumulate)]
            m.d.comb += Assume(self.sub % mb == 0)

        # The schedule: step j, token t; phase LOAD (a load cycle of its own), MAC, DRAIN, READ.
        j = Signal(range(n + 1))
        t = Signal(range(T))
        phase = Signal(range(5))
        LOAD, MAC, DRAIN, READ, DONE = range(5)
        wait = Signal(range(PE.LATENCY + 1))
        rd = Signal(range(T + 1))

        kept = [Signal(index_bits(cfg), name=f"kept{i}") for i in range(n)]  # I_j
        held = [Signal(act_block_layout(cfg), name=f"block{i}") for i in range(T)]  # a_t
        load = Signal()
        load_step = Signal(range(n + 1))  # a load shared with a MAC cycle is the next step's
        m.d.comb += load_step.eq(Mux(phase == MAC, j + 1, j))
        with m.If(load):
            m.d.sync += Array(kept)[load_step].eq(self.index)
            prev = Array(kept)[load_step - 1]
            m.d.comb += Assume((self.index < mb) & ((load_step == 0) | (self.index > prev)))
        m.d.comb += [dut.w_in.eq(self.w), dut.idx_in.eq(sub | self.index), dut.load.eq(load),
                     dut.act.eq(self.act), dut.ep.eq(0), dut.ep_mult.eq(0)]

        with m.If(started):
            with m.Switch(phase):
                with m.Case(LOAD):
                    m.d.comb += load.eq(1)
                    m.d.sync += [phase.eq(MAC), t.eq(0)]
                with m.Case(MAC):
                    m.d.comb += [dut.valid.eq(1), dut.tok.eq(t),
                                 dut.first.eq((j == 0) & ~acc_mode)]
                    with m.If(j == 0):
                        m.d.sync += Array(held)[t].eq(self.act)
                    with m.Else():
                        m.d.comb += Assume(self.act.as_value() == Array(held)[t].as_value())
                    with m.If(t == tm1):
                        m.d.sync += [j.eq(j + 1), t.eq(0)]
                        with m.If(j == n - 1):
                            m.d.sync += [phase.eq(DRAIN), wait.eq(0)]
                        with m.Elif(self.share):  # the next load shares this cycle
                            m.d.comb += load.eq(1)
                            m.d.sync += j.eq(j + 1)
                        with m.Else():
                            m.d.sync += phase.eq(LOAD)
                    with m.Else():
                        m.d.sync += t.eq(t + 1)
                with m.Case(DRAIN):
                    m.d.sync += wait.eq(wait + 1)
                    with m.If(wait == PE.LATENCY - 1):
                        m.d.sync += [phase.eq(READ), rd.eq(0)]
                with m.Case(READ):
                    m.d.comb += dut.rd_addr.eq(rd)
                    m.d.sync += rd.eq(rd + 1)
                    with m.If(rd == T - 1):
                        m.d.sync += phase.eq(DONE)

        # The reference. Position k of the dense vector contributes d[k] * a_t[sub + k]; for a
        # kept position the product comes from the PE's multiplier operands (module docstring).
        wshape = signed(max(cfg.weight_operand_bits, SLICE_BITS + 1))
        w_hold = Signal(signed(cfg.weight_operand_bits))
        i_hold = Signal(index_bits(cfg))
        with m.If(dut.load):
            m.d.sync += [w_hold.eq(dut.w_in), i_hold.eq(dut.idx_in)]
        op_a = Signal(signed(MULT_BITS + 1))
        op_w = Signal(wshape)
        m.d.sync += [op_a.eq(dut.act[i_hold]), op_w.eq(w_hold)]
        p_valid = Signal()
        p_tok = Signal.like(t)
        p_pos = Signal(index_bits(cfg))
        m.d.sync += [p_valid.eq(dut.valid), p_tok.eq(t), p_pos.eq(Array(kept)[j])]
        # The product, registered (as the PE does) with its token and dense position.
        q_prod = Signal(signed(len(op_a) + len(op_w)))
        q_valid = Signal()
        q_tok = Signal.like(t)
        q_pos = Signal.like(p_pos)
        m.d.sync += [q_prod.eq(op_a * op_w), q_valid.eq(p_valid), q_tok.eq(p_tok),
                     q_pos.eq(p_pos)]
        # dense[t] = sum over the steps so far of sum_k [I_j == k] * (d_k-term of token t).
        dense = [Signal(signed(cfg.acc_bits), name=f"dense_t{tt}") for tt in range(T)]
        term = sum(Mux(q_pos == k, q_prod, 0) for k in range(mb))
        with m.If(q_valid):
            m.d.sync += Array(dense)[q_tok].eq(Array(dense)[q_tok] + term)
            # While the PE adds this product, its file shows the entry's previous value (the
            # read port follows the accumulation): the reference before this step.
            m.d.comb += Assert(dut.rd_data == Array(dense)[q_tok],
                               "PE accumulator entry != dense partial sum")

        # The epilogue port shows entry rd - 1 one cycle after its address.
        check = Signal()
        check_tok = Signal.like(rd)
        m.d.sync += [check.eq(started & (phase == READ)), check_tok.eq(rd)]
        expect = Signal(signed(cfg.acc_bits))  # the sum wraps at acc_bits
        m.d.comb += expect.eq(Array(dense)[check_tok])
        with m.If(check):
            m.d.comb += Assert(dut.rd_data == expect,
                               "PE accumulator != dense dot product of the block")
        return m


def proofs(cfg: AcceleratorConfig) -> list[Proof]:
    """One proof per pattern of ``cfg.pattern_table``."""
    return [Proof(f"pe_{str(p).replace(':', 'of')}",
                  lambda p=p: PEHarness(cfg, p), "bmc", PEHarness.depth(cfg, p),
                  f"PE on one {p} block x {cfg.max_tokens} tokens == dense dot product of the "
                  f"decompressed weights")
            for p in cfg.pattern_table]
