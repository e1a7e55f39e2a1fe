"""The trace below whole passes: the ops each compute event ran, and a readable first window.

A modelled trace holds one compute event per stage, pass and micro-batch; the ops table
holds every op of the program with its stage, pass and modelled cycles, and the cycles of a
(stage, pass)'s ops sum to that pass's duration. `op_events` lays a pass's ops inside its
span in program order (the order of `step`), each as long as its share of the pass's
modelled cycles. This is the *modelled* order: the compiler's cost model, not a measured
on-chip timeline (Poplar may interleave compute sets differently). Measured profiles have
no op level: a run's ops carry no modelled cycles, and an imported trace's `cycles` are each
op's measured GPU time, which must not be laid out in program order inside each kernel."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.actions import COMPUTE_PASSES

OP_FIELDS = ("op", "op_class", "module", "op_id")


@dataclass(frozen=True)
class PassOps:
    """The ops of one (stage, pass) in program order, as fractions of the pass."""

    lo: np.ndarray  # start of each op as a fraction of the pass, 0..1
    hi: np.ndarray  # end, likewise
    cycles: np.ndarray  # modelled cycles of each op
    fields: dict[str, np.ndarray]  # op, op_class, module, op_id


def pass_ops(ops: pd.DataFrame, measured: bool = False) -> dict[tuple[int, str], PassOps]:
    """Per (stage, pass) the ops it runs with their share of the pass; {} when the ops
    carry no modelled cycles (`measured`, or no cycles column)."""
    need = {"stage", "pass", "cycles"}
    if measured or ops.empty or not need <= set(ops.columns):
        return {}
    order = ["step", "op_id"] if "step" in ops.columns else ["op_id"]
    ordered = ops[ops["pass"].astype(str).isin(COMPUTE_PASSES)].sort_values(order,
                                                                            kind="stable")
    keys = ordered["pass"].astype(str)
    if "grad_part" in ordered.columns:  # a zero-bubble plan runs B's two parts apart
        parts = ordered["grad_part"].astype(str)
        split = ordered[(keys == "B") & (parts != "")]
        ordered = pd.concat([ordered.assign(key=keys),
                             split.assign(key="B:" + parts[split.index])])
    else:
        ordered = ordered.assign(key=keys)
    out: dict[tuple[int, str], PassOps] = {}
    for (stage, pas), group in ordered.groupby(["stage", "key"], sort=True):
        cycles = group["cycles"].to_numpy(dtype=np.float64).clip(min=0)
        total = cycles.sum()
        if total <= 0:
            continue
        cum = np.concatenate([[0.0], np.cumsum(cycles)]) / total
        fields = {f: group[f].to_numpy() for f in OP_FIELDS if f in group.columns}
        out[(int(stage), str(pas))] = PassOps(cum[:-1], cum[1:], cycles, fields)  # type: ignore[call-overload]  # pandas-stubs: a group key is Hashable
    return out


def _lay_out(parts: list, lo: float, hi: float) -> pd.DataFrame:
    columns = ["ipu", "start", "end", "stage", "microbatch", "pass", *OP_FIELDS]
    frames = []
    for row, tpl in parts:
        span = float(row.end) - float(row.start)
        start = float(row.start) + tpl.lo * span
        end = float(row.start) + tpl.hi * span
        keep = (end > lo) & (start < hi) & (end > start)
        if not keep.any():
            continue
        n = int(keep.sum())
        frame = {"ipu": np.full(n, int(row.ipu)), "start": start[keep], "end": end[keep],
                 "stage": np.full(n, int(row.stage)),
                 "microbatch": np.full(n, int(row.microbatch)),
                 "pass": np.full(n, str(row.pass_).split(":")[0], dtype=object)}
        frame.update({f: v[keep] for f, v in tpl.fields.items()})
        frames.append(pd.DataFrame(frame))
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True)


def template_key(pass_: str, part: str = "") -> str:
    """The `pass_ops` key of a pass: "B:input" / "B:weight" for a backward a zero-bubble
    plan runs in two (`grad_part`), else the pass."""
    return f"{pass_}:{part}" if part not in ("", "nan") else pass_


def compute_rows(trace: pd.DataFrame) -> pd.DataFrame:
    """The compute events of a trace with `pass` renamed `pass_` (a keyword in Python);
    a zero-bubble plan's B and W (`grad_part`) as "B:input" and "B:weight"."""
    sel = trace[trace["kind"] == "compute"]
    cols = [c for c in ("ipu", "start", "end", "stage", "microbatch", "pass") if c in sel]
    out = sel[cols].rename(columns={"pass": "pass_"})
    if "grad_part" in sel.columns and "pass_" in out.columns:  # B's parts, run apart
        part = sel["grad_part"].astype(str)
        out["pass_"] = out["pass_"].astype(str).where(part == "", out["pass_"].astype(str)
                                                      + ":" + part)
    return out


def op_events(trace: pd.DataFrame, templates: dict[tuple[int, str], PassOps],
              lo: float = -np.inf, hi: float = np.inf) -> pd.DataFrame:
    """Op-level events inside the compute events of `trace`, clipped to those overlapping
    [lo, hi): ipu, start, end, stage, microbatch, pass, op, op_class, module, op_id. Each
    pass's ops laid out in program order in proportion to their modelled cycles."""
    rows = compute_rows(trace)
    if rows.empty or not templates or "pass_" not in rows or "stage" not in rows:
        return _lay_out([], lo, hi)
    rows = rows[(rows["end"] > lo) & (rows["start"] < hi)]
    parts = [(r, templates[(int(r.stage), str(r.pass_))]) for r in rows.itertuples(index=False)  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
             if (int(r.stage), str(r.pass_)) in templates]  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
    return _lay_out(parts, lo, hi)


def op_occurrences(trace: pd.DataFrame, templates: dict[tuple[int, str], PassOps],
                   op_id: int, lo: float = -np.inf, hi: float = np.inf) -> pd.DataFrame:
    """Where one op runs in [lo, hi] (ipu, start, end): its place in each pass that runs it,
    as `op_events` lays it out, but kept however short (an op of zero modelled cycles is
    a point, which `op_events` leaves out) and without laying out the other ops."""
    out = pd.DataFrame({"ipu": pd.Series(dtype="int64"), "start": pd.Series(dtype=float),
                        "end": pd.Series(dtype=float)})
    rows = compute_rows(trace)
    if rows.empty or not templates or "pass_" not in rows or "stage" not in rows:
        return out
    rows = rows[(rows["end"] >= lo) & (rows["start"] <= hi)]
    stage, key = rows["stage"].to_numpy(), rows["pass_"].astype(str).to_numpy()
    frames = []
    for (s, k), tpl in templates.items():
        at = np.flatnonzero(np.asarray(tpl.fields.get("op_id", [])) == op_id)
        mine = (stage == s) & (key == k)
        if not len(at) or not mine.any():
            continue
        start, end = rows["start"].to_numpy(float)[mine], rows["end"].to_numpy(float)[mine]
        frames.append(pd.DataFrame({"ipu": rows["ipu"].to_numpy()[mine],
                                    "start": start + tpl.lo[at[0]] * (end - start),
                                    "end": start + tpl.hi[at[0]] * (end - start)}))
    if not frames:
        return out
    found = pd.concat(frames, ignore_index=True)
    found = found[(found["end"] >= lo) & (found["start"] <= hi)]
    return found.sort_values(["ipu", "start"], kind="stable").reset_index(drop=True)


def count_ops(trace: pd.DataFrame, templates: dict[tuple[int, str], PassOps],
              lo: float, hi: float) -> int:
    """How many op events `op_events` returns for [lo, hi), without building them: a pass
    wholly inside counts its ops that take time; only the few passes cut by the range's
    edges are laid out to count theirs."""
    rows = compute_rows(trace)
    if rows.empty or not templates or "pass_" not in rows:
        return 0
    rows = rows[(rows["end"] > lo) & (rows["start"] < hi)]
    sizes = {k: int((v.hi > v.lo).sum()) for k, v in templates.items()}
    inside = (rows["start"] >= lo) & (rows["end"] <= hi)
    n = sum(sizes.get((int(s), str(p)), 0)
            for s, p in zip(rows.loc[inside, "stage"], rows.loc[inside, "pass_"], strict=True))
    for r in rows[~inside].itertuples(index=False):
        tpl = templates.get((int(r.stage), str(r.pass_)))  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
        if tpl is None:
            continue
        span = float(r.end) - float(r.start)  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
        start, end = float(r.start) + tpl.lo * span, float(r.start) + tpl.hi * span  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
        n += int(((end > lo) & (start < hi) & (end > start)).sum())
    return int(n)


def readable_window(trace: pd.DataFrame, steady_steps: int = 3,
                    min_events: int = 1500) -> tuple[float, float] | None:
    """(start, end) of the ramp-up plus `steady_steps` steady-state supersteps of a pipelined
    trace, or None when the whole run is short enough to read (at most `min_events` events
    or few supersteps) or the trace does not say which supersteps are ramp-up."""
    if not {"superstep", "schedule_phase"} <= set(trace.columns) or len(trace) <= min_events:
        return None
    phase = trace["schedule_phase"].astype(str)
    main = trace.loc[phase == "main", "superstep"]
    if main.empty:
        return None
    last = int(main.min()) + steady_steps
    if int(trace["superstep"].max()) <= last + steady_steps:  # short run: show all of it
        return None
    shown = trace[trace["superstep"] <= last]
    return float(trace["start"].min()), float(shown["end"].max())


MAX_MODULE_LEVELS = 2  # module rows in a flame view (the op itself names its own module)


def module_levels(ops: pd.DataFrame) -> int:
    """How many module rows a flame view nests between a pass and its ops: the deepest
    module path's ancestors (`layer1.0.conv1` -> `layer1`, `layer1.0`), at most 2."""
    if ops.empty or "module" not in ops:
        return 0
    mods = ops["module"].astype(str)
    depth = mods.str.count(r"\.").add(1).where(mods != "", 0)
    return int(min(MAX_MODULE_LEVELS, max(0, int(depth.max()) - 1))) if len(depth) else 0


def module_runs(op_ev: pd.DataFrame, level: int) -> pd.DataFrame:
    """Op events (`op_events`) merged into runs of consecutive ops of one pass inside the
    same module at `level` (1 = the first path component): ipu, start, end, module. Ops
    whose path is shorter than `level` have no module there."""
    cols = ["ipu", "start", "end", "module"]
    if op_ev.empty or "module" not in op_ev:
        return pd.DataFrame(columns=cols)
    ev = op_ev.sort_values(["ipu", "start"], kind="stable")
    parts = ev["module"].astype(str).str.split(".")
    prefix = parts.map(lambda p: ".".join(p[:level]) if len(p) >= level and p[0] else "")
    key = pd.DataFrame({"ipu": ev["ipu"].to_numpy(), "stage": ev["stage"].to_numpy(),
                        "mb": ev["microbatch"].to_numpy(),
                        "pass": ev["pass"].astype(str).to_numpy(),
                        "prefix": prefix.to_numpy()})
    new = (key != key.shift()).any(axis=1).to_numpy()
    runs = pd.DataFrame({"ipu": key["ipu"], "start": ev["start"].to_numpy(),
                         "end": ev["end"].to_numpy(), "module": key["prefix"],
                         "run": np.cumsum(new)})
    out = runs.groupby("run", sort=True).agg(ipu=("ipu", "first"), start=("start", "min"),
                                             end=("end", "max"), module=("module", "first"))
    return out[out["module"] != ""].reset_index(drop=True)[cols]
