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

from popviz.target.costmodel import DEFAULT_COST, CostModel
from popviz.target.gpu import GPU_ALIASES, GPU_TARGETS, IPU_FAMILY, GpuTarget

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
    # a pipeline stage's copy to the next IPU: the links joining those two IPUs, one
    # direction (0 = ipu_link_bytes_per_s)
    stage_link_bytes_per_s: float = 0.0
    host_bytes_per_s: float = 32.0e9
    host_latency_s: float = 2.0e-6  # assumed
    # Multi-rack Pods: IPU-Links join the IPUs of one rack (a Pod64); racks are joined by
    # the GW-Links of each IPU-Machine's IPU-Gateway. 0 = no gateway links (one rack at most).
    gw_link_bytes_per_s: float = 0.0  # one IPU-Machine's GW-Links, each direction
    ipus_per_machine: int = 4
    ipus_per_rack: int = 64
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    cost: CostModel = DEFAULT_COST  # modelling constants, each with its provenance

    family = IPU_FAMILY  # the other family is popviz.target.gpu's GpuTarget

    # ---- modelling constants, read from the cost model (kept as attributes so that
    # compile code and target files keep their names) ----
    @property
    def sync_cycles(self) -> int:
        return int(self.cost.sync_cycles)

    @property
    def exchange_code_bytes_per_op_per_tile(self) -> int:
        return int(self.cost.exchange_code_bytes_per_op_per_tile)

    @property
    def tile_overhead_bytes(self) -> int:
        return int(self.cost.tile_overhead_bytes)

    @property
    def host_call_cycles(self) -> float:
        return float(self.cost.host_call_s) * self.clock_hz

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

    def _transfer_cycles(self, nbytes: float, latency_s: float, bytes_per_s: float) -> float:
        if nbytes <= 0:
            return 0.0
        return (latency_s + nbytes / bytes_per_s) * self.clock_hz

    def link_cycles(self, nbytes: float) -> float:
        """Cycles to move `nbytes` over IPU-Links, latency included."""
        return self._transfer_cycles(nbytes, self.ipu_link_latency_s, self.ipu_link_bytes_per_s)

    def stage_copy_cycles(self, nbytes: float) -> float:
        """Cycles to copy `nbytes` from one pipeline stage's IPU to a neighbour's."""
        return self._transfer_cycles(nbytes, self.ipu_link_latency_s,
                                     self.stage_link_bytes_per_s or self.ipu_link_bytes_per_s)

    def racks(self, ipus: int) -> int:
        """Racks (IPU-Link domains) that `ipus` IPUs span: one unless gateway links exist."""
        if self.gw_link_bytes_per_s <= 0 or ipus <= self.ipus_per_rack:
            return 1
        return math.ceil(ipus / self.ipus_per_rack)

    def allreduce_cycles(self, nbytes: float, replicas: int, ipus_per_replica: int = 1) -> float:
        """Cycles of one gradient all-reduce of `nbytes` per replica over `replicas`.

        Within a rack a ring over IPU-Links (2(r-1)/r of the bytes, 2(r-1) transfers).
        When the replicas span R racks the reduction is hierarchical: reduce-scatter in
        each rack, an all-reduce of each IPU's 1/r shard across the racks over the
        GW-Links (a ring: 2(R-1)/R of the shard, 2(R-1) transfers; the IPUs of one
        IPU-Machine share its gateway), then an all-gather in the rack."""
        if replicas <= 1 or nbytes <= 0:
            return 0.0
        racks = self.racks(replicas * ipus_per_replica)
        r = max(1, replicas // racks)  # replicas in one rack
        lat = self.ipu_link_latency_s
        cycles = (self.link_cycles(2.0 * (r - 1) / r * nbytes)
                  + 2 * (r - 1) * lat * self.clock_hz) if r > 1 else 0.0
        if racks > 1:
            shard = nbytes / r
            per_ipu = self.gw_link_bytes_per_s / self.ipus_per_machine
            cycles += (2.0 * (racks - 1) / racks * shard / per_ipu
                       + 2 * (racks - 1) * lat) * self.clock_hz
        return cycles

    def host_cycles(self, nbytes: float) -> float:
        return self._transfer_cycles(nbytes, self.host_latency_s, self.host_bytes_per_s)

    def to_meta(self, num_ipus: int) -> dict[str, Any]:
        """The `target` dict of the profile contract (JSON-safe), plus the model constants."""
        meta = {k: v for k, v in asdict(self).items() if k not in ("sources", "cost")}
        meta.update(self.cost.to_dict())
        meta["num_ipus"] = int(num_ipus)
        return meta


_REF = "docs/hardware.md"
_EENEWS = ("eeNews Europe, 'Graphcore slashes power in first Dell server' (C2 card: 192 GB/s "
           "of IPU-Link bandwidth between its two IPUs; exchange 62.5 Tbit/s)")
_GW = ("published: Graphcore, 'Switched GW-Links in large scale Pod systems' "
       "(docs.graphcore.ai/projects/switched-gwlinks): each IPU-Machine has two GW-Link "
       "ports (east, west) with 100 Gbps interfaces, forming the horizontal loop of a 3D "
       "torus with the IPU-Links; 2 x 100 Gbit/s = 25 GB/s each direction")
_M2000 = "published: an IPU-M2000 / Bow-2000 holds 4 IPUs (" + "docs/hardware.md)"
_POD64 = ("published: Graphcore IPU-POD128 datasheet (docs.graphcore.ai/projects/"
          "ipu-pod128-datasheet): an IPU-POD128 is two IPU-POD64 logical racks joined by "
          "GW-Link cables; IPU-Links stay inside a rack")
_STAGE_LINK = ("assumed: a pipeline stage's copy to the next IPU uses the IPU-Links joining the "
               "two IPUs in one direction, not all ten both ways: 320 GB/s in all = 10 links x "
               "2 directions x 16 GB/s (a PCIe Gen4 x8 physical layer per link, as the "
               "IPU-M2000 block diagram of Graphcore's BMC user guide shows), and two links "
               "assumed between pipeline neighbours: 32 GB/s. Of the link counts tried (2, 4, "
               "all 10 both ways) two gives the one published pipeline with a large stage "
               "boundary (ResNet-50 on 4 IPUs, 25.7 MB a micro-batch at b1/2) the smallest "
               "error (docs/cost-model.md)")
_COMMON = {
    "ipu_link_latency_s": "assumed: 1 us per IPU-Link transfer (no public figure read; Jia et "
                          "al. 2019 measure it, see docs/cost-model.md)",
    "host_latency_s": "assumed: 2 us per host stream copy",
}

MK1 = Target(
    name="mk1",
    description="Graphcore Colossus Mk1 GC2 (C2 card)",
    tiles_per_ipu=1216,
    bytes_per_tile=256 * KIB,
    clock_hz=1.6e9,
    peak_fp16_flops=124.5e12,
    peak_fp32_flops=31.1e12,
    memory_bytes_per_s=45e12,
    exchange_bytes_per_s=8e12,
    ipu_link_bytes_per_s=192e9,
    host_bytes_per_s=32e9,
    ipus_per_machine=2,
    sources={
        "tiles_per_ipu": f"published: {_REF} (1216 tiles)",
        "bytes_per_tile": f"published: {_REF} (256 KiB)",
        "clock_hz": f"derived: {_REF} (~1.6 GHz, derived there from peak / tiles)",
        "peak_fp16_flops": f"published: {_REF} (124.5 TFLOPS)",
        "peak_fp32_flops": f"published: {_REF} (31.1 TFLOPS)",
        "memory_bytes_per_s": f"published: {_REF} (45 TB/s)",
        "exchange_bytes_per_s": f"published: {_REF} (~8 TB/s); {_EENEWS}",
        "ipu_link_bytes_per_s": f"published: {_EENEWS}",
        "stage_link_bytes_per_s": "published: 0 = the C2 card's 192 GB/s, already the figure "
                                  "between its two IPUs (" + _EENEWS + ")",
        "host_bytes_per_s": "derived: PCIe Gen3 x16, half of the Gen4 ~64 GB/s in " + _REF,
        "gw_link_bytes_per_s": "published: Mk1 C2 cards sit in host servers (PCIe); there is "
                               "no IPU-Gateway, so no multi-rack all-reduce (0)",
        "ipus_per_machine": f"published: {_REF} (C2 card: 2 IPUs; unused without GW-Links)",
        "ipus_per_rack": "assumed: unused without GW-Links",
        **_COMMON},
)

MK2 = Target(
    name="mk2",
    description="Graphcore Colossus Mk2 GC200 (IPU-M2000)",
    tiles_per_ipu=1472,
    bytes_per_tile=624 * KIB,
    clock_hz=1.33e9,
    peak_fp16_flops=250e12,
    peak_fp32_flops=62.5e12,
    memory_bytes_per_s=47.5e12,
    exchange_bytes_per_s=8e12,
    ipu_link_bytes_per_s=320e9,
    stage_link_bytes_per_s=32e9,
    host_bytes_per_s=64e9,
    gw_link_bytes_per_s=25e9,
    sources={
        "tiles_per_ipu": f"published: {_REF} (1472 tiles)",
        "bytes_per_tile": f"published: {_REF} (624 KiB)",
        "clock_hz": f"published: {_REF} (1.33 GHz)",
        "stage_link_bytes_per_s": _STAGE_LINK,
        "peak_fp16_flops": f"published: {_REF} (250 TFLOPS)",
        "peak_fp32_flops": f"published: {_REF} (62.5 TFLOPS)",
        "memory_bytes_per_s": f"published: {_REF} (47.5 TB/s)",
        "exchange_bytes_per_s": "published: Graphcore's GC200 product figures, 'IPU-Exchange "
                                "bandwidth 8 TB/s using any communication pattern' (as "
                                "summarised at thecharlieblake.co.uk/ipus; the ~47 TB/s that "
                                "reference/ipu.md lists for Mk2 is its 47.5 TB/s memory "
                                "bandwidth): 4 bytes per tile per cycle, as on Mk1",
        "ipu_link_bytes_per_s": f"published: {_REF} (10 IPU-Links, 320 GB/s in all)",
        "host_bytes_per_s": f"published: {_REF} (PCIe Gen4 x16, ~64 GB/s)",
        "gw_link_bytes_per_s": _GW,
        "ipus_per_machine": _M2000,
        "ipus_per_rack": _POD64,
        **_COMMON},
)

MK2_CLOCK_RATIO = 1.85e9 / 1.33e9
BOW = Target(
    name="bow",
    description="Graphcore Bow IPU (Bow-2000)",
    tiles_per_ipu=1472,
    bytes_per_tile=624 * KIB,
    clock_hz=1.85e9,
    peak_fp16_flops=350e12,
    peak_fp32_flops=62.5e12 * MK2_CLOCK_RATIO,
    memory_bytes_per_s=47.5e12 * MK2_CLOCK_RATIO,
    exchange_bytes_per_s=8e12 * MK2_CLOCK_RATIO,
    ipu_link_bytes_per_s=320e9,
    stage_link_bytes_per_s=32e9,
    host_bytes_per_s=64e9,
    gw_link_bytes_per_s=25e9,
    sources={
        "tiles_per_ipu": f"published: {_REF} (1472 tiles)",
        "bytes_per_tile": f"published: {_REF} (624 KiB)",
        "clock_hz": f"published: {_REF} (1.85 GHz)",
        "stage_link_bytes_per_s": "assumed: Mk2's (same IPU-Links); " + _STAGE_LINK,
        "peak_fp16_flops": f"derived: {_REF} (~350 TFLOPS = 1.4 PFLOPS per Bow-2000 / 4)",
        "peak_fp32_flops": "derived: Mk2's per-tile fp32 rate at Bow's clock",
        "memory_bytes_per_s": "derived: Mk2's 47.5 TB/s at Bow's clock (same tile)",
        "exchange_bytes_per_s": "derived: Mk2's 8 TB/s at Bow's clock (same tile)",
        "ipu_link_bytes_per_s": "assumed: Mk2's 320 GB/s (same IPU-Links)",
        "host_bytes_per_s": "assumed: Mk2's 64 GB/s (same PCIe Gen4 host link)",
        "gw_link_bytes_per_s": _GW,
        "ipus_per_machine": _M2000,
        "ipus_per_rack": _POD64,
        **_COMMON},
)

_REGISTRY: dict[str, Target] = {t.name: t for t in (MK1, MK2, BOW)}
_ALIASES = {"gc2": "mk1", "gc200": "mk2", "ipu": "mk2", "bow2000": "bow"}

_FIELDS = {f.name: f for f in fields(Target)}
REQUIRED = ("name", "tiles_per_ipu", "bytes_per_tile", "clock_hz", "peak_fp16_flops",
            "peak_fp32_flops")
POSITIVE = (*REQUIRED[1:], "memory_bytes_per_s", "exchange_bytes_per_s", "ipu_link_bytes_per_s",
            "host_bytes_per_s")


def target_names(family: str | None = None) -> list[str]:
    """Every target's name (IPUs, registered ones, GPUs), or one family's."""
    ipus = [] if family == "gpu" else list(_REGISTRY)
    gpus = [] if family == "ipu" else list(GPU_TARGETS)
    return sorted(ipus + gpus)


def get_target(name: str | Target | GpuTarget) -> Target | GpuTarget:
    """A target by name (case-insensitive; aliases gc2, gc200, bow2000, h100-sxm, ...):
    an IPU `Target`, or a `GpuTarget` (popviz.target.gpu) for h100, h100-pcie, h200, a100."""
    if isinstance(name, (Target, GpuTarget)):
        return name
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    gpu = GPU_TARGETS.get(GPU_ALIASES.get(key, key))
    if gpu is not None and key not in _REGISTRY:
        return gpu
    if key not in _REGISTRY:
        raise ValueError(f"unknown target {name!r}; valid targets: {', '.join(target_names())}")
    return _REGISTRY[key]


def ipu_target(name: str | Target) -> Target:
    """`get_target` for code that only models IPUs (tiles, AMP, calibration)."""
    target = get_target(name)
    if isinstance(target, GpuTarget):
        raise ValueError(f"{target.name} is a GPU target; this needs an IPU one")
    return target


def make_target(spec: dict[str, Any]) -> Target:
    """Validate a dict into a Target. `base` names a target whose values fill the gaps;
    without it the fields in REQUIRED must be present. Unknown keys are an error."""
    if not isinstance(spec, dict):
        raise ValueError(f"a target description must be a dict, got {type(spec).__name__}")
    spec = dict(spec)
    base_name = spec.pop("base", None)
    cost_spec = _cost_overrides(spec)
    unknown = sorted(k for k in spec if k not in _FIELDS)
    if unknown:
        raise ValueError(f"unknown target fields {unknown}; valid: {', '.join(sorted(_FIELDS))}")
    if base_name is not None:
        base = get_target(base_name)
        if not isinstance(base, Target):
            raise ValueError(f"base {base_name!r} is a GPU: a custom target must be based on "
                             "an IPU (mk1, mk2, bow)")
        values = {f: getattr(base, f) for f in _FIELDS if f not in ("sources", "cost")}
        values["sources"] = {}
        values["cost"] = base.cost
        values.update(spec)
    else:
        missing = [k for k in REQUIRED if k not in spec]
        if missing:
            raise ValueError(f"target description lacks fields {missing} (or give 'base')")
        values = spec
    if not str(values.get("name", "")).strip():
        raise ValueError("target name must be a non-empty string")
    values["name"] = str(values["name"]).strip().lower()
    base_cost = values.get("cost", DEFAULT_COST)
    values["cost"] = base_cost.with_values(**cost_spec) if cost_spec else base_cost
    for key, value in values.items():
        if key in ("name", "description", "sources", "cost"):
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


RETIRED = {"op_overhead_cycles": "IPU model v4 charges each compute set "
                                  "sync_cycles_internal, and exchange_fixed_cycles when it "
                                  "exchanges (docs/cost-model.md)"}


def _cost_overrides(spec: dict[str, Any]) -> dict[str, float]:
    """Pop cost-model constants from a target dict: a `cost` table, or the constants named
    at the top level (as older target files do, e.g. `sync_cycles`). Checked numbers."""
    table = spec.pop("cost", {}) or {}
    if not isinstance(table, dict):
        raise ValueError("target field 'cost' must be a table of cost model constants")
    names = {f.name for f in fields(CostModel)}
    table = {**table, **{k: spec.pop(k) for k in list(spec) if k in names or k in RETIRED}}
    out = {}
    for key, value in table.items():
        if key in RETIRED:
            raise ValueError(f"cost model constant {key!r} is retired: {RETIRED[key]}")
        if key not in names:
            raise ValueError(f"unknown cost model constant {key!r}; valid: "
                             f"{', '.join(sorted(names))}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"cost constant {key!r} must be a number, got {value!r}") from None
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"cost constant {key!r} must be >= 0, got {value!r}")
        out[key] = number
    return out


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
