"""The default recipe of each built-in model (:mod:`sw.models.recipes`): every assignment
covers its model's layers, options override it, and a gap is named."""

import pytest

from hw.config import AcceleratorConfig
from hw.format import FormatError, WeightFormat
from sw.models.recipes import DEFAULT_RECIPE, RECIPES, Recipe, recipe_for
from sw.models.source import BUILTINS

#: The linear layers compression selects in a LLaMA block (lm_head stays float).
KINDS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
#: Blocks of each built-in model (their configurations: the reference model's LlamaConfig
#: default, SmolLM2-135M's 30).
BLOCKS = {"reference": 4, "smollm2": 30}


def _layers(blocks: int) -> list[str]:
    return [f"model.layers.{b}.{k}" for b in range(blocks) for k in KINDS]


def test_every_builtin_has_a_recipe_whose_formats_cover_it():
    assert set(RECIPES) == set(BUILTINS) == set(BLOCKS)
    cfg = AcceleratorConfig()
    for name, recipe in RECIPES.items():
        formats = recipe.formats(_layers(BLOCKS[name]))
        assert len(formats) == 7 * BLOCKS[name] and recipe.why
        for fmt in set(formats.values()):
            fmt.check_supported(cfg)


#: A per-layer assignment in the co-design search's naming (two depth ranges of 2 blocks).
MIXED = Recipe(method="sparsegpt+gptq", why="a test", layers={
    **{f"{k}[0-1]": "dense-int4-g64" for k in KINDS},
    **{f"{k}[2-3]": "2:4-int4" for k in KINDS}})


def test_an_assignment_maps_each_group_to_its_blocks():
    formats = MIXED.formats(_layers(4))
    assert len(formats) == 28
    for unit, name in MIXED.layers.items():
        kind, blocks = unit.rstrip("]").split("[")
        lo, hi = map(int, blocks.split("-"))
        for b in (lo, hi):
            assert formats[f"model.layers.{b}.{kind}"] == WeightFormat.parse(name)
    assert MIXED.uniform_format() is None and "per-layer assignment of 14" in str(MIXED)


def test_a_layer_outside_the_assignment_is_named():
    with pytest.raises(FormatError, match=r"no format for layer 'model.layers.4.self_attn.q_proj'"):
        MIXED.formats(_layers(5))
    with pytest.raises(FormatError, match=r"recipe layer group 'q_proj'"):
        Recipe(layers={"q_proj": "2:4-int4"}).formats(_layers(1))


def test_options_override_the_recipe():
    assert MIXED.override() is MIXED
    only_method = MIXED.override(method="gptq")
    assert only_method.layers == MIXED.layers and only_method.method == "gptq"
    uniform = MIXED.override(sparsity="4:8")
    assert not uniform.layers and str(uniform) == f"4:8 INT4 g128, {MIXED.method}"
    assert uniform.uniform_format() == WeightFormat("4:8", 4, 128)
    assert RECIPES["smollm2"].override(bits=8).uniform_format().bits == 8
    assert recipe_for("path/to/model.gguf") is DEFAULT_RECIPE
    assert recipe_for("reference") is RECIPES["reference"]
    assert str(Recipe(sparsity="dense", bits=8, group=0)) == "dense INT8 g0, sparsegpt+gptq"


def test_the_lm_head_is_host_by_default_and_compressed_dense_when_asked():
    """``lm_head`` says where the head runs: every built-in leaves it on the host (the
    recipes' formats do not name it); int8 / int4 give it a dense format in the recipe's
    groups, with or without a per-layer assignment, and the other layers keep theirs."""
    assert all(r.lm_head == "host" and r.head_format() is None for r in RECIPES.values())
    layers = _layers(4)
    for head, bits in (("int8", 8), ("int4", 4)):
        for base in (DEFAULT_RECIPE, MIXED):
            r = base.override(lm_head=head)
            assert r.head_format() == WeightFormat("dense", bits, base.group)
            formats = r.formats([*layers, "lm_head"])
            assert formats.pop("lm_head") == r.head_format()
            assert formats == base.formats(layers)
            assert f"head {r.head_format().name}" in str(r) and r.why == "the options given"
    assert DEFAULT_RECIPE.override(lm_head="host") is DEFAULT_RECIPE
    with pytest.raises(FormatError, match="leaves lm_head on the host"):
        DEFAULT_RECIPE.formats([*layers, "lm_head"])
    with pytest.raises(FormatError, match="lm_head 'int2': choose one of host, int8, int4"):
        Recipe(lm_head="int2")
