"""Every module of hw, sim and sw imports on a plain install (no optional tool, no side effects).

The default run collects the docstring examples of these packages with ``--doctest-modules``,
which imports each module; ``__main__`` modules are not collected there, so this test imports
them too (their ``if __name__ == "__main__"`` guard keeps the command from running).
"""

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hw", "sim", "sw")


def _modules() -> list[str]:
    names = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_package_has_modules():
    names = _modules()
    assert {"hw.config", "sim.model", "sw.deploy", "sw.compress.__main__"} <= set(names), names


@pytest.mark.parametrize("name", _modules())
def test_module_imports(name):
    module = importlib.import_module(name)
    assert module.__name__ == name
