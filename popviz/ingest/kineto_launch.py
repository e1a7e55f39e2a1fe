"""A kernel's launch as torch.profiler (CUPTI) records it in the kernel event's args: grid
and block dimensions, registers per thread, static + dynamic shared memory, and CUPTI's
occupancy estimates. Both readers keep it per kernel span as one tuple (`launch`, LAUNCH
order; None for every other span), and `launch_table` turns a rank's into the profile's
optional `kernels` table, keyed by (rank, correlation) like the trace's kernel rows.

    (grid, block, registers, shared_bytes, occupancy_pct, blocks_per_sm, warps_per_sm)
    ("1568,1,64", "256,1,1", 32.0, 4224.0, 100.0, 760.242432, 6081.939453)

A field the event lacks is "" (dimensions) or NaN (numbers)."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd

from popviz.format.schema import LAUNCH_ARGS, OPTIONAL_COLUMNS

# the args key of each field, in tuple order; the first two are lists of up to three ints
LAUNCH_KEYS = tuple(LAUNCH_ARGS.values())
DIMENSIONS = 2
_INTEGER = re.compile(rb"-?(?:0|[1-9][0-9]*)")  # a JSON integer, nothing else
KERNEL_COLUMNS = OPTIONAL_COLUMNS["kernels"]
Launch = tuple[str, str, float, float, float, float, float]


def dimensions(value: Any) -> str:
    """[1568, 1, 64] -> "1568,1,64"; anything else (absent, not a list of ints) -> ""."""
    if not isinstance(value, list) or not value or len(value) > 3 or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return ""
    return ",".join(str(v) for v in value)


def number(value: Any) -> float:
    """A finite number as a float; anything else NaN."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    try:
        out = float(value)
    except OverflowError:  # an integer past a double (10**400): as the raw text reads
        return math.nan
    return out if math.isfinite(out) else math.nan


def launch_of(args: dict[str, Any]) -> Launch | None:
    """The launch fields of one kernel event's args; None when it has none of them."""
    if not any(k in args for k in LAUNCH_KEYS):
        return None
    get = args.get
    return (dimensions(get("grid")), dimensions(get("block")),
            *(number(get(k)) for k in LAUNCH_KEYS[DIMENSIONS:]))  # type: ignore[return-value]  # seven fields by construction


def dimensions_text(raw: bytes) -> str:
    """A JSON list's raw text as the vectorised reader cuts it ("[\\n1568,\\n1,\\n64\\n],")
    -> "1568,1,64", as `dimensions` reads the decoded list."""
    body = raw.rstrip(b" \t\r\n,{}").replace(b" ", b"").replace(b"\n", b"").replace(
        b"\r", b"").replace(b"\t", b"")
    if not (body.startswith(b"[") and body.endswith(b"]")):
        return ""
    parts = body[1:-1].split(b",")
    if not parts or len(parts) > 3 or not all(_INTEGER.fullmatch(p) for p in parts):
        return ""
    return ",".join(str(int(p)) for p in parts)


def number_text(raw: bytes) -> float:
    """A JSON number's raw text ("760.242432,\\n}") as a float; anything else NaN."""
    body = raw.rstrip(b" \t\r\n,{}").strip()
    if not body or body[:1] in (b'"', b"[", b"{", b"t", b"f", b"n"):
        return math.nan
    try:
        out = float(body)
    except ValueError:
        return math.nan
    return out if math.isfinite(out) else math.nan


def launch_table(spans: pd.DataFrame, rank: int) -> pd.DataFrame:
    """The `kernels` table of one rank: a row per kernel span with launch fields whose
    correlation id is its own."""
    if "launch" not in spans or spans.empty:
        return pd.DataFrame({c: [] for c in KERNEL_COLUMNS})
    launch = spans["launch"].to_numpy()
    corr = spans["corr"].to_numpy(np.int64)
    # a row per (rank, correlation) that names one kernel: kernels replayed from one CUDA
    # graph share their launch's id, and -1 is no id; those get no launch rather than a
    # neighbour's
    kernel = (spans["cat"].astype(str) == "kernel").to_numpy() & (corr >= 0)
    ids, counts = np.unique(corr[kernel], return_counts=True)
    single = np.isin(corr, ids[counts == 1]) & kernel
    have = np.flatnonzero(single & np.fromiter((x is not None for x in launch), bool,
                                               len(launch)))
    fields = list(zip(*launch[have])) if len(have) else [()] * len(LAUNCH_KEYS)
    out: dict[str, Any] = {"ipu": np.full(len(have), rank, dtype=np.int64),
                           "correlation": corr[have]}
    for name, values in zip(KERNEL_COLUMNS[2:], fields, strict=True):
        out[name] = (np.asarray(values, dtype=object) if name in ("grid", "block")
                     else np.asarray(values, dtype=np.float64))
    return pd.DataFrame(out)
