"""The board's DDR3 controller: LiteDRAM's generated core, instantiated from Amaranth.

:func:`core_config` is LiteDRAM's generator configuration for a :class:`hw.board.ecpix5.Board`
(every value from the board's facts): no CPU, DDR3, the board's memory chip (its tRFC as a
time, :attr:`~hw.board.ecpix5.Board.sdram_trfc_ns`: :func:`sdram_module_class`) and PHY, one x16
chip (the data width follows from the chip's geometry and the board's DRAM size), the board's
clocks, and two native user ports, ``accel`` (the accelerator, through the bridge) and
``host`` (the host link), of :attr:`~hw.board.ecpix5.Board.port_bits` bits addressed in words
(:attr:`~hw.board.ecpix5.Board.port_addr_bits` bits). :func:`generate` runs LiteDRAM's
generator (``litedram.gen.LiteDRAMCore``, what ``litedram_gen --no-compile`` builds) in a
subprocess into a cache, ``build/board/litedram/<key>/`` keyed by the configuration and
LiteDRAM's version; it is written under a file lock into a temporary directory that is renamed
into place when complete, so a cache directory is whole or absent.

:class:`LiteDRAMCore` wraps the generated Verilog module (``litedram_core``) in a
``wiring.Component``.

Clocking
--------
The core has its own clock and reset generator (LiteDRAM's ``LiteDRAMECP5DDRPHYCRG``): its
``clk`` input is the board's 100 MHz oscillator (``clk100``), its ``rst`` the board's reset
button. A power-on counter holds an ECP5 PLL (``EHXPLLL``) in reset for 65536 oscillator cycles;
the PLL makes ``sys2x`` (2 x :attr:`~hw.board.ecpix5.Board.sys_clk_hz`, 150 MHz, the DDR
I/O's edge clock through ``ECLKSYNCB``) and ``init`` (:attr:`~hw.board.ecpix5.Board.init_clk_hz`,
used inside the PHY's initialisation); ``CLKDIVF`` divides ``sys2x`` by two into ``sys``
(75 MHz). The core's ``user_clk`` output is ``sys``, and ``user_rst`` is ``sys``'s reset,
asserted (synchronously released) while the PLL is unlocked or the PHY resets its clock
divider. :class:`LiteDRAMCore` drives the clock and reset of a domain (default ``sync``) that
the top defines with ``user_clk`` / ``user_rst``: everything else on the board (accelerator,
bridge, host link) runs on it, and the native ports, the control bus and the status outputs
are synchronous to it.

The user ports accept nothing before initialisation: LiteDRAM gates ``cmd_ready``,
``wdata_ready`` and ``rdata_valid`` with ``init_done & ~init_error``, two control registers
the host sets at the end of :mod:`hw.board.dram_init`'s sequence.

Port names of the generated module (checked by :func:`generate` against this file's
expectations): ``clk``, ``rst``, ``pll_locked``, ``init_done``, ``init_error``, ``user_clk``,
``user_rst``, ``wb_ctrl_{adr,dat_w,dat_r,sel,cyc,stb,ack,we,cti,bte,err}`` (a 32-bit Wishbone
slave, word-addressed: a control register's byte address in ``csr.csv`` divided by 4; the
wrapper uses classic cycles, ``cti = bte = 0``, and leaves ``err`` open),
``user_port_<name>_{cmd,wdata,rdata}_*`` (:mod:`hw.board.native`) and the DDR3 pads
``ddram_*``. LiteX declares the bidirectional pads ``ddram_dq`` and ``ddram_dqs_p`` (driven by
``TRELLIS_IO`` cells inside the core) as ``input``; :func:`generate` rewrites those two
declarations as ``inout``, the only change to LiteDRAM's Verilog. The ECP5 pads are
pseudo-differential: only ``ddram_clk_p`` and ``ddram_dqs_p`` are pins, ``ddram_clk_n`` and
``ddram_dqs_n`` are unused inputs (tied low here).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from amaranth import ClockSignal, Const, Module, ResetSignal, Signal
from amaranth.hdl import Instance
from amaranth.lib import io, wiring
from amaranth.lib.wiring import In, Out

from hw.board.ecpix5 import ECPIX5, Board
from hw.board.link import WishboneSignature
from hw.board.native import NativePortSignature
from hw.board.protocol import CSR_ADDR_BITS, CSR_DATA_BITS

__all__ = ["MODULE", "USER_PORTS", "LITEDRAM_VERSION", "CACHE", "GeneratedCore",
           "dram_data_bits", "sdram_module_class", "core_config", "cache_key", "module_ports",
           "expected_ports", "generate", "LiteDRAMCore"]

ROOT = Path(__file__).resolve().parents[2]
#: Name of the generated Verilog module.
MODULE = "litedram_core"
#: The native user ports, in the crossbar's order: the accelerator's, the host link's.
USER_PORTS = ("accel", "host")
#: The installed LiteDRAM, part of the cache key.
LITEDRAM_VERSION = importlib.metadata.version("litedram")
#: Where generated cores are cached, one directory per :func:`cache_key`.
CACHE = ROOT / "build" / "board" / "litedram"


def _check_board(board: Board) -> None:
    if not isinstance(board, Board):
        raise TypeError(f"board must be a hw.board.ecpix5.Board, got {board!r}")


def dram_data_bits(board: Board) -> int:
    """Data width of the board's DRAM: its size over the chip's geometry (LiteDRAM's module).

    Raises ``ValueError`` when :attr:`~Board.dram_bytes` is not a whole number of bytes per
    cell of the chip, or the width disagrees with :attr:`~Board.peak_bytes_per_sys_cycle`
    (4 beats per ``sys`` cycle: LiteDRAM's DDR3 PHYs run ``sys`` at a quarter of the data rate).
    """
    _check_board(board)
    from litedram import modules
    module = getattr(modules, board.sdram_module, None)
    if module is None:
        raise ValueError(f"board.sdram_module {board.sdram_module!r} is not a LiteDRAM module")
    cells = module.nbanks * module.nrows * module.ncols
    bits, rem = divmod(board.dram_bytes * 8, cells)
    if rem or bits % 8:
        raise ValueError(f"board.dram_bytes={board.dram_bytes} is not a whole number of bytes "
                         f"per cell of {board.sdram_module} ({cells} cells)")
    if board.peak_bytes_per_sys_cycle != 4 * bits // 8:
        raise ValueError(f"board.peak_bytes_per_sys_cycle={board.peak_bytes_per_sys_cycle} is "
                         f"not 4 beats of the {bits}-bit {board.sdram_module}")
    return bits


def sdram_module_class(name: str, trfc_ns: float | None = None) -> type:
    """LiteDRAM's module class ``litedram.modules.<name>``; with ``trfc_ns``, a subclass whose
    every speed grade has the refresh cycle time tRFC as that time (``(None, trfc_ns)``:
    LiteDRAM rounds it up to controller cycles at the clock the module is built for) instead
    of the table's memory clocks (:attr:`hw.board.ecpix5.Board.sdram_trfc_ns`).

    Raises ``ValueError`` for a name LiteDRAM does not have or a ``trfc_ns`` not > 0.

    Examples
    --------
    >>> cls = sdram_module_class("MT41K256M16", 260.0)
    >>> cls.__name__, cls.speedgrade_timings["default"].tRFC
    ('MT41K256M16_tRFC260ns', (None, 260.0))
    """
    from litedram import modules
    chip = getattr(modules, name, None)
    if not (isinstance(chip, type) and issubclass(chip, modules.SDRAMModule)):
        raise ValueError(f"sdram module {name!r} is not a LiteDRAM module")
    if trfc_ns is None:
        return chip
    if isinstance(trfc_ns, bool) or not isinstance(trfc_ns, (int, float)) or not trfc_ns > 0:
        raise ValueError(f"trfc_ns must be > 0, got {trfc_ns!r}")
    timed = {}  # by the original's id: "default" stays the same object as its grade
    for t in chip.speedgrade_timings.values():
        fields = {k: getattr(t, k) for k in modules._speedgrade_timings}
        timed.setdefault(id(t), modules._SpeedgradeTimings(**{**fields,
                                                               "tRFC": (None, float(trfc_ns))}))
    grades = {g: timed[id(t)] for g, t in chip.speedgrade_timings.items()}
    return type(f"{name}_tRFC{trfc_ns:g}ns", (chip,), {"speedgrade_timings": grades})


def core_config(board: Board = ECPIX5) -> dict:
    """LiteDRAM's generator configuration for ``board`` (``litedram_gen``'s YAML, as a dict).

    Examples
    --------
    >>> cfg = core_config(ECPIX5)
    >>> cfg["sdram_phy"], cfg["sdram_module_nb"], cfg["sys_clk_freq"]
    ('ECP5DDRPHY', 2, 75000000.0)
    >>> sorted(cfg["user_ports"])
    ['accel', 'host']
    """
    _check_board(board)
    return {
        "name": MODULE,
        "cpu": "None",
        "memtype": "DDR3",
        "sdram_module": board.sdram_module,
        "sdram_trfc_ns": board.sdram_trfc_ns,
        "sdram_module_nb": dram_data_bits(board) // 8,
        "sdram_rank_nb": 1,
        "sdram_phy": board.sdram_phy,
        "device": board.device,
        "input_clk_freq": float(board.input_clk_hz),
        "sys_clk_freq": float(board.sys_clk_hz),
        "init_clk_freq": float(board.init_clk_hz),
        "user_ports": {name: {"type": "native", "data_width": board.port_bits}
                       for name in USER_PORTS},
    }


#: How the subprocess runs the generator (:func:`hw.board._litedram_gen.run`).
_WORKER = "import sys; from hw.board._litedram_gen import run; run(sys.argv[1], sys.argv[2])"
#: The generator's own source is part of the cache key: a change to it regenerates.
_GEN_HASH = hashlib.sha256(
    Path(__file__).with_name("_litedram_gen.py").read_bytes()).hexdigest()[:12]


def cache_key(board: Board = ECPIX5) -> str:
    """The cache directory's name of ``board``'s core: a hash of :func:`core_config`, the
    LiteDRAM and LiteX versions and this flow's generator script."""
    blob = json.dumps({"config": core_config(board), "litedram": LITEDRAM_VERSION,
                       "litex": importlib.metadata.version("litex"), "gen": _GEN_HASH},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class GeneratedCore:
    """A generated core in the cache.

    Attributes
    ----------
    dir:
        Its cache directory.
    verilog:
        The module's Verilog (``gateware/litedram_core.v``).
    ports:
        Port name -> (direction ``"input"``/``"output"``/``"inout"``, width), from the module
        header.
    csr:
        Control register name -> byte address on the control bus (``csr.csv``).
    csr_size:
        Control register name -> number of 32-bit words.
    init:
        ``init.json``: LiteDRAM's initialisation sequence and PHY settings
        (:mod:`hw.board._litedram_gen`).
    """

    dir: Path
    verilog: Path
    ports: dict
    csr: dict
    csr_size: dict
    init: dict


_PORT = re.compile(r"^\s*(input|output|inout)\s+wire\s+(?:\[(\d+):0\]\s+)?(\w+)\s*,?\s*$")


def module_ports(verilog: str, module: str = MODULE) -> dict[str, tuple[str, int]]:
    """Port name -> (direction, width) of ``module``'s ANSI header in ``verilog``."""
    m = re.search(rf"^module {module}\s*\((.*?)\);", verilog, re.MULTILINE | re.DOTALL)
    if not m:
        raise ValueError(f"no module {module!r} in the Verilog")
    ports = {}
    for line in m.group(1).splitlines():
        pm = _PORT.match(line)
        if pm:
            ports[pm.group(3)] = (pm.group(1), int(pm.group(2)) + 1 if pm.group(2) else 1)
    return ports


#: The bidirectional pads LiteX declares as ``input`` (see the module docstring).
_INOUT_PADS = ("ddram_dq", "ddram_dqs_p")


def _fix_inout(verilog: str) -> str:
    for name in _INOUT_PADS:
        verilog, n = re.subn(rf"^(\s*)input(\s+wire\s+(?:\[\d+:0\]\s+)?{name}\s*,)",
                             r"\1inout\2", verilog, count=1, flags=re.MULTILINE)
        if n != 1:
            raise ValueError(f"generated core: no 'input' declaration of {name} to make inout")
    return verilog


def expected_ports(board: Board = ECPIX5) -> dict[str, tuple[str, int]]:
    """The ports :class:`LiteDRAMCore` connects, as the generated module must have them."""
    from litedram import modules
    module = getattr(modules, board.sdram_module)
    nb = dram_data_bits(board) // 8
    ports = {
        "clk": ("input", 1), "rst": ("input", 1), "pll_locked": ("output", 1),
        "init_done": ("output", 1), "init_error": ("output", 1),
        "user_clk": ("output", 1), "user_rst": ("output", 1),
        "wb_ctrl_adr": ("input", CSR_ADDR_BITS), "wb_ctrl_dat_w": ("input", CSR_DATA_BITS),
        "wb_ctrl_dat_r": ("output", CSR_DATA_BITS), "wb_ctrl_sel": ("input", CSR_DATA_BITS // 8),
        "wb_ctrl_cyc": ("input", 1), "wb_ctrl_stb": ("input", 1), "wb_ctrl_we": ("input", 1),
        "wb_ctrl_cti": ("input", 3), "wb_ctrl_bte": ("input", 2),
        "wb_ctrl_ack": ("output", 1), "wb_ctrl_err": ("output", 1),
        "ddram_a": ("output", (module.nrows - 1).bit_length()),
        "ddram_ba": ("output", (module.nbanks - 1).bit_length()),
        "ddram_ras_n": ("output", 1), "ddram_cas_n": ("output", 1), "ddram_we_n": ("output", 1),
        "ddram_cs_n": ("output", 1), "ddram_cke": ("output", 1), "ddram_odt": ("output", 1),
        "ddram_reset_n": ("output", 1), "ddram_clk_p": ("output", 1),
        "ddram_clk_n": ("input", 1), "ddram_dm": ("output", nb),
        "ddram_dq": ("inout", 8 * nb), "ddram_dqs_p": ("inout", nb),
        "ddram_dqs_n": ("input", nb),
    }
    aw, dw = board.port_addr_bits, board.port_bits
    for name in USER_PORTS:
        p = f"user_port_{name}_"
        ports.update({
            p + "cmd_valid": ("input", 1), p + "cmd_ready": ("output", 1),
            p + "cmd_we": ("input", 1), p + "cmd_addr": ("input", aw),
            p + "wdata_valid": ("input", 1), p + "wdata_ready": ("output", 1),
            p + "wdata_we": ("input", dw // 8), p + "wdata_data": ("input", dw),
            p + "rdata_valid": ("output", 1), p + "rdata_ready": ("input", 1),
            p + "rdata_data": ("output", dw),
        })
    return ports


def _load(d: Path) -> GeneratedCore:
    verilog = d / "gateware" / f"{MODULE}.v"
    csr, size = {}, {}
    with open(d / "csr.csv", newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "csr_register":
                csr[row[1]] = int(row[2], 0)
                size[row[1]] = int(row[3])
    return GeneratedCore(dir=d, verilog=verilog, ports=module_ports(verilog.read_text()),
                         csr=csr, csr_size=size, init=json.loads((d / "init.json").read_text()))


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def generate(board: Board = ECPIX5, cache: Path | None = None, *,
             verbose: bool = False) -> GeneratedCore:
    """``board``'s LiteDRAM core, generated unless the cache has it.

    Parameters
    ----------
    board:
        The board.
    cache:
        The cache root (default :data:`CACHE`); the core goes to ``cache / cache_key(board)``.
    verbose:
        Print where the core is and whether it was generated.

    Returns
    -------
    GeneratedCore

    Raises
    ------
    RuntimeError
        LiteDRAM's generator failed (with the tail of its log), or the generated module's
        ports are not those :class:`LiteDRAMCore` connects (:func:`expected_ports`).
    """
    _check_board(board)
    cache = Path(cache) if cache is not None else CACHE
    final = cache / cache_key(board)
    with _locked(cache / ".lock"):
        if not (final / "init.json").exists():
            tmp = cache / f".tmp-{final.name}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            try:
                (tmp / "config.json").write_text(json.dumps(core_config(board), indent=1) + "\n")
                log = tmp / "litedram_gen.log"
                with open(log, "w") as f:
                    rc = subprocess.run([sys.executable, "-c", _WORKER, str(tmp / "config.json"),
                                         str(tmp)], cwd=ROOT,
                                        stdout=f, stderr=subprocess.STDOUT).returncode
                if rc != 0:
                    raise RuntimeError(f"LiteDRAM's generator failed (rc={rc}):\n"
                                       f"{log.read_text()[-3000:]}")
                v = tmp / "gateware" / f"{MODULE}.v"
                v.write_text(_fix_inout(v.read_text()))
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            if verbose:
                print(f"LiteDRAM {LITEDRAM_VERSION}: generated {final}")
        elif verbose:
            print(f"LiteDRAM {LITEDRAM_VERSION}: cached {final}")
    core = _load(final)
    want = expected_ports(board)
    if core.ports != want:
        diff = sorted(set(core.ports.items()) ^ set(want.items()))
        raise RuntimeError(f"{core.verilog}: ports differ from hw.board.litedram's "
                           f"expectations: {diff[:8]}")
    return core


class LiteDRAMCore(wiring.Component):
    """LiteDRAM's generated DDR3 controller, its PLL and PHY, as an Amaranth component.

    Elaborating it needs the board's platform (the pads ``ddr3``, ``clk100`` and ``rst`` are
    requested from it) and adds the generated Verilog to the platform's files. It drives the
    clock and reset of ``domain`` (``user_clk``, ``user_rst``: see the module docstring), which
    the top must define (``m.domains.sync = ClockDomain()``): else the platform makes its
    default ``sync`` from the oscillator and the two drivers collide.

    Parameters
    ----------
    board:
        The board (default :data:`hw.board.ecpix5.ECPIX5`).
    core:
        The generated core (default: :func:`generate` of ``board``, from the cache).
    domain:
        The clock domain the core clocks (default ``"sync"``).

    Members
    -------
    accel: In(NativePortSignature(board.port_bits, board.port_addr_bits))
        The accelerator's native port (the core provides it).
    host: In(NativePortSignature(board.port_bits, board.port_addr_bits))
        The host link's native port.
    wb_ctrl: In(hw.board.link.WishboneSignature())
        The control bus (LiteDRAM's control registers, ``core.csr``, at word addresses): the
        host link drives it.
    init_done: Out(1)
        The ``ddrctrl_init_done`` register: set by the host when initialisation finished.
    init_error: Out(1)
        The ``ddrctrl_init_error`` register: set by the host when it failed.
    pll_locked: Out(1)
        The core's PLL is locked.
    """

    def __init__(self, board: Board = ECPIX5, core: GeneratedCore | None = None, *,
                 domain: str = "sync"):
        _check_board(board)
        if not isinstance(domain, str) or not domain:
            raise TypeError(f"domain must be a domain name, got {domain!r}")
        self.board, self.domain = board, domain
        self.core = core if core is not None else generate(board)
        if not isinstance(self.core, GeneratedCore):
            raise TypeError(f"core must be a GeneratedCore, got {core!r}")
        port = NativePortSignature(board.port_bits, board.port_addr_bits)
        super().__init__({
            **{name: In(port) for name in USER_PORTS},
            "wb_ctrl": In(WishboneSignature()),
            "init_done": Out(1),
            "init_error": Out(1),
            "pll_locked": Out(1),
        })

    def elaborate(self, platform):
        if platform is None or not hasattr(platform, "request"):
            raise TypeError("LiteDRAMCore needs the board's platform (it requests the DDR3 "
                            f"pads and the clock), got {platform!r}")
        m = Module()
        platform.add_file(f"{MODULE}.v", self.core.verilog.read_text())

        clk = platform.request("clk100", 0, dir="-")
        m.submodules.rst_buffer = rst = io.Buffer("i", platform.request("rst", 0, dir="-"))
        ddr = platform.request("ddr3", 0, dir="-")
        conns = {
            "i_clk": clk.io, "i_rst": rst.i,
            "o_pll_locked": self.pll_locked,
            "o_init_done": self.init_done, "o_init_error": self.init_error,
            "o_user_clk": ClockSignal(self.domain), "o_user_rst": ResetSignal(self.domain),
            # The raw pins, whatever the resource's polarity: LiteDRAM drives the active-low
            # pins (ras_n, cas_n, we_n) itself.
            "o_ddram_a": ddr.a.io, "o_ddram_ba": ddr.ba.io,
            "o_ddram_ras_n": ddr.ras.io, "o_ddram_cas_n": ddr.cas.io, "o_ddram_we_n": ddr.we.io,
            "o_ddram_cke": ddr.clk_en.io, "o_ddram_odt": ddr.odt.io, "o_ddram_dm": ddr.dm.io,
            "o_ddram_clk_p": ddr.clk.p, "i_ddram_clk_n": Const(0, 1),
            "io_ddram_dq": ddr.dq.io, "io_ddram_dqs_p": ddr.dqs.p,
            "i_ddram_dqs_n": Const(0, len(ddr.dqs.p)),
            # Not wired on the ECPIX-5 (the resource has neither): left open.
            "o_ddram_cs_n": Signal(1, name="ddram_cs_n_nc"),
            "o_ddram_reset_n": Signal(1, name="ddram_reset_n_nc"),
        }
        wb = self.wb_ctrl
        for name in ("adr", "dat_w", "sel", "cyc", "stb", "we"):
            conns[f"i_wb_ctrl_{name}"] = getattr(wb, name)
        for name in ("dat_r", "ack"):
            conns[f"o_wb_ctrl_{name}"] = getattr(wb, name)
        # Classic cycles only; LiteX's CSR bus never ends a cycle with err (the link times out
        # an access nothing acknowledges).
        conns.update({"i_wb_ctrl_cti": Const(0, 3), "i_wb_ctrl_bte": Const(0, 2),
                      "o_wb_ctrl_err": Signal(1, name="wb_ctrl_err_nc")})
        for pname in USER_PORTS:
            port, p = getattr(self, pname), f"user_port_{pname}_"
            conns.update({
                f"i_{p}cmd_valid": port.cmd.valid, f"o_{p}cmd_ready": port.cmd.ready,
                f"i_{p}cmd_we": port.cmd.payload.we, f"i_{p}cmd_addr": port.cmd.payload.addr,
                f"i_{p}wdata_valid": port.wdata.valid, f"o_{p}wdata_ready": port.wdata.ready,
                f"i_{p}wdata_we": port.wdata.payload.we,
                f"i_{p}wdata_data": port.wdata.payload.data,
                f"o_{p}rdata_valid": port.rdata.valid, f"i_{p}rdata_ready": port.rdata.ready,
                f"o_{p}rdata_data": port.rdata.payload,
            })
        m.submodules.litedram = Instance(MODULE, **conns)
        return m
