"""The compiler's output: one :class:`Executable` that every backend runs.

It holds, for each phase (``prefill`` of the prompt, ``decode`` of one token), the optimised
graph whose host nodes the runtime executes and one encoded program per accelerator node
(per context bucket for attention), plus everything needed to run them: the DRAM regions of
every tensor (symbols), the DRAM image of the packed weights, the host-side tensors
(embedding, norm weights, float layers, the row scales of compressed layers), the KV-cache
geometry, the accelerator configuration and the I/O contract (prompt length, context).

:func:`save` / :func:`load` write it as one checksummed safetensors file
(:mod:`sw.artifact`): every byte is covered by a SHA-256.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from hw.config import AcceleratorConfig
from sw.artifact import ArtifactError, load_artifact, save_artifact
from sw.compile.ir import Graph, IRError
from sw.compile.plan import Region

__all__ = ["Executable", "ProgramInfo", "ExecutableError", "save", "load", "FORMAT_VERSION"]

FORMAT_VERSION = 1
_KEY = "nmfpga-executable"


class ExecutableError(ValueError):
    """A saved executable that cannot be loaded (corrupt, other version, inconsistent)."""


@dataclass(frozen=True)
class ProgramInfo:
    """What one program computes, for the runtime's I/O and the reports.

    ``members``: per GEMM layer, its DRAM symbols (``w``, ``x``, ``y``; ``b``: the int32 bias
    rows of a biased layer, as many bytes as its outputs), ``tokens`` (rows),
    ``n``, ``k``, ``act_row_bytes``, ``out_row_bytes`` and the minimal work: ``stream_bytes``
    (weight bytes read), ``macs`` (kept-weight MACs). Programs with the same ``template``
    are one lowered program placed at other addresses: their timing is identical.
    """

    phase: str
    node: str
    bucket: int | None
    instructions: int
    members: list[dict]
    template: int = 0   # programs of one template differ only in DRAM addresses

    @property
    def read_bytes(self) -> int:
        """Bytes the program must read at least: weights, int8 inputs (shared ones once) and
        bias rows."""
        inputs = {m["x"]: m["tokens"] * m["k"] for m in self.members}
        bias = sum(m["tokens"] * m["n"] * 4 for m in self.members if "b" in m)
        return sum(m["stream_bytes"] for m in self.members) + sum(inputs.values()) + bias

    @property
    def write_bytes(self) -> int:
        return sum(m["tokens"] * m["n"] * 4 for m in self.members)

    @property
    def macs(self) -> int:
        return sum(m["macs"] for m in self.members)


@dataclass
class Executable:
    """A compiled model (see the module docstring)."""

    cfg: AcceleratorConfig
    model: dict                         # LlamaConfig.to_dict()
    graphs: dict[str, Graph]            # phase -> optimised graph
    programs: list[np.ndarray]          # uint64 [n, 2] instruction words, END included
    infos: list[ProgramInfo]
    symbols: dict[str, Region]          # DRAM regions (bytes) of weights, KV cache, buffers
    image: dict[str, np.ndarray]        # symbol -> initial bytes (packed weights)
    host: dict[str, np.ndarray]         # host tensors by parameter name; "row_scale:<layer>"
    host_shapes: dict[str, list[int]]   # every host tensor's shape (timing-only: no data)
    kv: dict                            # KV-cache geometry (lower.KVLayout fields + heads)
    io: dict                            # prompt_tokens, max_context, vocab_size
    report: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ lookup
    def program_id(self, phase: str, node: str, bucket: int | None = None) -> int:
        """Index of the program of ``node`` in ``phase`` (attention: for ``bucket``)."""
        idx = self.__dict__.get("_idx")
        if idx is None:
            idx = {(i.phase, i.node, i.bucket): k for k, i in enumerate(self.infos)}
            self.__dict__["_idx"] = idx
        try:
            return idx[(phase, node, bucket)]
        except KeyError:
            raise ExecutableError(f"no program for node {node!r} of {phase}"
                                  + (f" at context bucket {bucket}" if bucket else "")
                                  + ": the executable was compiled for prompt_tokens="
                                  f"{self.io['prompt_tokens']}, max_context="
                                  f"{self.io['max_context']}") from None

    @property
    def timing_only(self) -> bool:
        """Compiled without weights: programs and timing, no values."""
        return not self.image

    @property
    def instructions(self) -> int:
        return sum(i.instructions for i in self.infos)

    def dram_image(self) -> np.ndarray:
        """The initial DRAM: zeros with the packed weights in place."""
        dram = np.zeros(self.cfg.memory.size_bytes, dtype=np.uint8)
        for name, data in self.image.items():
            r = self.symbols[name]
            dram[r.addr:r.addr + data.size] = data
        return dram


def save(exe: Executable, path: str | Path) -> Path:
    """Write ``exe`` to ``path`` (one checksummed safetensors file, written atomically)."""
    lengths = [int(p.shape[0]) for p in exe.programs]
    tensors = {"programs": (np.concatenate(exe.programs) if exe.programs
                            else np.zeros((0, 2), np.uint64)).view(np.uint8).reshape(-1)}
    tensors.update({f"image/{k}": v for k, v in exe.image.items()})
    tensors.update({f"host/{k}": v for k, v in exe.host.items()})
    doc = {"version": FORMAT_VERSION, "config": exe.cfg.to_dict(), "model": exe.model,
           "graphs": {k: g.to_dict() for k, g in exe.graphs.items()},
           "program_lengths": lengths, "infos": [asdict(i) for i in exe.infos],
           "symbols": {k: asdict(r) for k, r in exe.symbols.items()},
           "host_shapes": exe.host_shapes, "kv": exe.kv, "io": exe.io, "report": exe.report}
    return save_artifact(path, _KEY, tensors, doc)


def load(path: str | Path) -> Executable:
    """Read and verify a file written by :func:`save`.

    Raises
    ------
    ExecutableError
        Missing, corrupted (any checksum), of another version, or inconsistent.
    """
    try:
        tensors, doc = load_artifact(path, _KEY)
    except ArtifactError as e:
        raise ExecutableError(str(e)) from None
    if doc.get("version") != FORMAT_VERSION:
        raise ExecutableError(f"{path}: executable format version {doc.get('version')!r}, "
                              f"this toolkit reads version {FORMAT_VERSION}")
    try:
        words = tensors["programs"].view(np.uint64).reshape(-1, 2)
        lengths = doc["program_lengths"]
        if sum(lengths) != words.shape[0]:
            raise ExecutableError(f"{path}: program table does not match the program words")
        starts = np.cumsum([0] + lengths)
        return Executable(
            cfg=AcceleratorConfig.from_dict(doc["config"]), model=doc["model"],
            graphs={k: Graph.from_dict(g) for k, g in doc["graphs"].items()},
            programs=[words[a:b].copy() for a, b in zip(starts[:-1], starts[1:], strict=True)],
            infos=[ProgramInfo(**i) for i in doc["infos"]],
            symbols={k: Region(**r) for k, r in doc["symbols"].items()},
            image={k.removeprefix("image/"): v for k, v in tensors.items()
                   if k.startswith("image/")},
            host={k.removeprefix("host/"): v for k, v in tensors.items()
                  if k.startswith("host/")},
            host_shapes=doc["host_shapes"], kv=doc["kv"], io=doc["io"], report=doc["report"])
    except (KeyError, TypeError, IRError, ValueError) as e:
        if isinstance(e, ExecutableError):
            raise
        raise ExecutableError(f"{path}: inconsistent executable ({e!r})") from None
