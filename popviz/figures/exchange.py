"""Exchange between IPUs (ranks when measured) and the host: a bytes matrix and bytes over
time."""

from __future__ import annotations

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
    matrix = matrix.rename(index=naming.relabel, columns=naming.relabel)
    size, name = byte_unit(float(matrix.to_numpy().max()))
    z = matrix.to_numpy(dtype=float) / size
    if len(matrix) > LABELLED_CELLS:  # a job's ranks: no cell text, the hover's number
        fig = go.Figure(go.Heatmap(
            z=z, x=list(matrix.columns), y=list(matrix.index), colorscale="Blues",
            colorbar={"title": name},
            hovertemplate="%{y} → %{x}: %{z:,.2f} " + name + "<extra></extra>"))
    else:
        # cells in the colour bar's unit (never MiB on the bar and GiB in a cell)
        text = np.vectorize(lambda b: f"{b / size:,.1f}" if b else "")(matrix.to_numpy())
        fig = go.Figure(go.Heatmap(
            z=z, x=list(matrix.columns), y=list(matrix.index), text=text,
            texttemplate="%{text}", colorscale="Blues", colorbar={"title": name},
            customdata=np.vectorize(lambda b: fmt_bytes(b))(matrix.to_numpy()),
            hovertemplate="%{y} → %{x}: %{customdata}<extra></extra>"))
    fig.update_xaxes(side="bottom", title_text="to")
    fig.update_yaxes(title_text="from", autorange="reversed")
    return base_layout(fig, f"{title} ({name}, from row to column)",
                       height=_height(len(matrix)))


# a matrix of more rows than this (a job's ranks or stages) has no text in its cells and a
# plain number in its hover (1,024 ranks: a million labels and 46,000 px); its height stops
# growing there too
LABELLED_CELLS = 64


def _height(rows: int) -> int:
    return 160 + 45 * rows if rows <= LABELLED_CELLS else 160 + 12 * LABELLED_CELLS


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
    fig.update_xaxes(title_text=naming.time_title, tickformat=",d")
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
    diagonal."""
    if links.empty:
        return empty_figure("No transfers between stages in this profile.", title)
    stages = sorted(set(links["src_stage"]) | set(links["dst_stage"]))
    at = {s: i for i, s in enumerate(stages)}
    n = len(stages)
    total = np.zeros((n, n))
    hover = np.full((n, n), "", dtype=object)
    cells: dict[tuple[int, int], list[str]] = {}
    for row in links.to_dict("records"):
        src, dst = int(row["src_stage"]), int(row["dst_stage"])
        total[at[src], at[dst]] += float(row["bytes"])
        lines = cells.setdefault((src, dst), [f"<b>stage {src} → stage {dst}</b>"])
        lines.append(f"{row['kind']}: {int(row['transfers']):,} × · "
                     f"{fmt_bytes(float(row['bytes']))} · on the wire "
                     f"{_ms(float(row['transfer_ns']))}")
        if row["kind"] != "collective":
            lines.append(f"  receiver waited {_ms(float(row['receiver_wait_ns']))}, sender "
                         f"waited {_ms(float(row['sender_wait_ns']))}")
    size, name = byte_unit(float(total.max()))
    labels = [f"stage {s}" for s in stages]
    z = np.where(total > 0, total / size, np.nan)
    if n > LABELLED_CELLS:  # a job's stages: the hover's number, no cell text
        fig = go.Figure(go.Heatmap(
            z=z, x=labels, y=labels, colorscale="Blues", colorbar={"title": name}, zmin=0,
            hovertemplate="%{y} → %{x}: %{z:,.2f} " + name + "<extra></extra>"))
    else:
        for (src, dst), lines in cells.items():
            hover[at[src], at[dst]] = "<br>".join(lines)
        text = np.where(total > 0, np.vectorize(lambda b: f"{b / size:,.1f}")(total), "")
        fig = go.Figure(go.Heatmap(
            z=z, x=labels, y=labels, text=text, texttemplate="%{text}", colorscale="Blues",
            colorbar={"title": name}, zmin=0, customdata=hover,
            hovertemplate="%{customdata}<extra></extra>", xgap=1, ygap=1))
    fig.update_xaxes(side="bottom", title_text="to")
    fig.update_yaxes(title_text="from", autorange="reversed")
    return base_layout(fig, f"{title} ({name}, from row to column)", height=_height(n))
