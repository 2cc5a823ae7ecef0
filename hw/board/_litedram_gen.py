"""LiteDRAM's generator, run in a subprocess by :func:`hw.board.litedram.generate`.

``run(CONFIG_JSON, OUT_DIR)`` builds LiteDRAM's standalone core
(``litedram.gen.LiteDRAMCore``, what ``litedram_gen --no-compile`` builds) for the
configuration :func:`hw.board.litedram.core_config` wrote, and writes into ``OUT_DIR``:

``gateware/litedram_core.v``
    the core's Verilog (LiteX's output, unchanged);
``csr.csv``, ``csr.json``
    its control and status registers (LiteX's exports);
``init.json``
    the DFII control and command bits (``DFII_CONTROL_*``, ``DFII_COMMAND_*``, from
    ``litedram.init.get_sdram_phy_py_header``), LiteDRAM's DRAM initialisation sequence
    (``litedram.init.get_sdram_phy_init_sequence``: ``[comment, a, ba, cmd, delay]`` per
    step, ``cmd`` the C expression of the DFII command bits) and the PHY settings the read
    leveling needs (what LiteX writes to the BIOS's ``sdram_phy.h``), and the controller's
    timings in ``sys`` cycles (``timing``: ``tREFI``, ``tRFC``, ... as LiteDRAM computed them
    from the module class, :func:`hw.board.litedram.sdram_module_class`).

LiteX is imported only here, in its own process: it prints its build log and keeps global
state, which the caller does not want.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hw.board.litedram import sdram_module_class


def run(config_path: str, out_dir: str) -> None:
    """Generate the core of the configuration in ``config_path`` into ``out_dir``."""
    from litedram import phy as litedram_phys
    from litedram.gen import LiteDRAMCore
    from litedram.init import get_sdram_phy_init_sequence, get_sdram_phy_py_header
    from litex.build.lattice import LatticePlatform
    from litex.soc.integration.builder import Builder

    config = json.loads(Path(config_path).read_text())
    core_config = dict(config)
    core_config["cpu"] = None
    core_config["sdram_module"] = sdram_module_class(config["sdram_module"],
                                                     config.get("sdram_trfc_ns"))
    core_config.pop("sdram_trfc_ns", None)
    core_config["sdram_phy"] = getattr(litedram_phys, config["sdram_phy"])
    for k in core_config:
        if "clk_freq" in k:
            core_config[k] = float(core_config[k])
    out = Path(out_dir)
    platform = LatticePlatform(core_config["device"], io=[], toolchain="trellis")
    # integrated_rom_size as litedram_gen passes it (unused without a CPU).
    soc = LiteDRAMCore(platform, core_config, integrated_rom_size=0xC000)
    builder = Builder(soc, output_dir=str(out), compile_software=False, compile_gateware=False,
                      csr_csv=str(out / "csr.csv"), csr_json=str(out / "csr.json"))
    builder.build(build_name=config["name"], regular_comb=False)

    settings = soc.sdram.controller.settings
    phy = settings.phy
    sequence, mr = get_sdram_phy_init_sequence(phy, settings.timing)

    def reset_value(v):
        return v.reset.value if hasattr(v, "reset") else int(v)

    # The DFII control and command bits, as LiteDRAM's Python header names them.
    header = get_sdram_phy_py_header(phy, settings.timing)
    bits = {name.upper(): int(value, 0) for name, value in
            re.findall(r"^(dfii_\w+)\s*=\s*(0x[0-9a-fA-F]+)\s*$", header, re.MULTILINE)}
    init = {
        "dfii": bits,
        "sequence": [[comment, int(a), int(ba), cmd, int(delay)]
                     for comment, a, ba, cmd, delay in sequence],
        "mode_registers": {str(k): int(v) for k, v in (mr or {}).items()},
        "phy": {
            "phytype": phy.phytype,
            "memtype": phy.memtype,
            "databits": phy.databits,
            "dfi_databits": phy.dfi_databits,
            "nphases": phy.nphases,
            "rdphase": reset_value(phy.rdphase),
            "wrphase": reset_value(phy.wrphase),
            "strobes": phy.strobes,
            "delays": phy.delays,
            "bitslips": phy.bitslips,
            "read_leveling": bool(phy.read_leveling),
            "write_leveling": bool(phy.write_leveling),
            "cl": phy.cl,
            "cwl": phy.cwl,
        },
    }
    # The controller's timings in sys cycles (what the generated Verilog counts).
    init["timing"] = {k: v for k, v in vars(settings.timing).items()
                      if k.startswith("t") and (v is None or isinstance(v, int))}
    (out / "init.json").write_text(json.dumps(init, indent=1) + "\n")

