"""The caching allocator's blocks, segments and stack frames from a
`torch.cuda.memory._snapshot()` dict: what PyTorch's memory_viz draws, as three tables.

- `alloc_blocks`: one row per allocation (an `alloc` event up to its `free_completed`),
  plus blocks already live when the history began: freed during it (their free event's
  stack), or still allocated in the snapshot's segments (their recorded stack, if any).
- `alloc_segments`: reserved memory (cudaMalloc'd segments): the snapshot's segments,
  each from its `segment_alloc` (or the start) to its `segment_free` (or the end).
- `alloc_frames`: each distinct stack once (`stack`, `depth` from the innermost frame).

Times are ns since the epoch here (`time_us` x 1000); the importer moves them onto the
profile's clock. Only the device `memsnap.snapshot_series` chose is kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from popviz.ingest import import_limits as limits

MAX_DEPTH = 128  # frames kept per stack (innermost first)
MAX_STACKS = 100_000  # distinct stacks kept; later ones are stored without frames
MAX_TEXT = 512  # characters kept of a frame's name or filename

BLOCK_COLUMNS = ("ipu", "block", "addr", "bytes", "stream", "start", "end", "from_start",
                 "to_end", "stack")
SEGMENT_COLUMNS = ("ipu", "segment", "addr", "bytes", "stream", "segment_type", "start",
                   "end", "from_start", "to_end")
FRAME_COLUMNS = ("ipu", "stack", "depth", "name", "filename", "line")
FREE = ("free_completed",)
SEGMENT_OPEN = ("segment_alloc", "segment_map")
SEGMENT_CLOSE = ("segment_free", "segment_unmap")


def _whole(value: Any) -> int:
    """A whole number within int64's safe range (ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{str(value)[:40]!r} is not a number")
    number = int(value)
    if abs(number) >= limits.MAX_INT:
        raise ValueError(f"{number} is out of range")
    return number


class _Stacks:
    """Distinct stacks interned to ids, their frames as rows."""

    def __init__(self) -> None:
        self.ids: dict[tuple[tuple[str, str, int], ...], int] = {}
        self.rows: list[tuple[int, int, str, str, int]] = []

    def of(self, frames: Any) -> int:
        if not isinstance(frames, list) or not frames:
            return -1
        key = tuple((str(f.get("name", ""))[:MAX_TEXT], str(f.get("filename", ""))[:MAX_TEXT],
                     _whole(f.get("line", 0) or 0))
                    for f in frames[:MAX_DEPTH] if isinstance(f, dict))
        if not key:
            return -1
        found = self.ids.get(key)
        if found is None:
            if len(self.ids) >= MAX_STACKS:
                return -1
            found = self.ids[key] = len(self.ids)
            self.rows.extend((found, d, n, f, ln) for d, (n, f, ln) in enumerate(key))
        return found


def allocation_tables(snap: dict[str, Any], device: int, rank: int) -> dict[str, pd.DataFrame]:
    """`alloc_blocks`, `alloc_segments`, `alloc_frames` of one device of a snapshot (read
    by `memsnap.read_snapshot`, its events checked by `memsnap.snapshot_series`)."""
    events = [e for e in (snap["device_traces"][device] if snap["device_traces"] else [])
              if isinstance(e, dict)]
    times = [_whole(e.get("time_us", 0)) * 1000 for e in events]
    first = min(times) if times else 0
    last = max(times) if times else 0
    stacks = _Stacks()
    blocks: list[list[Any]] = []  # addr, bytes, stream, start, end, from_start, to_end, stack
    segments: list[list[Any]] = []  # addr, bytes, stream, type, start, end, from, to
    open_blocks: dict[int, int] = {}
    open_segments: dict[int, int] = {}
    for e, t in zip(events, times):
        action = e.get("action")
        addr, size = _whole(e.get("addr", 0)), _whole(e.get("size", 0))
        stream = _whole(e.get("stream", 0) or 0)
        if action == "alloc":
            if addr in open_blocks:  # allocated twice without a free: close the first
                blocks[open_blocks[addr]][4] = t
            open_blocks[addr] = len(blocks)
            blocks.append([addr, size, stream, t, last, False, True, stacks.of(e.get("frames"))])
        elif action in FREE:
            k = open_blocks.pop(addr, None)
            if k is not None:
                blocks[k][4], blocks[k][6] = t, False
            else:  # live before the history began
                blocks.append([addr, size, stream, first, t, True, False,
                               stacks.of(e.get("frames"))])
        elif action in SEGMENT_OPEN:
            open_segments[addr] = len(segments)
            segments.append([addr, size, stream, "", t, last, False, True])
        elif action in SEGMENT_CLOSE:
            k = open_segments.pop(addr, None)
            if k is not None:
                segments[k][5], segments[k][7] = t, False
            else:
                segments.append([addr, size, stream, "", first, t, True, False])
    _final_state(snap, device, stacks, blocks, segments, open_blocks, open_segments,
                 (first, last))
    return {"alloc_blocks": _frame(BLOCK_COLUMNS, rank, "block", blocks),
            "alloc_segments": _frame(SEGMENT_COLUMNS, rank, "segment", segments),
            "alloc_frames": pd.DataFrame(stacks.rows, columns=list(FRAME_COLUMNS[1:]))
            .astype({"stack": "int64", "depth": "int64", "line": "int64"})
            .assign(ipu=rank)[list(FRAME_COLUMNS)]}


def _final_state(snap: dict[str, Any], device: int, stacks: _Stacks,
                 blocks: list[list[Any]], segments: list[list[Any]],
                 open_blocks: dict[int, int], open_segments: dict[int, int],
                 span: tuple[int, int]) -> None:
    """Blocks and segments of the snapshot's final state that no event opened: live for the
    whole recording. Segment types come from there too."""
    first, last = span
    for seg in snap["segments"]:
        if not isinstance(seg, dict) or _whole(seg.get("device", 0)) != device:
            continue
        addr = _whole(seg.get("address", 0))
        kind = str(seg.get("segment_type", ""))[:16]
        k = open_segments.get(addr)
        if k is None:
            segments.append([addr, _whole(seg.get("total_size", 0)),
                             _whole(seg.get("stream", 0) or 0), kind, first, last, True, True])
        else:
            segments[k][3] = kind
        for b in seg.get("blocks") or []:
            if not isinstance(b, dict) or not str(b.get("state", "")).startswith("active"):
                continue
            baddr = _whole(b.get("address", 0))
            if baddr not in open_blocks:
                blocks.append([baddr, _whole(b.get("size", 0)),
                               _whole(seg.get("stream", 0) or 0), first, last, True, True,
                               stacks.of(b.get("frames"))])


def _frame(columns: tuple[str, ...], rank: int, key: str, rows: list[list[Any]]
           ) -> pd.DataFrame:
    rest = [c for c in columns if c not in ("ipu", key)]
    frame = pd.DataFrame(rows, columns=rest)
    for c in rest:
        if c in ("from_start", "to_end"):
            frame[c] = frame[c].astype(bool)
        elif c != "segment_type":
            frame[c] = frame[c].astype("int64")
    sizes = frame["bytes"].to_numpy()
    if ((sizes < 0) | (sizes > limits.MAX_MEMORY_BYTES)).any():
        raise ValueError("a block or segment size is below 0 or above 1 PiB")
    frame = frame.sort_values(["start", "addr"], kind="stable").reset_index(drop=True)
    frame.insert(0, key, np.arange(len(frame), dtype=np.int64))
    frame.insert(0, "ipu", np.full(len(frame), rank, dtype=np.int64))
    return frame[list(columns)]
