"""Every benchmark's command line (and sw.codesign's) documents each option with its default."""

import importlib
import re

import pytest

COMMANDS = [f"bench.{name}" for name in ("accuracy", "beats", "board", "codesign", "compile",
                                         "compress", "dse", "fuzz", "rtl", "scaling", "simspeed")
            ] + ["sw.codesign"]


@pytest.mark.parametrize("module", COMMANDS)
def test_help_shows_every_default(module, capsys):
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    options = set(re.findall(r"^\s+(--[a-z][a-z-]*)", text, re.M)) - {"--help"}
    documented = set(re.findall(r"^\s+(--[a-z][a-z-]*)[^\n]*(?:\n\s{10,}[^\n]*)*?\(default:",
                                text, re.M))
    assert options and options == documented, options - documented
