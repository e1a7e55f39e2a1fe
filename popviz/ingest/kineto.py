"""Read one Kineto / Chrome trace (torch.profiler's `export_chrome_trace`, plain or .gz) into
columns, fast and without holding every event as a Python object at once.

torch.profiler's own layout goes through the vectorised reader (kineto_fast.py). Anything
else goes through `read_general`: one linear pass over the bytes (kineto_scan.blocks: the
strings, the brackets outside them, every event's opening brace) finds where each event
of the `traceEvents` array begins; slices of about CHUNK_BYTES of whole events are then
decoded on their own (orjson when installed, else json), once each, so a decoding error is
the file's, named with its byte offset, and the time stays linear whatever the input.
Only the fields popviz uses are kept, as numpy columns. Sizes are bounded before anything
is allocated (import_limits.py). Times are ns since the file's `baseTimeNanoseconds` (see
docs/import.md); an event whose ts or dur is not a finite number of µs within
import_limits.MAX_TIME_NS is dropped with a counted warning.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from popviz.errors import ProfileError
from popviz.ingest import import_limits as limits
from popviz.ingest import kineto_scan as scan
from popviz.ingest.kineto_launch import launch_of

try:  # optional: 3-4x faster than json on large traces
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - json is always there
    _loads = json.loads

CHUNK_BYTES = 4 << 20
MAX_TOP_BYTES = 64 << 20  # the document outside traceEvents (metadata: a few KB)
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_EMPTY: dict[str, Any] = {}

# categories of complete ('X') events that popviz reads; the rest (python_function, Trace,
# overhead, ...) are skipped before any per-event work; cuda_driver calls (cuLaunchKernel
# of cutlass kernels) launch kernels as runtime calls do (host_slices, flow arrows)
KEEP_CATS = frozenset({"cpu_op", "user_annotation", "gpu_user_annotation", "kernel",
                       "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver"})
SPAN_COLUMNS = ["cat", "name", "tid", "ts", "dur", "ext", "corr", "stream", "bytes",
                "dims", "types", "concrete", "flops", "collective", "nelems", "dtype",
                "src_rank", "dst_rank", "launch"]


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
    warnings: list[str] = field(default_factory=list)


def read_bytes(path: Path) -> bytes:
    """The file's JSON text; a missing, unreadable, cut-short or too large file is a
    ProfileError."""
    return limits.read_input(path, "trace file")


def _decode_error(exc: Exception) -> str:
    """A decoder's complaint in one short line (without json's line and column inside
    the slice it was given, or its advice on int digits)."""
    text = str(getattr(exc, "msg", exc)).split("; use sys.")[0]
    return " ".join(text.split())[:160]


def _top_level(data: bytes, begin: int, end: int, path: Path) -> dict[str, Any]:
    if begin + len(data) - end > MAX_TOP_BYTES:
        raise ProfileError(f"{path}: {_too_much_outside(data, begin, end)}")
    try:
        top = _loads(data[:begin] + b"]" + data[end + 1:])
    except (ValueError, RecursionError):  # orjson's and json's errors are ValueErrors
        raise ProfileError(f"{path}: not valid JSON outside traceEvents") from None
    if not isinstance(top, dict):
        raise ProfileError(f"{path}: not a Chrome / Kineto trace (top level is not an object)")
    top.pop("traceEvents", None)
    return top


def _too_much_outside(data: bytes, begin: int, end: int) -> str:
    """Why the document outside traceEvents (before `begin`, after `end`) is too large,
    naming the string that makes it so, and its key, when one does."""
    size, key = 0, None
    arr = np.frombuffer(data, dtype=np.uint8)
    for lo, hi in ((0, begin), (end + 1, len(data))):
        quotes = np.flatnonzero(arr[lo:hi] == 34) + lo
        if len(quotes) and (arr[lo:hi] == 92).any():  # \" inside a string: not a quote
            quotes = quotes[~scan._escaped(arr, lo, hi, quotes,
                                           np.ones(len(quotes), dtype=bool), 0)[0]]
        if len(quotes) < 2:
            continue
        opens, closes = quotes[0:len(quotes) // 2 * 2:2], quotes[1::2]
        longest = int(np.argmax(closes - opens))
        if int(closes[longest] - opens[longest]) - 1 > size:
            size = int(closes[longest] - opens[longest]) - 1
            key = None
            if longest and data[closes[longest - 1] + 1:opens[longest]].strip() == b":":
                key = data[opens[longest - 1] + 1:closes[longest - 1]][:80].decode(
                    "utf-8", "replace")
    if size * 2 < begin + len(data) - end:  # no one string makes it too large
        return f"more than {MAX_TOP_BYTES:,} bytes outside traceEvents; refused"
    where = f"field {json.dumps(key)}" if key is not None else "a value"
    return (f"{where} outside traceEvents is a string of {size:,} bytes, past the "
            f"{MAX_TOP_BYTES:,} bytes a trace may hold outside traceEvents; refused")


def event_starts(data: bytes, begin: int, end: int, path: Path) -> np.ndarray:
    """Where each event of the array between `begin` (its `[`) and `end` (its `]`) opens:
    one pass over the bytes, strings and brackets checked (kineto_scan.blocks), at most
    MAX_EVENTS of them; ProfileError naming the file otherwise."""
    arr = np.frombuffer(data, dtype=np.uint8)
    opens: list[np.ndarray] = []
    count = 0
    try:
        for _, o in scan.blocks(arr, begin, end):
            count += len(o)
            limits.check_event_count(count)
            opens.append(o)
    except scan.NotKineto:
        raise ProfileError(f"{path}: not valid JSON in traceEvents (unbalanced brackets or "
                           "quotes, or an element that is not an object)") from None
    except limits.LimitError as exc:
        raise ProfileError(f"{path}: {exc}") from None
    return np.concatenate(opens) if opens else np.zeros(0, dtype=np.int64)


def iter_events(data: bytes, begin: int, end: int, path: Path) -> Any:
    """Lists of event dicts, about CHUNK_BYTES of whole events at a time; each slice is
    decoded once (a decoding error is the file's: ProfileError with its byte offset)."""
    opens = event_starts(data, begin, end, path)
    view = memoryview(data)
    i = 0
    while i < len(opens):
        j = max(i + 1, int(np.searchsorted(opens, opens[i] + CHUNK_BYTES)))
        first = int(opens[i])
        stop = int(opens[j]) if j < len(opens) else end
        text = bytes(view[first:stop]).rstrip(b" \t\r\n,")
        try:
            events = _loads(b"[" + text + b"]")
        except (ValueError, RecursionError) as exc:
            at = getattr(exc, "pos", None)
            where = f" near byte {first + at - 1:,}" if isinstance(at, int) else ""
            raise ProfileError(f"{path}: not valid JSON in traceEvents{where}: "
                               f"{_decode_error(exc)}") from None
        yield events
        i = j


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
    cols["launch"] = [launch_of(a) if c == "kernel" else None for a, c in zip(args, cat)]
    return cols


def _memory_columns(evs: list[dict]) -> dict[str, list]:
    mem = [e for e in evs if e.get("ph") == "i" and e.get("name") == "[memory]"]
    args = [e.get("args") or _EMPTY for e in mem]
    return {"ts": [e.get("ts", 0.0) for e in mem],
            "allocated": [a.get("Total Allocated", 0) for a in args],
            "device_type": [a.get("Device Type", 0) for a in args],
            "device_id": [a.get("Device Id", -1) for a in args]}


def _int(values: list, default: int = -1) -> np.ndarray:
    """int64 column from JSON values that may be strings, missing, or out of range
    (`default` for anything that is not a whole number within +-2**62)."""
    try:
        out = np.asarray(values, dtype=np.int64)
        if not len(out) or np.abs(out).max() < limits.MAX_INT:
            return out
    except (TypeError, ValueError, OverflowError):
        pass
    return np.asarray([_as_int(v, default) for v in values], dtype=np.int64)


def _as_int(value: Any, default: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if -limits.MAX_INT < number < limits.MAX_INT else default


def _float(values: list) -> np.ndarray:
    """float64 column (NaN for what is not a number: such events are dropped)."""
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return np.asarray([_as_float(v) for v in values], dtype=np.float64)


def _as_float(value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _frame(parts: list[dict[str, list]], columns: list[str]) -> dict[str, list]:
    return {c: [v for part in parts for v in part[c]] for c in columns}


def array_end(data: bytes, begin: int, path: Path) -> tuple[int, dict[str, Any]]:
    """Position of the `]` closing traceEvents (the array starts at `begin`) and the
    top-level fields: the last `]` whose remainder makes the document whole (64 tries,
    each over the bytes outside the array only), else the bracket a scan of the array's
    strings and brackets finds closing it (fields with many lists after the array)."""
    end = len(data)
    for _ in range(64):
        end = data.rfind(b"]", begin, end)
        if end < 0 or begin + len(data) - end > MAX_TOP_BYTES:
            break
        try:
            return end, _top_level(data, begin + 1, end, path)
        except ProfileError:
            continue
    close: list[int] = []
    with contextlib.suppress(scan.NotKineto, limits.LimitError):
        for _ in scan.blocks(np.frombuffer(data, dtype=np.uint8), begin, len(data),
                             close=close):
            pass
    if close and data[close[0]] == ord("]"):
        return close[0], _top_level(data, begin + 1, close[0], path)
    raise ProfileError(f"{path}: not valid JSON outside traceEvents (cut short or corrupt)")


def read_trace(path: str | os.PathLike[str]) -> KinetoTrace:
    """Parse one trace file into a KinetoTrace; ProfileError (one line) if it is not one.
    The vectorised reader (kineto_fast) takes the layout torch.profiler writes; anything
    else goes through the general chunked decoder. Declared ranks, world size and base
    time are checked against import_limits."""
    from popviz.ingest import kineto_fast

    path = Path(path)
    data = read_bytes(path)
    key = _KEY.search(data)
    if key is None:
        raise ProfileError(f"{path}: not a Chrome / Kineto trace (no traceEvents array)")
    end, top = array_end(data, key.end() - 1, path)
    warnings: list[str] = []
    try:
        spans, memory = kineto_fast.fast_frames(data, key.end() - 1, end)
    except limits.LimitError as exc:
        raise ProfileError(f"{path}: {exc}") from None
    except kineto_fast.NotKineto:
        spans, memory, _ = read_general(data, path, warnings, (key.end() - 1, end, top))
    del data
    spans, memory = kept_values(spans, memory, path, warnings)
    trace = KinetoTrace(path=path, meta=top, spans=spans, memory=memory, warnings=warnings)
    declared(trace)
    return trace


def declared(trace: KinetoTrace) -> None:
    """Rank, world size, backend and base time from the top-level fields, each checked:
    ProfileError naming the file when out of range (a rank of -1, a world of 10**12)."""
    top, path = trace.meta, trace.path
    dist = top.get("distributedInfo") or {}
    if not isinstance(dist, dict):
        raise ProfileError(f"{path}: distributedInfo is not an object")
    world = _as_int(dist.get("world_size", 1), -1)
    rank = _as_int(dist.get("rank", 0), -1)
    if not 1 <= world <= limits.MAX_WORLD:
        raise ProfileError(f"{path}: distributedInfo.world_size "
                           f"{str(dist.get('world_size'))[:40]} is not a count of ranks in "
                           f"1..{limits.MAX_WORLD:,}")
    if not 0 <= rank < world:
        raise ProfileError(f"{path}: distributedInfo.rank {str(dist.get('rank'))[:40]} is "
                           f"not a rank of its world of {world:,}")
    base = _as_int(top.get("baseTimeNanoseconds", 0), -1)
    if not 0 <= base <= limits.MAX_BASE_NS:
        raise ProfileError(f"{path}: baseTimeNanoseconds "
                           f"{str(top.get('baseTimeNanoseconds'))[:40]} is not a time in ns "
                           "since the epoch")
    trace.rank, trace.world_size, trace.base_ns = rank, world, base
    trace.backend = str(dist.get("backend", ""))[:100]


def kept_values(spans: pd.DataFrame, memory: pd.DataFrame, path: Path,
                warnings: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Sizes clipped into the format's range (bytes, elements, FLOPs >= 0); [memory]
    events whose allocated bytes are negative or beyond MAX_MEMORY_BYTES dropped with a
    counted warning (their liveness would be refused by the reader)."""
    for col in ("bytes", "nelems", "flops"):
        spans[col] = np.clip(spans[col].to_numpy(np.int64), 0, limits.MAX_MEMORY_BYTES)
    alloc = memory["allocated"].to_numpy(np.int64)
    bad = (alloc < 0) | (alloc > limits.MAX_MEMORY_BYTES)
    if bad.any():
        warnings.append(f"{path.name}: {int(bad.sum()):,} [memory] event(s) with allocated "
                        "bytes below 0 or above 1 PiB dropped")
        memory = memory[~bad].reset_index(drop=True)
    return spans, memory


def _times(ts: list, dur: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start ns, end ns, kept) from ts and dur in µs: kept where both are finite and
    within MAX_TIME_NS (a negative dur counts as 0, as the vectorised reader reads it)."""
    with np.errstate(over="ignore", invalid="ignore"):  # 1e308 x 1000: inf, dropped
        t = _float(ts) * 1000.0
        d = _float(dur) * 1000.0
    ok = np.isfinite(t) & np.isfinite(d) & (np.abs(t) <= limits.MAX_TIME_NS) \
        & (d <= limits.MAX_TIME_NS)
    d = np.maximum(d, 0.0)
    start = np.rint(np.where(ok, t, 0.0)).astype(np.int64)
    return start, start + np.rint(np.where(ok, d, 0.0)).astype(np.int64), ok


def read_general(data: bytes, path: Path, warnings: list[str] | None = None,
                 array: tuple[int, int, dict[str, Any]] | None = None,
                 ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Any Chrome trace JSON: decoded in slices of CHUNK_BYTES (see the module doc).
    `array`: (its `[`, its `]`, the top-level fields) when already found. Events with a
    time that is not a finite number in range are dropped; `warnings` gets their count."""
    if array is None:
        key = _KEY.search(data)
        if key is None:
            raise ProfileError(f"{path}: not a Chrome / Kineto trace (no traceEvents array)")
        array = (key.end() - 1, *array_end(data, key.end() - 1, path))
    begin, end, top = array
    spans_parts: list[dict[str, list]] = []
    mem_parts: list[dict[str, list]] = []
    try:
        for events in iter_events(data, begin, end, path):
            spans_parts.append(_span_columns(events))
            mem_parts.append(_memory_columns(events))
    except (AttributeError, TypeError, KeyError, ValueError) as exc:
        raise ProfileError(f"{path}: events of an unexpected shape "
                           f"({_decode_error(exc)})") from None
    s = _frame(spans_parts, SPAN_COLUMNS)
    del spans_parts
    start, end_ns, ok = _times(s["ts"], s["dur"])
    m = _frame(mem_parts, ["ts", "allocated", "device_type", "device_id"])
    m_start, _, m_ok = _times(m["ts"], [0] * len(m["ts"]))
    dropped = int((~ok).sum()) + int((~m_ok).sum())
    if dropped and warnings is not None:
        warnings.append(f"{path.name}: {dropped:,} event(s) whose ts or dur is not a "
                        f"finite number of µs within {limits.MAX_TIME_NS // 1000:,} "
                        "dropped")
    try:
        spans = pd.DataFrame({
            "cat": pd.Categorical(s["cat"]), "name": pd.Categorical(_texts(s["name"])),
            "tid": pd.Categorical(s["tid"]), "start": start, "end": end_ns,
            "ext": _int(s["ext"]), "corr": _int(s["corr"]), "stream": _int(s["stream"]),
            "bytes": _int(s["bytes"], 0), "flops": _int(s["flops"], 0),
            "dims": s["dims"], "types": s["types"], "concrete": s["concrete"],
            "collective": pd.Categorical(_texts(s["collective"])),
            "nelems": _int(s["nelems"], 0), "dtype": _texts(s["dtype"]),
            "src_rank": _int(s["src_rank"]), "dst_rank": _int(s["dst_rank"]),
            "launch": pd.Series(s["launch"], dtype=object),
        })[ok].reset_index(drop=True)
    except TypeError as exc:  # an unhashable name (a list, an object)
        raise ProfileError(f"{path}: events of an unexpected shape "
                           f"({_decode_error(exc)})") from None
    memory = pd.DataFrame({
        "time": m_start, "allocated": _int(m["allocated"], 0),
        "device_type": _int(m["device_type"], 0),
        "device_id": _int(m["device_id"])})[m_ok].reset_index(drop=True)
    return spans, memory, top


def _texts(values: list) -> list[str]:
    """Text of names and similar fields (a number or list where a string belongs: its
    JSON-ish text, as the vectorised reader reads it)."""
    return [v if isinstance(v, str) else str(v) for v in values]
