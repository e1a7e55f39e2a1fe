"""Figures of a comparison of two profiles (popviz.compare): A solid / blue-ish, B dashed /
orange-ish, the same category colours as the single-profile views. Plain Plotly, no Dash."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.figures.lod import minmax_indices
from popviz.figures.memory import far_below
from popviz.figures.style import (
    CAPACITY_COLOUR,
    CATEGORY_COLOURS,
    KiB,
    MiB,
    base_layout,
    empty_figure,
)
from popviz.vocab import Naming, ipu_label, naming_of

if TYPE_CHECKING:  # figures draw what analysis built; no import at run time
    from popviz.analysis.compare.table import Comparison

SIDE_COLOURS = {"A": "#3b75af", "B": "#ef8636"}
SIDE_DASH = {"A": "solid", "B": "dash"}
IPU_SHADES = ["#1f4e79", "#3b75af", "#6fa8dc", "#9fc5e8", "#a0522d", "#ef8636", "#f6b26b",
              "#f9cb9c"]
TIME_COLOURS = {"forward": CATEGORY_COLOURS["F"], "backward": CATEGORY_COLOURS["B"],
                "recompute": CATEGORY_COLOURS["R"], "weight_update": CATEGORY_COLOURS["WU"],
                "compute": CATEGORY_COLOURS["compute"], "exchange": CATEGORY_COLOURS["exchange"],
                "idle": CATEGORY_COLOURS["idle"], "untraced": "#b0b0b0"}
PHASE_NAMES = {"backward": "backward starts", "optimiser": "weight update starts"}
PIXELS = 800


def _naming(comp: Comparison, side: str) -> Naming:
    """A side's words: IPUs and cycles when modelled, ranks and ns when measured."""
    row = comp.sides[comp.sides["side"] == side]
    return naming_of(row.iloc[0].to_dict() if len(row) else None)


def _device(comp: Comparison) -> str:
    """'IPU', 'rank', or 'IPU / rank' for a modelled vs measured pair."""
    names = dict.fromkeys(_naming(comp, s).device for s in ("A", "B"))
    return " / ".join(names)


def _side_name(comp: Comparison, side: str) -> str:
    row = comp.sides[comp.sides["side"] == side]
    return f"{side}: {row['name'].iloc[0]}" if len(row) else side


def liveness_compare_figure(comp: Comparison, pixels: int = PIXELS,
                            title: str = "Liveness, A vs B (phases aligned)") -> go.Figure:
    """Always-live + not-always-live memory of every IPU of both profiles on one common
    progress axis whose forward / backward / weight-update boundaries coincide (min/max
    downsampled per curve so no peak is lost)."""
    lv = comp.liveness
    if lv.empty:
        return empty_figure("Neither profile has a liveness report.", title)
    fig = go.Figure()
    for side in ("A", "B"):
        for ipu, g in lv[lv["side"] == side].groupby("ipu", sort=True):
            y = g["total_bytes"].to_numpy(float) / MiB
            keep = minmax_indices(y, pixels)
            shade = IPU_SHADES[(cast(int, ipu) % 4) + (0 if side == "A" else 4)]
            dev = _naming(comp, side).label(ipu)
            fig.add_trace(go.Scatter(
                x=g["x"].to_numpy()[keep], y=y[keep], mode="lines",
                name=f"{_side_name(comp, side)} · {dev}", legendgroup=side,
                line={"color": shade, "dash": SIDE_DASH[side], "width": 1.6},
                customdata=np.stack([g["step"].to_numpy()[keep],
                                     g["phase"].astype(str).to_numpy()[keep]],
                                    axis=1).astype(object),
                hovertemplate="progress %{x:.3f} (step %{customdata[0]}, %{customdata[1]})"
                "<br>%{y:,.1f} MiB<extra>" + f"{side} {dev}</extra>"))
    for name, x in comp.phase_x.items():
        fig.add_vline(x=x, line={"color": "#555", "dash": "dot", "width": 1},
                      annotation_text=PHASE_NAMES.get(name, name),
                      annotation_position="top right", annotation_font_size=11)
    peak = float(lv["total_bytes"].max())
    caps = {s["side"]: float(s["ipu_capacity_bytes"] or 0) for _, s in comp.sides.iterrows()}
    cap_names = {s["side"]: str(s.get("capacity_name") or "IPU capacity")
                 for _, s in comp.sides.iterrows()}
    same = len(set(caps.values())) == 1 and len(set(cap_names.values())) == 1
    if not all(caps.values()):
        # a line spans every curve: one side's capacity over a device without one (a CPU
        # rank) would read as that device out of memory
        none = " and ".join(s for s, c in caps.items() if not c)
        if any(caps.values()):
            title += f" (no capacity line: {none} has none)"
        caps = {}
    for side, cap in caps.items():  # capacity only when it is within sight of the peak
        if cap and peak >= 0.4 * cap and not (same and side == "B"):
            fig.add_hline(y=cap / MiB, line={"color": CAPACITY_COLOUR, "dash": SIDE_DASH[side],
                                             "width": 1.2},
                          annotation_text=cap_names[side] if same
                          else f"{side} {cap_names[side]}",
                          annotation_position="bottom right")
    fig.update_xaxes(title_text="program progress (0 = start, 1 = end of the step; "
                     "phase boundaries aligned)", range=[0, 1])
    fig.update_yaxes(title_text="live memory (MiB)", rangemode="tozero")
    fig.update_layout(hovermode="closest", legend={"orientation": "v", "y": 1, "x": 1.01,
                                                   "xanchor": "left", "yanchor": "top"})
    fig = base_layout(fig, title, height=440)
    fig.update_layout(legend={"orientation": "v", "y": 1, "x": 1.01, "xanchor": "left",
                              "yanchor": "top"}, margin={"r": 200})
    return fig


def _multicat(comp: Comparison, frame: pd.DataFrame) -> list[list[str]]:
    return [frame["side"].tolist(),
            [_naming(comp, s).label(i) for s, i in zip(frame["side"], frame["ipu"])]]


def _wide_ipus(comp: Comparison) -> pd.DataFrame:
    """ipus delta frame -> one row per (side, ipu) with a column per metric."""
    long = comp.ipus
    rows = []
    for side in ("A", "B"):
        w = long.pivot_table(index="ipu", columns="metric", values=side.lower(),
                             aggfunc="first", dropna=False)
        w = w.dropna(how="all").reset_index()
        w.insert(0, "side", side)
        rows.append(w)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def _samples_per_step(comp: Comparison) -> dict[str, float] | None:
    """Each side's samples per step when both are known and they differ (else None)."""
    rows = comp.metrics[comp.metrics["metric"] == "samples_per_step"]
    if rows.empty:
        return None
    a, b = (float(rows.iloc[0][k]) for k in ("a", "b"))
    if not (np.isfinite(a) and np.isfinite(b)) or min(a, b) <= 0 or a == b:
        return None
    return {"A": a, "B": b}


def ipu_time_compare_figure(comp: Comparison, title: str | None = None) -> go.Figure:
    """Compute / exchange / idle (and a measured rank's untraced time) per IPU, A's IPUs
    then B's, side by side: ms per step, or µs per sample when the two steps hold
    different numbers of samples (a step of 1,024 micro-batches against one of 16 is not
    the same work)."""
    samples = _samples_per_step(comp)
    dev = _device(comp)
    title = title or (f"Time per {dev} per sample, A | B (steps of {samples['A']:,.0f} vs "
                      f"{samples['B']:,.0f} samples)" if samples
                      else f"Time per {dev} in one step, A | B")
    if comp.ipus.empty:
        return empty_figure("No per-IPU figures in these profiles.", title)
    w = _wide_ipus(comp)
    unit = "ms"
    if samples:  # ms per step -> µs per sample
        scale = w["side"].map(lambda side: 1e3 / samples[str(side)]).to_numpy(np.float64)
        for col in ("compute_ms", "exchange_ms", "idle_ms", "untraced_ms"):
            if col in w.columns:
                w[col] = w[col].to_numpy(np.float64) * scale
        unit = "µs"
    x = _multicat(comp, w)
    fig = go.Figure()
    for col, name, marker in (
            ("compute_ms", "compute", {"color": CATEGORY_COLOURS["compute"]}),
            ("exchange_ms", "exchange", {"color": CATEGORY_COLOURS["exchange"]}),
            ("idle_ms", "idle + sync", {"color": "#b8b8b8"}),
            ("untraced_ms", "untraced (no event)",
             {"color": "#ffffff", "line": {"color": "#8a8a8a", "width": 1},
              "pattern": {"shape": "/", "fgcolor": "#8a8a8a"}})):
        if col in w.columns and (col != "untraced_ms" or (w[col].fillna(0) > 0).any()):
            fig.add_trace(go.Bar(x=x, y=w[col].fillna(0), name=name, marker=marker,
                                 hovertemplate="%{x}: %{y:,.4f} " + unit + "<extra>" + name
                                 + "</extra>"))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text=f"{dev}-µs per sample" if samples else "ms per step")
    return base_layout(fig, title, height=380)


def ipu_memory_compare_figure(comp: Comparison, title: str | None = None) -> go.Figure:
    """Peak live memory of each IPU of both profiles with each side's IPU capacity."""
    title = title or f"Peak memory per {_device(comp)}, A | B"
    w = _wide_ipus(comp)
    if w.empty or "peak_bytes" not in w.columns or w["peak_bytes"].isna().all():
        return empty_figure("No liveness in these profiles.", title)
    x = _multicat(comp, w)
    colours = [SIDE_COLOURS[s] for s in w["side"]]
    text = [f"{int(o)} OOM tiles" if o and o == o else "" for o in w.get(
        "oom_tiles", pd.Series(0, index=w.index))]
    fig = go.Figure(go.Bar(x=x, y=w["peak_bytes"] / MiB, marker={"color": colours},
                           name="peak", text=text, textposition="outside",
                           hovertemplate="%{x}: peak %{y:,.1f} MiB<extra></extra>"))
    cap = w["peak_bytes"] + w["headroom_bytes"] if "headroom_bytes" in w.columns else None
    if cap is not None:
        # a capacity far above every bar (a GPU's device memory beside IPUs) would flatten
        # them all to the axis: its marks are left out and the title says so
        top = float(w["peak_bytes"].max())
        off = cap.notna() & cap.map(lambda c: far_below(top, float(c)))
        if off.any():
            sides = sorted(set(w.loc[off, "side"]))
            whose = f"{sides[0]}'s capacity" if len(sides) == 1 else "capacity"
            title += f" ({whose} {float(cap[off].max()) / MiB:,.0f} MiB is off the scale)"
            cap = cap.where(~off)
    if cap is not None and cap.notna().any():
        fig.add_trace(go.Scatter(x=x, y=cap / MiB, mode="markers", name="capacity",
                                 marker={"symbol": "line-ew-open", "size": 36,
                                         "color": CAPACITY_COLOUR, "line": {"width": 2}},
                                 hovertemplate="%{x} capacity %{y:,.0f} MiB<extra></extra>"))
    fig.update_yaxes(title_text="MiB", rangemode="tozero")
    return base_layout(fig, title, height=380)


def tile_distribution_figure(comp: Comparison, points: int = 400,
                             title: str = "Memory per tile, fullest first, A vs B") -> go.Figure:
    """The distribution of memory over the tiles of every IPU as sorted curves (fullest tile
    at x = 0, emptiest at 1, so Mk1's 1216 and Mk2's 1472 tiles share the axis), each
    side's tile capacity as a line: a curve above its line is tiles out of memory."""
    tiles = comp.tiles
    if tiles.empty:
        return empty_figure("No tile memory in these profiles.", title)
    fig = go.Figure()
    for side in ("A", "B"):
        t = tiles[tiles["side"] == side]
        for ipu, g in t.groupby("ipu", sort=True):
            y = np.sort(g["total_bytes"].to_numpy(float))[::-1] / KiB
            n = len(y)
            keep = np.unique(np.linspace(0, n - 1, min(n, points)).round().astype(int))
            shade = IPU_SHADES[(cast(int, ipu) % 4) + (0 if side == "A" else 4)]
            fig.add_trace(go.Scatter(
                x=keep / max(n - 1, 1), y=y[keep], mode="lines",
                name=f"{_side_name(comp, side)} · {ipu_label(ipu)}", legendgroup=side,
                line={"color": shade, "dash": SIDE_DASH[side], "width": 1.8},
                customdata=keep, hovertemplate="tile rank %{customdata}: %{y:,.1f} KiB"
                "<extra>" + f"{side} {ipu_label(ipu)}</extra>"))
        if len(t):
            cap = float(t["capacity_bytes"].max()) / KiB
            if far_below(float(tiles["total_bytes"].max()) / KiB, cap):
                title += f" ({side} tile capacity {cap:,.0f} KiB is off the scale)"
                continue
            fig.add_trace(go.Scatter(
                x=[0, 1], y=[cap, cap], mode="lines", name=f"{side} tile capacity",
                line={"color": CAPACITY_COLOUR, "dash": SIDE_DASH[side], "width": 1.2},
                hovertemplate=f"{side} tile capacity " + "%{y:,.0f} KiB<extra></extra>"))
    fig.update_xaxes(title_text="tiles, fullest first (fraction of the IPU's tiles)",
                     range=[0, 1])
    fig.update_yaxes(title_text="memory per tile (KiB)", rangemode="tozero")
    fig = base_layout(fig, title, height=400)
    fig.update_layout(legend={"orientation": "v", "y": 1, "x": 1.01, "xanchor": "left",
                              "yanchor": "top"}, margin={"r": 200})
    return fig


def time_per_sample_figure(comp: Comparison, title: str | None = None) -> go.Figure:
    """Horizontal stacked bars: IPU-us per sample by category for A and B. The bar length is
    1e6 / throughput per IPU, so the shorter bar is the faster layout per IPU."""
    dev = _device(comp)
    title = title or f"Where the {dev} time per sample goes"
    tps = comp.time_per_sample
    if tps.empty or not (tps["a"].abs().sum() + tps["b"].abs().sum()):
        return empty_figure("Throughput is not known for these profiles.", title)
    labels = [_side_name(comp, "B"), _side_name(comp, "A")]  # A on top
    fig = go.Figure()
    for _, r in tps.iterrows():
        if not (r["a"] or r["b"]):
            continue
        cat = str(r["category"])
        # a negative rest (measured events that overlap add up past the step) cannot be
        # drawn in a stack: it is left out and the total is said at the end of the bar
        x = [max(float(r["b"]), 0.0), max(float(r["a"]), 0.0)]
        if not any(x):
            continue
        fig.add_trace(go.Bar(y=labels, x=x, orientation="h",
                             name=cat.replace("_", " "),
                             marker={"color": TIME_COLOURS.get(cat, "#999")},
                             hovertemplate="%{y}: %{x:,.2f} " + dev + "-µs per sample<extra>"
                             + cat.replace("_", " ") + "</extra>"))
    totals = {side: float(tps[side.lower()].sum()) for side in ("A", "B")}
    drawn = {side: float(tps[side.lower()].clip(lower=0).sum()) for side in ("A", "B")}
    for side, label in (("A", labels[1]), ("B", labels[0])):
        over = drawn[side] - totals[side]
        text = f"{totals[side]:,.4g} µs per sample"
        if over > 1e-9 * max(abs(totals[side]), 1.0):
            text += f" (its events overlap: {over:,.4g} µs counted twice)"
        fig.add_annotation(x=drawn[side], y=label, text=text, showarrow=False,
                           xanchor="left", xshift=6, font={"size": 11, "color": "#333"})
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text=f"{dev}-microseconds per sample (shorter = faster per {dev})",
                     range=[0, max(drawn.values()) * 1.45])
    return base_layout(fig, title, height=260)

__all__ = ["ipu_memory_compare_figure", "ipu_time_compare_figure", "liveness_compare_figure",
           "tile_distribution_figure", "time_per_sample_figure"]
