"""A rank's host slices on /trace (trace_threads.py lays the rows out): each slice a bar
coloured as Perfetto colours it (runtime calls orange, syncs grey, annotations pale, ops
by a hash of their name), and the slices of the op a link points at outlined."""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.analysis.trace_threads import SYNC_NAMES
from popviz.figures.style import CATEGORY_COLOURS
from popviz.figures.trace import HIGHLIGHT, _stack
from popviz.figures.trace_outline import widened
from popviz.vocab import Naming

BAR = 0.84  # a bar's height, of its row's
# muted hues for host ops, picked by a hash of the name as Perfetto does (the same op is
# the same colour everywhere); blue-green-purple, away from red (capacity) and green (WU)
OP_PALETTE = ("#8fb3d9", "#9ccfc4", "#b9a9d6", "#d9c59a", "#a9c7a0", "#d6a9c2",
              "#a7bfc9", "#c9b8a5", "#9fa8da", "#b0d4e3", "#cfc79f", "#b7b7d9")
RUNTIME = "#e8a33d"  # cudaLaunchKernel and the other runtime calls
SYNC = CATEGORY_COLOURS["sync"]
ANNOTATION = "#c7d0d9"


def slice_colours(frame: pd.DataFrame) -> np.ndarray:
    """Per slice: runtime calls orange (syncs grey), annotations pale, ops by name."""
    names = frame["name"].astype(str)
    codes, uniques = pd.factorize(names)
    hashed = np.array([OP_PALETTE[zlib.crc32(u.encode()) % len(OP_PALETTE)]
                       for u in uniques], dtype=object)
    out = hashed[codes] if len(codes) else np.zeros(0, dtype=object)
    cat = frame["cat"].astype(str).to_numpy()
    out = np.where(cat == "user_annotation", ANNOTATION, out)
    out = np.where(np.isin(cat, ["cuda_runtime", "cuda_driver"]), RUNTIME, out)
    return np.where(names.str.startswith(SYNC_NAMES).to_numpy(), SYNC, out)


def host_bars(frame: pd.DataFrame, rows: np.ndarray, naming: Naming) -> list[go.Bar]:
    unit = naming.unit
    hover = ("<b>%{customdata[0]}</b><br>%{customdata[1]} · depth %{customdata[2]}<br>"
             f"%{{base:,.0f}} → %{{customdata[3]:,.0f}} {unit} "
             f"(duration %{{customdata[4]:,.0f}} {unit})<extra>%{{fullData.name}}</extra>")
    cat = frame["cat"].astype(str).to_numpy()
    out = []
    runtime = np.isin(cat, ["cuda_runtime", "cuda_driver"])
    for name, sel in (("host ops and annotations", ~runtime), ("CUDA runtime calls", runtime)):
        part = frame[sel]
        if part.empty:
            continue
        order = np.argsort(part["depth"].to_numpy(), kind="stable")  # deeper drawn on top
        part, r = part.iloc[order], rows[sel][order]
        dur = (part["end"] - part["start"]).to_numpy()
        custom = _stack([part["name"].astype(str).to_numpy(),
                         [f"{naming.label(int(i))} {t}" for i, t in
                          zip(part["ipu"], part["thread"].astype(str))],
                         part["depth"].to_numpy(), part["end"].to_numpy(), dur])
        out.append(go.Bar(
            name=name, orientation="h", y=r, base=part["start"].to_numpy(dtype=float),
            x=np.maximum(dur, 0).astype(float), width=BAR,
            marker={"color": slice_colours(part), "line": {"width": 0.3, "color": "white"}},
            customdata=custom, hovertemplate=hover, text=slice_labels(part["name"]),
            textposition="inside", insidetextanchor="start", textfont={"color": "#222"},
            cliponaxis=True))
    return out


def selected_bar(frame: pd.DataFrame, rows: np.ndarray, naming: Naming, lo: float,
                  hi: float) -> list[go.Bar]:
    """The slices of the op a link points at, outlined: a bar with no fill over their own
    (so the slices nested in them stay seen in flat mode), drawn last so nothing covers
    it, and drawn however short (its own bar may be merged with the short slices): a few
    pixels wide at least (trace_outline.widened)."""
    if frame.empty:
        return []
    unit = naming.unit
    dur = (frame["end"] - frame["start"]).to_numpy()
    base, width = widened(frame["start"].to_numpy(dtype=float),
                          frame["end"].to_numpy(dtype=float), lo, hi)
    custom = _stack([frame["name"].astype(str).to_numpy(),
                     [f"{naming.label(int(i))} {t}" for i, t in
                      zip(frame["ipu"], frame["thread"].astype(str))],
                     frame["depth"].to_numpy(), frame["end"].to_numpy(), dur,
                     frame["start"].to_numpy()])  # the bar's base is widened
    return [go.Bar(
        name=f"{slice_labels(frame['name'])[0]} (selected op)", orientation="h", y=rows,
        base=base, x=width, width=BAR,
        marker={"color": "rgba(0,0,0,0)", "line": {"width": 3, "color": HIGHLIGHT}},
        customdata=custom, cliponaxis=True,
        hovertemplate=("<b>%{customdata[0]}</b> (selected op)<br>%{customdata[1]} · depth "
                       f"%{{customdata[2]}}<br>%{{customdata[5]:,.0f}} → "
                       f"%{{customdata[3]:,.0f}} {unit} (duration %{{customdata[4]:,.0f}} "
                       f"{unit})<extra></extra>"))]


def slice_labels(names: pd.Series) -> np.ndarray:
    """'aten::convolution' -> 'convolution'; runtime and other names as they are."""
    text = names.astype(str)
    return text.str.replace(r"^aten::", "", regex=True).str.slice(0, 40).to_numpy()
