"""An imported torch.profiler trace as Perfetto lays it out: per rank, one lane per host
thread (its slices stacked by nesting depth in flame mode, one row in flat mode), a lane
of GPU idle gaps (and a CPU rank's p2p waits), and one lane per CUDA stream; launch ->
kernel links by correlation id; and, for each GPU idle gap, what the host was doing.

Pure functions over the profile's `trace` and `host_slices` tables (format 1.2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

FLAME, FLAT = "flame", "flat"
MODES = (FLAME, FLAT)
SYNC_NAMES = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
              "cudaStreamWaitEvent")
LINK_COLUMNS = ["ipu", "correlation", "tid", "depth", "launch_start", "launch_end",
                "launch", "stream", "start", "end", "kernel"]


@dataclass(frozen=True)
class Row:
    """One drawn row: a thread's depth, the idle / waits lane, or a stream."""

    ipu: int
    lane: str  # "thread" | "waits" | "stream"
    key: int  # thread lane number, stream id, or -1
    depth: int
    label: str


def has_threads(slices: pd.DataFrame, trace: pd.DataFrame) -> bool:
    """Whether a profile can be drawn in thread / stream lanes (an import of format 1.2)."""
    return len(slices) > 0 and "stream" in trace.columns


def side_events(trace: pd.DataFrame) -> pd.DataFrame:
    """Trace events of no stream and not a host call: GPU idle gaps and p2p waits /
    transfers of a CPU rank (its ops and a GPU rank's sync calls are host slices)."""
    stream = trace["stream"].to_numpy() if "stream" in trace else np.full(len(trace), -1)
    kind = trace["kind"].astype(str).to_numpy()
    peer = trace["peer"].to_numpy() if "peer" in trace else np.full(len(trace), -1)
    keep = (stream < 0) & ((kind == "idle") | (peer >= 0))
    return trace[keep]


def stream_events(trace: pd.DataFrame) -> pd.DataFrame:
    return trace[trace["stream"].to_numpy() >= 0] if "stream" in trace else trace.iloc[:0]


def thread_rows(slices: pd.DataFrame, trace: pd.DataFrame, mode: str = FLAME) -> list[Row]:
    """Rows top to bottom: per rank its threads (every depth in flame mode, depth 0 in
    flat), then its waits lane when it has one, then its streams."""
    if mode not in MODES:
        raise ValueError(f"trace mode {mode!r}: use one of {', '.join(MODES)}")
    rows: list[Row] = []
    deepest = slices.groupby(["ipu", "tid"])["depth"].max() if len(slices) else pd.Series(
        dtype="int64")
    names = slices.drop_duplicates(["ipu", "tid"]).set_index(["ipu", "tid"])["thread"] \
        if len(slices) else pd.Series(dtype=object)
    side = side_events(trace)
    streams = stream_events(trace)
    ipus = sorted({int(i) for f in (slices, side, streams) for i in np.unique(f["ipu"])})
    for ipu in ipus:
        for key, top in deepest.items():
            i, tid = cast(tuple[int, int], key)  # pandas-stubs: a group key is Hashable
            if int(i) != ipu:
                continue
            name = str(names[(i, tid)])
            for d in range(int(top) + 1 if mode == FLAME else 1):
                rows.append(Row(ipu, "thread", int(tid), d, name if d == 0 else f"depth {d}"))
        mine = side[side["ipu"] == ipu]
        if len(mine):
            gpu = bool((mine["kind"].astype(str) == "idle").all()) and len(streams)
            rows.append(Row(ipu, "waits", -1, 0, "GPU idle" if gpu else "p2p waits"))
        for s in np.unique(streams.loc[streams["ipu"].to_numpy() == ipu, "stream"]):
            rows.append(Row(ipu, "stream", int(s), 0, f"stream {int(s)}"))
    return rows


def visible(frame: pd.DataFrame, lo: float, hi: float) -> pd.DataFrame:
    """Rows of `frame` (start, end) overlapping [lo, hi); an instant at lo counts."""
    s, e = frame["start"].to_numpy(), frame["end"].to_numpy()
    return frame[(s < hi) & ((e > lo) | (s >= lo))]


def launch_links(slices: pd.DataFrame, trace: pd.DataFrame) -> pd.DataFrame:
    """Each GPU event joined to the runtime call that queued it (same rank, same
    correlation id): the call's thread, depth and times, the event's stream and times.
    Sorted by the event's start. Build once per profile; `visible_links` cuts a window."""
    runtime = slices[slices["correlation"].to_numpy() >= 0]
    gpu = stream_events(trace)
    gpu = gpu[gpu["correlation"].to_numpy() >= 0]
    if runtime.empty or gpu.empty:
        return pd.DataFrame({c: pd.Series([], dtype="int64" if c not in ("launch", "kernel")
                                          else object) for c in LINK_COLUMNS})
    left = runtime.rename(columns={"start": "launch_start", "end": "launch_end",
                                   "name": "launch"})[["ipu", "correlation", "tid", "depth",
                                                       "launch_start", "launch_end",
                                                       "launch"]]
    left = left.drop_duplicates(["ipu", "correlation"])
    right = gpu.rename(columns={"op": "kernel"})[["ipu", "correlation", "stream", "start",
                                                  "end", "kernel"]]
    links = right.merge(left, on=["ipu", "correlation"], how="inner")
    return links.sort_values("start", kind="stable").reset_index(drop=True)[LINK_COLUMNS]


def visible_links(links: pd.DataFrame, lo: float, hi: float,
                  cap: int) -> tuple[pd.DataFrame, int]:
    """Links with either end in [lo, hi), at most `cap` of them (the first by kernel start);
    returns (links, how many more were in view)."""
    ls, ks = links["launch_start"].to_numpy(), links["start"].to_numpy()
    hit = links[((ls >= lo) & (ls < hi)) | ((ks >= lo) & (ks < hi))]
    return hit.iloc[:cap], max(0, len(hit) - cap)


def deepest_at(slices: pd.DataFrame, ipu: int, tid: int, t: np.ndarray) -> np.ndarray:
    """Name of the innermost slice of a thread running at each time ("" when none): at
    each depth slices do not overlap, so one binary search per depth finds the candidate."""
    mine = np.flatnonzero((slices["ipu"].to_numpy() == ipu)
                          & (slices["tid"].to_numpy() == tid))
    return _deepest(_SliceArrays.of(slices), mine, t)


@dataclass
class _SliceArrays:
    """The host slices' columns `deepest_at` reads, as arrays (read once per table)."""

    depth: np.ndarray
    start: np.ndarray
    end: np.ndarray
    name: np.ndarray

    @classmethod
    def of(cls, slices: pd.DataFrame) -> _SliceArrays:
        return cls(slices["depth"].to_numpy(), slices["start"].to_numpy(),
                   slices["end"].to_numpy(), slices["name"].to_numpy(dtype=object))


def _deepest(arrays: _SliceArrays, rows: np.ndarray, t: np.ndarray) -> np.ndarray:
    """`deepest_at` over the slices at `rows` (one thread's)."""
    out = np.full(len(t), "", dtype=object)
    depth = arrays.depth[rows]
    for d in np.unique(depth).tolist():
        level = rows[depth == d]
        level = level[np.argsort(arrays.start[level], kind="stable")]
        s, e = arrays.start[level], arrays.end[level]
        at = np.searchsorted(s, t, side="right") - 1
        ok = (at >= 0) & (e[np.clip(at, 0, None)] > t)
        out[ok] = arrays.name[level][at[ok]]
    return out


LATE, QUEUED, UNKNOWN = "launched late", "queued before the gap", "launch not recorded"
BETWEEN_OPS = "no recorded op (Python between ops)"


def idle_reasons(gaps: pd.DataFrame, links: pd.DataFrame,
                 slices: pd.DataFrame) -> pd.DataFrame:
    """Why the GPU sat idle in each gap, one row per gap in its order: `cause` (LATE,
    QUEUED or UNKNOWN), `host` (what the launching thread was doing when the gap began:
    its innermost slice, e.g. a cudaStreamSynchronize or an op's CPU work, else
    BETWEEN_OPS; "" unless late), `late_ns` (launch minus gap start) and `kernel` (the
    first GPU event after the gap). Late: the host queued that kernel only after the GPU
    ran dry. Queued before: the GPU waited on something else (a stream, an event, a copy)."""
    n = len(gaps)
    cause = np.full(n, UNKNOWN, dtype=object)
    host = np.full(n, "", dtype=object)
    late_ns = np.zeros(n, np.int64)
    kernel = np.full(n, "", dtype=object)
    if n and len(links):
        link_start, launch = links["start"].to_numpy(), links["launch_start"].to_numpy()
        link_tid, names = links["tid"].to_numpy(), links["kernel"].astype(str).to_numpy()
        # row positions by key, each in row order (links: start order): one hash pass,
        # where a filter per rank scanned every row each time
        by_ipu = links.groupby("ipu", sort=False).indices
        threads = slices.groupby(["ipu", "tid"], sort=False).indices
        arrays = _SliceArrays.of(slices)
        g_start, g_end = gaps["start"].to_numpy(), gaps["end"].to_numpy()
        for ipu, rows in gaps.groupby("ipu", sort=False).indices.items():
            mine = by_ipu.get(ipu)
            if mine is None:
                continue
            nxt = np.searchsorted(link_start[mine], g_end[rows], "left")
            found = nxt < len(mine)
            nxt = mine[np.clip(nxt, 0, len(mine) - 1)]
            late = launch[nxt] - g_start[rows]
            tid = link_tid[nxt]
            doing = np.full(len(rows), "", dtype=object)
            for t in set(tid.tolist()):
                sel = tid == t
                own = threads.get((ipu, int(t)))
                if own is not None:
                    doing[sel] = _deepest(arrays, np.asarray(own), g_start[rows][sel])
            hit, was_late = rows[found], late[found] > 0
            cause[hit] = np.where(was_late, LATE, QUEUED)
            host[hit] = np.where(was_late, np.where(doing[found] == "", BETWEEN_OPS,
                                                    doing[found]), "")
            late_ns[hit] = late[found]
            kernel[hit] = names[nxt][found]
    return pd.DataFrame({"cause": cause, "host": host, "late_ns": late_ns, "kernel": kernel})


def idle_causes(gaps: pd.DataFrame, links: pd.DataFrame,
                slices: pd.DataFrame) -> np.ndarray:
    """`idle_reasons` as one line per gap (the figure's hover)."""
    why = idle_reasons(gaps, links, slices)
    out = np.full(len(why), "next GPU event's launch not recorded", dtype=object)
    for j, (cause, host, late, kernel) in enumerate(why.itertuples(index=False)):
        name = str(kernel)[:60]
        if cause == LATE:
            waiting = " (waiting for the GPU)" if str(host).startswith(SYNC_NAMES) else ""
            out[j] = (f"host launched the next kernel {late:,} ns late; at the gap's start "
                      f"it was in {host}{waiting} · next: {name}")
        elif cause == QUEUED:
            out[j] = (f"next kernel queued {-late:,} ns before the gap: the GPU waited on a "
                      f"dependency (stream, event or copy) · next: {name}")
    return out


def idle_by_cause(trace: pd.DataFrame, links: pd.DataFrame, slices: pd.DataFrame,
                  lo: float, hi: float, top: int = 10) -> pd.DataFrame:
    """The GPU idle time of [lo, hi) (gaps clipped to it) grouped by cause and by what the
    host was doing: cause, host, gaps, idle (ns), share (of that idle), largest first."""
    gaps = side_events(trace)
    gaps = gaps[(gaps["kind"].astype(str) == "idle").to_numpy()
                & (gaps["op"].astype(str) == "GPU idle").to_numpy()]
    gaps = visible(gaps, lo, hi)
    cols = ["cause", "host", "gaps", "idle", "share"]
    if gaps.empty:
        return pd.DataFrame(columns=cols)
    why = idle_reasons(gaps, links, slices)
    why["idle"] = (np.minimum(gaps["end"].to_numpy(), hi)
                   - np.maximum(gaps["start"].to_numpy(), lo)).round().astype(np.int64)
    out = why.groupby(["cause", "host"], sort=False).agg(
        gaps=("idle", "size"), idle=("idle", "sum")).reset_index()
    total = float(out["idle"].sum())
    out["share"] = out["idle"] / total if total > 0 else 0.0
    return out.sort_values("idle", ascending=False, kind="stable").head(top)[cols] \
        .reset_index(drop=True)
