"""Bounded and inductive proofs of the accelerator's units with SymbiYosys (``make prove``).

Each module builds Amaranth harnesses around one unit of hw/ and states its contract against
the project's own Python definitions (hw.config, hw.isa, hw.format/hw.numerics):

* :mod:`formal.pe` -- the PE on every N:M pattern of the configuration equals the dense dot
  product of the decompressed weights with the activations;
* :mod:`formal.dequant` -- the dequantiser equals ``code * (q - zero)``;
* :mod:`formal.events` -- the event counters never lose or duplicate a signal;
* :mod:`formal.fetch` -- the fetch unit dispatches a word or stops with the error code of the
  dispatch rules of hw.isa, in program order.

``python -m formal`` runs them all (docs/architecture.md, section 6, "Proofs").
"""

from __future__ import annotations

from hw.config import AcceleratorConfig, MemoryModel

__all__ = ["formal_config"]


def formal_config() -> AcceleratorConfig:
    """The configuration the proofs use: the 2x4 array of the equivalence harness with every
    default pattern, INT4 and INT8 weights and 8-bit scale codes, shrunk where state costs the
    solver (2 tokens, 3 events of 2 bits, a 2-word instruction memory, 64 KiB of DRAM)."""
    return AcceleratorConfig(rows=2, cols=4, max_tokens=2, num_events=3, event_bits=2,
                             imem_depth=2, memory=MemoryModel(size_bytes=1 << 16))
