"""The fuzz targets of ``python -m bench.fuzz`` on their seeds and on every input a fuzzing
run found (``tests/fuzz_regressions/<target>/``): each may raise only what its surface
documents."""

from pathlib import Path

import pytest

from bench.fuzz import REGRESSIONS, TARGETS, check

CASES = sorted((p.parent.name, p) for p in REGRESSIONS.glob("*/*") if p.is_file())


@pytest.mark.parametrize("target, path", CASES, ids=[f"{t}/{p.name}" for t, p in CASES])
def test_fixed_findings_stay_fixed(target: str, path: Path):
    check(target, path.read_bytes())


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_targets_accept_their_seeds_and_mutations(target: str):
    import numpy as np
    rng = np.random.default_rng(0)
    for seed in TARGETS[target].seeds():
        check(target, seed)
        for _ in range(3):  # a few random byte flips: the targets' own error paths
            data = bytearray(seed)
            for i in rng.integers(0, len(data), 4).tolist():
                data[i] ^= int(rng.integers(1, 256))
            check(target, bytes(data))


@pytest.mark.parametrize("target", ["executable_load", "compressed_load", "hf_checkpoint",
                                    "gguf_load"])
def test_file_seeds_are_valid_files(target: str):
    """The file targets start from files their loaders accept, so mutations explore the
    loaders' insides rather than their first magic-number check."""
    for seed in TARGETS[target].seeds():
        TARGETS[target].run(seed)  # raises if the seed itself is refused
