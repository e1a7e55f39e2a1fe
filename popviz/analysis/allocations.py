"""A CUDA memory snapshot's allocator, as PyTorch's memory_viz shows it: live blocks over
time stacked in allocation order (a freed block's band ends and those above it drop),
reserved (segments) against allocated bytes with the fragmentation between them, and one
block's stack. Pure functions over the `alloc_blocks` / `alloc_segments` / `alloc_frames`
tables (docs/profile-format.md); times stay on the profile's clock (ns)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

MAX_BLOCKS = 100  # blocks drawn as their own band; the rest share one band
MAX_TIMES = 600  # time points the bands are evaluated at (beyond the shown blocks' edges)
OTHER = -1  # the `block` of the band of the blocks not drawn alone

# frames of the allocator and interpreter themselves: memory_viz hides them too
HIDDEN_NAMES = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp",
                "CUDACachingAllocator", "_start", "__libc_start_main", "__libc_init_first",
                "Py_BytesMain", "Py_RunMain", "PyRun_", "_PyRun_", "PyEval_", "_PyEval_",
                "PyObject_", "_PyObject_", "PyFunction_", "PyType_", "c10::intrusive_ptr",
                "c10::TensorImpl::", "THPVariable_", "decref(", "wrap_kernel_functor",
                "c10::Dispatcher::", "c10::OperatorHandle::", "c10::KernelFunction::")
HIDDEN_FILES = ("??", "core/boxing", "/Register", "/Redispatch", "pythonrun.c",
                "Modules/main.c", "Objects/call.c", "Objects/methodobject.c")


def has_allocations(blocks: pd.DataFrame) -> bool:
    """Whether a profile holds a snapshot's blocks (imported with --memory-snapshot by a
    popviz of format 1.2 or later)."""
    return not blocks.empty


def allocation_devices(blocks: pd.DataFrame) -> list[int]:
    return sorted(int(i) for i in blocks["ipu"].unique()) if len(blocks) else []


def _on(frame: pd.DataFrame, ipu: int) -> pd.DataFrame:
    return frame[frame["ipu"].to_numpy() == ipu]


def _level(frame: pd.DataFrame, times: np.ndarray) -> np.ndarray:
    """Bytes live at each of `times` (a row is live on [start, end), or through the end
    when `to_end`)."""
    start = np.sort(frame["start"].to_numpy(np.int64))
    sizes_by_start = frame["bytes"].to_numpy(np.int64)[np.argsort(frame["start"].to_numpy(
        np.int64), kind="stable")]
    opened = np.concatenate([[0], np.cumsum(sizes_by_start)])[
        np.searchsorted(start, times, side="right")]
    closing = frame[~frame["to_end"].to_numpy(bool)]
    order = np.argsort(closing["end"].to_numpy(np.int64), kind="stable")
    end = closing["end"].to_numpy(np.int64)[order]
    closed = np.concatenate([[0], np.cumsum(closing["bytes"].to_numpy(np.int64)[order])])[
        np.searchsorted(end, times, side="right")]
    return opened - closed


def allocator_series(blocks: pd.DataFrame, segments: pd.DataFrame, ipu: int
                     ) -> pd.DataFrame:
    """Per event time of one device: `allocated` (live blocks), `reserved` (segments) and
    `fragmentation` (reserved but not allocated: cached free space), in bytes."""
    b, s = _on(blocks, ipu), _on(segments, ipu)
    times = np.unique(np.concatenate([b["start"].to_numpy(np.int64),
                                      b["end"].to_numpy(np.int64),
                                      s["start"].to_numpy(np.int64),
                                      s["end"].to_numpy(np.int64)]))
    allocated = _level(b, times)
    reserved = _level(s, times) if len(s) else np.zeros(len(times), np.int64)
    return pd.DataFrame({"time": times, "allocated": allocated, "reserved": reserved,
                         "fragmentation": np.maximum(reserved - allocated, 0)})


def allocation_summary(series: pd.DataFrame, blocks: pd.DataFrame, ipu: int
                       ) -> dict[str, Any]:
    """Headline figures: peak allocated (and when, and what was reserved then), peak
    reserved, the most fragmentation, blocks and segments counted."""
    if series.empty:
        return {}
    k = int(series["allocated"].to_numpy().argmax())
    f = int(series["fragmentation"].to_numpy().argmax())
    b = _on(blocks, ipu)
    return {"peak_allocated": int(series["allocated"].iloc[k]),
            "peak_time": int(series["time"].iloc[k]),
            "reserved_at_peak": int(series["reserved"].iloc[k]),
            "peak_reserved": int(series["reserved"].max()),
            "max_fragmentation": int(series["fragmentation"].iloc[f]),
            "fragmentation_time": int(series["time"].iloc[f]),
            "blocks": len(b), "from_start": int(b["from_start"].sum()),
            "to_end": int(b["to_end"].sum())}


@dataclass
class Timeline:
    """Stacked bands: `bands` has one row per shown block per interval it is live in
    (block, start, end, lower, upper in bytes; block OTHER = the blocks not drawn alone, at
    the bottom); `shown` the drawn blocks' rows of `alloc_blocks`; `hidden` how many blocks
    share the OTHER band; `window` the time range."""

    bands: pd.DataFrame
    shown: pd.DataFrame
    hidden: int
    window: tuple[int, int]


def block_timeline(blocks: pd.DataFrame, ipu: int, t0: int | None = None,
                   t1: int | None = None, max_blocks: int = MAX_BLOCKS,
                   max_times: int = MAX_TIMES) -> Timeline:
    """memory_viz's active memory timeline over [t0, t1] of one device: every block live
    in the window is stacked in allocation order; the `max_blocks` largest are bands of
    their own, the rest one band beneath them. Bands are evaluated at the shown blocks'
    alloc and free times plus up to `max_times` other event times, so the response stays
    small whatever the snapshot's length."""
    b = _on(blocks, ipu)
    if b.empty:
        return Timeline(pd.DataFrame(columns=["block", "start", "end", "lower", "upper"]), b, 0,
                        (0, 0))
    lo = int(b["start"].min()) if t0 is None else int(t0)
    hi = int(b["end"].max()) if t1 is None else int(t1)
    hi = max(hi, lo)
    live = b[(b["start"].to_numpy() <= hi) & ((b["end"].to_numpy() > lo)
                                              | b["to_end"].to_numpy(bool))]
    shown = live.sort_values(["bytes", "block"], ascending=[False, True],
                             kind="stable").head(max_blocks)
    shown = shown.sort_values(["start", "block"], kind="stable")
    rest = live.drop(shown.index)
    edges = np.concatenate([shown["start"].to_numpy(np.int64),
                            shown["end"].to_numpy(np.int64), [lo, hi]])
    others = np.unique(np.concatenate([rest["start"].to_numpy(np.int64),
                                       rest["end"].to_numpy(np.int64)]))
    if len(others) > max_times:
        others = others[np.linspace(0, len(others) - 1, max_times).astype(np.int64)]
    times = np.unique(np.clip(np.concatenate([edges, others]), lo, hi))
    start = shown["start"].to_numpy(np.int64)
    end = shown["end"].to_numpy(np.int64)
    to_end = shown["to_end"].to_numpy(bool)
    # interval k is [times[k], times[k+1]): block j is in it when allocated by its start
    # and not yet freed; blocks above a freed one drop at the free (steps, as allocated)
    t_a, t_b = times[:-1], times[1:]
    alive = (start[None, :] <= t_a[:, None]) & ((end[None, :] > t_a[:, None]) | to_end)
    sizes = shown["bytes"].to_numpy(np.int64)
    base = _level(rest, t_a) if len(rest) else np.zeros(len(t_a), np.int64)
    below = np.cumsum(alive * sizes, axis=1) - alive * sizes + base[:, None]
    k, j = np.nonzero(alive)
    ids = shown["block"].to_numpy(np.int64)
    bands = pd.DataFrame({"block": ids[j], "start": t_a[k], "end": t_b[k],
                          "lower": below[k, j], "upper": below[k, j] + sizes[j]})
    if len(rest):
        bands = pd.concat([pd.DataFrame({"block": OTHER, "start": t_a, "end": t_b,
                                         "lower": np.zeros(len(t_a), np.int64),
                                         "upper": base}), bands], ignore_index=True)
    bands = _runs(bands.sort_values(["block", "start"], kind="stable"))
    return Timeline(bands, shown.reset_index(drop=True), len(rest), (lo, hi))


def _runs(bands: pd.DataFrame) -> pd.DataFrame:
    """Consecutive intervals of one block at the same height merged into one row."""
    if bands.empty:
        return bands.reset_index(drop=True)
    key = bands[["block", "lower", "upper"]].to_numpy()
    new = np.ones(len(bands), dtype=bool)
    new[1:] = (key[1:] != key[:-1]).any(axis=1) | (
        bands["start"].to_numpy()[1:] != bands["end"].to_numpy()[:-1])
    run = np.cumsum(new) - 1
    out = bands.iloc[np.flatnonzero(new)].copy()
    out["end"] = bands.groupby(run, sort=True)["end"].max().to_numpy()
    return out.reset_index(drop=True)


def frame_text(name: str, filename: str, line: int) -> str:
    """A frame as memory_viz writes it: `filename:line name`."""
    return f"{filename}:{line} {name}"


def _hidden(name: str, filename: str) -> bool:
    base = filename.rsplit("/", 1)[-1]  # the dispatcher's generated files, wherever built
    return any(h in name for h in HIDDEN_NAMES) or any(h in filename for h in HIDDEN_FILES) \
        or not filename or base.startswith(("Register", "VariableType", "ADInplaceOrView"))


def block_stack(frames: pd.DataFrame, ipu: int, stack: int, everything: bool = False
                ) -> tuple[list[str], int]:
    """(frames innermost first as `filename:line name`, how many were hidden): the
    allocator's and interpreter's own frames are left out unless `everything`."""
    f = _on(frames, ipu)
    f = f[f["stack"].to_numpy() == stack].sort_values("depth")
    out, hidden = [], 0
    for name, filename, line in zip(f["name"].astype(str), f["filename"].astype(str),
                                    f["line"].astype(int)):
        if not everything and _hidden(name, filename):
            hidden += 1
            continue
        out.append(frame_text(name, filename, line))
    return out, hidden


def block_detail(blocks: pd.DataFrame, frames: pd.DataFrame, ipu: int, block: int
                 ) -> dict[str, Any]:
    """One block: its row (bytes, addr, stream, start, end, from_start, to_end) and its
    stack (`frames`, `hidden`); ValueError naming a block that does not exist."""
    b = _on(blocks, ipu)
    row = b[b["block"].to_numpy() == block]
    if row.empty:
        raise ValueError(f"no block {block} on device {ipu}")
    r = row.iloc[0]
    shown, hidden = block_stack(frames, ipu, int(r["stack"])) if int(r["stack"]) >= 0 \
        else ([], 0)
    return {"block": int(block), "bytes": int(r["bytes"]), "addr": int(r["addr"]),
            "stream": int(r["stream"]), "start": int(r["start"]), "end": int(r["end"]),
            "from_start": bool(r["from_start"]), "to_end": bool(r["to_end"]),
            "stack": int(r["stack"]), "frames": shown, "hidden": hidden}


def top_frame(frames: pd.DataFrame, ipu: int) -> dict[int, str]:
    """Per stack: its first frame with a source file (a Python line where there is one),
    for hover labels."""
    f = _on(frames, ipu)
    if f.empty:
        return {}
    f = f.sort_values(["stack", "depth"], kind="stable")
    py = f[f["filename"].astype(str).str.endswith(".py")]
    first: dict[int, str] = {}
    for s, n, fn, ln in zip(py["stack"], py["name"], py["filename"], py["line"]):
        first.setdefault(int(s), frame_text(str(n), str(fn), int(ln)))
    return first
