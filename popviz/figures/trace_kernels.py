"""How /trace's thread and stream lanes say a GPU kernel: its name wrapped for a hover, its
function as a bar's label, its launch (grid, block, registers, occupancy) as hover lines."""

from __future__ import annotations

import html
import textwrap

import numpy as np
import pandas as pd

from popviz.format.schema import OPTIONAL_COLUMNS

KERNEL_COLUMNS = OPTIONAL_COLUMNS["kernels"]


def launch_lines(events: pd.DataFrame, kernels: pd.DataFrame | None) -> np.ndarray:
    """Per GPU event: its kernel's launch as hover lines ("grid 1568×1×64 · block
    256×1×1<br>32 registers a thread · 4,224 B shared memory<br>occupancy 100% (CUPTI's
    estimate) · grid over the SMs: 760.2 blocks and 6,081.9 warps each"), "" where
    `kernels` has no row for it. Kineto's "blocks / warps per SM" are the whole grid
    divided by the SMs (6,081.9 is no resident count: an SM holds at most 64 warps), and
    its occupancy estimate is 0 where CUPTI's calculation fails (a single block, shared
    memory past the default 48 KiB): said as no estimate, not as an idle kernel."""
    out = np.full(len(events), "", dtype=object)
    if kernels is None or kernels.empty or events.empty or "correlation" not in events \
            or not set(KERNEL_COLUMNS) <= set(kernels.columns):
        return out
    # a (rank, correlation) that names one kernel only (a damaged table may repeat one)
    known = kernels[kernels["correlation"] >= 0].drop_duplicates(["ipu", "correlation"],
                                                                 keep=False)
    keys = events[["ipu", "correlation"]].reset_index(drop=True)
    found = keys.merge(known, on=["ipu", "correlation"], how="left")
    dims = {c: found[c].astype(object).to_numpy() for c in ("grid", "block")}
    num = {c: pd.to_numeric(found[c], errors="coerce").to_numpy(dtype=np.float64) for c in
           ("registers", "shared_bytes", "occupancy_pct", "blocks_per_sm", "warps_per_sm")}
    for i in range(len(found)):
        shape = " · ".join(f"{c} {str(dims[c][i]).replace(',', '×')}" for c in dims
                           if isinstance(dims[c][i], str) and dims[c][i])
        use = " · ".join(text.format(num[c][i]) for c, text in
                         (("registers", "{:,.0f} registers a thread"),
                          ("shared_bytes", "{:,.0f} B shared memory"))
                         if np.isfinite(num[c][i]))
        per_sm = " and ".join(text.format(num[c][i]) for c, text in
                              (("blocks_per_sm", "{:,.1f} blocks"),
                               ("warps_per_sm", "{:,.1f} warps")) if np.isfinite(num[c][i]))
        occupancy = num["occupancy_pct"][i]
        fill = " · ".join(
            ([f"occupancy {occupancy:,.0f}% (CUPTI's estimate)" if occupancy > 0 else
              "occupancy not estimated (CUPTI gives 0%)"] if np.isfinite(occupancy) else [])
            + ([f"grid over the SMs: {per_sm} each"] if per_sm else []))
        out[i] = "<br>".join(x for x in (shape, use, fill) if x)
    return out


HOVER_WIDTH = 90  # characters a hover line holds before it wraps
HOVER_LINES = 4


def hover_names(names: pd.Series) -> np.ndarray:
    """Kernel names for a hover, wrapped at HOVER_WIDTH characters (at most HOVER_LINES
    lines, the rest elided): a template kernel's name runs to hundreds of characters, and
    one such line makes the hover wider than the plot, pushing its other lines out of
    sight."""
    codes, uniques = pd.factorize(names.astype(str))
    wrapped = []
    for name in uniques:
        lines = textwrap.wrap(str(name), HOVER_WIDTH, break_on_hyphens=False) or [""]
        if len(lines) > HOVER_LINES:
            lines = [*lines[:HOVER_LINES - 1], lines[HOVER_LINES - 1][:HOVER_WIDTH - 1] + "…"]
        wrapped.append("<br>".join(html.escape(x, quote=False) for x in lines))
    return np.asarray(wrapped, dtype=object)[codes] if len(codes) else \
        np.zeros(0, dtype=object)


def kernel_labels(names: pd.Series) -> np.ndarray:
    """A kernel's name as a label: its function, without `void`, namespaces, template
    arguments or parameters ('void at::native::vectorized_elementwise_kernel<4, ...>(...)'
    -> 'vectorized_elementwise_kernel'); a memcpy / memset keeps its words."""
    text = names.astype(str).str.replace(r"^void\s+", "", regex=True)
    head = text.str.split(r"[<(]", n=1, regex=True).str[0].str.strip()
    short = head.str.rsplit("::", n=1).str[-1]
    return np.where(short == "", text, short).astype(str).astype(object)
