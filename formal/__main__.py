"""``python -m formal [-k SUBSTRING] [--list] [--out DIR]``: run the proofs, print a table.

Exits 1 if any proof does not pass (failures print their failing assertions and the work
directory holding the counterexample trace).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hw.cli import OneLineParser, command

from . import formal_config
from .flow import run_proof
from .registry import all_proofs


@command("python -m formal")
def main(argv: list[str] | None = None) -> int:
    """Run the proofs selected by ``-k`` (or list them); 0 if all pass, 1 otherwise."""
    ap = OneLineParser(prog="python -m formal", description=__doc__)
    ap.add_argument("-k", default="", metavar="SUBSTRING",
                    help="run the proofs whose name contains SUBSTRING (default: all)")
    ap.add_argument("--list", action="store_true",
                    help="list the proofs and exit (default: run them)")
    ap.add_argument("--out", default="build/formal",
                    help="work directory (default: %(default)s)")
    args = ap.parse_args(argv)
    proofs = [p for p in all_proofs(formal_config()) if args.k in p.name]
    if args.list:
        for p in proofs:
            print(f"{p.name:28s} {p.mode:5s} {p.depth:3d}  {p.statement}")
        return 0
    failed = 0
    total = 0.0
    print(f"{'proof':28s} {'mode':5s} {'depth':>5s} {'solver':6s} {'time':>8s}  result")
    for p in proofs:
        r = run_proof(p, Path(args.out))
        total += r.seconds
        print(f"{p.name:28s} {p.mode:5s} {p.depth:5d} {p.solver:6s} {r.seconds:7.1f}s  "
              f"{r.status}", flush=True)
        if not r.passed:
            failed += 1
            print(f"    {r.workdir}\n" + "\n".join(f"    {ln}" for ln in r.detail.splitlines()),
                  flush=True)
    print(f"{len(proofs) - failed} passed, {failed} failed ({total:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
