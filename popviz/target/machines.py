"""Machine descriptions: IPU Mk1 GC2, Mk2 GC200, Bow, the C600 card, and user-registered
targets.

Every figure cites docs/hardware.md ("hardware.md": the figures and their public sources).
"derived" marks a figure computed from published ones; "assumed" marks a modelling
constant with no public figure (documented and calibrated in docs/cost-model.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

from popviz.target.costmodel import DEFAULT_COST, CostModel
from popviz.target.gpu import GPU_ALIASES, GPU_TARGETS, GpuTarget
from popviz.target.ipus import BOW, C600, MK1, MK2
from popviz.target.targetspec import KIB, Target

__all__ = ["BOW", "C600", "KIB", "MK1", "MK2", "Target", "get_target", "ipu_target",
           "load_target", "make_target", "register_target", "target_names"]


_REGISTRY: dict[str, Target] = {t.name: t for t in (MK1, MK2, BOW, C600)}
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
                             "an IPU (mk1, mk2, bow, c600)")
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
