"""Where a thing of one view lies on the trace's time axis, and what of a view lies in a
trace range: the numbers behind the links between /liveness, /operations, /tree and
/trace (`/trace?profile=..&t0=..&t1=..&ipu=..`). Pure functions over a profile's tables;
times in the trace's unit (cycles, or ns when measured)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz.analysis.trace_detail import template_key

MIN_FRACTION = 0.002  # a link's window is at least this share of the whole trace
Span = tuple[float, float]


def _compute(trace: pd.DataFrame) -> pd.DataFrame:
    return trace[trace["kind"].astype(str) == "compute"]


def _passes(trace: pd.DataFrame, ipu: int, stage: int, ps: str,
            microbatch: int | None = None) -> pd.DataFrame:
    """The compute events of one pass of a stage on a device (every micro-batch's, or
    one's), in time order."""
    c = _compute(trace)
    keep = (c["ipu"].to_numpy() == ipu) & (c["stage"].to_numpy() == stage) \
        & (c["pass"].astype(str).to_numpy() == ps)
    if microbatch is not None and microbatch >= 0 and "microbatch" in c.columns:
        keep &= c["microbatch"].to_numpy() == microbatch
    return c[keep].sort_values("start", kind="stable")


def _by_microbatch(liveness: pd.DataFrame, ipu: int) -> bool:
    """Whether a device's liveness steps tell micro-batches apart (a measured run's
    actions); a modelled program is one micro-batch's, standing for every one."""
    if "microbatch" not in liveness.columns:
        return False
    on = liveness.loc[liveness["ipu"].to_numpy() == ipu, "microbatch"]
    return bool(on[on >= 0].nunique() > 1)


def padded(span: Span, trace: pd.DataFrame, fraction: float = MIN_FRACTION) -> Span:
    """`span` widened about its centre to at least `fraction` of the trace, kept inside."""
    lo, hi = float(trace["start"].min()), float(trace["end"].max())
    a, b = span
    need = (hi - lo) * fraction
    if b - a < need:
        mid = (a + b) / 2
        a, b = mid - need / 2, mid + need / 2
    inside = max(a, lo), min(b, hi)
    return inside if inside[1] > inside[0] else (a, b)


def run_span(trace: pd.DataFrame, slices: pd.DataFrame | None = None) -> Span:
    """The whole run on the trace's time axis: its events' and (an import drawn in thread
    lanes) its host slices' first start and last end. A measured run's clock starts at its
    first recorded step (a ProfilerStep slice at 0), before its first device event."""
    frames = [f for f in (trace, slices) if f is not None and len(f)]
    if not frames:
        return 0.0, 0.0
    return (float(min(f["start"].min() for f in frames)),
            float(max(f["end"].max() for f in frames)))


def op_window(span: Span, trace: pd.DataFrame, around: float = 20.0,
              fraction: float = 1e-5, run: Span | None = None) -> Span:
    """A window about an op's `span`, `around` times as wide (so the op is seen with its
    neighbours), and at least `fraction` of the run; centred on the op, but shifted to lie
    inside the run (`run`, else `run_span(trace)`) when the op is near either end: a link
    never asks for times before the run's start (a negative t0) or after its end."""
    a, b = span
    lo, hi = run if run is not None else run_span(trace)
    lo, hi = min(lo, a), max(hi, b)  # the op itself is always inside
    width = max((b - a) * around, (hi - lo) * fraction, 1.0)
    if width >= hi - lo:  # the whole run (a short one: at least one unit)
        return lo, lo + width
    start = min(max((a + b) / 2 - width / 2, lo), hi - width)
    return start, start + width


LAUNCH_REACH = 4.0  # a launch this many kernel windows away is left out of view


def kernel_window(kernel: Span, launch: Span | None, trace: pd.DataFrame,
                  run: Span | None = None) -> Span:
    """The window a found kernel opens: `op_window` about the kernel, widened to take in
    the host slice that launched it when the two together span at most LAUNCH_REACH such
    windows (then padded by a tenth), else the kernel's own: the GPU can run milliseconds
    behind the host, and a window wide enough for both would shrink the kernel to a
    pixel."""
    own = op_window(kernel, trace, run=run)
    if launch is None:
        return own
    both = (min(kernel[0], launch[0]), max(kernel[1], launch[1]))
    if own[0] <= both[0] and both[1] <= own[1]:
        return own
    if both[1] - both[0] > LAUNCH_REACH * (own[1] - own[0]):
        return own
    return op_window(both, trace, around=1.2, run=run)


def op_span(ops: pd.DataFrame, trace: pd.DataFrame, op_id: int,
            templates: dict | None = None, microbatch: int | None = None
            ) -> tuple[int, Span] | None:
    """(device, span) of one op: its own start / end when measured, else where the op
    runs in the first pass of its stage on its device (modelled ops run in every
    micro-batch's; `microbatch`: in that micro-batch's pass): its share of the pass as
    `templates` (trace_detail.pass_ops) lay it out, or the whole pass without them."""
    row = ops[ops["op_id"].to_numpy() == op_id]
    if row.empty or trace.empty or "ipu" not in row.columns:
        return None
    r = row.iloc[0]
    ipu = int(r["ipu"])
    if {"start", "end"} <= set(row.columns) and 0 <= float(r["start"]) <= float(r["end"]):
        return ipu, (float(r["start"]), float(r["end"]))
    if "stage" not in row.columns or "pass" not in row.columns:
        return None
    mb = microbatch if microbatch is not None else \
        int(r["microbatch"]) if "microbatch" in row.columns else None
    hit = _passes(trace, ipu, int(r["stage"]), str(r["pass"]), mb)
    if "grad_part" in hit.columns and "grad_part" in row.columns:
        # a zero-bubble plan runs the backward's two parts apart: the op's own part
        own = hit[hit["grad_part"].astype(str) == str(r["grad_part"])]
        hit = own if len(own) else hit
    if hit.empty:
        return None
    first = hit.iloc[0]
    start, end = float(first["start"]), float(first["end"])
    part = str(first["grad_part"]) if "grad_part" in hit.columns else ""
    tpl = (templates or {}).get((int(r["stage"]), template_key(str(r["pass"]), part)))
    if tpl is not None and "op_id" in tpl.fields:
        at = np.flatnonzero(np.asarray(tpl.fields["op_id"]) == op_id)
        if len(at):
            k = int(at[0])
            span = end - start
            return ipu, (start + float(tpl.lo[k]) * span, start + float(tpl.hi[k]) * span)
    return ipu, (start, end)


def op_slices(ops: pd.DataFrame, slices: pd.DataFrame, op_id: int) -> pd.Index:
    """Index labels of the host slices of one measured op (an import's ops are its
    `cpu_op` slices: same rank, start, end and name); none for a modelled op or one
    without times."""
    row = ops[ops["op_id"].to_numpy() == op_id] if "op_id" in ops.columns else ops.iloc[:0]
    need = {"ipu", "start", "end"}
    if row.empty or slices.empty or not need <= set(row.columns) \
            or not need <= set(slices.columns):
        return slices.index[:0]
    r = row.iloc[0]
    if not 0 <= float(r["start"]) <= float(r["end"]):
        return slices.index[:0]
    keep = (slices["ipu"].to_numpy() == int(r["ipu"])) \
        & (slices["start"].to_numpy() == r["start"]) & (slices["end"].to_numpy() == r["end"])
    if "op" in row.columns and "name" in slices.columns:
        # a parent and its only child may share both times: the op's own name decides
        named = keep & (slices["name"].astype(str).to_numpy() == str(r["op"]))
        keep = named if named.any() else keep
    return slices.index[keep]


def kernel_ops(kernels: pd.DataFrame, ops: pd.DataFrame, slices: pd.DataFrame
               ) -> list[tuple[int, Span] | None]:
    """Per kernel (rows of an import's trace): (op_id, launch span) of the op that launched
    it, the innermost op around its launch (the host slice of the same rank and
    correlation) and named as the kernel's `host_op` where one is; None where the launch or
    its op is not recorded."""
    need = {"ipu", "correlation"}
    if not need <= set(kernels.columns) or not need | {"start", "end"} <= set(slices.columns) \
            or not {"op_id", "ipu", "start", "end"} <= set(ops.columns):
        return [None] * len(kernels)
    out: list[tuple[int, Span] | None] = []
    corr, rank = slices["correlation"].to_numpy(), slices["ipu"].to_numpy()
    o_ipu, o_start = ops["ipu"].to_numpy(), ops["start"].to_numpy(dtype=float)
    o_end = ops["end"].to_numpy(dtype=float)
    names = ops["op"].astype(str).to_numpy() if "op" in ops.columns else None
    hosts = kernels["host_op"].astype(str).to_numpy() if "host_op" in kernels.columns \
        else np.full(len(kernels), "")
    for ipu, c, host in zip(kernels["ipu"].to_numpy(), kernels["correlation"].to_numpy(),
                            hosts, strict=True):
        at = np.flatnonzero((corr == c) & (rank == ipu) & (c >= 0))
        if not len(at):
            out.append(None)
            continue
        a, b = float(slices["start"].iloc[at[0]]), float(slices["end"].iloc[at[0]])
        around = (o_ipu == ipu) & (o_start <= a) & (o_end >= b)
        if names is not None and (around & (names == host)).any():
            around &= names == host
        hit = np.flatnonzero(around)
        if not len(hit):
            out.append(None)
            continue
        inner = hit[np.argmax(o_start[hit])]  # nested ops: the one that launched it
        out.append((int(ops["op_id"].iloc[inner]), (a, b)))
    return out


def step_span(liveness: pd.DataFrame, trace: pd.DataFrame, ipu: int, step: int
              ) -> Span | None:
    """The time of one liveness step of a device: from the step before to the one after
    when the table has times (an import), else the pass (stage, micro-batch, pass) the
    step belongs to."""
    on = liveness[liveness["ipu"].to_numpy() == ipu].sort_values("step", kind="stable")
    at = np.flatnonzero(on["step"].to_numpy() == step)
    if not len(at) or trace.empty:
        return None
    k = int(at[0])
    if "time" in on.columns:
        t = on["time"].to_numpy(dtype=float)
        return float(t[max(k - 1, 0)]), float(t[min(k + 1, len(t) - 1)])
    if not {"stage", "pass"} <= set(on.columns):
        return None
    r = on.iloc[k]
    mb = int(r["microbatch"]) if _by_microbatch(liveness, ipu) else None
    hit = _passes(trace, ipu, int(r["stage"]), str(r["pass"]), mb)
    if hit.empty:
        return None
    return float(hit["start"].iloc[0]), float(hit["end"].iloc[0])


def ops_in_range(ops: pd.DataFrame, trace: pd.DataFrame, t0: float, t1: float,
                 ipu: int | None = None) -> np.ndarray:
    """Which ops ran in [t0, t1] (on `ipu` alone when given): a measured op by its own
    times, a modelled one when a pass of its stage that runs it overlaps the range."""
    keep = np.ones(len(ops), dtype=bool)
    if ipu is not None and "ipu" in ops.columns:
        keep &= ops["ipu"].to_numpy() == ipu
    if {"start", "end"} <= set(ops.columns):
        start, end = ops["start"].to_numpy(dtype=float), ops["end"].to_numpy(dtype=float)
        return keep & (start <= t1) & (end >= t0) & (start >= 0)
    if not {"ipu", "stage", "pass"} <= set(ops.columns):
        return keep & False
    c = _compute(trace)
    c = c[(c["start"].to_numpy() <= t1) & (c["end"].to_numpy() >= t0)]
    ran = set(zip(c["ipu"].astype(int), c["stage"].astype(int), c["pass"].astype(str),
                  strict=True))
    hit = np.array([(int(i), int(s), str(p)) in ran for i, s, p in
                    zip(ops["ipu"], ops["stage"], ops["pass"], strict=True)], dtype=bool)
    return keep & hit


def steps_in_range(liveness: pd.DataFrame, trace: pd.DataFrame, t0: float, t1: float
                   ) -> dict[int, tuple[int, int]]:
    """Per device, the first and last liveness step in [t0, t1]: by the steps' times (an
    import), else by the passes they belong to; devices with none are left out."""
    out: dict[int, tuple[int, int]] = {}
    if liveness.empty:
        return out
    if "time" in liveness.columns:
        t = liveness["time"].to_numpy(dtype=float)
        inside = liveness[(t >= t0) & (t <= t1)]
    elif {"stage", "pass"} <= set(liveness.columns):
        c = _compute(trace)
        c = c[(c["start"].to_numpy() <= t1) & (c["end"].to_numpy() >= t0)]
        ran = {(int(i), int(s), str(p)) for i, s, p in zip(c["ipu"], c["stage"], c["pass"],
                                                            strict=True)}
        ran_mb = {(int(i), int(s), str(p), int(m)) for i, s, p, m in
                  zip(c["ipu"], c["stage"], c["pass"], c["microbatch"], strict=True)} \
            if "microbatch" in c.columns else set()
        split = {int(i): _by_microbatch(liveness, int(i)) for i in liveness["ipu"].unique()}
        mb = liveness["microbatch"] if "microbatch" in liveness.columns else \
            pd.Series(-1, index=liveness.index)
        mask = [(int(i), int(s), str(p), int(m)) in ran_mb if split[int(i)]
                else (int(i), int(s), str(p)) in ran for i, s, p, m in
                zip(liveness["ipu"], liveness["stage"], liveness["pass"], mb, strict=True)]
        inside = liveness[np.array(mask, dtype=bool)]
    else:
        return out
    for ipu, g in inside.groupby("ipu"):
        out[int(ipu)] = (int(g["step"].min()), int(g["step"].max()))  # type: ignore[arg-type]  # pandas-stubs: a group key is any scalar
    return out


def module_span(ops: pd.DataFrame, trace: pd.DataFrame, module: str
                ) -> tuple[int, Span] | None:
    """(device, span) of the first compute event that runs an op of `module` or of a
    module inside it (a program-tree box)."""
    if not module or trace.empty or not {"module", "stage", "pass"} <= set(ops.columns):
        return None
    mods = ops["module"].astype(str)
    mine = ops[(mods == module) | mods.str.startswith(module + ".")]
    if mine.empty:
        return None
    if {"start", "end"} <= set(mine.columns) and (mine["start"] >= 0).any():
        first = mine[mine["start"] >= 0].sort_values("start", kind="stable").iloc[0]
        return int(first["ipu"]), (float(first["start"]), float(first["end"]))
    keys = set(zip(mine["stage"].astype(int), mine["pass"].astype(str), strict=True))
    c = _compute(trace)
    hit = c[[(int(s), str(p)) in keys for s, p in zip(c["stage"], c["pass"], strict=True)]]
    if hit.empty:
        return None
    first = hit.sort_values("start", kind="stable").iloc[0]
    return int(first["ipu"]), (float(first["start"]), float(first["end"]))
