"""Every backend satisfies sim.backends.Backend: the members the runtime uses, with the
fast model's signature for ``run``. No backend is built or run here (the Verilator backends
build lazily, on their first run)."""

import inspect

import pytest

from hw.config import AcceleratorConfig
from sim.backends import BACKENDS, Backend, make_backend
from sim.netlist import NetlistBackend
from sim.rtl import RTLBackend

CFG = AcceleratorConfig()
#: The protocol's data members and their types, read from the protocol itself.
DATA = {"name": str, "cfg": AcceleratorConfig, "values": bool, "traces": bool}


def _run_params(obj) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(obj.run).parameters.values()]


def _check(backend, name: str) -> None:
    assert isinstance(backend, Backend), type(backend).__name__
    for member, kind in DATA.items():
        assert isinstance(getattr(backend, member), kind), (name, member)
    assert backend.name == name and backend.cfg is CFG
    got = _run_params(backend)
    P = inspect.Parameter
    assert got[:3] == [("program", P.POSITIONAL_OR_KEYWORD, P.empty),
                       ("dram", P.POSITIONAL_OR_KEYWORD, got[1][2]),
                       ("trace", P.KEYWORD_ONLY, False)], (name, got)
    # anything after the protocol's parameters is optional
    assert all(default is not P.empty for _, _, default in got[3:]), (name, got)


def test_protocol_members_are_what_the_test_checks():
    assert set(Backend.__annotations__) == set(DATA)
    assert "run" in vars(Backend)


@pytest.mark.parametrize("name", BACKENDS)
def test_every_backend_satisfies_the_protocol(name):
    _check(make_backend(name, CFG), name)


@pytest.mark.parametrize("cls, name", [(RTLBackend, "rtl"), (NetlistBackend, "netlist")])
def test_verilator_backends_are_backends_themselves(cls, name):
    backend = cls(CFG)
    _check(backend, name)
    assert backend.values and not backend.traces


def test_the_check_fails_on_a_missing_member_or_a_wrong_signature():
    class Stub:
        name, values, traces = "x", True, False

        def __init__(self):
            self.cfg = CFG

        def run(self, program, dram, *, trace=False):
            return None

    _check(Stub(), "x")

    del Stub.traces
    with pytest.raises(AssertionError):
        _check(Stub(), "x")
    Stub.traces = False

    class Positional(Stub):
        def run(self, program, dram, trace=False):  # trace is not keyword-only
            return None

    with pytest.raises(AssertionError):
        _check(Positional(), "x")

    class NotABool(Stub):
        values = 1

    with pytest.raises(AssertionError):
        _check(NotABool(), "x")
