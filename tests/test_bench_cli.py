"""Every benchmark's command line documents each option with its default."""

import importlib
import re

import pytest

BENCHES = ["accuracy", "compile", "compress", "dse", "fuzz", "rtl", "scaling", "simspeed"]


@pytest.mark.parametrize("name", BENCHES)
def test_help_shows_every_default(name, capsys):
    main = importlib.import_module(f"bench.{name}").main
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    options = set(re.findall(r"^\s+(--[a-z][a-z-]*)", text, re.M)) - {"--help"}
    documented = set(re.findall(r"^\s+(--[a-z][a-z-]*)[^\n]*(?:\n\s{10,}[^\n]*)*?\(default:",
                                text, re.M))
    assert options and options == documented, options - documented
