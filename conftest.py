"""Collection of the default run: tests/ and the docstring examples of hw, sim and sw.

pyproject.toml runs ``--doctest-modules`` over its ``testpaths``, which imports every module
there to collect its examples. A ``conftest.py`` is loaded by pytest as a plugin, never collected
as a test module, and tests/ has several with the same basename: collecting them as doctest
modules as well would import a second ``conftest`` under a taken name (an "import file mismatch"
error), so they are left out. Every module of hw, sim and sw imports without optional tools;
``tests/test_imports.py`` checks that.
"""

from pathlib import Path


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """Leave conftest.py files out of collection (pytest loads them as plugins, not tests)."""
    return True if collection_path.name == "conftest.py" else None
