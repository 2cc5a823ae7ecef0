"""Generate the accelerator's Verilog from a configuration.

``python -m hw.generate --config X.json --out DIR`` writes ``DIR/accel.v`` (module ``accel``,
:class:`hw.top.Accelerator`) and ``DIR/config.json`` (the normalised configuration it was
generated from). ``--top sim`` generates :class:`hw.sim_top.SimTop` instead (accelerator + DRAM
model + host port; only sensible for small ``memory.size_bytes``). Invalid configurations are
rejected before any elaboration, with the bad value in the message, and exit status 2.

The Python API is :func:`generate_verilog` / :func:`write_design`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from amaranth import Signal
from amaranth.back import verilog
from amaranth.hdl import Value
from amaranth.lib import wiring

from hw.cli import OneLineParser, command, write_text_atomic
from hw.config import AcceleratorConfig, ConfigError
from hw.sim_top import RunnerTop, SimTop
from hw.top import Accelerator

__all__ = ["TOP_NAME", "SIM_TOP_NAME", "TOPS", "top_ports", "build_top", "generate_verilog",
           "write_design", "main"]

#: Verilog module name of the accelerator top.
TOP_NAME = "accel"
#: Verilog module name of the simulation top (accelerator + DRAM model).
SIM_TOP_NAME = "sim_top"


def top_ports(component: wiring.Component) -> list[Signal]:
    """The signals of a component's signature, for ``verilog.convert(ports=...)``.

    Constant members (the ``ready`` of an ``always_ready`` stream) are left out: a constant is
    not a port. A top that defines its own clock domain exposes its clock as ``clk``.
    """
    ports = []
    for _path, _flow, value in component.signature.flatten(component):
        value = Value.cast(value)
        if isinstance(value, Signal):
            ports.append(value)
    clk = getattr(component, "clk", None)
    if isinstance(clk, Signal):
        ports.append(clk)
    return ports


#: Tops :func:`build_top` can construct, and their Verilog module names.
TOPS = {"accel": TOP_NAME, "sim": SIM_TOP_NAME, "runner": TOP_NAME}


def build_top(cfg: AcceleratorConfig, *, top: str = "accel",
              compute: Callable | None = None) -> wiring.Component:
    """Construct a top-level component: ``"accel"`` (:class:`hw.top.Accelerator`), ``"sim"``
    (:class:`hw.sim_top.SimTop`) or ``"runner"`` (:class:`hw.sim_top.RunnerTop`)."""
    if not isinstance(cfg, AcceleratorConfig):
        raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
    if top == "accel":
        return Accelerator(cfg, compute=compute)
    if top == "sim":
        return SimTop(cfg, compute=compute)
    if top == "runner":
        return RunnerTop(cfg, compute=compute)
    raise ValueError(f"top must be one of {sorted(TOPS)}, got {top!r}")


def generate_verilog(cfg: AcceleratorConfig, *, top: str = "accel",
                     compute: Callable | None = None) -> str:
    """Verilog text of the ``top`` for ``cfg`` (module ``accel`` or ``sim_top``)."""
    design = build_top(cfg, top=top, compute=compute)
    name = TOPS[top]
    return verilog.convert(design, name=name, ports=top_ports(design), emit_src=False)


def write_design(cfg: AcceleratorConfig, out_dir: str | Path, *, top: str = "accel",
                 compute: Callable | None = None) -> dict[str, Path]:
    """Write the Verilog and ``config.json`` into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    name = TOPS[top]
    text = generate_verilog(cfg, top=top, compute=compute)
    out.mkdir(parents=True, exist_ok=True)
    v_path, c_path = out / f"{name}.v", out / "config.json"
    for path, content in ((v_path, text), (c_path, cfg.to_json() + "\n")):
        write_text_atomic(path, content)
    return {"verilog": v_path, "config": c_path}


@command("hw.generate")
def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m hw.generate", name="hw.generate",
                       description=__doc__.split("\n")[0])
    ap.add_argument("--config", help="configuration JSON (default: AcceleratorConfig())")
    ap.add_argument("--out", required=True, help="output directory, created if missing (required)")
    ap.add_argument("--top", choices=("accel", "sim"), default="accel",
                    help="accel: the synthesizable top; sim: with the DRAM model "
                         "(default: %(default)s)")
    args = ap.parse_args(argv)
    try:
        cfg = AcceleratorConfig.load(args.config) if args.config else AcceleratorConfig()
    except ConfigError as e:
        print(f"hw.generate: --config {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"hw.generate: --out {out}: exists and is not a directory", file=sys.stderr)
        return 2
    print(f"hw.generate: elaborating the {args.top} top for a {cfg.rows}x{cfg.cols} array and "
          "converting it to Verilog (about 20 s on 2 cores)...", file=sys.stderr, flush=True)
    try:
        paths = write_design(cfg, args.out, top=args.top)
    except (ConfigError, ValueError) as e:
        print(f"hw.generate: configuration rejected by the generator: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"hw.generate: --out {out}: cannot write it ({e.strerror or e})", file=sys.stderr)
        return 2
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
