"""One error hierarchy per package: every exception a package defines derives from its base,
so a caller can catch the package's errors with one clause."""

import importlib
import inspect
import pkgutil

import pytest

from hw.errors import ContractError
from sim.errors import SimulationError
from sw.compile.errors import CompileError
from sw.compress.errors import CompressError
from sw.models.errors import ModelError
from sw.runtime import RuntimeFault

BASES = {"hw": ContractError, "sim": SimulationError, "sw.compile": CompileError,
         "sw.compress": CompressError, "sw.models": ModelError, "sw.runtime": RuntimeFault}


def _errors(package: str) -> list[type]:
    """Public exception classes (warnings aside) defined in ``package``, every module
    imported."""
    pkg = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(pkg.__path__, f"{package}.")
                         if not m.name.endswith("__main__")]
    found = set()
    for name in names:
        module = importlib.import_module(name)
        found |= {c for _, c in inspect.getmembers(module, inspect.isclass)
                  if issubclass(c, Exception) and not issubclass(c, Warning)
                  and c.__module__ == name and not c.__name__.startswith("_")}
    return sorted(found, key=lambda c: c.__qualname__)


@pytest.mark.parametrize("package", sorted(BASES))
def test_every_error_of_a_package_derives_from_its_base(package):
    errors = _errors(package)
    assert BASES[package] in errors  # the scan sees the package's own errors
    outside = [c.__qualname__ for c in errors if not issubclass(c, BASES[package])]
    assert not outside, f"{package} defines errors outside {BASES[package].__name__}: {outside}"
