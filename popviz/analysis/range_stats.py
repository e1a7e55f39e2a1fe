"""Statistics of a time range of a trace: time by kind, per IPU, by op class, top ops.

Events are clipped to the range, so a pass that straddles an edge counts only its inside
part. Op-level figures come from `trace_detail.pass_ops` (ops laid out in modelled order
inside each pass): passes wholly inside the range contribute their ops' modelled shares
without being expanded one by one, so the whole of a million-event trace costs a group-by,
not one row per op per micro-batch.

Time by kind and per device is the metrics core's sweep (`popviz.metrics.sweep`): each
instant of a device goes to one kind (compute > exchange > host_io > sync > idle), so on a
measured trace, where events overlap, the shares still add to 100 % and agree with the
Stages table. A measured profile has no modelled op layout: its tables are of the kernels in
the range, with their measured GPU time (clipped to the range) and true run counts, and,
where the trace names the host op that launched each kernel (`host_op`, `op_class`:
`popviz import`), of those ops and their classes; else there is no op-class table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

from popviz.analysis.trace_detail import PassOps, compute_rows, op_events
from popviz.metrics import CATEGORIES, COMPUTE, sweep
from popviz.vocab import category_codes

KINDS = ("compute", "exchange", "sync", "host_io", "idle", "untraced")
# each sweep category's kind: the passes of compute are one kind here
KIND_OF = [("compute" if c in COMPUTE else c) for c in CATEGORIES]


@dataclass
class RangeStats:
    lo: float
    hi: float
    by_kind: pd.DataFrame  # kind, time, share (of the range summed over devices)
    per_ipu: pd.DataFrame  # ipu, one column per kind, busy_share
    by_class: pd.DataFrame  # op_class, time, share (of compute time with op detail)
    top_ops: pd.DataFrame  # op_id, op, module, op_class, time, runs (measured: op,
    #                       op_class, time, kernels: the host ops that launched them)
    measured: bool = False  # measured times: top_ops and by_class from the launching ops
    top_kernels: pd.DataFrame | None = None  # measured: kernel, time, runs

    @property
    def events(self) -> int:
        return int(self.per_ipu.attrs.get("events", 0))


def _kind_time(trace: pd.DataFrame, lo: float, hi: float,
               devices: list[int]) -> tuple[pd.DataFrame, int]:
    """Per device, the time of each kind inside [lo, hi), each instant counted once
    (metrics.sweep), "untraced" what no event covers; and the number of events seen."""
    start = trace["start"].to_numpy(float)
    end = trace["end"].to_numpy(float)
    keep = (end > lo) & (start < hi)
    codes = category_codes(trace["kind"].to_numpy()[keep],
                           trace["pass"].to_numpy()[keep] if "pass" in trace.columns else None)
    group = np.searchsorted(np.asarray(devices, dtype=np.int64),
                            trace["ipu"].to_numpy(np.int64)[keep])
    times = sweep(group, np.maximum(start[keep], lo), np.minimum(end[keep], hi), codes,
                  len(devices), len(CATEGORIES))
    frame = pd.DataFrame(times, columns=KIND_OF, index=devices).T.groupby(level=0).sum().T
    frame["untraced"] = np.clip(max(hi - lo, 0.0) - frame.sum(axis=1), 0.0, None)
    return frame, int(keep.sum())


def _op_time(trace: pd.DataFrame, templates: dict[tuple[int, str], PassOps], lo: float,
             hi: float) -> pd.DataFrame:
    """Per op (op_id): time inside [lo, hi) and the number of pass runs it was part of."""
    rows = compute_rows(trace)
    if rows.empty or not templates or "pass_" not in rows:
        return pd.DataFrame(columns=["op_id", "op", "pass", "module", "op_class", "time",
                                     "runs"])
    rows = rows[(rows["end"] > lo) & (rows["start"] < hi)]
    whole = rows[(rows["start"] >= lo) & (rows["end"] <= hi)]
    parts = []
    spans = (whole["end"] - whole["start"]).groupby(
        [whole["stage"].astype(int), whole["pass_"].astype(str)]).agg(["sum", "size"])
    for key, (span, runs) in spans.iterrows():
        stage, pas = cast(tuple[int, str], key)  # grouped by (stage, pass)
        tpl = templates.get((int(stage), str(pas)))
        if tpl is None:
            continue
        frame = pd.DataFrame({f: v for f, v in tpl.fields.items()})
        frame["pass"] = str(pas)  # a recompute row reads apart from its forward one
        frame["time"] = (tpl.hi - tpl.lo) * float(span)
        frame["runs"] = int(runs)
        parts.append(frame)
    edge = rows.drop(whole.index).rename(columns={"pass_": "pass"})
    if not edge.empty:  # passes cut by the range: lay them out and clip their ops
        ops = op_events(edge.assign(kind="compute"), templates, lo, hi)
        if not ops.empty:
            ops["time"] = ops["end"].clip(upper=hi) - ops["start"].clip(lower=lo)
            ops["runs"] = 1
            parts.append(ops[[c for c in ("op_id", "op", "module", "op_class", "pass",
                                          "time", "runs") if c in ops]])
    if not parts:
        return pd.DataFrame(columns=["op_id", "op", "pass", "module", "op_class", "time",
                                     "runs"])
    frame = pd.concat(parts, ignore_index=True)
    keys = [c for c in ("op_id", "op", "pass", "module", "op_class") if c in frame]
    return frame.groupby(keys, as_index=False, dropna=False).agg(
        time=("time", "sum"), runs=("runs", "sum"))


def _short_kernel(name: str, width: int = 90) -> str:
    """A kernel's name without "void " and cut to `width` characters (C++ template
    arguments run to hundreds)."""
    name = name.removeprefix("void ")
    return name if len(name) <= width else name[:width - 1] + "…"


def _kernel_time(trace: pd.DataFrame, lo: float, hi: float) -> pd.DataFrame:
    """Per kernel name (a measured trace's compute events): GPU time inside [lo, hi) and
    how many of its runs overlap the range."""
    comp = trace[(trace["kind"] == "compute") & (trace["end"] > lo) & (trace["start"] < hi)]
    if comp.empty or "op" not in comp:
        return pd.DataFrame(columns=["kernel", "time", "runs"])
    time = comp["end"].clip(upper=hi) - comp["start"].clip(lower=lo)
    out = time.groupby(comp["op"].astype(str).to_numpy()).agg(["sum", "size"])
    return pd.DataFrame({"kernel": [_short_kernel(k) for k in out.index],
                         "time": out["sum"].to_numpy(float),
                         "runs": out["size"].to_numpy(int)})


def _launched_time(trace: pd.DataFrame, lo: float, hi: float) -> pd.DataFrame:
    """Per host op that launched compute kernels (`host_op`, with its `op_class`): their
    GPU time inside [lo, hi) and how many of them overlap the range (`kernels`)."""
    cols = ["op", "pass", "op_class", "time", "kernels"]
    if "host_op" not in trace or "op_class" not in trace:
        return pd.DataFrame(columns=cols)
    comp = trace[(trace["kind"] == "compute") & (trace["end"] > lo) & (trace["start"] < hi)
                 & (trace["host_op"].astype(str) != "")]
    if comp.empty:
        return pd.DataFrame(columns=cols)
    time = comp["end"].clip(upper=hi) - comp["start"].clip(lower=lo)
    passes = comp["pass"].astype(str).to_numpy() if "pass" in comp else \
        np.full(len(comp), "", dtype=object)
    out = time.groupby([comp["host_op"].astype(str).to_numpy(), passes,
                        comp["op_class"].astype(str).to_numpy()]).agg(["sum", "size"])
    return pd.DataFrame({"op": out.index.get_level_values(0),
                         "pass": out.index.get_level_values(1),
                         "op_class": out.index.get_level_values(2),
                         "time": out["sum"].to_numpy(float),
                         "kernels": out["size"].to_numpy(int)})


def _by_class(ops: pd.DataFrame) -> pd.DataFrame:
    if ops.empty or "op_class" not in ops:
        return pd.DataFrame(columns=["op_class", "time", "share"])
    by_class = ops.groupby("op_class", as_index=False)["time"].sum().sort_values(  # type: ignore[call-overload]  # pandas-stubs: as_index=False gives a DataFrame
        "time", ascending=False, kind="stable")
    by_class["share"] = by_class["time"] / by_class["time"].sum()
    return by_class.reset_index(drop=True)


def range_statistics(trace: pd.DataFrame, templates: dict[tuple[int, str], PassOps],
                     lo: float, hi: float, top: int = 10,
                     measured: bool = False) -> RangeStats:
    """What ran in [lo, hi): time by kind, per IPU (rank), by op class and the `top` ops by
    time. Times in the trace's unit (cycles, or ns when measured). `measured`: no op
    layout (templates ignored); `top_kernels` lists the compute events, and the op-class
    and top-op tables come from each one's launching host op where the trace names it
    (`host_op`, `op_class`), else they are empty."""
    lo, hi = float(min(lo, hi)), float(max(lo, hi))
    devices = sorted(int(i) for i in trace["ipu"].unique()) if len(trace) else []
    span = max(hi - lo, 0.0)
    per_dev, events = _kind_time(trace, lo, hi, devices)
    by_kind = per_dev.sum(axis=0)
    shown = [k for k in KINDS if k in by_kind.index and by_kind[k] > 0]
    by_kind = by_kind.reindex(shown)
    total = span * max(len(devices), 1)
    kind_frame = pd.DataFrame({"kind": by_kind.index, "time": by_kind.to_numpy(),
                               "share": by_kind.to_numpy() / total if total else 0.0})
    per_ipu = per_dev[shown].copy()
    # busy: not waiting (idle, sync: metrics' one idle) and not untraced
    busy = per_ipu.drop(columns=[c for c in ("idle", "sync", "untraced")
                                 if c in per_ipu]).sum(axis=1)
    per_ipu["busy_share"] = busy / span if span else 0.0
    per_ipu = per_ipu.rename_axis("ipu").reset_index()
    per_ipu.columns.name = None
    per_ipu.attrs["events"] = events
    if measured:
        kernels = _kernel_time(trace, lo, hi)
        top_k = kernels.sort_values("time", ascending=False, kind="stable").head(top)
        launched = _launched_time(trace, lo, hi)
        top_ops = launched.sort_values("time", ascending=False, kind="stable").head(top)
        return RangeStats(lo, hi, kind_frame, per_ipu, _by_class(launched),
                          top_ops.reset_index(drop=True), measured=True,
                          top_kernels=top_k.reset_index(drop=True))
    ops = _op_time(trace, templates, lo, hi)
    top_ops = ops.sort_values("time", ascending=False, kind="stable").head(top)
    return RangeStats(lo, hi, kind_frame, per_ipu, _by_class(ops),
                      top_ops.reset_index(drop=True))
