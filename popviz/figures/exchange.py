"""Exchange between IPUs (ranks when measured) and the host: a bytes matrix and bytes over
time."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.figures.style import base_layout, byte_unit, empty_figure, fmt_bytes
from popviz.vocab import MEASURED, MODELLED, Naming

KIND_COLOURS = {"activation": "#3b75af", "gradient": "#ef8636", "allreduce": "#8e6bbf",
                "host_in": "#519e3e", "host_out": "#8d6e63", "weights": "#1b9e8f"}


def exchange_matrix_figure(matrix: pd.DataFrame, title: str = "Bytes exchanged",
                           naming: Naming = MODELLED) -> go.Figure:
    """Heat map of bytes from each source (rows) to each destination (columns). A measured
    run has no host: its empty host row and column are left out."""
    if matrix.empty or int(matrix.to_numpy().sum()) == 0:
        return empty_figure(f"No exchange between {naming.devices} or with the host.", title)
    if naming.in_ns and "host" in matrix.index and "host" in matrix.columns \
            and not matrix.loc["host"].any() and not matrix["host"].any():
        matrix = matrix.drop(index="host", columns="host")
    matrix, block = _in_blocks(matrix, naming)
    if block > 1:
        title += f", {naming.devices} in blocks of {block}"
    matrix = matrix.rename(index=naming.relabel, columns=naming.relabel)
    size, name = byte_unit(float(matrix.to_numpy().max()))
    z = matrix.to_numpy(dtype=float) / size
    if len(matrix) > TEXT_ROWS:  # small cells: no text in them, the hover's number
        fig = go.Figure(go.Heatmap(
            z=z, x=list(matrix.columns), y=list(matrix.index), colorscale="Blues",
            colorbar={"title": name}, zmin=0, zmax=_top(z),
            hovertemplate="%{y} → %{x}: %{z:,.2f} " + name + "<extra></extra>"))
    else:
        # cells in the colour bar's unit (never MiB on the bar and GiB in a cell)
        text = np.vectorize(lambda b: cell_text(b, size))(matrix.to_numpy())
        fig = go.Figure(go.Heatmap(
            z=z, x=list(matrix.columns), y=list(matrix.index), text=text,
            texttemplate="%{text}", colorscale="Blues", colorbar={"title": name},
            zmin=0, zmax=_top(z),  # from none: equal cells are not a bar of 19.5-20.5
            customdata=np.vectorize(lambda b: fmt_bytes(b))(matrix.to_numpy()),
            hovertemplate="%{y} → %{x}: %{customdata}<extra></extra>"))
    fig.update_xaxes(side="bottom", title_text="to")
    fig.update_yaxes(title_text="from", autorange="reversed")
    return base_layout(fig, f"{title} ({name}, from row to column)",
                       height=_height(len(matrix)))


def _top(z: np.ndarray) -> float:
    """The colour bar's top: the largest cell (Plotly ignores a zmin given without a
    zmax, and colours equal cells over value +- 0.5)."""
    finite = z[np.isfinite(z)]
    return float(finite.max()) if len(finite) and finite.max() > 0 else 1.0


def cell_text(nbytes: float, size: float) -> str:
    """A cell's bytes in the colour bar's unit, one decimal; a transfer too small to show
    at that precision is "<0.1", not a 0.0 that reads as none, and no transfer is blank."""
    if not nbytes or nbytes <= 0:
        return ""
    return "<0.1" if nbytes / size < 0.05 else f"{nbytes / size:,.1f}"


# a matrix of more rows than this (a job's ranks or stages) is drawn in blocks of
# consecutive devices, at most this many a side (1,024 ranks: a million cells, most far
# under a pixel, that Chromium took 18 s to draw and that looked empty)
LABELLED_CELLS = 64
TEXT_ROWS = 24  # a matrix of more rows has no text in its cells and rows of ROW_PX
ROW_PX = 14
_DEVICE = re.compile(r"^IPU\d+$")  # an analysis table's device label


def block_size(n: int) -> int:
    """Devices per block for a matrix of `n` a side (1: none)."""
    return 1 if n <= LABELLED_CELLS else -(-n // LABELLED_CELLS)


def _in_blocks(matrix: pd.DataFrame, naming: Naming) -> tuple[pd.DataFrame, int]:
    """`matrix` (devices "IPU<n>" and perhaps the host, the same labels on both axes)
    summed over blocks of consecutive devices, labelled in the profile's words ("rank
    0–15"); the host stays a row and column of its own. (matrix, devices per block)."""
    labels = [str(x) for x in matrix.index]
    devices = [x for x in labels if _DEVICE.match(x)]
    block = block_size(len(devices))
    if block == 1 or labels != [str(x) for x in matrix.columns]:
        return matrix, 1
    others = [x for x in labels if not _DEVICE.match(x)]
    order = devices + others
    z = matrix.set_axis(labels, axis=0).set_axis(labels, axis=1).loc[order, order] \
        .to_numpy(dtype=float)
    firsts = np.arange(0, len(devices), block)
    starts = np.r_[firsts, np.arange(len(others)) + len(devices)]
    z = np.add.reduceat(np.add.reduceat(z, starts, axis=0), starts, axis=1)

    count = len(devices)
    # "rank 0–15": the block's first device in the profile's words, its last's number
    names = [f"{naming.relabel(devices[int(a)])}–{devices[min(int(a) + block, count) - 1][3:]}"
             for a in firsts] + others
    return pd.DataFrame(z, index=names, columns=names), block


def _height(rows: int) -> int:
    return 160 + (45 if rows <= TEXT_ROWS else ROW_PX) * rows


def exchange_time_figure(over_time: pd.DataFrame, unit: str = "cycles",
                         title: str = "Exchange over time",
                         naming: Naming | None = None) -> go.Figure:
    """Stacked bytes per time bin per kind (from `exchange_over_time`)."""
    naming = naming or (MEASURED if unit == "ns" else Naming(unit=unit))
    unit = naming.unit
    if over_time.empty:
        return empty_figure("No exchange in this profile.", title)
    fig = go.Figure()
    per_bin = over_time.groupby(["bin_start"])["bytes"].sum()
    size, name = byte_unit(float(per_bin.max()) if len(per_bin) else 0.0)
    for kind, g in over_time.groupby("kind", sort=True):
        fig.add_trace(go.Bar(
            x=(g["bin_start"] + g["bin_end"]) / 2, y=g["bytes"] / size,
            width=(g["bin_end"] - g["bin_start"]) * 0.95, name=str(kind),
            marker={"color": KIND_COLOURS.get(str(kind), "#7f7f7f")},
            hovertemplate="%{x:,.0f} " + unit + ": %{y:,.2f} " + name + "<extra>" + str(kind)
            + "</extra>"))
    fig.update_layout(barmode="stack")
    # the range set, not left to Plotly: it pads a bar axis by half the smallest gap
    # between bar centres, whatever the bars' widths, so two bins far apart (a host_in at
    # the start, a host_out at the end) gave an axis from minus half the step. From 0 (a
    # profile's times count from its start), unless the bins start later than their own
    # span (a clock that does not)
    first, last = float(over_time["bin_start"].min()), float(over_time["bin_end"].max())
    lo = 0.0 if 0.0 <= first <= last - first else first
    fig.update_xaxes(title_text=naming.time_title, tickformat=",d", range=[lo, last])
    fig.update_yaxes(title_text=name)
    widths = (over_time["bin_end"] - over_time["bin_start"]).to_numpy(dtype=float)
    width = f" · bins of {float(np.median(widths)):,.0f} {unit}" if len(widths) else ""
    return base_layout(fig, title + width, height=340)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.2f} ms" if ns >= 1e5 else f"{ns / 1e3:,.1f} µs"


def stage_links_figure(links: pd.DataFrame, title: str = "Between stages") -> go.Figure:
    """Heat map of the bytes each stage sends each other stage (rows: from), from
    `analysis.exchange.stage_links`; the hover gives transfers, kinds, time on the wire
    and how long each side waited for the other. A stage's own collectives sit on the
    diagonal. More than LABELLED_CELLS stages are drawn in blocks of consecutive stages;
    a job whose links carry no bytes (collectives timed, not sized) is coloured by time
    on the wire."""
    if links.empty:
        return empty_figure("No transfers between stages in this profile.", title)
    stages = sorted(set(links["src_stage"]) | set(links["dst_stage"]))
    block = block_size(len(stages))
    cell_of = {s: i // block for i, s in enumerate(stages)}
    firsts = stages[::block]
    lasts = [stages[min(i + block, len(stages)) - 1] for i in range(0, len(stages), block)]
    labels = [f"stage {a}" if a == b else f"stages {a}–{b}" for a, b in zip(firsts, lasts,
                                                                             strict=True)]
    n = len(labels)
    src = links["src_stage"].map(cell_of).to_numpy()
    dst = links["dst_stage"].map(cell_of).to_numpy()
    sized = float(links["bytes"].sum()) > 0
    value = links["bytes" if sized else "transfer_ns"].to_numpy(dtype=float)
    total = np.zeros((n, n))
    np.add.at(total, (src, dst), value)
    # one hover line per kind of each cell (a block's links summed)
    per_kind = links.assign(src=src, dst=dst).groupby(["src", "dst", "kind"], sort=True).agg(
        transfers=("transfers", "sum"), bytes=("bytes", "sum"),
        transfer_ns=("transfer_ns", "sum"), receiver_wait_ns=("receiver_wait_ns", "sum"),
        sender_wait_ns=("sender_wait_ns", "sum")).reset_index()
    hover = np.full((n, n), "", dtype=object)
    for row in per_kind.to_dict("records"):
        i, j = int(row["src"]), int(row["dst"])
        lines = [f"{row['kind']}: {int(row['transfers']):,} × · "
                 f"{fmt_bytes(float(row['bytes']))} · on the wire "
                 f"{_ms(float(row['transfer_ns']))}"]
        if row["kind"] != "collective":
            lines.append(f"  receiver waited {_ms(float(row['receiver_wait_ns']))}, sender "
                         f"waited {_ms(float(row['sender_wait_ns']))}")
        head = "" if hover[i, j] else f"<b>{labels[i]} → {labels[j]}</b><br>"
        hover[i, j] = hover[i, j] + ("<br>" if hover[i, j] else "") + head + "<br>".join(lines)
    if sized:
        size, name = byte_unit(float(total.max()))
        text = np.vectorize(lambda b: cell_text(b, size))(total)
    else:
        size, name = 1e6, "ms on the wire"
        text = np.where(total > 0, np.vectorize(_ms)(total), "")
    z = np.where(total > 0, total / size, np.nan)
    small = n <= TEXT_ROWS
    fig = go.Figure(go.Heatmap(
        z=z, x=labels, y=labels, text=text if small else None,
        texttemplate="%{text}" if small else None, colorscale="Blues",
        colorbar={"title": name}, zmin=0, zmax=_top(z), customdata=hover,
        hovertemplate="%{customdata}<extra></extra>", xgap=int(small), ygap=int(small)))
    fig.update_xaxes(side="bottom", title_text="to")
    fig.update_yaxes(title_text="from", autorange="reversed")
    # short enough for half the page's width: the axes say from and to
    what = name if sized else f"{name}, no bytes recorded"
    blocks = f", blocks of {block}" if block > 1 else ", from row to column"
    return base_layout(fig, f"{title} ({what}{blocks})", height=_height(n))
