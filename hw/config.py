"""The accelerator configuration: one dataclass, the single source of every hardware parameter.

hw/ generates RTL from it, sim/ models it, sw/ compiles for it. Everything derived from it (lane
count, word widths, operand widths, spad depths) is a property here, never recomputed elsewhere.

Example
-------
>>> cfg = AcceleratorConfig()
>>> cfg.rows, cfg.cols, cfg.lanes, cfg.beat_bytes, cfg.wgt_word_bytes
(4, 8, 32, 16, 32)
>>> cfg.lanes == cfg.rows * cfg.cols
True
>>> AcceleratorConfig.from_json(cfg.to_json()) == cfg
True
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from hw.errors import ContractError

__all__ = ["NMPattern", "MemoryModel", "AcceleratorConfig", "ConfigError", "DENSE"]


class ConfigError(ContractError):
    """An invalid accelerator configuration or pattern; the message names the bad value."""


def _is_pow2(x: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0 and (x & (x - 1)) == 0


@dataclass(frozen=True, order=True)
class NMPattern:
    """An N:M sparsity pattern along the reduction dimension: at most ``n`` of every ``m``.

    ``n == m`` is dense. Dense streams carry no index field; their implicit block size is
    :data:`DENSE_BLOCK` activations (see docs/architecture.md, "Weight stream").
    """

    n: int
    m: int

    def __post_init__(self):
        if not isinstance(self.n, int) or not isinstance(self.m, int):
            raise ConfigError(f"N:M pattern needs integers, got {self.n!r}:{self.m!r}")
        if self.m not in (1, 2, 4, 8, 16):
            raise ConfigError(f"N:M pattern: M must be a power of two <= 16, got M={self.m!r}")
        if not 1 <= self.n <= self.m:
            raise ConfigError(f"N:M pattern: need 1 <= N <= M, got {self.n}:{self.m}")

    @classmethod
    def parse(cls, text: str | NMPattern) -> NMPattern:
        """Parse ``"2:4"``; ``"dense"`` means 1:1."""
        if isinstance(text, NMPattern):
            return text
        if not isinstance(text, str):
            raise ConfigError(f"N:M pattern must be a string like '2:4', got {text!r}")
        if text.strip().lower() == "dense":
            return DENSE
        try:
            n, m = (int(p) for p in text.split(":"))
        except ValueError:
            raise ConfigError(f"N:M pattern must look like '2:4', got {text!r}") from None
        if n == m:
            return DENSE
        if n > m:
            raise ConfigError(f"N:M pattern: N must be < M for sparsity, got {text!r}")
        return cls(n, m)

    @property
    def dense(self) -> bool:
        return self.n == self.m

    @property
    def index_bits(self) -> int:
        """Bits of the in-block index stored with every kept value (0 for dense)."""
        return 0 if self.dense else int(math.log2(self.m))

    @property
    def block(self) -> int:
        """Activations one step may select from (the M-block; dense uses DENSE_BLOCK)."""
        return DENSE_BLOCK if self.dense else self.m

    @property
    def steps_per_block(self) -> int:
        """Steps (kept values per lane) that share one activation block."""
        return DENSE_BLOCK if self.dense else self.n

    @property
    def density(self) -> float:
        return self.n / self.m

    def __str__(self) -> str:
        return "dense" if self.dense else f"{self.n}:{self.m}"


DENSE = NMPattern(1, 1)
#: Weight widths the dequantisation units decode (INT4 and INT8 codes); a configuration
#: streams a non-empty subset (``weight_bits``), always with 4.
WEIGHT_BITS = (4, 8)
#: Activations fetched at once in dense mode; step ``s`` uses element ``s % DENSE_BLOCK``.
DENSE_BLOCK = 16
#: Bytes of one element of the vector engine's scratchpads (an int32 activation word).
VECTOR_WORD_BYTES = 4
#: The configuration fields of the vector engine's scratchpads (0: no vector engine).
_VECTOR_SPADS = ("vin_spad_bytes", "vout_spad_bytes")

#: The slowest DRAM port pace (:attr:`MemoryModel.cycles_per_beat`): a beat every 16 cycles.
MAX_CYCLES_PER_BEAT = 16


@dataclass(frozen=True)
class MemoryModel:
    """The DRAM seen by the DMA engines.

    Parameters
    ----------
    bytes_per_cycle:
        Beat size: bytes moved per cycle in each direction (separate read and write channels).
    latency:
        Cycles from a read request to its data.
    size_bytes:
        DRAM size modelled in simulation (addresses beyond it are errors).
    cycles_per_beat:
        The DRAM port's pace ``k``: the LOAD engine issues a read request, and the STORE
        engine reads a beat for a DRAM write, once every ``k`` cycles of an instruction
        (:func:`hw.timing.load_cycles`, :func:`hw.timing.store_cycles`), so the port never
        asks more than ``bytes_per_cycle / k`` bytes a cycle of a memory that gives no more (a
        DRAM slower than the accelerator's port, behind a bridge that stops the accelerator
        while the memory is late). Moves (:func:`hw.isa.is_move`) are not paced: their beats
        go from VOUT or OUT to VIN on chip, one a cycle, and are no DRAM traffic. A positive
        int; at 1 (the default, one beat a cycle) it is left out of
        :meth:`AcceleratorConfig.to_dict`, so the unpaced configurations keep their
        :attr:`AcceleratorConfig.fingerprint`.
    """

    bytes_per_cycle: int = 16
    latency: int = 24
    size_bytes: int = 1 << 22
    cycles_per_beat: int = 1

    def __post_init__(self):
        if not _is_pow2(self.bytes_per_cycle) or not 4 <= self.bytes_per_cycle <= 1 << 16:
            raise ConfigError(
                f"memory.bytes_per_cycle must be a power of two in [4, 65536], "
                f"got {self.bytes_per_cycle!r}")
        if not isinstance(self.latency, int) or not 1 <= self.latency <= 4096:
            raise ConfigError(f"memory.latency must be an int in [1, 4096], got {self.latency!r}")
        if not isinstance(self.size_bytes, int) or self.size_bytes % self.bytes_per_cycle:
            raise ConfigError(
                f"memory.size_bytes must be a multiple of bytes_per_cycle "
                f"({self.bytes_per_cycle}), got {self.size_bytes!r}")
        if self.size_bytes // self.bytes_per_cycle > 1 << 32:
            raise ConfigError(f"memory.size_bytes too large for 32-bit beat addresses: "
                              f"{self.size_bytes!r}")
        if (not isinstance(self.cycles_per_beat, int) or isinstance(self.cycles_per_beat, bool)
                or not 1 <= self.cycles_per_beat <= MAX_CYCLES_PER_BEAT):
            raise ConfigError(f"memory.cycles_per_beat must be an int in "
                              f"[1, {MAX_CYCLES_PER_BEAT}], got {self.cycles_per_beat!r}")


def _default_patterns() -> tuple[NMPattern, ...]:
    return tuple(NMPattern.parse(p) for p in ("1:4", "2:4", "1:8", "2:8", "4:8", "4:16"))


@dataclass(frozen=True)
class AcceleratorConfig:
    """Every parameter of one accelerator instance.

    Parameters
    ----------
    rows, cols:
        The array: ``rows`` pipelined rows of ``cols`` processing elements (lanes = rows*cols).
    max_tokens:
        Depth of every PE's accumulator file: tokens one GEMM instruction processes.
    patterns:
        Sparse N:M patterns the decoder supports, selectable per instruction. Dense is always
        supported and is pattern index 0 in instructions.
    weight_bits:
        Weight value widths the decoder supports (4 and/or 8).
    act_bits, acc_bits:
        Activation and accumulator widths (two's complement; accumulators wrap).
    scale_code_bits:
        Width of the unsigned per-group scale code (see docs/architecture.md, "Numerics").
    group_size:
        Default quantization group along K used by the compiler and compressor.
    act_spad_bytes, wgt_spad_bytes, out_spad_bytes, param_spad_bytes:
        Scratchpad capacities.
    vin_spad_bytes, vout_spad_bytes:
        Capacities of the vector engine's input (LOAD writes it, the vector engine reads it) and
        output (the vector engine writes it, STORE reads it) scratchpads; both 0 (the default)
        or both positive: the accelerator has a vector engine (:attr:`has_vector`) exactly when
        they are positive. At 0 they are left out of :meth:`to_dict`, so a configuration
        without the engine keeps the :attr:`fingerprint` it had before the engine existed.
    vector_lanes:
        Elements the vector engine takes per cycle in the sub-ops that stream laned
        (:func:`hw.isa.vec_lanes`; the others one): a power of two from 1 to the
        elements of a DMA beat (:attr:`vector_lanes_max`), above 1 only with a vector engine.
        At 1 (the default) it is left out of :meth:`to_dict`, so the configurations that
        stream one element a cycle keep their :attr:`fingerprint`.
    vector_laned_silu:
        SILU_GATE streams :attr:`vector_lanes` elements a cycle too
        (:func:`hw.isa.laned_vec_funcs`): each lane past the first gets its own copy of the
        SiLU-gate's chain (``Recip``, ``Scale(60)`` and two ``Mul(30)``, its ``Exp(30)`` the
        lane's SOFTMAX ``Exp``: 11 multipliers a lane in Yosys' count), which the ECP5-85F
        has beside the 4x8 array with two lanes, not with four (docs/architecture.md,
        *Lanes*): the wide systems set it, the ``vector`` preset does not. Needs
        ``vector_lanes > 1``; False (the default) is left out of :meth:`to_dict`.
    vector_laned_rope_heads:
        A ROPE whose heads the lanes hold whole (:func:`hw.isa.rope_heads_laned`: a power-of-two
        ``head_dim`` dividing :attr:`vector_lanes`) streams ``vector_lanes`` elements a cycle
        too (:func:`hw.isa.rope_laned`), each lane's ``Rope`` taking its partner lane's
        element through a multiplexer of the ``log2 vector_lanes`` half heads and its table
        word through another, the table's group read beside the row (docs/architecture.md,
        *Lanes*): the wide systems set it (HBM-class's 512 lanes hold four LLaMA heads), the
        ``vector`` preset does not. Needs ``vector_lanes > 1``; False (the default) is left
        out of :meth:`to_dict`.
    queue_depth:
        Depth of each engine's instruction queue.
    num_events:
        Event counters (at most 31: id 31 in an instruction means "none").
    event_bits:
        Width of each event counter; counting past its maximum is an error.
    imem_depth:
        Instruction memory depth (instructions).
    memory:
        The DRAM model.
    clock_mhz:
        Target clock, used to convert cycles into seconds.
    """

    rows: int = 4
    cols: int = 8
    max_tokens: int = 16
    patterns: tuple[NMPattern, ...] = field(default_factory=_default_patterns)
    weight_bits: tuple[int, ...] = WEIGHT_BITS
    act_bits: int = 8
    acc_bits: int = 32
    scale_code_bits: int = 8
    group_size: int = 128
    act_spad_bytes: int = 32 << 10
    wgt_spad_bytes: int = 64 << 10
    out_spad_bytes: int = 16 << 10
    param_spad_bytes: int = 1 << 10
    vin_spad_bytes: int = 0
    vout_spad_bytes: int = 0
    vector_lanes: int = 1
    vector_laned_silu: bool = False
    vector_laned_rope_heads: bool = False
    queue_depth: int = 4
    num_events: int = 16
    event_bits: int = 8
    imem_depth: int = 4096
    memory: MemoryModel = field(default_factory=MemoryModel)
    clock_mhz: float = 100.0

    def __post_init__(self):
        # Normalise patterns given as strings (e.g. from JSON or the CLI).
        for name in ("patterns", "weight_bits"):
            if not isinstance(getattr(self, name), (list, tuple)):
                raise ConfigError(f"{name} must be a list, got {getattr(self, name)!r}")
        pats = tuple(NMPattern.parse(p) for p in self.patterns)
        object.__setattr__(self, "patterns", pats)
        if not all(isinstance(b, int) and not isinstance(b, bool) for b in self.weight_bits):
            raise ConfigError(f"weight_bits must be a list of ints, got {self.weight_bits!r}")
        object.__setattr__(self, "weight_bits", tuple(self.weight_bits))
        if isinstance(self.memory, dict):
            unknown = set(self.memory) - {f.name for f in dataclasses.fields(MemoryModel)}
            if unknown:
                raise ConfigError(f"unknown memory fields: {sorted(unknown)}")
            object.__setattr__(self, "memory", MemoryModel(**self.memory))
        if not isinstance(self.memory, MemoryModel):
            raise ConfigError(f"memory must be an object, got {self.memory!r}")
        self._validate()

    # ------------------------------------------------------------------ validation
    def _validate(self):
        def need(cond, msg):
            if not cond:
                raise ConfigError(msg)

        for name in ("rows", "cols"):
            v = getattr(self, name)
            need(isinstance(v, int) and _is_pow2(v) and v <= 256,
                 f"{name} must be a power of two in [1, 256], got {v!r}")
        need(self.lanes >= 8, f"rows*cols must be >= 8 (byte-aligned lane fields), "
                              f"got {self.rows}*{self.cols}={self.lanes}")
        need(isinstance(self.max_tokens, int) and _is_pow2(self.max_tokens)
             and self.max_tokens <= 32,
             f"max_tokens must be a power of two in [1, 32], got {self.max_tokens!r}")
        need(len(self.patterns) <= 7, f"at most 7 sparse patterns, got {len(self.patterns)}")
        need(len(set(self.patterns)) == len(self.patterns),
             f"duplicate patterns in {[str(p) for p in self.patterns]}")
        for p in self.patterns:
            need(not p.dense, f"patterns lists sparse patterns only (dense is implicit), got {p}")
        need(set(self.weight_bits) <= set(WEIGHT_BITS) and len(self.weight_bits) > 0,
             f"weight_bits must be a non-empty subset of {WEIGHT_BITS}, got "
             f"{self.weight_bits!r}")
        need(4 in self.weight_bits, f"weight_bits must include 4, got {self.weight_bits!r}")
        need(self.act_bits == 8, f"act_bits must be 8, got {self.act_bits!r}")
        need(self.acc_bits in (24, 32, 40, 48),
             f"acc_bits must be one of 24, 32, 40, 48, got {self.acc_bits!r}")
        need(self.scale_code_bits in (4, 6, 8),
             f"scale_code_bits must be 4, 6 or 8, got {self.scale_code_bits!r}")
        need(self.group_size in (32, 64, 128, 256) or self.group_size == 0,
             f"group_size must be 32, 64, 128, 256 or 0 (whole row), got {self.group_size!r}")
        need(self.beat_bytes <= self.lanes or self.lanes % self.beat_bytes == 0
             or self.beat_bytes % self.lanes == 0,
             f"memory.bytes_per_cycle ({self.beat_bytes}) and lanes ({self.lanes}) must divide "
             f"one another")
        for name in ("act_spad_bytes", "wgt_spad_bytes", "out_spad_bytes", "param_spad_bytes"):
            v = getattr(self, name)
            word = getattr(self, name.replace("spad_bytes", "word_bytes"))
            need(isinstance(v, int) and v > 0 and v % max(word, self.beat_bytes) == 0,
                 f"{name} must be a positive multiple of {max(word, self.beat_bytes)} bytes, "
                 f"got {v!r}")
            need(v // self.beat_bytes <= 1 << 16,
                 f"{name}={v} exceeds 65536 beats, the ISA's spad address range")
        for name in _VECTOR_SPADS:
            v = getattr(self, name)
            row = max(VECTOR_WORD_BYTES, self.beat_bytes)
            need(isinstance(v, int) and not isinstance(v, bool) and v >= 0 and v % row == 0,
                 f"{name} must be 0 (no vector engine) or a positive multiple of {row} bytes, "
                 f"got {v!r}")
            need(v // self.beat_bytes <= 1 << 16 and v // VECTOR_WORD_BYTES <= 1 << 16,
                 f"{name}={v} exceeds 65536 beats or elements, the ISA's address ranges")
        need((self.vin_spad_bytes > 0) == (self.vout_spad_bytes > 0),
             f"vin_spad_bytes={self.vin_spad_bytes} and vout_spad_bytes="
             f"{self.vout_spad_bytes} must both be 0 (no vector engine) or both positive")
        need(isinstance(self.vector_lanes, int) and _is_pow2(self.vector_lanes)
             and self.vector_lanes <= self.vector_lanes_max,
             f"vector_lanes must be a power of two in [1, {self.vector_lanes_max}] (the "
             f"int32 elements of a {self.beat_bytes}-byte beat), got {self.vector_lanes!r}")
        need(self.vector_lanes == 1 or self.has_vector,
             f"vector_lanes={self.vector_lanes} needs a vector engine (vin_spad_bytes and "
             f"vout_spad_bytes positive)")
        need(isinstance(self.vector_laned_silu, bool),
             f"vector_laned_silu must be a bool, got {self.vector_laned_silu!r}")
        need(not self.vector_laned_silu or self.vector_lanes > 1,
             f"vector_laned_silu needs vector_lanes > 1, got vector_lanes={self.vector_lanes}")
        need(isinstance(self.vector_laned_rope_heads, bool),
             f"vector_laned_rope_heads must be a bool, got {self.vector_laned_rope_heads!r}")
        need(not self.vector_laned_rope_heads or self.vector_lanes > 1,
             f"vector_laned_rope_heads needs vector_lanes > 1, got vector_lanes="
             f"{self.vector_lanes}")
        need(self.param_spad_bytes // self.beat_bytes <= 1 << 8,
             f"param_spad_bytes={self.param_spad_bytes} exceeds the ISA's 256-beat param range")
        need(isinstance(self.queue_depth, int) and 1 <= self.queue_depth <= 64,
             f"queue_depth must be in [1, 64], got {self.queue_depth!r}")
        need(isinstance(self.num_events, int) and 1 <= self.num_events <= 31,
             f"num_events must be in [1, 31], got {self.num_events!r}")
        need(self.event_bits in range(2, 17), f"event_bits must be in [2, 16], "
                                              f"got {self.event_bits!r}")
        need(isinstance(self.imem_depth, int) and _is_pow2(self.imem_depth)
             and self.imem_depth <= 1 << 20,
             f"imem_depth must be a power of two <= 2**20, got {self.imem_depth!r}")
        need(isinstance(self.clock_mhz, (int, float)) and 0 < self.clock_mhz <= 1000,
             f"clock_mhz must be in (0, 1000], got {self.clock_mhz!r}")
        need(max(self.max_block, self.beat_bytes) % self.act_word_bytes == 0
             or self.act_word_bytes % self.beat_bytes == 0,
             "act word and beat widths must nest")

    # ------------------------------------------------------------------ derived
    @property
    def lanes(self) -> int:
        """Processing elements = output channels computed at once = weight-stream lanes."""
        return self.rows * self.cols

    @property
    def beat_bytes(self) -> int:
        """DMA beat: bytes per cycle per direction; spad addresses in the ISA count beats."""
        return self.memory.bytes_per_cycle

    @property
    def dram_bytes_per_cycle(self) -> float:
        """The DRAM port's bandwidth per direction: a beat every
        :attr:`MemoryModel.cycles_per_beat` cycles (:attr:`beat_bytes` unpaced)."""
        return self.beat_bytes / self.memory.cycles_per_beat

    @property
    def max_block(self) -> int:
        """Largest activation block a step selects from (also the ACT spad word)."""
        return max([DENSE_BLOCK] + [p.m for p in self.patterns])

    @property
    def act_word_bytes(self) -> int:
        return self.max_block

    @property
    def wgt_word_bytes(self) -> int:
        """One WGT spad word holds one byte per lane: the widest step record."""
        return self.lanes

    @property
    def out_word_bytes(self) -> int:
        return self.lanes

    @property
    def param_word_bytes(self) -> int:
        """Per-lane 16-bit requantisation multipliers for the INT8 epilogue."""
        return 2 * self.lanes

    @property
    def vin_word_bytes(self) -> int:
        """The vector engine reads one int32 element per word."""
        return VECTOR_WORD_BYTES

    @property
    def vout_word_bytes(self) -> int:
        """The vector engine writes one int32 element per word."""
        return VECTOR_WORD_BYTES

    @property
    def vector_lanes_max(self) -> int:
        """The most :attr:`vector_lanes`: the vector engine's elements in a DMA beat (LOAD and
        STORE move VIN and VOUT in whole beats).

        >>> AcceleratorConfig().vector_lanes_max
        4
        """
        return max(1, self.beat_bytes // VECTOR_WORD_BYTES)

    @property
    def has_vector(self) -> bool:
        """The accelerator has a vector engine (its scratchpads are not empty).

        >>> AcceleratorConfig().has_vector, AcceleratorConfig(vin_spad_bytes=256,
        ...                                                   vout_spad_bytes=256).has_vector
        (False, True)
        """
        return self.vin_spad_bytes > 0

    @property
    def weight_operand_bits(self) -> int:
        """Signed width of a dequantised weight ``code * (q - z)`` entering a PE."""
        code_max = (1 << self.scale_code_bits) - 1
        worst = max(code_max * ((1 << b) - 1) for b in self.weight_bits)  # asymmetric bound
        return worst.bit_length() + 1

    @property
    def product_bits(self) -> int:
        return self.weight_operand_bits + self.act_bits

    @property
    def pattern_table(self) -> tuple[NMPattern, ...]:
        """Pattern index as encoded in GEMM instructions: 0 is dense."""
        return (DENSE,) + self.patterns

    def pattern_index(self, pattern: NMPattern | str) -> int:
        """Index of ``pattern`` in :attr:`pattern_table`; raises if unsupported."""
        p = NMPattern.parse(pattern)
        try:
            return self.pattern_table.index(p)
        except ValueError:
            raise ConfigError(f"pattern {p} is not supported by this accelerator; supported: "
                              f"{[str(q) for q in self.pattern_table]}") from None

    def spad_beats(self, spad: str) -> int:
        return getattr(self, f"{spad}_spad_bytes") // self.beat_bytes

    @property
    def peak_macs_per_cycle(self) -> int:
        """Dense MACs per cycle at full utilisation (one per PE)."""
        return self.lanes

    @property
    def dram_beats(self) -> int:
        return self.memory.size_bytes // self.beat_bytes

    # ------------------------------------------------------------------ identity
    @property
    def fingerprint(self) -> str:
        """The configuration's identity: the first 12 hex digits of the SHA-256 of its
        canonical JSON (:meth:`to_json`). Equal configurations, and only they (up to hash
        collisions), share it; it names build directories and stamps benchmark records.

        >>> AcceleratorConfig().fingerprint == AcceleratorConfig.from_json(
        ...     AcceleratorConfig().to_json()).fingerprint
        True
        >>> AcceleratorConfig(rows=2).fingerprint != AcceleratorConfig().fingerprint
        True
        """
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]

    @property
    def array(self) -> str:
        """The array as ``"ROWSxCOLS"``.

        >>> AcceleratorConfig(rows=2, cols=4).array
        '2x4'
        """
        return f"{self.rows}x{self.cols}"

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["patterns"] = [str(p) for p in self.patterns]
        d["weight_bits"] = list(self.weight_bits)
        for name in _VECTOR_SPADS:  # absent engine: absent fields (the fingerprint is kept)
            if d[name] == 0:
                del d[name]
        if d["vector_lanes"] == 1:  # one element a cycle: absent, as before the field
            del d["vector_lanes"]
        for name in ("vector_laned_silu", "vector_laned_rope_heads"):
            if not d[name]:  # absent, as before the field
                del d[name]
        if d["memory"]["cycles_per_beat"] == 1:  # unpaced: absent, as before the field
            del d["memory"]["cycles_per_beat"]
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> AcceleratorConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown configuration fields: {sorted(unknown)}")
        d = dict(d)
        if "memory" in d:
            mem = d["memory"]
            if not isinstance(mem, dict):
                raise ConfigError(f"memory must be an object, got {mem!r}")
            unknown = set(mem) - {f.name for f in dataclasses.fields(MemoryModel)}
            if unknown:
                raise ConfigError(f"unknown memory fields: {sorted(unknown)}")
            d["memory"] = MemoryModel(**mem)
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> AcceleratorConfig:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"configuration is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise ConfigError(f"configuration JSON must be an object, got {type(d).__name__}")
        return cls.from_dict(d)

    @classmethod
    def load(cls, path: str | Path) -> AcceleratorConfig:
        """The configuration in the JSON file ``path``: the one loader of every command.

        Parameters
        ----------
        path : str or Path
            A configuration JSON file (as :meth:`save` writes).

        Returns
        -------
        AcceleratorConfig
            The validated configuration.

        Raises
        ------
        ConfigError
            Naming ``path``: it cannot be read (missing, a directory, no permission), is not
            UTF-8 text or JSON, or holds an invalid configuration.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not a UTF-8 text file ({e.reason} at byte "
                              f"{e.start})") from None
        except OSError as e:
            raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
        try:
            return cls.from_json(text)
        except (ConfigError, TypeError, ValueError) as e:
            raise ConfigError(f"{path}: invalid configuration: {e}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    def replace(self, **changes) -> AcceleratorConfig:
        return dataclasses.replace(self, **changes)

    def with_dram(self, size_bytes: int) -> AcceleratorConfig:
        """The same accelerator with a simulated DRAM of ``size_bytes`` (validated)."""
        return self.replace(memory=dataclasses.replace(self.memory, size_bytes=size_bytes))

    def timing_only(self) -> AcceleratorConfig:
        """The same accelerator as timing-only simulations of whole models see it: a 64 GiB
        DRAM (LLaMA-7B's addresses are legal) and an instruction memory of at least 2**20
        (a whole layer in one program). No cycle count depends on either."""
        return self.with_dram(max(self.memory.size_bytes, 1 << 36)).replace(
            imem_depth=max(self.imem_depth, 1 << 20))


#: Scratchpads of the vector engine in the named ``"vector"`` configuration: the sizes
#: synthesised beside the default 4x8 array (int32 elements: 4096 in VIN, 2048 in VOUT).
VECTOR_PRESET_SPADS = {"vin_spad_bytes": 16384, "vout_spad_bytes": 8192}
#: The ``"vector"`` configuration's :attr:`AcceleratorConfig.vector_lanes`: a 16-byte beat's
#: four int32 elements (:attr:`AcceleratorConfig.vector_lanes_max`), which fit the ECP5-85F's
#: 156 multipliers beside the 4x8 array's 67 (the engine takes 27 with one lane, 35 with two
#: and 55 with four, a lane's sub-ops sharing its units, Recip and Rsqrt one unit, Scale and
#: Requant another, and the SiLU-gate's two ``Mul(30)`` lanes 1 and 2's) with
#: :attr:`AcceleratorConfig.vector_laned_silu` off (11 more a lane past the first, and lane
#: 0's ``Mul(30)`` its own; docs/architecture.md, *Lanes*).
VECTOR_PRESET_LANES = 4

#: Named configurations (``sw.deploy --config NAME``): each a function of no arguments.
PRESETS = {
    "default": AcceleratorConfig,
    "vector": lambda: AcceleratorConfig(**VECTOR_PRESET_SPADS, vector_lanes=VECTOR_PRESET_LANES),
}


def preset(name: str) -> AcceleratorConfig:
    """The named configuration ``name`` (:data:`PRESETS`): ``"default"`` is
    ``AcceleratorConfig()``, ``"vector"`` the same with the vector engine's scratchpads of
    :data:`VECTOR_PRESET_SPADS` and :data:`VECTOR_PRESET_LANES` lanes.

    >>> preset("vector").has_vector, preset("default") == AcceleratorConfig()
    (True, True)

    Raises
    ------
    ConfigError
        ``name`` is not a preset (the message lists them).
    """
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"no configuration named {name!r}; the named ones are "
                          f"{', '.join(PRESETS)}") from None


def named_or_file(name: str | None) -> AcceleratorConfig:
    """The configuration a command's ``--config`` names: a preset (:data:`PRESETS`), a JSON
    file (:meth:`AcceleratorConfig.load`), or the default for ``None``.

    >>> named_or_file("vector") == preset("vector"), named_or_file(None) == AcceleratorConfig()
    (True, True)

    Raises
    ------
    ConfigError
        ``name`` is neither a preset nor a readable configuration file (a missing file's
        message also lists the presets).
    """
    if name is None:
        return AcceleratorConfig()
    if name in PRESETS:
        return preset(name)
    try:
        return AcceleratorConfig.load(name)
    except ConfigError as e:
        names = "" if Path(name).exists() else f" (nor a named one: {', '.join(PRESETS)})"
        raise ConfigError(f"{e}{names}") from None


__all__ += ["PRESETS", "VECTOR_PRESET_LANES", "VECTOR_PRESET_SPADS", "named_or_file", "preset"]
