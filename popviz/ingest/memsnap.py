"""Liveness from what PyTorch records about memory: a `torch.cuda.memory._snapshot()` pickle
(plain or .gz), or the `[memory]` instant events of a Kineto trace (profile_memory=True).

Allocated bytes over time become the liveness table: `always_live_bytes` is the least
allocated over the recording (weights, optimiser state: what never goes away),
`not_always_live_bytes` the rest. Long recordings are thinned to MAX_POINTS by keeping each
bin's highest point, so peaks survive.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from popviz.errors import ProfileError, interrupted_by
from popviz.ingest import import_limits as limits

MAX_POINTS = 20_000
PHASE = {"F": "forward", "B": "backward", "WU": "optimiser", "": "other"}


class _DataOnly(pickle.Unpickler):
    """A snapshot is plain dicts, lists, tuples, numbers and strings: refuse anything that
    names a class or function, so a crafted pickle cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}: a memory snapshot holds "
                                     "plain data only")


def read_snapshot(path: str | Path) -> dict[str, Any]:
    """The snapshot's dict; ProfileError naming the file for anything else (a missing,
    too large or damaged file, a pickle naming a class, a structure not a snapshot's)."""
    path = Path(path)
    raw = limits.read_input(path, "memory snapshot")
    try:
        snap = _DataOnly(io.BytesIO(raw)).load()
    except MemoryError:
        raise ProfileError(f"{path}: the memory snapshot does not fit in memory") from None
    except Exception as exc:  # any unpickling failure: the file is damaged
        if interrupted_by(exc):  # a Ctrl-C, not damage
            raise KeyboardInterrupt from None
        # (no code runs: find_class refuses every class, so this is data only)
        raise ProfileError(f"{path}: not a torch.cuda.memory._snapshot() pickle "
                           f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]})") \
            from None
    del raw
    if not isinstance(snap, dict) or "device_traces" not in snap or "segments" not in snap:
        raise ProfileError(f"{path}: not a torch.cuda.memory._snapshot() pickle "
                           "(no segments / device_traces)")
    return snap


def snapshot_series(snap: dict[str, Any], path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """(time ns since the epoch, allocated bytes after each event, device) for the device
    with the most recorded events. The allocated level before the first event follows
    from the segments' allocated bytes at snapshot time minus the recorded net change.
    Every value is checked (sizes in 0..MAX_MEMORY_BYTES, times in range, allocated bytes
    never below 0): ProfileError naming the file otherwise."""
    try:
        return _series(snap, path)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError,
            IndexError) as exc:
        raise ProfileError(f"{path}: not a torch.cuda.memory._snapshot() pickle (an entry of "
                           f"an unexpected shape: {type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:100]})") from None


def _series(snap: dict[str, Any], path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    traces, segments = snap["device_traces"], snap["segments"]
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces) \
            or not isinstance(segments, list):
        raise ProfileError(f"{path}: not a torch.cuda.memory._snapshot() pickle "
                           "(device_traces / segments are not lists)")
    device = int(np.argmax([len(t) for t in traces])) if traces else 0
    events = traces[device] if traces else []
    if len(events) > limits.MAX_SNAPSHOT_EVENTS:
        raise ProfileError(f"{path}: more than {limits.MAX_SNAPSHOT_EVENTS:,} events "
                           "(POPVIZ_IMPORT_MAX_EVENTS); refused")
    sign = {"alloc": 1, "free_completed": -1}
    kept = [e for e in events if isinstance(e, dict) and e.get("action") in sign]
    if not kept:
        raise ProfileError(f"{path}: the snapshot has no alloc / free events (was "
                           "torch.cuda.memory._record_memory_history on?)")
    size = np.array([_whole(e["size"]) for e in kept], dtype=np.int64)
    time_us = np.array([_whole(e.get("time_us", 0)) for e in kept], dtype=np.int64)
    final = np.array([_whole(s.get("allocated_size", 0)) for s in segments
                      if _whole(s.get("device", 0)) == device], dtype=np.int64)
    if (size < 0).any() or (size > limits.MAX_MEMORY_BYTES).any() or (final < 0).any() \
            or (final > limits.MAX_MEMORY_BYTES).any():
        raise ProfileError(f"{path}: a size in the snapshot is below 0 or above 1 PiB")
    if (time_us < 0).any() or (time_us > limits.MAX_BASE_NS // 1000).any():  # epoch µs
        raise ProfileError(f"{path}: an event time (time_us) in the snapshot is out of range")
    delta = np.array([sign[e["action"]] for e in kept], dtype=np.int64) * size
    allocated = int(final.sum()) - int(delta.sum()) + np.cumsum(delta)
    if allocated.min() < 0:
        raise ProfileError(f"{path}: the snapshot's alloc / free events do not add up "
                           "(allocated bytes fall below 0)")
    return time_us * 1000, allocated, device


def _whole(value: Any) -> int:
    """A whole number within int64's safe range (ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{str(value)[:40]!r} is not a number")
    number = int(value)  # OverflowError / ValueError for inf / NaN
    if abs(number) >= limits.MAX_INT:
        raise ValueError(f"{number} is out of range")
    return number


def disjoint(time: np.ndarray, window: tuple[int, int]) -> bool:
    """Whether a snapshot's timed events all fall outside the trace's window (taken in
    another run); False when it has no usable times."""
    lo, hi = window
    if len(time) == 0 or hi <= lo or not time.any() or (time == time[0]).all():
        return False
    return not bool(((time >= lo) & (time <= hi)).any())


def mismatch(path: Path, time: np.ndarray, window: tuple[int, int], rank: int,
             used: bool = True) -> str | None:
    """Why a snapshot's events may not belong to the trace they are paired with: times
    missing, or mostly outside the trace's [first start, last end] (same clock), as when
    the snapshot was taken in another run; None when at least half fall inside. `used`:
    whether its curve replaces the trace's own memory events (the warning says which)."""
    lo, hi = window
    if len(time) == 0 or hi <= lo:
        return None
    name = Path(path).name
    if len(time) > 1 and (not time.any() or (time == time[0]).all()):
        return (f"memory snapshot {name} (rank {rank}) records no event times: its curve "
                "cannot be placed on the trace's clock, so it has no phases")
    inside = float(((time >= lo) & (time <= hi)).mean())
    if inside >= 0.5:
        return None
    if inside == 0:
        if time.min() > hi:
            where = f"starts {_seconds(time.min() - hi)} after the trace ends"
        elif time.max() < lo:
            where = f"ends {_seconds(lo - time.max())} before the trace starts"
        else:
            where = "falls in no part of the trace's span"
        return (f"memory snapshot {name} (rank {rank}): none of its {len(time):,} alloc / "
                f"free events is inside the trace's {_seconds(hi - lo)} span (it {where}): "
                "taken in another run? " + ("Its curve is kept without phases" if used else
                                            "It is not used: the trace's own memory events "
                                            "are shown"))
    return (f"memory snapshot {name} (rank {rank}): only {inside:.0%} of its "
            f"{len(time):,} alloc / free events are inside the trace's span: those outside "
            "it have no phase")


def _seconds(ns: float) -> str:
    return f"{ns / 1e9:,.1f} s" if ns >= 1e9 else f"{ns / 1e6:,.1f} ms"


def thin(time: np.ndarray, allocated: np.ndarray,
         limit: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most `limit` points: the highest point of each of `limit` equal index bins."""
    if len(time) <= limit:
        return time, allocated
    bins = np.arange(len(time)) * limit // len(time)
    order = np.lexsort((-allocated, bins))
    first = np.ones(len(order), dtype=bool)
    first[1:] = bins[order][1:] != bins[order][:-1]
    pick = np.sort(order[first])
    return time[pick], allocated[pick]


def liveness_rows(rank: int, time: np.ndarray, allocated: np.ndarray,
                  labels: tuple[np.ndarray, np.ndarray, np.ndarray]) -> pd.DataFrame:
    """The liveness table of one rank from allocated bytes over time (ns on the profile's
    clock) and the stage / pass / micro-batch at each point."""
    stage, ps, mb = labels
    base = int(allocated.min()) if len(allocated) else 0
    return pd.DataFrame({
        "ipu": rank, "step": np.arange(len(time), dtype=np.int64),
        "phase": [PHASE.get(p, "other") for p in ps],
        "always_live_bytes": np.full(len(time), base, dtype=np.int64),
        "not_always_live_bytes": (allocated - base).astype(np.int64),
        "label": "", "microbatch": mb, "stage": stage, "pass": ps, "training_step": 0,
        "stashed_microbatches": 0, "time": time.astype(np.int64)})


def trace_series(memory: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Allocated bytes over time from a trace's [memory] events: the GPU's (the device
    with most events) when there are any, else the host's; and that GPU's id (None for
    the host's memory, or no events)."""
    if memory.empty:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), None
    gpu = memory[memory["device_type"] == 1]
    mem = gpu if len(gpu) else memory[memory["device_type"] == 0]
    if len(mem) and mem["device_id"].nunique() > 1:
        mem = mem[mem["device_id"] == mem["device_id"].value_counts().idxmax()]
    mem = mem.sort_values("time", kind="stable")
    device = int(mem["device_id"].iloc[0]) if len(gpu) else None
    return mem["time"].to_numpy(np.int64), mem["allocated"].to_numpy(np.int64), device
