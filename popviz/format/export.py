"""Export a profile's tables to other formats: CSV files, or a Chrome / Perfetto trace.

Import back is `popviz.format.writer.write_profile` over the same tables (see cli/io.py).
Every file is written under a temporary name and renamed when complete (tempfiles.py), so a
full disk or Ctrl-C never leaves a truncated or empty file under a final name.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from popviz.format import schema, tempfiles
from popviz.format.profile import Profile
from popviz.vocab import naming_for

# Chrome trace "ts"/"dur" are microseconds.
_US_PER_S = 1e6


def export_csv(profile: Profile, out_dir: Path, tables: list[str] | None = None) -> list[Path]:
    """Write one CSV per table into out_dir, plus meta.json; return the files written.
    All or none: the files appear only once every one of them is complete."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = list(tables or profile.table_names)
    finals = [out_dir / f"{name}.csv" for name in names] + [out_dir / "meta.json"]
    with tempfiles.replacing(finals, out_dir) as temps:
        for name, temp in zip(names, temps, strict=False):
            with open(temp, "w", encoding="utf-8", newline="") as handle:
                profile.table(name).to_csv(handle, index=False)
        with open(temps[-1], "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"meta": profile.meta, "summary": profile.summary},
                                    indent=2, sort_keys=True))
    return finals


def time_scale_us(profile: Profile) -> float:
    """Multiply a trace time by this to get microseconds (cycles or ns -> us)."""
    if naming_for(profile).in_ns:  # a run, or a GPU plan: ns
        return 1e-3
    clock = float(profile.meta.get("target", {}).get("clock_hz") or 0)
    if clock <= 0:
        raise ValueError(f"{profile.path}: modelled profile without target.clock_hz")
    return _US_PER_S / clock


def chrome_trace(profile: Profile) -> dict[str, Any]:
    """The trace as Chrome trace-event JSON (opens in Perfetto or chrome://tracing).

    One process row per IPU; compute / exchange / sync / host_io / idle events on separate
    threads of it, so overlapping kinds stay readable. An import (format 1.2) adds its host
    threads' slices (`host_slices`) as threads of the same process and each kernel launch
    as a flow arrow from the runtime call to the kernel (their shared correlation id).
    """
    trace: pd.DataFrame = profile.trace
    scale = time_scale_us(profile)
    kinds = sorted(trace["kind"].unique().tolist()) if len(trace) else []
    tid = {kind: i for i, kind in enumerate(kinds)}
    events: list[dict[str, Any]] = []
    for ipu in sorted(trace["ipu"].unique().tolist()) if len(trace) else []:
        label = naming_for(profile).label(ipu)
        events.append({"name": "process_name", "ph": "M", "pid": int(ipu),
                       "args": {"name": label}})
        for kind, t in tid.items():
            events.append({"name": "thread_name", "ph": "M", "pid": int(ipu), "tid": t,
                           "args": {"name": kind}})
    starts = trace["start"].to_numpy(dtype=np.float64) * scale
    ends = trace["end"].to_numpy(dtype=np.float64) * scale
    columns = [trace[c].tolist() for c in ("ipu", "kind", "stage", "microbatch", "pass", "op")]
    # an import's kernels name the host op that launched them
    launched = trace["host_op"].astype(str).tolist() if "host_op" in trace else \
        [""] * len(trace)
    correlation = trace["correlation"].tolist() if "correlation" in trace else \
        [-1] * len(trace)
    launches = _launch_args(profile)
    for ts, te, ipu, kind, stage, microbatch, pass_, op, host_op, corr in zip(
            starts, ends, *columns, launched, correlation, strict=True):
        args: dict[str, Any] = {"stage": int(stage), "microbatch": int(microbatch),
                                "pass": str(pass_)}
        if host_op and host_op != op:
            args["host_op"] = host_op
        if corr >= 0 and (int(ipu), int(corr)) in launches:  # as CUPTI's args name them
            args.update(launches[int(ipu), int(corr)])
        events.append({
            "name": str(op or f"{kind} {pass_}".strip()), "cat": str(kind), "ph": "X",
            "ts": float(ts), "dur": float(max(te - ts, 0.0)),
            "pid": int(ipu), "tid": tid[kind], "args": args,
        })
    events += _host_events(profile, scale, tid)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"profile": str(profile.path), "kind": profile.kind}}


def _launch_args(profile: Profile) -> dict[tuple[int, int], dict[str, Any]]:
    """(rank, correlation) -> a kernel's launch fields under torch.profiler's own arg names
    (format 1.4 `kernels`; {} without it)."""
    if "kernels" not in profile.table_names:
        return {}
    kernels = profile.table("kernels")
    if not set(schema.OPTIONAL_COLUMNS["kernels"]) <= set(kernels.columns):
        return {}
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for row in kernels.to_dict("records"):
        args: dict[str, Any] = {}
        for column, key in schema.LAUNCH_ARGS.items():
            value = row[column]
            if column in ("grid", "block"):
                parts = str(value).split(",") if value else []
                if parts and all(p.lstrip("-").isdigit() for p in parts):
                    args[key] = [int(v) for v in parts]
            elif isinstance(value, int | float) and math.isfinite(value):
                args[key] = int(value) if float(value).is_integer() else float(value)
        out[int(row["ipu"]), int(row["correlation"])] = args
    return out


HOST_TID0 = 1000  # host threads' tids: after the trace kinds'


def _host_events(profile: Profile, scale: float, kind_tid: dict[str, int]
                 ) -> list[dict[str, Any]]:
    """Host thread slices and launch -> kernel flows of an import (empty otherwise)."""
    if "host_slices" not in profile.table_names:
        return []
    slices = profile.table("host_slices")
    if slices.empty:
        return []
    events: list[dict[str, Any]] = []
    threads = slices.drop_duplicates(["ipu", "tid"])[["ipu", "tid", "thread"]]
    for ipu, t, name in threads.itertuples(index=False):
        events.append({"name": "thread_name", "ph": "M", "pid": int(ipu),
                       "tid": HOST_TID0 + int(t), "args": {"name": f"host {name}"}})
    starts = slices["start"].to_numpy(dtype=np.float64) * scale
    ends = slices["end"].to_numpy(dtype=np.float64) * scale
    launch: dict[tuple[int, int], tuple[int, float]] = {}  # (ipu, correlation) -> tid, ts
    for ts, te, ipu, t, name, cat, corr in zip(
            starts, ends, slices["ipu"].tolist(), slices["tid"].tolist(),
            slices["name"].tolist(), slices["cat"].tolist(), slices["correlation"].tolist(),
            strict=True):
        args = {"correlation": int(corr)} if corr >= 0 else {}
        events.append({"name": str(name), "cat": str(cat), "ph": "X", "ts": float(ts),
                       "dur": float(max(te - ts, 0.0)), "pid": int(ipu),
                       "tid": HOST_TID0 + int(t), "args": args})
        if corr >= 0:
            launch[(int(ipu), int(corr))] = (HOST_TID0 + int(t), float(ts))
    trace = profile.trace
    if "correlation" not in trace or not launch:
        return events
    kernels = trace[trace["correlation"].to_numpy() > 0]
    for ipu, kind, start, corr in zip(kernels["ipu"].tolist(), kernels["kind"].tolist(),
                                      (kernels["start"].to_numpy(dtype=np.float64) * scale),
                                      kernels["correlation"].tolist(), strict=True):
        host = launch.get((int(ipu), int(corr)))
        if host is None:
            continue
        # correlation ids are per rank: the flow id carries the rank too
        flow = {"name": "launch", "cat": "launch", "id": (int(ipu) << 32) | int(corr),
                "pid": int(ipu)}
        events.append({**flow, "ph": "s", "tid": host[0], "ts": host[1]})
        events.append({**flow, "ph": "f", "bp": "e", "tid": kind_tid[kind],
                       "ts": float(start)})
    return events


def export_chrome_trace(profile: Profile, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(chrome_trace(profile))
    with tempfiles.replacing([path]) as (temp,), open(temp, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
