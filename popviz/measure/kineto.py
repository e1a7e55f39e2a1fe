"""Read one Kineto / Chrome trace (torch.profiler's `export_chrome_trace`, plain or .gz) into
columns, fast and without holding every event as a Python object at once.

torch.profiler's own layout goes through the vectorised reader (kineto_fast.py). Anything
else goes through `read_general`: the `traceEvents` array is cut into slices of about
CHUNK_BYTES at event boundaries and each slice is decoded on its own (orjson when
installed, else json); only the fields popviz uses are kept, as numpy columns. A cut is only
a guess (`}` `,` `{` may sit inside an event), but a wrong cut leaves unbalanced brackets,
which the decoder refuses, so the next candidate is tried: the result never depends on the
guess. Times are ns since the file's `baseTimeNanoseconds` (see docs/import.md).
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from popviz.errors import ProfileError

try:  # optional: 3-4x faster than json on large traces
    import orjson

    _loads = orjson.loads
    _DecodeError: tuple[type[Exception], ...] = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - json is always there
    _loads = json.loads
    _DecodeError = (ValueError,)

CHUNK_BYTES = 4 << 20
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BETWEEN = re.compile(rb"\}\s*,\s*\{")
_LAST = re.compile(rb"\}\s*\]")
_EMPTY: dict[str, Any] = {}

# categories of complete ('X') events that popviz reads; the rest (python_function, Trace,
# overhead, cuda_driver, ...) are skipped before any per-event work
KEEP_CATS = frozenset({"cpu_op", "user_annotation", "gpu_user_annotation", "kernel",
                       "gpu_memcpy", "gpu_memset", "cuda_runtime"})
SPAN_COLUMNS = ["cat", "name", "tid", "ts", "dur", "ext", "corr", "stream", "bytes",
                "dims", "types", "concrete", "flops", "collective", "nelems", "dtype",
                "src_rank", "dst_rank"]


@dataclass
class KinetoTrace:
    """One rank's trace: `spans` (complete events of KEEP_CATS, times in ns since
    `base_ns`), `memory` ([memory] instant events: ts ns, allocated, device type and id)
    and the file's top-level fields (`meta`: distributedInfo, deviceProperties, ...)."""

    path: Path
    meta: dict[str, Any]
    spans: pd.DataFrame
    memory: pd.DataFrame
    base_ns: int = 0
    rank: int = 0
    world_size: int = 1
    backend: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def read_bytes(path: Path) -> bytes:
    """The file's JSON text; a missing, unreadable or cut-short file is a ProfileError."""
    try:
        raw = path.read_bytes()
        return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such trace file") from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise ProfileError(f"{path}: cannot read: {exc}") from None


def _decode(text: bytes | bytearray | memoryview) -> Any:
    return _loads(bytes(text))


def iter_events(data: bytes, path: Path) -> Any:
    """Yield (top-level fields or None, list of event dicts), one slice at a time; the
    top-level fields come with the last slice."""
    key = _KEY.search(data)
    if key is None:
        raise ProfileError(f"{path}: not a Chrome / Kineto trace (no traceEvents array)")
    begin = pos = key.end()
    view = memoryview(data)
    size = len(data)
    while True:
        while pos < size and data[pos] in b" \t\r\n":
            pos += 1
        if pos >= size:
            raise ProfileError(f"{path}: cut short inside traceEvents")
        if data[pos] == ord("]"):  # empty array, or a trailing comma-free end
            yield _top_level(data, begin, pos, path), []
            return
        events, pos, last = _next_slice(data, view, pos, path)
        if last:
            yield _top_level(data, begin, pos, path), events
            return
        yield None, events


def _next_slice(data: bytes, view: memoryview, pos: int,
                path: Path) -> tuple[list[dict], int, bool]:
    """Decode the events from `pos` to a cut near pos + CHUNK_BYTES; returns them, the next
    position and whether the array ended (then the position is at its ']')."""
    for match in _BETWEEN.finditer(data, pos + CHUNK_BYTES):
        try:
            events = _decode(b"[" + view[pos:match.start() + 1] + b"]")
        except _DecodeError:
            continue  # the cut fell inside an event: try the next one
        return events, match.end() - 1, False
    for match in _LAST.finditer(data, pos):
        try:
            events = _decode(b"[" + view[pos:match.start() + 1] + b"]")
        except _DecodeError:
            continue
        return events, match.end() - 1, True
    raise ProfileError(f"{path}: not valid JSON in traceEvents (cut short or corrupt)")


def _top_level(data: bytes, begin: int, end: int, path: Path) -> dict[str, Any]:
    try:
        top = _decode(data[:begin] + b"]" + data[end + 1:])
    except _DecodeError:
        raise ProfileError(f"{path}: not valid JSON outside traceEvents") from None
    if not isinstance(top, dict):
        raise ProfileError(f"{path}: not a Chrome / Kineto trace (top level is not an object)")
    top.pop("traceEvents", None)
    return top


def _span_columns(evs: list[dict]) -> dict[str, list]:
    """The columns of SPAN_COLUMNS for complete events of KEEP_CATS (one pass per field:
    list comprehensions over dicts are the fastest pure-Python way)."""
    evs = [e for e in evs if e.get("ph") == "X" and e.get("cat") in KEEP_CATS]
    args = [e.get("args") or _EMPTY for e in evs]
    cat = [e["cat"] for e in evs]
    is_op = [c == "cpu_op" or c == "user_annotation" for c in cat]
    is_gpu = [c in ("kernel", "gpu_memcpy", "gpu_memset") for c in cat]
    cols: dict[str, list] = {
        "cat": cat, "name": [e.get("name", "") for e in evs],
        "tid": [str(e.get("tid", "")) for e in evs],
        "ts": [e.get("ts", 0.0) for e in evs], "dur": [e.get("dur", 0.0) for e in evs],
        "ext": [a.get("External id", -1) for a in args],
        "corr": [a.get("correlation", -1) for a in args],
        "stream": [a.get("stream", -1) if g else -1 for a, g in zip(args, is_gpu)],
        "bytes": [a.get("bytes", 0) if g else 0 for a, g in zip(args, is_gpu)],
        # shapes stay Python objects until an ops-table row needs them as text
        "dims": [a.get("Input Dims") if o else None for a, o in zip(args, is_op)],
        "types": [a.get("Input type") if o else None for a, o in zip(args, is_op)],
        "concrete": [a.get("Concrete Inputs") if o else None for a, o in zip(args, is_op)],
        "flops": [a.get("flops", 0) for a in args],
    }
    coll = [a.get("Collective name") for a in args]
    cols["collective"] = [c or "" for c in coll]
    cols["nelems"] = [a.get("In msg nelems", 0) if c else 0 for a, c in zip(args, coll)]
    cols["dtype"] = [a.get("dtype", "") if c else "" for a, c in zip(args, coll)]
    cols["src_rank"] = [a.get("Src Rank", -1) if c else -1 for a, c in zip(args, coll)]
    cols["dst_rank"] = [a.get("Dst Rank", -1) if c else -1 for a, c in zip(args, coll)]
    return cols


def _memory_columns(evs: list[dict]) -> dict[str, list]:
    mem = [e for e in evs if e.get("ph") == "i" and e.get("name") == "[memory]"]
    args = [e.get("args") or _EMPTY for e in mem]
    return {"ts": [e.get("ts", 0.0) for e in mem],
            "allocated": [a.get("Total Allocated", 0) for a in args],
            "device_type": [a.get("Device Type", 0) for a in args],
            "device_id": [a.get("Device Id", -1) for a in args]}


def _int(values: list, default: int = -1) -> np.ndarray:
    """int64 column from JSON values that may be strings or missing."""
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError):
        return np.asarray([_as_int(v, default) for v in values], dtype=np.int64)


def _as_int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _frame(parts: list[dict[str, list]], columns: list[str]) -> dict[str, list]:
    return {c: [v for part in parts for v in part[c]] for c in columns}


def array_end(data: bytes, begin: int, path: Path) -> tuple[int, dict[str, Any]]:
    """Position of the `]` closing traceEvents (the array starts at `begin`) and the
    top-level fields: the last `]` whose remainder makes the document whole."""
    end = len(data)
    for _ in range(64):
        end = data.rfind(b"]", begin, end)
        if end < 0:
            break
        try:
            return end, _top_level(data, begin + 1, end, path)
        except ProfileError:
            continue
    raise ProfileError(f"{path}: not valid JSON outside traceEvents (cut short or corrupt)")


def read_trace(path: str | Path) -> KinetoTrace:
    """Parse one trace file into a KinetoTrace; ProfileError (one line) if it is not one.
    The vectorised reader (kineto_fast) takes the layout torch.profiler writes; anything
    else goes through the general chunked decoder."""
    from popviz.measure import kineto_fast

    path = Path(path)
    data = read_bytes(path)
    key = _KEY.search(data)
    if key is None:
        raise ProfileError(f"{path}: not a Chrome / Kineto trace (no traceEvents array)")
    try:
        end, top = array_end(data, key.end() - 1, path)
        spans, memory = kineto_fast.fast_frames(data, key.end() - 1, end)
    except (kineto_fast.NotKineto, ProfileError):
        spans, memory, top = read_general(data, path)
    del data
    dist = top.get("distributedInfo") or {}
    return KinetoTrace(path=path, meta=top, spans=spans, memory=memory,
                       base_ns=_as_int(top.get("baseTimeNanoseconds", 0), 0),
                       rank=_as_int(dist.get("rank", 0), 0),
                       world_size=max(1, _as_int(dist.get("world_size", 1), 1)),
                       backend=str(dist.get("backend", "")))


def read_general(data: bytes, path: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Any Chrome trace JSON: decoded in slices of CHUNK_BYTES (see the module doc)."""
    spans_parts: list[dict[str, list]] = []
    mem_parts: list[dict[str, list]] = []
    top: dict[str, Any] = {}
    try:
        for head, events in iter_events(data, path):
            spans_parts.append(_span_columns(events))
            mem_parts.append(_memory_columns(events))
            if head is not None:
                top = head
    except (AttributeError, TypeError, KeyError) as exc:
        raise ProfileError(f"{path}: events of an unexpected shape ({exc})") from None
    s = _frame(spans_parts, SPAN_COLUMNS)
    del spans_parts
    ts = np.asarray(s["ts"], dtype=np.float64)
    dur = np.asarray(s["dur"], dtype=np.float64)
    start = np.rint(ts * 1000.0).astype(np.int64)
    spans = pd.DataFrame({
        "cat": pd.Categorical(s["cat"]), "name": pd.Categorical(s["name"]),
        "tid": pd.Categorical(s["tid"]), "start": start,
        "end": start + np.rint(np.maximum(dur, 0.0) * 1000.0).astype(np.int64),
        "ext": _int(s["ext"]), "corr": _int(s["corr"]), "stream": _int(s["stream"]),
        "bytes": _int(s["bytes"], 0), "flops": _int(s["flops"], 0),
        "dims": s["dims"], "types": s["types"], "concrete": s["concrete"],
        "collective": pd.Categorical(s["collective"]), "nelems": _int(s["nelems"], 0),
        "dtype": s["dtype"], "src_rank": _int(s["src_rank"]),
        "dst_rank": _int(s["dst_rank"]),
    })
    m = _frame(mem_parts, ["ts", "allocated", "device_type", "device_id"])
    memory = pd.DataFrame({
        "time": np.rint(np.asarray(m["ts"], dtype=np.float64) * 1000.0).astype(np.int64),
        "allocated": _int(m["allocated"], 0), "device_type": _int(m["device_type"], 0),
        "device_id": _int(m["device_id"])})
    return spans, memory, top
