"""The ops table grouped (by op, op class, module, pass ...): counts, totals and shares,
and for an import (host ops that nest, each with the GPU time of the kernels it launched)
self vs inclusive time, as PyTorch's profiler and Perfetto report them."""

from __future__ import annotations

import numpy as np
import pandas as pd

GROUP_KEYS = ("op", "op_class", "module", "phase", "pass", "stage", "ipu")


def nesting(ops: pd.DataFrame) -> np.ndarray:
    """Each op's parent row position (-1: none): the innermost op on the same device whose
    [start, end] holds it. Ops sorted by start, longer first, swept with a stack."""
    parent = np.full(len(ops), -1, dtype=np.int64)
    if ops.empty or not {"start", "end"} <= set(ops.columns):
        return parent
    start = ops["start"].to_numpy(np.int64)
    end = ops["end"].to_numpy(np.int64)
    device = ops["ipu"].to_numpy(np.int64) if "ipu" in ops.columns else np.zeros(len(ops))
    order = np.lexsort((-end, start, device))
    stack: list[int] = []
    last_device = None
    for i in order:
        if device[i] != last_device:
            stack, last_device = [], device[i]
        while stack and end[stack[-1]] < end[i]:  # ended before this one does: closed
            stack.pop()
        if stack and start[stack[-1]] <= start[i]:
            parent[i] = stack[-1]
        stack.append(int(i))
    return parent


def nested_in_group(parent: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Whether each op runs inside another op of its own group (an ancestor with the same
    `key`): its inclusive time is already in that ancestor's."""
    nested = np.zeros(len(parent), dtype=bool)
    above = parent.copy()
    while (live := above >= 0).any():
        at = np.flatnonzero(live)
        nested[at] |= key[above[at]] == key[at]
        above[at] = parent[above[at]]
    return nested


def self_and_inclusive(ops: pd.DataFrame, parent: np.ndarray | None = None) -> pd.DataFrame:
    """Per op: host_inclusive (its own span), host_self (minus its children's spans),
    gpu_self (its kernels' time, the `cycles` of an import) and gpu_inclusive (with its
    descendants'). In the profile's time unit (ns). `parent`: `nesting(ops)`, if known."""
    parent = nesting(ops) if parent is None else parent
    span = (ops["end"] - ops["start"]).to_numpy(np.int64)
    gpu = pd.to_numeric(ops["cycles"], errors="coerce").fillna(0).to_numpy(np.float64) \
        if "cycles" in ops.columns else np.zeros(len(ops))
    has = parent >= 0
    children = np.bincount(parent[has], weights=span[has], minlength=len(ops))
    # inclusive GPU: add each op's own time to every ancestor (deepest first is not needed:
    # walk each op up its chain; chains are short, a few levels of aten calls)
    inclusive = gpu.copy()
    for i in np.flatnonzero(gpu > 0):
        p = parent[i]
        while p >= 0:
            inclusive[p] += gpu[i]
            p = parent[p]
    return pd.DataFrame({"host_inclusive": span, "host_self": span - children.astype(np.int64),
                         "gpu_self": gpu, "gpu_inclusive": inclusive}, index=ops.index)


def has_gpu_time(ops: pd.DataFrame) -> bool:
    """Whether a measured profile's ops carry GPU time (an import of a CUDA run); a CPU
    run's (gloo ranks) have only host time, whatever its columns."""
    return "gpu_ns" in ops.columns and bool(
        pd.to_numeric(ops["gpu_ns"], errors="coerce").fillna(0).gt(0).any())


def group_ops(ops: pd.DataFrame, by: str, measured: bool = False,
              gpu: bool | None = None) -> pd.DataFrame:
    """One row per value of `by`: count, total and share of the time column, the mean,
    largest first. Modelled: `cycles`. Measured (an import whose ops nest): host time, self
    and inclusive, and with `gpu` (default: whether these ops have GPU time) GPU time too;
    the shares are of the GPU self time (each kernel counted once) or, without GPU time,
    of the host self time. A group's inclusive times count each of its ops once: an op
    inside another op of the same group adds nothing (conv2d > convolution > _convolution
    in one pass or class is one span, not three)."""
    if by not in ops.columns:
        raise ValueError(f"no column {by!r} to group by")
    key = ops[by].astype(str)
    if measured and {"start", "end"} <= set(ops.columns):
        gpu = has_gpu_time(ops) if gpu is None else gpu
        parent = nesting(ops)
        times = self_and_inclusive(ops, parent)
        inner = nested_in_group(parent, key.to_numpy())
        times.loc[inner, ["host_inclusive", "gpu_inclusive"]] = 0
        grouped = times.groupby(key.to_numpy(), sort=False)
        out = grouped.sum()
        out.insert(0, "count", grouped.size())
        basis = "gpu_self" if gpu and out["gpu_self"].sum() > 0 else "host_self"
        out = out[["count", "host_self", "host_inclusive"]
                  + (["gpu_self", "gpu_inclusive"] if gpu else [])]
    else:
        cycles = pd.to_numeric(ops["cycles"], errors="coerce").fillna(0) \
            if "cycles" in ops.columns else pd.Series(0.0, index=ops.index)
        grouped = cycles.groupby(key.to_numpy(), sort=False)
        out = pd.DataFrame({"count": grouped.size(), "cycles": grouped.sum()})
        out["mean_cycles"] = out["cycles"] / out["count"]
        basis = "cycles"
    total = float(out[basis].sum())
    out["share"] = out[basis] / total if total else 0.0
    out.index.name = by
    return out.sort_values([basis, "count"], ascending=False, kind="stable").reset_index()
