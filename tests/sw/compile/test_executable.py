"""The Executable round-trips through its file, and any corrupted byte is caught."""

from dataclasses import fields

import numpy as np
import pytest
from compile_testutil import SMALL, compressed, tiny_lm

from sw.compile import CompileOptions, compile_model
from sw.compile.executable import FORMAT_VERSION, Executable, ExecutableError, load, save


@pytest.fixture(scope="module")
def exe():
    lm = tiny_lm(layers=1)
    return compile_model(lm, SMALL, CompileOptions(prompt_tokens=4, max_context=8),
                         weights=compressed(lm))


def test_round_trip(exe, tmp_path):
    back = load(save(exe, tmp_path / "m.safetensors"))
    for f in fields(Executable):
        if f.name not in ("graphs", "image", "host"):
            assert getattr(back, f.name) == getattr(exe, f.name), f.name
    assert {k: g.to_dict() for k, g in back.graphs.items()} == \
        {k: g.to_dict() for k, g in exe.graphs.items()}
    for a, b in ((back.image, exe.image), (back.host, exe.host)):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert np.array_equal(back.dram_image(), exe.dram_image())


def test_every_part_is_checksummed(exe, tmp_path):
    path = save(exe, tmp_path / "m.safetensors")
    raw = path.read_bytes()
    header = int.from_bytes(raw[:8], "little") + 8
    # a byte in the JSON header (metadata, names, shapes), early, middle and late in the data
    for pos in (60, header // 2, header + 1, (header + len(raw)) // 2, len(raw) - 2):
        bad = bytearray(raw)
        bad[pos] ^= 0x5A
        corrupt = tmp_path / f"bad{pos}.safetensors"
        corrupt.write_bytes(bytes(bad))
        with pytest.raises(ExecutableError):
            load(corrupt)
    (tmp_path / "short.safetensors").write_bytes(raw[:len(raw) // 3])
    with pytest.raises(ExecutableError, match="truncated or corrupted"):
        load(tmp_path / "short.safetensors")
    with pytest.raises(ExecutableError, match="no such file"):
        load(tmp_path / "missing.safetensors")


def test_interrupted_save_leaves_nothing(exe, tmp_path, monkeypatch):
    import sw.artifact

    def boom(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(sw.artifact, "save_file", boom)
    with pytest.raises(KeyboardInterrupt):
        save(exe, tmp_path / "m.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_another_format_version_is_refused_with_one_line(exe, tmp_path, monkeypatch):
    import sw.compile.executable as executable
    path = save(exe, tmp_path / "m.safetensors")
    monkeypatch.setattr(executable, "FORMAT_VERSION", FORMAT_VERSION + 1)
    with pytest.raises(ExecutableError, match=rf"format version {FORMAT_VERSION}, this toolkit "
                       rf"reads version {FORMAT_VERSION + 1}") as e:
        load(path)
    assert "\n" not in str(e.value)


def test_a_file_of_the_previous_version_is_refused_naming_both(exe, tmp_path, monkeypatch):
    """Version 6 files' relative words add a register times their stride (pos, tok), not a
    register file's offsets with a register table: a newer reader would move them wrongly,
    so this one refuses them in one line naming both versions."""
    import sw.compile.executable as executable
    assert FORMAT_VERSION == 7
    monkeypatch.setattr(executable, "FORMAT_VERSION", 6)
    path = save(exe, tmp_path / "v6.safetensors")
    monkeypatch.undo()
    with pytest.raises(ExecutableError, match="executable format version 6, this toolkit reads "
                       "version 7; compile the model again") as e:
        load(path)
    assert "\n" not in str(e.value)


def test_the_program_table_covers_exactly_the_compiled_contexts():
    lm = tiny_lm(layers=1)
    exe = compile_model(lm, SMALL, CompileOptions(prompt_tokens=4, max_context=40,
                                                  decode_contexts=(40,)),
                        weights=compressed(lm))
    scores = next(n for n in exe.table.nodes("decode") if n.endswith("scores"))
    mlp = next(n for n in exe.table.nodes("decode") if "mlp" in n)
    covered = [s for s in range(1, 41) if exe.table.lookup("decode", scores, s) is not None]
    assert covered == list(range(covered[0], 41)) and 20 < covered[0] <= 40
    assert exe.program_index("decode", mlp, 5) == exe.program_index("decode", mlp, 40)
    with pytest.raises(ExecutableError, match=f"no program for node '{scores}' of decode at "
                       "20 key positions"):
        exe.program_index("decode", scores, 20)
