"""The compression recipe each built-in model gets by default (the one table of them).

A :class:`Recipe` is a method and a uniform weight format (N:M pattern, bits, group), or a
method and a per-layer assignment: one format per layer type and range of blocks, as the
co-design search (:mod:`sw.codesign`, ``python -m bench.codesign``) writes them, e.g.
``"mlp.down_proj[0-14]": "dense-int4"``. ``python -m sw.deploy --model NAME`` compresses with
``RECIPES[NAME]`` unless its options say otherwise (:meth:`Recipe.override`); any other model
gets :data:`DEFAULT_RECIPE`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hw.config import WEIGHT_BITS
from hw.format import FormatError, WeightFormat

__all__ = ["HEAD", "LM_HEADS", "Recipe", "DEFAULT_RECIPE", "RECIPES", "recipe_for"]

#: The qualified name of the LM head (the linear :attr:`Recipe.head_bits` compresses).
HEAD = "lm_head"

#: The LM head's choices (``sw.deploy --lm-head``): name -> :attr:`Recipe.head_bits` (0: float,
#: on the host).
LM_HEADS = {"host": 0, **{f"int{b}": b for b in sorted(WEIGHT_BITS)}}

_UNIT = re.compile(r"(?P<kind>[\w.]+)\[(?P<lo>\d+)-(?P<hi>\d+)\]")
_BLOCK = re.compile(r"model\.layers\.(\d+)\.(.+)")


@dataclass(frozen=True)
class Recipe:
    """How a model is compressed.

    Parameters
    ----------
    method : str
        Compression method (a key of :data:`sw.compress.model.COMPRESS_METHODS`).
    sparsity : str
        N:M pattern of every layer, or ``"dense"`` (ignored when ``layers`` is given).
    bits : int
        Weight bits (ignored when ``layers`` is given).
    group : int
        Quantisation group along K, 0 = whole row (ignored when ``layers`` is given).
    layers : mapping, optional
        Per-layer assignment ``{"<layer type>[<first>-<last block>]": "<format name>"}``
        (:meth:`hw.format.WeightFormat.parse` names); every compressed layer must be covered.
    why : str
        Where the recipe comes from (stated in ``--help`` and in reports).
    head_bits : int
        Weight bits of the LM head (dense, groups of ``group``), which then runs on the
        accelerator like the other linears; 0 (the default) leaves it in float on the host,
        as the GPTQ / SparseGPT papers do.
    """

    method: str = "sparsegpt+gptq"
    sparsity: str = "2:4"
    bits: int = 4
    group: int = 128
    layers: Mapping[str, str] = field(default_factory=dict)
    why: str = ""
    head_bits: int = 0

    def __str__(self) -> str:
        head = f", LM head dense INT{self.head_bits} g{self.group}" if self.head_bits else ""
        if not self.layers:
            return f"{self.sparsity} INT{self.bits} g{self.group}, {self.method}{head}"
        counts: dict[str, int] = {}
        for name in self.layers.values():
            counts[name] = counts.get(name, 0) + 1
        mix = ", ".join(f"{n} x{k}" for n, k in sorted(counts.items()))
        return (f"per-layer assignment of {len(self.layers)} layer groups ({mix}), "
                f"{self.method}{head}")

    def head_format(self) -> WeightFormat | None:
        """The LM head's format, or None when it stays in float on the host.

        >>> Recipe(head_bits=8).head_format().name, Recipe().head_format()
        ('dense-int8', None)
        """
        return WeightFormat("dense", self.head_bits, self.group) if self.head_bits else None

    def uniform_format(self) -> WeightFormat | None:
        """The one format of every layer, or None for a per-layer assignment.

        Raises
        ------
        FormatError
            ``sparsity``, ``bits`` and ``group`` do not make a format.
        """
        if self.layers:
            return None
        return WeightFormat(self.sparsity, self.bits, self.group)

    def formats(self, layers: Iterable[str]) -> dict[str, WeightFormat]:
        """The format of each of ``layers`` (qualified names, ``model.layers.<i>.<type>``).

        Raises
        ------
        FormatError
            A format name that does not parse, or a layer the assignment does not cover
            (the message names it).
        """
        layers = list(layers)
        if HEAD in layers:
            head = self.head_format()
            if head is None:
                raise FormatError(f"the recipe keeps {HEAD!r} in float (head_bits=0)")
            return {**self.formats([n for n in layers if n != HEAD]), HEAD: head}
        uniform = self.uniform_format()
        if uniform is not None:
            return {name: uniform for name in layers}
        parsed = {unit: WeightFormat.parse(name) for unit, name in self.layers.items()}
        ranges = []
        for unit in self.layers:
            m = _UNIT.fullmatch(unit)
            if not m:
                raise FormatError(f"recipe layer group {unit!r}: expected "
                                  "'<layer type>[<first>-<last block>]'")
            ranges.append((m["kind"], int(m["lo"]), int(m["hi"]), unit))
        out = {}
        for name in layers:
            m = _BLOCK.fullmatch(name)
            hit = m and next((u for kind, lo, hi, u in ranges
                              if kind == m.group(2) and lo <= int(m.group(1)) <= hi), None)
            if not hit:
                raise FormatError(f"the recipe's per-layer assignment has no format for layer "
                                  f"{name!r}")
            out[name] = parsed[hit]
        return out

    def override(self, *, method: str | None = None, sparsity: str | None = None,
                 bits: int | None = None, group: int | None = None,
                 head_bits: int | None = None) -> Recipe:
        """This recipe with the options given (not None) in its place: any of ``sparsity``,
        ``bits`` or ``group`` replaces a per-layer assignment by one uniform format."""
        changes: dict = {k: v for k, v in (("method", method), ("sparsity", sparsity),
                                           ("bits", bits), ("group", group),
                                           ("head_bits", head_bits)) if v is not None}
        if not changes:
            return self
        if {"sparsity", "bits", "group"} & set(changes):
            changes["layers"] = {}
        if set(changes) - {"head_bits"}:
            changes["why"] = "the options given"
        return dataclasses.replace(self, **changes)


#: The recipe of any model without its own: 2:4 INT4 in groups of 128, SparseGPT + GPTQ.
DEFAULT_RECIPE = Recipe(why="the default")

#: Each built-in model's default recipe (``sw.models.source.BUILTINS`` names the models), each
#: chosen by measurement: the model must answer its default prompt with tokens equal to the
#: twin's (``python -m sw.deploy --model NAME``).
RECIPES: dict[str, Recipe] = {
    "reference": dataclasses.replace(
        DEFAULT_RECIPE, why="2:4 INT4 answers and loses little on this model "
        "(python -m bench.accuracy)"),
    # The sparse recipes measured on SmolLM2-135M do not answer the France prompt: uniform 2:4
    # and the co-design search's per-layer assignment at the 2:4 latency
    # (python -m bench.codesign, recompressed; perplexity 19.5 on 8,192 held-out tokens
    # with the accelerator's numerics) end at once, 4:8 in groups of 64 (perplexity 20.1;
    # sw.deploy --model smollm2 --sparsity 4:8 --group 64) says "furnlles". Dense INT4
    # answers; groups of 64 do not pad K = 576 as 128 do.
    "smollm2": Recipe(
        method="gptq", sparsity="dense", bits=4, group=64,
        why="dense INT4 g64: the sparse recipes measured (uniform 2:4, 4:8 g64, the co-design "
            "search's assignment at the 2:4 latency) do not answer on this 135 M model"),
}


def recipe_for(model: str) -> Recipe:
    """The default recipe of ``model`` (a built-in name or a path)."""
    return RECIPES.get(model, DEFAULT_RECIPE)
