"""A BSP view of one superstep of one IPU: tiles x time, compute / exchange / sync / idle.

PopVision's BSP trace shows, per tile, when it computes, exchanges and waits at a sync. A
modelled profile has no per-tile timeline, so this one is rebuilt from each op's plan:

- The superstep is the IPU's trace events with that `superstep` (compute, then the
  waits, sync, inter-IPU exchange and host stream copies of `popviz.compiler.bsp`; a
  Grouped training clock has a wait and a sync between its forwards and its backwards).
- Each compute event's ops run one after another in program order, each as long as its
  share of the pass's modelled cycles (`popviz.analysis.trace_detail.pass_ops`).
- An op runs on `tiles_used` contiguous tiles placed as `popviz.compiler.memory` places
  ops and their tensors: from `mapping.start_tiles(tiles_used, key)`, the key being the op
  it recomputes (`source_op`) or its own `op_id`. Every other tile is **idle** for the
  op's duration (each compute set ends in an internal sync): that is where imbalance
  shows. A conv / matmul whose plan has several passes (e.g. `bwd; wu`) is drawn on its
  widest pass's tiles (`tiles_used`) for its whole duration.
- On its tiles an op runs its plan's internal **exchange** (`exchange_cycles_internal`)
  then its **compute**, split into `passes` serial slices (each exchange then compute),
  scaled like the op to the event's length.
- The IPU's wait for the other IPUs and the sync itself are **sync** on every tile, up to
  the end of the sync; the inter-IPU exchange and the host stream copies are **exchange**
  on every tile (Poplar spreads them over the tiles); the wait for the others' exchange
  that ends the superstep is **sync** again (a barrier wait).
So per tile compute + exchange + sync + idle = the superstep's length, exactly.

Modelled profiles only: a measured run or an imported trace has no tiles."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.analysis.trace_detail import PassOps, pass_ops
from popviz.target.mapping import start_tiles

KINDS = ("compute", "exchange", "sync", "idle")
MAX_SLICES = 16  # serial slices drawn per op (a plan's passes; more add nothing visible)
# the trace's non-compute events on every tile of the IPU
EVENT_KIND = {"exchange": "exchange", "host_io": "exchange", "sync": "sync", "idle": "sync"}


class SuperstepError(ValueError):
    """A request the profile cannot answer (one line, for the page)."""


@dataclass(frozen=True)
class Superstep:
    """The BSP view: `rects` cover tiles [tile0, tile1) over cycles [start, end) with one
    kind each, tiling the whole tiles x [start, end) box without overlap; `ops` is one row
    per op run (op, op_class, module, op_id, pass, microbatch, start, end, tile0, tiles,
    exchange, plan)."""

    ipu: int
    superstep: int
    start: float
    end: float
    tiles: int
    rects: pd.DataFrame  # tile0, tile1, start, end, kind, op (label)
    ops: pd.DataFrame

    @property
    def length(self) -> float:
        return self.end - self.start


def has_tiles(ops: pd.DataFrame, measured: bool) -> bool:
    """Whether a profile can have a BSP view: modelled, with ops that say their tiles."""
    need = {"tiles_used", "cycles", "stage", "pass", "op_id"}
    return not measured and not ops.empty and need <= set(ops.columns)


def superstep_at(trace: pd.DataFrame, ipu: int, t: float) -> int:
    """The superstep of the event on `ipu` that holds time `t` (start < t <= end: a bar's
    end is what a click reports); a compute event wins a tie."""
    if "superstep" not in trace.columns:
        raise SuperstepError("this trace has no supersteps")
    on = trace[(trace["ipu"] == ipu) & (trace["start"] < t) & (trace["end"] >= t)]
    if on.empty:
        raise SuperstepError(f"no event on IPU {ipu} at {t:,.0f} cycles")
    comp = on[on["kind"].astype(str) == "compute"]
    return int((comp if len(comp) else on)["superstep"].iloc[0])


def _op_rows(ops: pd.DataFrame, tiles: int) -> pd.DataFrame:
    """Per op its placement: tile0, tiles, exchange, slices (indexed by op_id)."""
    nt = ops["tiles_used"].to_numpy(np.int64).clip(0, tiles)
    src = ops["source_op"].to_numpy(np.int64) if "source_op" in ops else np.full(len(ops), -1)
    key = np.where(src >= 0, src, ops["op_id"].to_numpy(np.int64))
    exch = (ops["exchange_cycles_internal"].to_numpy(np.float64)
            if "exchange_cycles_internal" in ops else np.zeros(len(ops)))
    slices = (ops["passes"].to_numpy(np.int64) if "passes" in ops
              else np.ones(len(ops), dtype=np.int64)).clip(1, MAX_SLICES)
    plan = ops["plan"].astype(str).to_numpy() if "plan" in ops else np.full(len(ops), "")
    return pd.DataFrame({"tile0": start_tiles(nt, key, tiles), "tiles": nt,
                         "exchange": exch, "slices": slices, "plan": plan,
                         "cycles": ops["cycles"].to_numpy(np.float64)},
                        index=ops["op_id"].to_numpy(np.int64))


def superstep_view(trace: pd.DataFrame, ops: pd.DataFrame, tiles: int, ipu: int,
                   superstep: int, templates: dict[tuple[int, str], PassOps] | None = None
                   ) -> Superstep:
    """The BSP view of `superstep` on `ipu` of a modelled profile with `tiles` tiles per IPU
    (`templates`: `pass_ops(ops)` when the caller keeps it). Raises SuperstepError when
    the IPU has no event in that superstep."""
    if tiles <= 0:
        raise SuperstepError("the profile does not say how many tiles an IPU has")
    if "superstep" not in trace.columns:
        raise SuperstepError("this trace has no supersteps")
    ev = trace[(trace["ipu"] == ipu) & (trace["superstep"] == superstep)]
    ev = ev.sort_values(["start", "end"], kind="stable").rename(columns={"pass": "pass_"})
    if ev.empty:
        raise SuperstepError(f"IPU {ipu} has no superstep {superstep}")
    t0, t1 = float(ev["start"].min()), float(ev["end"].max())
    templates = pass_ops(ops) if templates is None else templates
    place = _op_rows(ops, tiles)
    cols: dict[str, list] = {c: [] for c in ("tile0", "tile1", "start", "end", "kind", "op")}
    op_runs: list[pd.DataFrame] = []

    def add(a: np.ndarray, b: np.ndarray, s: np.ndarray, e: np.ndarray, kind: str,
            label: np.ndarray) -> None:
        keep = (b > a) & (e > s)
        for name, v in (("tile0", a), ("tile1", b), ("start", s), ("end", e),
                        ("op", label)):
            cols[name].append(np.asarray(v)[keep])
        cols["kind"].append(np.full(int(keep.sum()), kind, dtype=object))

    def whole(s: float, e: float, kind: str, label: str) -> None:
        add(np.array([0]), np.array([tiles]), np.array([s]), np.array([e]), kind,
            np.array([label], dtype=object))

    clock = t0
    for r in ev.itertuples(index=False):
        s, e = float(r.start), float(r.end)  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
        if s > clock:  # no gap in a modelled trace; fill one rather than lose its time
            whole(clock, s, "idle", "no event")
        clock = max(clock, e)
        kind = str(r.kind)
        if kind != "compute":
            whole(s, e, EVENT_KIND.get(kind, "idle"), str(r.op))
            continue
        tpl = templates.get((int(r.stage), str(r.pass_)))  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
        if tpl is None:  # no op level for this pass: the whole IPU computes
            whole(s, e, "compute", str(r.op))
            continue
        op_ids = tpl.fields["op_id"].astype(np.int64)
        p = place.loc[op_ids]
        span = e - s
        o0, o1 = s + tpl.lo * span, s + tpl.hi * span
        dur = o1 - o0
        a = p["tile0"].to_numpy(np.int64)
        b = a + p["tiles"].to_numpy(np.int64)
        names = tpl.fields["op"].astype(str).astype(object)
        # the fraction of each op spent in its internal exchange, as the op is scaled
        xf = np.clip(p["exchange"].to_numpy() / np.maximum(p["cycles"].to_numpy(), 1.0),
                     0.0, 1.0)
        none = np.zeros_like(a)
        add(none, a, o0, o1, "idle", names)
        add(b, np.full_like(a, tiles), o0, o1, "idle", names)
        k = p["slices"].to_numpy(np.int64)
        rep = np.repeat(np.arange(len(a)), k)
        j = np.concatenate([np.arange(n) for n in k]) if len(k) else np.zeros(0, np.int64)
        piece = dur[rep] / k[rep]
        ps = o0[rep] + j * piece
        px = ps + xf[rep] * piece
        add(a[rep], b[rep], ps, px, "exchange", names[rep])
        add(a[rep], b[rep], px, ps + piece, "compute", names[rep])
        op_runs.append(pd.DataFrame({
            "op": names, "op_class": tpl.fields.get("op_class", names),
            "module": tpl.fields.get("module", np.full(len(a), "")), "op_id": op_ids,
            "pass": str(r.pass_), "microbatch": int(r.microbatch),  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
            "start": o0, "end": o1, "tile0": a, "tiles": b - a,
            "exchange": xf * dur, "plan": p["plan"].to_numpy()})[dur > 0])
    rects = pd.DataFrame({c: np.concatenate(v) if v else np.zeros(0)
                          for c, v in cols.items()})
    rects = rects.astype({"tile0": np.int64, "tile1": np.int64, "start": np.float64,
                          "end": np.float64})
    op_frame = (pd.concat(op_runs, ignore_index=True) if op_runs else pd.DataFrame(
        columns=["op", "op_class", "module", "op_id", "pass", "microbatch", "start", "end",
                 "tile0", "tiles", "exchange", "plan"]))
    return Superstep(int(ipu), int(superstep), t0, t1, int(tiles), rects, op_frame)


def per_tile(view: Superstep) -> pd.DataFrame:
    """Cycles of each kind on each tile: a (tiles x KINDS) frame (a difference array)."""
    out = {}
    r = view.rects
    for kind in KINDS:
        sel = r[r["kind"] == kind]
        diff = np.zeros(view.tiles + 1)
        w = (sel["end"] - sel["start"]).to_numpy(np.float64)
        np.add.at(diff, sel["tile0"].to_numpy(np.int64), w)
        np.add.at(diff, sel["tile1"].to_numpy(np.int64), -w)
        out[kind] = np.cumsum(diff)[:view.tiles]
    return pd.DataFrame(out)


@dataclass(frozen=True)
class Grid:
    """A superstep in buckets: `share[k, row, col]` is the share of the cell (tile rows of
    `tiles_per_row` tiles x `edges` in cycles) spent in KINDS[k]; `op[col]` the op running
    longest in the column ('' when none)."""

    share: np.ndarray
    edges: np.ndarray
    tiles_per_row: int
    row_tiles: np.ndarray  # first tile of each row
    op: np.ndarray


def _cover(lo: np.ndarray, hi: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(n, buckets) share of each bucket [edges[i], edges[i+1]) that [lo, hi) covers."""
    left = np.maximum(lo[:, None], edges[None, :-1])
    right = np.minimum(hi[:, None], edges[None, 1:])
    width = np.maximum(np.diff(edges), 1e-12)
    return np.clip(right - left, 0.0, None) / width[None, :]


def bucketed(view: Superstep, rows: int = 64, cols: int = 400) -> Grid:
    """The view in at most `rows` tile rows (1472 tiles: 64 rows of 23) and `cols` time
    buckets. Rectangles are separable (a tile range times a time range), so each kind's
    grid is one matrix product: cost grows with rectangles x (rows + cols), not area."""
    tpr = max(1, -(-view.tiles // max(1, rows)))
    row_tiles = np.arange(0, view.tiles, tpr)
    tile_edges = np.append(row_tiles, view.tiles).astype(np.float64)
    edges = np.linspace(view.start, view.end, max(1, cols) + 1)
    r = view.rects
    share = np.zeros((len(KINDS), len(row_tiles), len(edges) - 1))
    for k, kind in enumerate(KINDS):
        sel = r[r["kind"] == kind]
        if sel.empty:
            continue
        tc = _cover(sel["tile0"].to_numpy(np.float64), sel["tile1"].to_numpy(np.float64),
                    tile_edges)
        xc = _cover(sel["start"].to_numpy(np.float64), sel["end"].to_numpy(np.float64),
                    edges)
        share[k] = tc.T @ xc
    op = np.full(len(edges) - 1, "", dtype=object)
    ops = view.ops
    if len(ops):
        cover = _cover(ops["start"].to_numpy(np.float64), ops["end"].to_numpy(np.float64),
                       edges)
        best = cover.argmax(axis=0)
        has = cover.max(axis=0) > 0
        op[has] = ops["op"].astype(str).to_numpy()[best[has]]
    return Grid(share, edges, tpr, row_tiles, op)
