"""Machine descriptions: IPU Mk1 GC2, Mk2 GC200, Bow, and user-registered targets.

Every figure cites docs/hardware.md ("hardware.md": the figures and their public sources).
"derived" marks a figure computed from published ones; "assumed" marks a modelling
constant with no public figure (documented and calibrated in docs/cost-model.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

KIB = 1024


@dataclass(frozen=True)
class Target:
    """One IPU-like tiled accelerator. Rates are whole-IPU published figures; the
    per-tile-per-cycle rates the cost model uses are derived properties."""

    name: str
    tiles_per_ipu: int
    bytes_per_tile: int
    clock_hz: float
    peak_fp16_flops: float  # per IPU, fp16 inputs on the AMP units
    peak_fp32_flops: float
    memory_bytes_per_s: float  # on-chip SRAM bandwidth, whole IPU
    exchange_bytes_per_s: float  # on-chip tile-to-tile exchange, whole IPU
    ipu_link_bytes_per_s: float  # one IPU to its neighbours
    ipu_link_latency_s: float = 1.0e-6  # assumed
    host_bytes_per_s: float = 32.0e9
    host_latency_s: float = 2.0e-6  # assumed
    sync_cycles: int = 600  # assumed: one BSP sync across IPUs
    op_overhead_cycles: int = 200  # assumed: compute-set launch + internal sync per op
    code_bytes_per_op_per_tile: int = 320  # assumed: vertex code + vertex state per tile used
    exchange_code_bytes_per_op_per_tile: int = 64  # assumed: internal exchange code per op
    tile_overhead_bytes: int = 8 * KIB  # assumed: control code + stack per tile
    vector_flops_per_tile_cycle_fp16: float = 4.0  # assumed: 64-bit SIMD, non-AMP ops
    vector_flops_per_tile_cycle_fp32: float = 2.0  # assumed
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    # ---- derived per-tile, per-cycle rates ----
    def _per_tile_cycle(self, per_second: float) -> float:
        return per_second / (self.tiles_per_ipu * self.clock_hz)

    @property
    def flops_per_tile_cycle_fp16(self) -> float:
        return self._per_tile_cycle(self.peak_fp16_flops)

    @property
    def flops_per_tile_cycle_fp32(self) -> float:
        return self._per_tile_cycle(self.peak_fp32_flops)

    @property
    def memory_bytes_per_tile_cycle(self) -> float:
        return self._per_tile_cycle(self.memory_bytes_per_s)

    @property
    def exchange_bytes_per_tile_cycle(self) -> float:
        return self._per_tile_cycle(self.exchange_bytes_per_s)

    @property
    def bytes_per_ipu(self) -> int:
        return self.tiles_per_ipu * self.bytes_per_tile

    def link_cycles(self, nbytes: float) -> float:
        """Cycles to move `nbytes` over IPU-Links, latency included."""
        if nbytes <= 0:
            return 0.0
        return (self.ipu_link_latency_s + nbytes / self.ipu_link_bytes_per_s) * self.clock_hz

    def host_cycles(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        return (self.host_latency_s + nbytes / self.host_bytes_per_s) * self.clock_hz

    def to_meta(self, num_ipus: int) -> dict[str, Any]:
        """The `target` dict of the profile contract (JSON-safe), plus the model constants."""
        meta = {k: v for k, v in asdict(self).items() if k not in ("sources",)}
        meta["num_ipus"] = int(num_ipus)
        return meta


_REF = "docs/hardware.md"

MK1 = Target(
    name="mk1",
    description="Graphcore Colossus Mk1 GC2 (C2 card)",
    tiles_per_ipu=1216,  # hardware.md: tiles
    bytes_per_tile=256 * KIB,  # hardware.md: SRAM per tile
    clock_hz=1.6e9,  # hardware.md: ~1.6 GHz (derived there)
    peak_fp16_flops=124.5e12,  # hardware.md: peak FP16 -> 64 FLOPs/tile/cycle (derived)
    peak_fp32_flops=31.1e12,  # hardware.md: peak FP32 -> 16 FLOPs/tile/cycle (derived)
    memory_bytes_per_s=45e12,  # hardware.md: on-chip memory bandwidth
    exchange_bytes_per_s=8e12,  # hardware.md: on-chip exchange ~8 TB/s
    ipu_link_bytes_per_s=320e9,  # assumed: hardware.md gives no Mk1 figure; Mk2's 320 GB/s
    host_bytes_per_s=32e9,  # derived: PCIe Gen3 x16, half of hardware.md's Gen4 ~64 GB/s
    sources={"tiles": _REF, "bytes_per_tile": _REF, "clock_hz": f"{_REF} (derived)",
             "peak_fp16_flops": _REF, "peak_fp32_flops": _REF, "memory": _REF,
             "exchange": _REF, "ipu_link": "assumed (Mk2 figure)",
             "host": "derived (PCIe Gen3 x16)"},
)

MK2 = Target(
    name="mk2",
    description="Graphcore Colossus Mk2 GC200 (IPU-M2000)",
    tiles_per_ipu=1472,  # hardware.md
    bytes_per_tile=624 * KIB,  # hardware.md
    clock_hz=1.33e9,  # hardware.md
    peak_fp16_flops=250e12,  # hardware.md -> ~128 FLOPs/tile/cycle (derived)
    peak_fp32_flops=62.5e12,  # hardware.md -> ~32 FLOPs/tile/cycle (derived)
    memory_bytes_per_s=47.5e12,  # hardware.md
    exchange_bytes_per_s=47e12,  # hardware.md: ~47 TB/s within an IPU
    ipu_link_bytes_per_s=320e9,  # hardware.md: 10 IPU-Links, 320 GB/s in all
    host_bytes_per_s=64e9,  # hardware.md: PCIe Gen4 x16 ~64 GB/s
    sources={"tiles": _REF, "bytes_per_tile": _REF, "clock_hz": _REF,
             "peak_fp16_flops": _REF, "peak_fp32_flops": _REF, "memory": _REF,
             "exchange": _REF, "ipu_link": _REF, "host": _REF},
)

MK2_CLOCK_RATIO = 1.85e9 / 1.33e9
BOW = Target(
    name="bow",
    description="Graphcore Bow IPU (Bow-2000)",
    tiles_per_ipu=1472,  # hardware.md
    bytes_per_tile=624 * KIB,  # hardware.md
    clock_hz=1.85e9,  # hardware.md
    peak_fp16_flops=350e12,  # hardware.md (derived there: 1.4 PFLOPS per Bow-2000 / 4)
    peak_fp32_flops=62.5e12 * MK2_CLOCK_RATIO,  # derived: Mk2 per-tile rate at Bow's clock
    memory_bytes_per_s=47.5e12 * MK2_CLOCK_RATIO,  # derived: same tile, faster clock
    exchange_bytes_per_s=47e12 * MK2_CLOCK_RATIO,  # derived: same tile, faster clock
    ipu_link_bytes_per_s=320e9,  # assumed: Mk2 figure
    host_bytes_per_s=64e9,  # assumed: Mk2 figure
    sources={"tiles": _REF, "bytes_per_tile": _REF, "clock_hz": _REF,
             "peak_fp16_flops": f"{_REF} (derived)", "peak_fp32_flops": "derived",
             "memory": "derived", "exchange": "derived", "ipu_link": "assumed (Mk2)",
             "host": "assumed (Mk2)"},
)

_REGISTRY: dict[str, Target] = {t.name: t for t in (MK1, MK2, BOW)}
_ALIASES = {"gc2": "mk1", "gc200": "mk2", "ipu": "mk2", "bow2000": "bow"}

_FIELDS = {f.name: f for f in fields(Target)}
REQUIRED = ("name", "tiles_per_ipu", "bytes_per_tile", "clock_hz", "peak_fp16_flops",
            "peak_fp32_flops")
POSITIVE = (*REQUIRED[1:], "memory_bytes_per_s", "exchange_bytes_per_s", "ipu_link_bytes_per_s",
            "host_bytes_per_s")


def target_names() -> list[str]:
    return sorted(_REGISTRY)


def get_target(name: str | Target) -> Target:
    """A target by name (case-insensitive; aliases gc2, gc200, bow2000)."""
    if isinstance(name, Target):
        return name
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        raise ValueError(f"unknown target {name!r}; valid targets: {', '.join(target_names())}")
    return _REGISTRY[key]


def make_target(spec: dict[str, Any]) -> Target:
    """Validate a dict into a Target. `base` names a target whose values fill the gaps;
    without it the fields in REQUIRED must be present. Unknown keys are an error."""
    if not isinstance(spec, dict):
        raise ValueError(f"a target description must be a dict, got {type(spec).__name__}")
    spec = dict(spec)
    base_name = spec.pop("base", None)
    unknown = sorted(k for k in spec if k not in _FIELDS)
    if unknown:
        raise ValueError(f"unknown target fields {unknown}; valid: {', '.join(sorted(_FIELDS))}")
    if base_name is not None:
        values = asdict(get_target(base_name))
        values["sources"] = {}
        values.update(spec)
    else:
        missing = [k for k in REQUIRED if k not in spec]
        if missing:
            raise ValueError(f"target description lacks fields {missing} (or give 'base')")
        values = spec
    if not str(values.get("name", "")).strip():
        raise ValueError("target name must be a non-empty string")
    values["name"] = str(values["name"]).strip().lower()
    for key, value in values.items():
        if key in ("name", "description", "sources"):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"target field {key!r} must be a number, got {value!r}") from None
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"target field {key!r} must be >= 0, got {value!r}")
        if number == 0 and key in POSITIVE:
            raise ValueError(f"target field {key!r} must be > 0, got {value!r}")
        is_int = _FIELDS[key].type in ("int", int)
        values[key] = int(number) if is_int else number
    return Target(**values)


def register_target(spec: dict[str, Any] | Target, replace: bool = False) -> Target:
    """Add a custom target (a dict as for `make_target`, or a Target) to the registry."""
    target = spec if isinstance(spec, Target) else make_target(spec)
    if target.name in _REGISTRY and not replace and _REGISTRY[target.name] != target:
        raise ValueError(f"target {target.name!r} exists; pass replace=True to redefine it")
    _REGISTRY[target.name] = target
    return target


def load_target(path: str | Path, register: bool = True) -> Target:
    """Read a target from a .json or .toml file (one table of fields) and register it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"target file {path} does not exist")
    text = path.read_text()
    try:
        if path.suffix.lower() == ".toml":
            import tomllib

            spec = tomllib.loads(text)
        else:
            spec = json.loads(text)
    except Exception as exc:
        raise ValueError(f"target file {path} is not valid {path.suffix[1:]}: {exc}") from None
    spec = spec.get("target", spec) if isinstance(spec, dict) else spec
    return register_target(spec, replace=True) if register else make_target(spec)
