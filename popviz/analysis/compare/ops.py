"""Compare two profiles op by op (like Holistic Trace Analysis's trace diff).

Each side's op time comes from its own records: a modelled profile's `ops` table (each op's
cycles, once per execution, at meta.target.clock_hz) and a measured / imported profile's
device trace (each kernel or action of kind compute, exchange or host I/O, in ns, named by
the host op that launched it where the import knows it). Rows are grouped by a key the user
picks (op type, op class, module path cut to a depth, pass) and aligned A vs B.

Normalisation reuses the comparison's own facts (sides.load_side: micro-batch,
gradient accumulation, replicas, samples per step): an op of a per-sample phase runs once
per micro-batch, an optimiser op once per weight update (sides.PER_SAMPLE_PHASES,
as `Comparison.op_classes`); "per sample" divides a replica's step by its samples.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from popviz.analysis.compare.sides import PER_SAMPLE_PHASES, seconds_per_unit
from popviz.jsonsafe import jsonable
from popviz.vocab import naming_for

if TYPE_CHECKING:  # the type only: importing popviz.format loads h5py
    from popviz.analysis.compare.table import Comparison
    from popviz.format.profile import Profile

GROUP_BY = {"op": "op type", "class": "op class", "module": "module", "pass": "pass"}
PER = ("auto", "step", "sample")  # auto: per sample when a replica's step holds
# different numbers of samples on the two sides (micro-batch or accumulation differ)
PASS_NAMES = {"F": "forward", "B": "backward", "R": "recompute", "WU": "optimiser"}
NO_MODULE = "(no module)"
# a measured trace's kinds that are device work (idle and sync are waiting, not an op)
WORK_KINDS = ("compute", "exchange", "host_io")
SIDE_COLUMNS = ("seconds", "count", "temp_bytes", "bytes_written")
COLUMNS = ["group", "a_seconds", "b_seconds", "delta_seconds", "ratio", "a_count",
           "b_count", "a_temp_bytes", "b_temp_bytes", "a_bytes_written", "b_bytes_written"]


def time_unit(per: str) -> tuple[float, str]:
    """(multiplier from seconds, label): ms per step, µs per sample."""
    return (1e3, "ms per step") if per == "step" else (1e6, "µs per sample")


@dataclass
class OpDiff:
    """A vs B per group: `table` has COLUMNS (seconds and bytes written per step or per
    sample, count = calls per step, temp_bytes = the largest temporary of one op in the
    group), sorted by |delta_seconds|; a group one side never ran is NaN on that side."""

    table: pd.DataFrame
    by: str
    depth: int
    per: str                   # step | sample (auto resolved)
    names: tuple[str, str]
    totals: dict[str, float]  # a_seconds, b_seconds: every op of each side

    def to_dict(self) -> dict[str, Any]:
        clean = self.table.astype(object).where(self.table.notna(), None)
        return {"by": self.by, "depth": self.depth, "per": self.per,
                "names": list(self.names), "totals": jsonable(self.totals),
                "rows": [{k: jsonable(v) for k, v in r.items()}
                         for r in clean.to_dict("records")]}


def short_op(name: str) -> str:
    """'aten.convolution.default' and 'aten::convolution' -> 'convolution', so modelled
    and imported names of one aten op meet."""
    text = str(name)
    text = re.sub(r"^aten(::|\.)", "", text)
    parts = text.split(".")
    return parts[0] if len(parts) == 2 and parts[1] in ("default", "Tensor", "Scalar",
                                                         "int", "out") else text


def module_at(path: str, depth: int) -> str:
    """A module path cut to its first `depth` parts ('layer1.0.conv1', 2 -> 'layer1.0')."""
    if not path:
        return NO_MODULE
    return ".".join(str(path).split(".")[:max(depth, 1)])


def _num(frame: pd.DataFrame, name: str, default: float = 0.0) -> pd.Series:
    if name in frame.columns:
        return pd.to_numeric(frame[name], errors="coerce").fillna(default).astype(float)
    return pd.Series(default, index=frame.index, dtype=float)


def _text(frame: pd.DataFrame, name: str, default: str = "") -> pd.Series:
    if name in frame.columns:
        return frame[name].fillna(default).astype(str)
    return pd.Series(default, index=frame.index, dtype=object)


def _side_facts(comp: Comparison, side: str) -> tuple[float, float, float]:
    """(samples per replica step, micro-batch, gradient accumulation) from the
    comparison's own facts and metrics (sides.load_side made them)."""
    facts = comp.sides.set_index("side").loc[side]
    metrics = comp.metrics.set_index("metric")[side.lower()]
    replicas = float(facts.get("replicas") or 1)
    samples = float(metrics.get("samples_per_step", float("nan")))
    micro = float(facts.get("micro_batch_size") or 1)
    if not math.isfinite(samples) or samples <= 0:
        samples = micro * replicas
    return samples / replicas, micro, float(facts.get("gradient_accumulation") or 1)


def op_records(profile: Profile, comp: Comparison, side: str) -> pd.DataFrame:
    """One row per recorded op (modelled) or kernel / action (measured): op, op_class,
    module, pass, seconds and count per replica step, temp_bytes, bytes_written per step."""
    scale, _ = seconds_per_unit(profile)
    per_replica, micro, accumulation = _side_facts(comp, side)
    if not naming_for(profile).measured:
        ops = profile.ops
        phase = _text(ops, "phase")
        # executions per replica step: per micro-batch, or once per weight update
        runs = np.where(phase.isin(PER_SAMPLE_PHASES), per_replica / micro,
                        per_replica / (micro * accumulation))
        temp = (_num(ops, "temp_total_bytes") if "temp_total_bytes" in ops.columns
                else _num(ops, "temp_bytes", np.nan))
        written = (_num(ops, "bytes_written") * runs if "bytes_written" in ops.columns
                   else np.nan)
        return pd.DataFrame({
            "op": _text(ops, "op").map(short_op), "op_class": _text(ops, "op_class", "other"),
            "module": _text(ops, "module"), "pass": _text(ops, "pass"),
            "seconds": _num(ops, "cycles") * scale * runs, "count": runs,
            "temp_bytes": temp, "bytes_written": written})
    trace = profile.trace
    work = trace[trace["kind"].astype(str).isin(WORK_KINDS)]
    steps = float(trace["step"].nunique()) if "step" in trace.columns and len(trace) else 1.0
    host = _text(work, "host_op")
    name = host.where(host != "", _text(work, "op"))  # a kernel no host op launched
    cls = _text(work, "op_class")
    cls = cls.where(cls != "", work["kind"].astype(str))
    return pd.DataFrame({
        "op": name.map(short_op), "op_class": cls, "module": _text(work, "module"),
        "pass": _text(work, "pass"),
        "seconds": (_num(work, "end") - _num(work, "start")).clip(lower=0) * scale / steps,
        "count": _calls_per_event(getattr(profile, "ops", pd.DataFrame()), host,
                                  work["kind"]) / steps,
        "temp_bytes": np.nan, "bytes_written": np.nan})


def _calls_per_event(ops: pd.DataFrame, host: pd.Series, kind: pd.Series) -> np.ndarray:
    """Each work event's share of a call of the host op that launched it, so that a
    group's count is calls, not kernels: an op whose 53 calls launched 295 compute
    kernels counts 53/295 a kernel and nothing for its memsets (convolution_backward
    read 318 'calls per step'). Events of an op with no compute kernel (a copy), events no
    op launched, and a CPU run's (each event is an op) count 1."""
    out = np.ones(len(host))
    if ops.empty or not {"op", "kernels"} <= set(ops.columns):
        return out
    kernels = pd.to_numeric(ops["kernels"], errors="coerce").fillna(0)
    launched = ops[kernels.to_numpy() > 0]
    if launched.empty:
        return out
    names = launched["op"].astype(str)
    share = (names.value_counts() / kernels[kernels > 0].groupby(names.to_numpy()).sum())
    known = host.map(share).to_numpy(dtype=np.float64)
    computing = (kind.astype(str) == "compute").to_numpy()
    return np.where(np.isfinite(known), np.where(computing, known, 0.0), 1.0)


def _keys(records: pd.DataFrame, by: str, depth: int) -> pd.Series:
    if by == "op":
        return records["op"]
    if by == "class":
        return records["op_class"]
    if by == "module":
        return records["module"].map(lambda m: module_at(m, depth))
    return records["pass"].map(lambda p: PASS_NAMES.get(p, p or "(none)"))


def _grouped(records: pd.DataFrame, by: str, depth: int, divisor: float) -> pd.DataFrame:
    g = records.groupby(_keys(records, by, depth), sort=False)
    out = pd.DataFrame({"seconds": g["seconds"].sum() / divisor, "count": g["count"].sum(),
                        "temp_bytes": g["temp_bytes"].max(),
                        "bytes_written": g["bytes_written"].sum(min_count=1) / divisor})
    out.index.name = "group"
    return out


def resolve_per(comp: Comparison, per: str = "auto") -> str:
    """'step' or 'sample': `auto` is per sample when the two sides' replica steps hold
    different numbers of samples (their step times then measure different work)."""
    if per != "auto":
        return per
    return "step" if _side_facts(comp, "A")[0] == _side_facts(comp, "B")[0] else "sample"


def compare_ops(a: Profile, b: Profile, comp: Comparison, by: str = "op", depth: int = 1,
                per: str = "auto") -> OpDiff:
    """A vs B op by op. `a`, `b`: the open profiles `comp` (popviz.compare) compared; `by`:
    op | class | module | pass; `depth`: module levels kept; `per`: auto | step | sample."""
    if by not in GROUP_BY:
        raise ValueError(f"cannot group ops by {by!r}: choose one of {', '.join(GROUP_BY)}")
    if per not in PER:
        raise ValueError(f"per must be auto, step or sample, not {per!r}")
    if depth < 1:
        raise ValueError(f"module depth must be at least 1, not {depth}")
    per = resolve_per(comp, per)
    sides = {}
    totals: dict[str, float] = {}
    for label, profile in (("a", a), ("b", b)):
        records = op_records(profile, comp, label.upper())
        divisor = _side_facts(comp, label.upper())[0] if per == "sample" else 1.0
        sides[label] = _grouped(records, by, depth, divisor)
        totals[f"{label}_seconds"] = float(records["seconds"].sum() / divisor)
    frame = pd.concat([sides[s].add_prefix(f"{s}_") for s in ("a", "b")], axis=1)
    frame["delta_seconds"] = frame["b_seconds"] - frame["a_seconds"]
    frame["ratio"] = frame["b_seconds"] / frame["a_seconds"].where(frame["a_seconds"] != 0)
    frame = frame.rename_axis("group").reset_index()[COLUMNS]
    # largest difference first; a one-sided group's difference is its own time
    size = frame["delta_seconds"].abs().fillna(frame[["a_seconds", "b_seconds"]].max(axis=1))
    frame = frame.iloc[np.lexsort((frame["group"].astype(str).to_numpy(), -size.to_numpy()))]
    names = tuple(str(n) for n in comp.sides.set_index("side").loc[["A", "B"], "name"])
    return OpDiff(table=frame.reset_index(drop=True), by=by, depth=depth, per=per,
                  names=(names[0], names[1]), totals=totals)


__all__ = ["GROUP_BY", "PER", "OpDiff", "compare_ops", "module_at", "op_records",
           "resolve_per", "short_op"]
