"""What Perfetto draws of a torch.profiler trace and the rest of the import does not keep:
every host slice on its thread with its nesting depth (the `host_slices` table), and for
each GPU event its CUDA stream and correlation id (the trace's `stream` and `correlation`
columns), so a kernel links back to the cudaLaunchKernel that queued it (Kineto's 'ac2g'
flow events pair exactly these correlation ids). Format 1.2; docs/import.md."""

from __future__ import annotations

import numpy as np
import pandas as pd

# host spans drawn on thread lanes: ops, annotations (pipelining's PP:1F0, ProfilerStep)
# and CUDA runtime / driver calls (the launches the flow arrows start from)
HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
SLICE_COLUMNS = ["ipu", "tid", "thread", "depth", "start", "end", "name", "cat",
                 "correlation"]
LINK_COLUMNS = ["stream", "correlation"]  # added to the trace: -1 where an event has none


def slice_depths(tid: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Nesting depth of each span on its thread (0 = top level), vectorised: sorted by
    (thread, start, longest first), a span's ancestors are the spans before it on its
    thread that have not ended when it starts. A zero-length span counts as one ns long so
    that it never closes before a sibling starting at the same instant."""
    n = len(start)
    depth = np.zeros(n, dtype=np.int64)
    if n == 0:
        return depth
    order = np.lexsort((-end, start, tid))
    t, s = tid[order], start[order]
    e = np.maximum(end[order], s + 1)
    bounds = np.flatnonzero(np.diff(t)) + 1
    for a, b in zip(np.r_[0, bounds], np.r_[bounds, n]):
        before = np.arange(b - a)  # spans of this thread sorted before each one
        ended = np.searchsorted(np.sort(e[a:b]), s[a:b], side="right")
        depth[order[a:b]] = np.maximum(before - ended, 0)
    return depth


def host_slices(spans: pd.DataFrame, rank: int) -> pd.DataFrame:
    """One row per host span of one rank (rank clock): its thread as a lane number (`tid`,
    threads in order of their first span) and label, depth, times, name, category and
    correlation id (-1 but on runtime and driver calls)."""
    host = spans[spans["cat"].isin(HOST_CATS).to_numpy()]
    if host.empty:
        return pd.DataFrame({c: pd.Series([], dtype="int64" if c not in
                                          ("thread", "name", "cat") else object)
                             for c in SLICE_COLUMNS})
    raw = host["tid"].astype(str).to_numpy()
    start = host["start"].to_numpy(dtype=np.int64)
    end = host["end"].to_numpy(dtype=np.int64)
    firsts = pd.Series(start).groupby(raw).min().sort_values(kind="stable")
    lane = {name: i for i, name in enumerate(firsts.index)}
    tid = pd.Series(raw).map(lane).to_numpy(dtype=np.int64)
    cat = host["cat"].astype(str).to_numpy()
    launcher = np.isin(cat, ["cuda_runtime", "cuda_driver"])
    corr = np.where(launcher, host["corr"].to_numpy(dtype=np.int64), -1)
    frame = pd.DataFrame({
        "ipu": rank, "tid": tid,
        "thread": np.array([f"thread {x}" for x in firsts.index], dtype=object)[tid],
        "depth": slice_depths(tid, start, end), "start": start, "end": end,
        "name": host["name"].astype(str).to_numpy(dtype=object), "cat": cat.astype(object),
        "correlation": corr})
    return frame.sort_values(["tid", "start", "depth"], kind="stable").reset_index(drop=True)


def gpu_links(spans: pd.DataFrame, gpu_cats: tuple[str, ...]) -> pd.DataFrame:
    """Stream and correlation id of each GPU span, in the order `spans` holds them."""
    gpu = spans[spans["cat"].isin(gpu_cats)]
    return pd.DataFrame({"stream": gpu["stream"].to_numpy(dtype=np.int64),
                         "correlation": gpu["corr"].to_numpy(dtype=np.int64)})


def fill_links(trace: pd.DataFrame) -> pd.DataFrame:
    """The trace's link columns as int64, -1 where an event has none (idle gaps, sync
    calls, CPU ranks, p2p waits)."""
    for c in LINK_COLUMNS:
        trace[c] = trace[c].fillna(-1).astype(np.int64) if c in trace else np.int64(-1)
    return trace
