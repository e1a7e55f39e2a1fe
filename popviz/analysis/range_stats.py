"""Statistics of a time range of a trace: time by kind, per IPU, by op class, top ops.

Events are clipped to the range, so a pass that straddles an edge counts only its inside
part. Op-level figures come from `trace_detail.pass_ops` (ops laid out in modelled order
inside each pass): passes wholly inside the range contribute their ops' modelled shares
without being expanded one by one, so the whole of a million-event trace costs a group-by,
not one row per op per micro-batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.analysis.trace_detail import PassOps, compute_rows, op_events

KINDS = ("compute", "exchange", "sync", "host_io", "idle")


@dataclass
class RangeStats:
    lo: float
    hi: float
    by_kind: pd.DataFrame  # kind, time, share (of the range summed over devices)
    per_ipu: pd.DataFrame  # ipu, one column per kind, busy_share
    by_class: pd.DataFrame  # op_class, time, share (of compute time with op detail)
    top_ops: pd.DataFrame  # op_id, op, module, op_class, time, runs

    @property
    def events(self) -> int:
        return int(self.per_ipu.attrs.get("events", 0))


def _clipped(trace: pd.DataFrame, lo: float, hi: float) -> pd.DataFrame:
    start = trace["start"].to_numpy(float)
    end = trace["end"].to_numpy(float)
    keep = (end > lo) & (start < hi)
    kind = trace["kind"].to_numpy()[keep]
    return pd.DataFrame({"ipu": trace["ipu"].to_numpy()[keep],
                         "kind": pd.Categorical(kind).astype(str) if len(kind) else kind,
                         "time": np.minimum(end[keep], hi) - np.maximum(start[keep], lo)})


def _op_time(trace: pd.DataFrame, templates: dict[tuple[int, str], PassOps], lo: float,
             hi: float) -> pd.DataFrame:
    """Per op (op_id): time inside [lo, hi) and the number of pass runs it was part of."""
    rows = compute_rows(trace)
    if rows.empty or not templates or "pass_" not in rows:
        return pd.DataFrame(columns=["op_id", "op", "module", "op_class", "time", "runs"])
    rows = rows[(rows["end"] > lo) & (rows["start"] < hi)]
    whole = rows[(rows["start"] >= lo) & (rows["end"] <= hi)]
    parts = []
    spans = (whole["end"] - whole["start"]).groupby(
        [whole["stage"].astype(int), whole["pass_"].astype(str)]).agg(["sum", "size"])
    for (stage, pas), (span, runs) in spans.iterrows():
        tpl = templates.get((int(stage), str(pas)))
        if tpl is None:
            continue
        frame = pd.DataFrame({f: v for f, v in tpl.fields.items()})
        frame["time"] = (tpl.hi - tpl.lo) * float(span)
        frame["runs"] = int(runs)
        parts.append(frame)
    edge = rows.drop(whole.index).rename(columns={"pass_": "pass"})
    if not edge.empty:  # passes cut by the range: lay them out and clip their ops
        ops = op_events(edge.assign(kind="compute"), templates, lo, hi)
        if not ops.empty:
            ops["time"] = ops["end"].clip(upper=hi) - ops["start"].clip(lower=lo)
            ops["runs"] = 1
            parts.append(ops[[c for c in ("op_id", "op", "module", "op_class", "time", "runs")
                              if c in ops]])
    if not parts:
        return pd.DataFrame(columns=["op_id", "op", "module", "op_class", "time", "runs"])
    frame = pd.concat(parts, ignore_index=True)
    keys = [c for c in ("op_id", "op", "module", "op_class") if c in frame]
    return frame.groupby(keys, as_index=False, dropna=False).agg(
        time=("time", "sum"), runs=("runs", "sum"))


def range_statistics(trace: pd.DataFrame, templates: dict[tuple[int, str], PassOps],
                     lo: float, hi: float, top: int = 10) -> RangeStats:
    """What ran in [lo, hi): time by kind, per IPU (rank), by op class and the `top` ops by
    time. Times in the trace's unit (cycles, or ns when measured)."""
    lo, hi = float(min(lo, hi)), float(max(lo, hi))
    clipped = _clipped(trace, lo, hi)
    devices = sorted(int(i) for i in trace["ipu"].unique()) if len(trace) else []
    span = max(hi - lo, 0.0)
    by_kind = clipped.groupby("kind")["time"].sum()
    present = set(by_kind.index)
    by_kind = by_kind.reindex([k for k in KINDS if k in present]
                              + sorted(present - set(KINDS)), fill_value=0.0)
    total = span * max(len(devices), 1)
    kind_frame = pd.DataFrame({"kind": by_kind.index, "time": by_kind.to_numpy(),
                               "share": by_kind.to_numpy() / total if total else 0.0})
    per_ipu = clipped.groupby(["ipu", "kind"])["time"].sum().unstack(
        fill_value=0.0).reindex(devices, fill_value=0.0)
    per_ipu = per_ipu[[k for k in kind_frame["kind"] if k in per_ipu.columns]]
    busy = per_ipu.drop(columns=[c for c in ("idle",) if c in per_ipu]).sum(axis=1)
    per_ipu["busy_share"] = busy / span if span else 0.0
    per_ipu = per_ipu.reset_index()
    per_ipu.columns.name = None
    per_ipu.attrs["events"] = len(clipped)
    ops = _op_time(trace, templates, lo, hi)
    if ops.empty or "op_class" not in ops:
        by_class = pd.DataFrame(columns=["op_class", "time", "share"])
    else:
        by_class = ops.groupby("op_class", as_index=False)["time"].sum().sort_values(
            "time", ascending=False, kind="stable")
        by_class["share"] = by_class["time"] / by_class["time"].sum()
    top_ops = ops.sort_values("time", ascending=False, kind="stable").head(top)
    return RangeStats(lo, hi, kind_frame, per_ipu, by_class.reset_index(drop=True),
                      top_ops.reset_index(drop=True))
