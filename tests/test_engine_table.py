"""The engine table (hw/engines.py) is the one source of the per-engine and per-opcode design:
every queued opcode and every engine is in it once, and the fetch unit, the top level, the
counters, the timing dispatch, the fast model and the functional model follow it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hw import engines as table
from hw import timing
from hw.counters import COUNTERS, CounterLayout, counter_layout, counters
from hw.engines import (
    ENGINE,
    ENGINES,
    FETCH_ONLY,
    OP,
    OPS,
    WORK_COUNTERS,
    completion_delay,
    engine_of,
    engines_fields,
    engines_of,
    exec_cycles,
    exec_cycles_fields,
    work_fields,
)
from hw.errors import ContractError
from hw.fetch import FetchUnit
from hw.isa import (
    INSTRUCTIONS,
    MOVE_SPAD,
    End,
    Engine,
    Gemm,
    Load,
    Opcode,
    Repeat,
    Spad,
    Store,
    Sync,
    Vec,
    VecFunc,
    decode_fields,
    program_words,
)
from hw.queues import entry_layout
from hw.top import Accelerator
from sim import functional
from sim.model import schedule
from sim.random_programs import EQUIVALENCE_CONFIGS, random_program

CFG = EQUIVALENCE_CONFIGS["2x4"]
#: A configuration with every engine of the table (the vector engine is optional).
FULL = EQUIVALENCE_CONFIGS["4x4"]


def test_every_queued_opcode_is_in_the_table_once():
    queued = set(Opcode) - set(FETCH_ONLY)
    for o in Opcode:
        assert [op.opcode for op in OPS].count(o) == (o in queued), o
    assert set(OP) == queued
    # and every instruction class but END's and REPEAT's (the fetch unit's) is an entry's
    assert {op.cls for op in OPS} == set(INSTRUCTIONS) - {End, Repeat}


def test_every_engine_is_in_the_table_once_in_value_order():
    assert [e.engine for e in ENGINES] == list(Engine)
    assert [e.engine.value for e in ENGINES] == list(range(len(ENGINES)))
    assert set(ENGINE) == set(Engine)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("ENGINES", ENGINES[:-1], "not every hw.isa.Engine"),
    ("OPS", OPS[:-1], "not every queued opcode"),
    ("OPS", (OPS[1], OPS[0]) + OPS[2:], r"lists \['STORE', 'LOAD'"),
    ("ENGINES", (dataclasses.replace(ENGINES[0], body="nobody"),) + ENGINES[1:],
     "body 'nobody' is not in the instruction's body union"),
    ("OPS", (dataclasses.replace(OPS[0], engine=Engine.COMPUTE),) + OPS[1:],
     "LOAD has body 'dma', its engine COMPUTE carries 'gemm'"),
    ("OPS", (dataclasses.replace(OPS[0], engine=None),) + OPS[1:],
     "LOAD has no fixed engine and its body 'dma' has no engine field"),
    ("OPS", (OPS[0], dataclasses.replace(OPS[1], work=OPS[0].work)) + OPS[2:],
     r"STORE: work counters \['dram_read_beats'\] belong to another opcode"),
])
def test_an_inconsistent_table_is_refused_naming_the_entry(monkeypatch, field, value, match):
    monkeypatch.setattr(table, field, value)
    with pytest.raises(ContractError, match=match):
        table._checked()


def test_counter_names_derive_from_the_table():
    per_engine = [n for e in ENGINES for n in (f"{e.name}_exec", f"{e.name}_wait")]
    assert counters(FULL) == (*per_engine, "fetch_stall", *WORK_COUNTERS, "instructions")
    assert list(WORK_COUNTERS) == [n for op in OPS for n in op.work]
    assert [name for name, _ in counter_layout(FULL)] == list(counters(FULL))
    # without the vector engine: none of its counters (the default's, the board's)
    absent = {"vector_exec", "vector_wait", "vector_elements"}
    assert set(counters(FULL)) - set(counters(CFG)) == absent
    assert COUNTERS == counters(CFG) == tuple(n for n in counters(FULL) if n not in absent)
    assert [name for name, _ in CounterLayout] == list(COUNTERS)


def test_presence_is_the_table_s():
    """The vector engine is optional: present exactly when the configuration has its
    scratchpads; the others always are."""
    assert [e.engine for e in engines_of(CFG)] == [Engine.LOAD, Engine.COMPUTE, Engine.STORE]
    assert [e.engine for e in engines_of(FULL)] == list(Engine)
    assert not CFG.has_vector and FULL.has_vector


@pytest.mark.parametrize("cfg", [CFG, FULL], ids=["no-vector", "vector"])
def test_the_fetch_unit_has_a_port_per_engine_with_its_body(cfg):
    members = FetchUnit(cfg).signature.members
    for e in ENGINES:
        assert (e.name in members) == e.present(cfg), e
        if e.present(cfg):
            assert members[e.name].signature.members["payload"].shape == \
                entry_layout(e.body_layout), e


@pytest.mark.parametrize("cfg", [CFG, FULL], ids=["no-vector", "vector"])
def test_the_elaborated_top_has_a_queue_and_a_sequencer_per_engine(cfg):
    """Every engine of the table the configuration has has its queue and sequencer block in
    the design, with its body, and a wait and a signal port of the event unit; an absent one
    has none (nor its scratchpads)."""
    machine = Accelerator(cfg).elaborate(None).submodules["machine"]
    for e in ENGINES:
        if not e.present(cfg):
            assert not _has(machine, f"{e.name}_queue"), e
            assert not _has(machine, f"{e.name}_seq"), e
            continue
        queue = machine.submodules[f"{e.name}_queue"]
        seq = machine.submodules[f"{e.name}_seq"]
        assert queue.signature.members["w"].signature.members["payload"].shape == \
            entry_layout(e.body_layout), e
        assert seq.signature.members["cmd"].signature.members["payload"].shape == \
            e.body_layout, e
    events = machine.submodules["events"]
    assert len(events.wait) == len(events.signal) == len(engines_of(cfg))
    assert _has(machine, "vin_spad") == _has(machine, "vout_spad") == cfg.has_vector


def _has(module, name: str) -> bool:
    """The elaborated module has a submodule ``name``."""
    try:
        module.submodules[name]
    except AttributeError:
        return False
    return True


def test_a_sync_on_every_engine_lands_in_its_column_of_the_fast_model():
    prog = [Sync(engine=e.engine) for e in ENGINES] + [End()]
    s = schedule(prog, FULL)
    assert s.error.name == "NONE"
    assert list(s.times[:-1, 0]) == [e.engine.value for e in ENGINES]
    assert [t.engine for t in s.timings[:-1]] == [e.engine for e in ENGINES]
    for e in ENGINES:
        assert s.counters[e.exec_counter] == timing.SYNC_CYCLES, e
    # the last SYNC completes last: the run is done the cycle after (hw/timing.py, Done)
    done = s.times[:-1, 6]
    assert s.cycles == max(int(done.max()), int(s.times[-1, 2])) + 1


def test_engine_and_work_arrays_equal_the_scalar_definitions():
    """The array twins the fast model uses agree with each opcode's scalar definition on the
    instructions of random programs."""
    rng = np.random.default_rng(5)
    prog = random_program(FULL, rng, chains=2, tasks=6).program + [Repeat(count=2)] + \
        random_program(FULL, rng, chains=1, tasks=4, vector=1.0, moves=1.0).program
    f = decode_fields(program_words(prog))
    eng, work = engines_fields(f), work_fields(f)
    col = {name: j for j, name in enumerate(WORK_COUNTERS)}
    assert {type(i) for i in prog} == set(INSTRUCTIONS)  # the sample has every kind
    for i, ins in enumerate(prog):
        e = engine_of(ins)
        assert eng[i] == (-1 if e is None else e.value), ins
        want = dict.fromkeys(WORK_COUNTERS, 0)
        if isinstance(ins, Load):
            want["dram_read_beats"] = ins.rows * ins.row_beats
        elif isinstance(ins, Store):   # a move (VOUT -> VIN) writes no DRAM
            want["dram_write_beats"] = ins.rows * ins.row_beats * (ins.spad != Spad.VIN)
        elif isinstance(ins, Gemm):
            want["mac_cycles"] = ins.k_steps * ins.tokens
        elif isinstance(ins, Vec):
            want["vector_elements"] = ins.length
        assert {n: int(work[i, col[n]]) for n in WORK_COUNTERS} == want, ins


def test_timing_dispatch_follows_the_table():
    assert completion_delay(Engine.LOAD, CFG) == timing.load_completion_delay(CFG)
    for e in ENGINES:
        want = 0 if e.completion is None else e.completion(CFG)
        assert completion_delay(e.engine, CFG) == want, e
    for ins in (Load(rows=2, row_beats=3), Store(rows=2, row_beats=3), Gemm(k_steps=5),
                Sync(), Vec(func=VecFunc.ARGMAX, length=7)):
        assert exec_cycles(ins, FULL) == OP[ins.opcode].cycles(ins, FULL), ins
    with pytest.raises(TypeError, match="End does not execute on an engine"):
        exec_cycles(End(), CFG)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_paced_dma_durations(k):
    """A DRAM port paced a beat every ``k`` cycles (MemoryModel.cycles_per_beat): a LOAD of B
    beats executes ``k (B - 1) + 1`` cycles, a STORE to DRAM one more, a move (on chip, not
    paced) ``B + 1``; the array twin the fast model uses agrees on random programs."""
    cfg = FULL.replace(memory=dataclasses.replace(FULL.memory, cycles_per_beat=k))
    for ins, want in ((Load(rows=2, row_beats=3), k * 5 + 1), (Store(rows=2, row_beats=3),
                      k * 5 + 2), (Store(spad=MOVE_SPAD, rows=2, row_beats=3), 7),
                      (Load(rows=1, row_beats=1), 1)):
        assert exec_cycles(ins, cfg) == want, ins
    rng = np.random.default_rng(6)
    prog = random_program(cfg, rng, chains=2, tasks=6).program + \
        random_program(cfg, rng, chains=1, tasks=4, vector=1.0, moves=1.0).program
    f = decode_fields(program_words(prog))
    durs = exec_cycles_fields(f, cfg)
    dma = [i for i, ins in enumerate(prog) if isinstance(ins, (Load, Store))]
    assert any(getattr(prog[i], "spad", None) == MOVE_SPAD for i in dma)
    for i in dma:
        assert durs[i] == exec_cycles(prog[i], cfg), prog[i]


def test_the_functional_model_has_semantics_for_every_opcode_that_moves_data():
    assert set(functional._PREPARE) == {op.opcode for op in OPS if not op.sync}
    assert functional.prepare(Sync(), CFG) is None
    assert functional.prepare(End(), CFG) is None
    for op in OPS:
        if not op.sync:
            assert callable(functional.prepare(op.cls(), CFG)), op
