"""hw.board.dram_init: LiteDRAM's initialisation sequence and the ECP5 read leveling, on fake
control buses."""

from __future__ import annotations

import re

import pytest

from hw.board import dram_init
from hw.board.ecpix5 import ECPIX5
from hw.board.litedram import generate


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return generate(ECPIX5, tmp_path_factory.mktemp("litedram"))


def _c_header_sequence(core) -> list[tuple]:
    """The writes and waits of ``init_sequence()`` in the C header LiteX generated for its BIOS
    (``sdram_phy.h``), register addresses from its ``csr.h`` (in words): an independent reading
    of what LiteDRAM wants done."""
    gen = core.dir / "software" / "include" / "generated"
    header, csr_h = (gen / "sdram_phy.h").read_text(), (gen / "csr.h").read_text()
    defines = {k: int(v, 0) for k, v in re.findall(r"#define (DFII_\w+) (0x[0-9a-f]+)", header)}
    base = int(re.search(r"#define CSR_BASE (0x[0-9a-fA-F]+)L?", csr_h).group(1), 0)
    addr = {k.lower(): (base + int(v, 16)) // 4 for k, v in
            re.findall(r"#define CSR_(\w+)_ADDR \(CSR_BASE \+ 0x([0-9a-f]+)L\)", csr_h)}
    body = header.split("static inline void init_sequence(void)", 1)[1].split("\n}", 1)[0]

    def value(expr):
        return sum(defines[n] if n in defines else int(n, 0) for n in expr.split("|"))

    ops = []
    for name, arg in re.findall(r"^\s*(\w+)\((.*)\);", body, re.MULTILINE):
        if name == "cdelay":
            ops.append(("wait", int(arg) / ECPIX5.sys_clk_hz))
        elif name.startswith("command_p"):
            p = name.removeprefix("command_p")
            ops += [("write", addr[f"sdram_dfii_pi{p}_command"], value(arg)),
                    ("write", addr[f"sdram_dfii_pi{p}_command_issue"], 1)]
        else:
            ops.append(("write", addr[name.removesuffix("_write")], value(arg)))
    return ops


def test_sequence_is_litedram_s(core):
    ops = dram_init.sequence_ops(core.csr, core.csr_size, core.init, ECPIX5.sys_clk_hz)
    want = _c_header_sequence(core)
    assert len(want) > 20 and ops == want


def test_lfsr_matches_litex():
    # LiteX's lfsr(32, 42) by hand: 42 is even, so the first step only shifts.
    assert dram_init.lfsr32(42) == 21
    assert dram_init.lfsr32(21) == (10 ^ 0x80200003)
    words = dram_init.pattern_words(42, 2, 8)
    assert [len(w) for w in words] == [8, 8] and words != dram_init.pattern_words(84, 2, 8)


class FakePhy:
    """LiteDRAM's DFII and ECP5 PHY registers over a memory that returns a lane's write data
    only at that lane's good bitslip and read delays (else the lane's bytes are inverted and its
    burst detector stays low)."""

    def __init__(self, core, good: dict[int, tuple[int, set[int]]]):
        self.reg = {a // 4: n for n, a in core.csr.items()}  # word addresses
        self.size = core.csr_size
        self.phy = core.init["phy"]
        self.bits = core.init["dfii"]
        self.good = good
        self.words: dict[str, list[int]] = {n: [0] * core.csr_size[n] for n in core.csr}
        lanes = self.phy["strobes"]
        self.delay, self.bitslip, self.sel = [0] * lanes, [0] * lanes, 0
        self.mem: list[int] = [0] * self.phy["nphases"]
        self.seen = 0
        self.ops: list[tuple] = []

    def _locate(self, addr):
        for name, a in ((n, a) for a, n in self.reg.items()):
            if a <= addr < a + self.size[name]:
                return name, addr - a
        raise KeyError(f"no register at {addr:#x}")

    def _value(self, name):
        v = 0
        for w in self.words[name]:
            v = (v << 32) | w
        return v

    def _lane_ok(self, m):
        bitslip, delays = self.good[m]
        return self.bitslip[m] == bitslip and self.delay[m] in delays

    def csr_write(self, addr, value):
        name, i = self._locate(addr)
        self.ops.append(("write", name, value))
        self.words[name][i] = value
        lanes = range(self.phy["strobes"])
        selected = [m for m in lanes if self.sel >> m & 1]
        if name == "ddrphy_dly_sel":
            self.sel = value
        elif name == "ddrphy_rdly_dq_rst":
            for m in selected:
                self.delay[m] = 0
        elif name == "ddrphy_rdly_dq_inc":
            for m in selected:
                self.delay[m] = (self.delay[m] + 1) % self.phy["delays"]
        elif name == "ddrphy_rdly_dq_bitslip_rst":
            for m in selected:
                self.bitslip[m] = 0
        elif name == "ddrphy_rdly_dq_bitslip":
            for m in selected:
                self.bitslip[m] = (self.bitslip[m] + 1) % self.phy["bitslips"]
        elif name == "ddrphy_burstdet_clr":
            self.seen = 0
        elif name.endswith("_command_issue"):
            cmd = self._value(name.removesuffix("_issue"))
            phases = range(self.phy["nphases"])
            if cmd & self.bits["DFII_COMMAND_WRDATA"]:
                self.mem = [self._value(f"sdram_dfii_pi{p}_wrdata") for p in phases]
            if cmd & self.bits["DFII_COMMAND_RDDATA"]:
                nbytes = self.phy["dfi_databits"] // 8
                for p in phases:
                    data = bytearray(self.mem[p].to_bytes(nbytes, "big"))
                    for m in lanes:
                        if not self._lane_ok(m):
                            for b in (nbytes // 2 - 1 - m, nbytes - 1 - m):
                                data[b] ^= 0xFF
                    v = int.from_bytes(data, "big")
                    n = self.size[f"sdram_dfii_pi{p}_rddata"]
                    self.words[f"sdram_dfii_pi{p}_rddata"] = [
                        (v >> (32 * (n - 1 - k))) & 0xFFFF_FFFF for k in range(n)]
                self.seen = sum(1 << m for m in lanes if self._lane_ok(m))

    def csr_read(self, addr):
        name, i = self._locate(addr)
        if name == "ddrphy_burstdet_seen":
            return self.seen
        return self.words[name][i]


def _run(core, phy):
    waits = []
    res = dram_init.initialize(phy, core.csr, core.csr_size, core.init, ECPIX5.sys_clk_hz,
                               wait=waits.append)
    return res, waits


def test_leveling_finds_each_lane_s_window(core):
    """Lane 0 reads right at bitslip 1, delays 2..5; lane 1 at bitslip 2, delays 0..6: each
    gets its bitslip and the centre of its window, and the DRAM is declared initialised."""
    phy = FakePhy(core, {0: (1, {2, 3, 4, 5}), 1: (2, set(range(0, 7)))})
    res, waits = _run(core, phy)
    assert res.ok and not res.error
    (l0, l1) = res.lanes
    assert (l0.bitslip, l0.window, l0.delay) == (1, (2, 5), 3)
    assert (l1.bitslip, l1.window, l1.delay) == (2, (0, 6), 3)
    assert l0.scores.index(max(l0.scores)) == 1 and l1.scores.index(max(l1.scores)) == 2
    # The PHY is left at what leveling chose, the DFI back in hardware control.
    assert phy.bitslip == [1, 2] and phy.delay == [3, 3]
    assert phy.words["sdram_dfii_control"] == [core.init["dfii"]["DFII_CONTROL_SEL"]]
    writes = [(n, v) for _, n, v in phy.ops if n.startswith("ddrctrl")]
    assert writes == [("ddrctrl_init_done", 0), ("ddrctrl_init_error", 0),
                      ("ddrctrl_init_done", 1)]
    # LiteDRAM's sequence ran first, with its waits.
    want = [op[1] for op in dram_init.sequence_ops(core.csr, core.csr_size, core.init,
                                                   ECPIX5.sys_clk_hz) if op[0] == "wait"]
    assert waits[:len(want)] == want


def test_a_lane_without_a_window_is_an_init_error(core):
    """Lane 1 never reads right (a single good delay is no window: two in a row are needed):
    init_error is set, then init_done, and the result says which lane failed."""
    phy = FakePhy(core, {0: (0, {1, 2, 3}), 1: (3, {4})})
    res, _ = _run(core, phy)
    assert res.error and not res.ok
    assert res.lanes[0].ok and res.lanes[0].window == (1, 3)
    assert not res.lanes[1].ok and res.lanes[1].window is None and res.lanes[1].delay == -1
    writes = [(n, v) for _, n, v in phy.ops if n.startswith("ddrctrl")]
    assert writes[-2:] == [("ddrctrl_init_error", 1), ("ddrctrl_init_done", 1)]


def test_a_core_without_read_leveling_is_refused(core):
    init = {**core.init, "phy": {**core.init["phy"], "write_leveling": True}}
    with pytest.raises(ValueError, match="write_leveling=True"):
        dram_init.initialize(FakePhy(core, {}), core.csr, core.csr_size, init,
                             ECPIX5.sys_clk_hz)


def test_initialize_board_uses_the_board_s_core(core, monkeypatch):
    import hw.board.litedram
    monkeypatch.setattr(hw.board.litedram, "generate", lambda board: core)
    phy = FakePhy(core, {0: (1, {2, 3, 4, 5}), 1: (2, {3, 4, 5})})
    res = dram_init.initialize_board(phy, wait=lambda s: None)
    assert res.ok and [lane.delay for lane in res.lanes] == [3, 4]
