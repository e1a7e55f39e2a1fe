"""The bars of /trace's lanes when single events are drawn: passes (and sync, exchange,
host I/O) in their lanes, the ops of a pass in modelled order and the modules they ran
in, each drawn over its part in the shown window (`drawn_part`) with its true start,
end and duration in its customdata and hover."""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from popviz.analysis.trace_detail import module_runs
from popviz.figures.lod import CATEGORIES, category_codes
from popviz.figures.style import CATEGORY_COLOURS, CATEGORY_NAMES, WEIGHT_GRAD_COLOUR
from popviz.figures.trace import HIGHLIGHT, _stack, drawn_part
from popviz.figures.trace_host_slices import OP_PALETTE
from popviz.vocab import Naming

LANE_HEIGHT = 0.8
# which lane each trace category is drawn in
LANE_OF = {"F": "compute", "B": "compute", "R": "compute", "WU": "compute",
           "compute": "compute", "sync": "sync", "idle": "sync", "exchange": "exchange",
           "host_io": "host I/O"}
# green is the weight update's (CATEGORY_COLOURS["WU"]) and the optimiser's alone
OP_CLASS_COLOURS = {"conv": "#1f5f99", "matmul": "#6a3d9a", "norm": "#c51b8a",
                    "elementwise": "#a6cee3", "reduction": "#dfc27d",
                    "data_movement": "#cab2d6", "pool": "#fdbf6f", "loss": "#ff7f00",
                    "optimiser": "#519e3e", "other": "#bbbbbb"}


def module_bars(ops: pd.DataFrame, row_of: dict, levels: int, lo: float,
                 hi: float) -> list[go.Bar]:
    """The modules the drawn ops ran in, one row per path level (flame): consecutive ops of
    a pass in one module are one bar, coloured by the module's name, drawn over its part
    in [lo, hi]."""
    runs = [module_runs(ops, k).assign(level=k) for k in range(1, levels + 1)]
    runs = [r for r in runs if len(r)]
    if not runs:
        return []
    mods = pd.concat(runs, ignore_index=True)
    colours = [OP_PALETTE[zlib.crc32(m.encode()) % len(OP_PALETTE)] for m in mods["module"]]
    base, width = drawn_part(mods["start"].to_numpy(), mods["end"].to_numpy(), lo, hi)
    return [go.Bar(
        name="modules", orientation="h",
        y=[row_of[(int(i), f"module {k}")] for i, k in zip(mods["ipu"], mods["level"])],
        base=base, x=width, width=LANE_HEIGHT,
        marker={"color": colours, "line": {"width": 0.5, "color": "white"}},
        customdata=mods[["module"]].to_numpy(), text=mods["module"].str.rsplit(".").str[-1],
        textposition="inside", insidetextanchor="middle", textfont={"color": "#222"},
        hovertemplate="module <b>%{customdata[0]}</b><extra>module</extra>",
        cliponaxis=True)]


def short_name(op: str) -> str:
    """'aten.convolution_backward.default' -> 'convolution_backward'."""
    parts = str(op).split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else str(op)


def _column(frame: pd.DataFrame, name: str, fill: object) -> np.ndarray:
    return frame[name].to_numpy() if name in frame else np.full(len(frame), fill)


def event_where(ev: pd.DataFrame) -> np.ndarray:
    """'stage 0 · micro-batch 3 · pass F' with only the fields an event has (an import's
    kernel has no micro-batch: -1 is left out), and the host op that launched it."""
    stage = _column(ev, "stage", -1)
    micro = _column(ev, "microbatch", -1)
    passes = _column(ev, "pass", "").astype(str)
    host = _column(ev, "host_op", "").astype(str)
    out = []
    for s, m, p, h in zip(stage, micro, passes, host, strict=True):
        parts = [f"stage {int(s)}"] if int(s) >= 0 else []
        parts += [f"micro-batch {int(m)}"] if int(m) >= 0 else []
        parts += [f"pass {p}"] if p and p != "nan" else []
        parts += [f"launched by {h}"] if h and h != "nan" else []
        out.append(" · ".join(parts))
    return np.array(out, dtype=object)


def pass_bars(ev: pd.DataFrame, naming: Naming, row_of: dict, lo: float,
               hi: float) -> list[go.Bar]:
    """The passes (and sync, exchange, host I/O) of `ev`, each drawn over its part in
    [lo, hi] (drawn_part). customdata: op, stage, micro-batch, pass, end, ipu, duration,
    where, start (9 fields; app/trace_bsp.PICK reads ipu and end)."""
    codes = category_codes(ev)
    unit = naming.unit
    hover = (f"<b>%{{customdata[0]}}</b><br>{naming.device} %{{customdata[5]}} · "
             "%{customdata[7]}<br>"
             f"%{{customdata[8]:,.0f}} → %{{customdata[4]:,.0f}} {unit}<br>"
             f"duration %{{customdata[6]:,.0f}} {unit}<extra>%{{fullData.name}}</extra>")
    bars = []
    # a zero-bubble plan's deferred weight gradients: backward still, a darker shade
    weight = _column(ev, "grad_part", "").astype(str) == "weight"
    groups = [(name, codes == k, CATEGORY_NAMES[name], CATEGORY_COLOURS[name])
              for k, name in enumerate(CATEGORIES)]
    if weight.any():
        groups = [(n, m & ~weight, t, c) for n, m, t, c in groups] + \
            [("B", weight, "compute: backward, weight gradients (W)", WEIGHT_GRAD_COLOUR)]
    for name, mask, title, colour in groups:
        sel = ev[mask]
        if sel.empty:
            continue
        n = len(sel)
        label = _column(sel, "op", "").astype(str)
        custom = _stack([label, _column(sel, "stage", -1), _column(sel, "microbatch", -1),
                         _column(sel, "pass", "").astype(str), sel["end"].to_numpy(),
                         sel["ipu"].to_numpy(), (sel["end"] - sel["start"]).to_numpy(),
                         event_where(sel), sel["start"].to_numpy()])
        rows = [row_of[(int(i), LANE_OF[name])] for i in sel["ipu"]]
        text = label if name in ("F", "B", "R", "WU", "compute") else np.full(n, "")
        base, width = drawn_part(sel["start"].to_numpy(), sel["end"].to_numpy(), lo, hi)
        bars.append(go.Bar(
            name=title, orientation="h", y=rows, base=base, x=width,
            marker={"color": colour, "line": {"width": 0}},
            width=LANE_HEIGHT, customdata=custom, hovertemplate=hover, legendgroup=name,
            text=text, textposition="inside", insidetextanchor="middle",
            textfont={"color": "white"}, cliponaxis=True))
    return bars


def op_bars(ops: pd.DataFrame, naming: Naming, row_of: dict, lo: float, hi: float,
             highlight: str | None, highlight_op: int | None = None) -> list[go.Bar]:
    """The ops, each drawn over its part in [lo, hi] (drawn_part). customdata: op, class,
    module, micro-batch, pass, ipu, end, duration, op_id, start (10 fields;
    app/trace_bsp.PICK reads ipu and end)."""
    unit = naming.unit
    hover = ("<b>%{customdata[0]}</b> (%{customdata[1]})<br>module %{customdata[2]} · "
             f"{naming.device} %{{customdata[5]}} · micro-batch %{{customdata[3]}} · pass "
             f"%{{customdata[4]}}<br>%{{customdata[9]:,.0f}} → %{{customdata[6]:,.0f}} "
             f"{unit}<br>"
             f"duration %{{customdata[7]:,.0f}} {unit} (modelled order)"
             "<extra>op %{customdata[8]}</extra>")
    classes = ops["op_class"].astype(str) if "op_class" in ops else pd.Series("other",
                                                                             index=ops.index)
    module = ops["module"].astype(str) if "module" in ops else pd.Series("", index=ops.index)
    hit = (module.eq(highlight) | module.str.startswith(f"{highlight}.")) if highlight else \
        pd.Series(False, index=ops.index)
    chosen = " (selected module)"
    if highlight_op is not None and "op_id" in ops:
        hit = hit | (ops["op_id"] == highlight_op)
        chosen = " (selected op)" if not highlight else " (selected)"
        highlight = highlight or f"op {highlight_op}"
    bars = []
    for cls in sorted(classes.unique()):
        for lit in ((False, True) if highlight else (False,)):
            sel = ops[(classes == cls) & (hit == lit)]
            if sel.empty:
                continue
            custom = _stack([sel["op"].astype(str).to_numpy(), classes[sel.index].to_numpy(),
                             module[sel.index].to_numpy(), sel["microbatch"].to_numpy(),
                             sel["pass"].astype(str).to_numpy(), sel["ipu"].to_numpy(),
                             sel["end"].to_numpy(), (sel["end"] - sel["start"]).to_numpy(),
                             _column(sel, "op_id", -1), sel["start"].to_numpy()])
            colour = OP_CLASS_COLOURS.get(cls, OP_CLASS_COLOURS["other"])
            base, width = drawn_part(sel["start"].to_numpy(), sel["end"].to_numpy(), lo, hi)
            bars.append(go.Bar(
                name=f"op: {cls}" + (chosen if lit else ""), orientation="h",
                y=[row_of[(int(i), "ops")] for i in sel["ipu"]], base=base, x=width,
                marker={"color": colour,
                        "line": {"width": 2 if lit else 0.3,
                                 "color": HIGHLIGHT if lit else "white"}},
                opacity=1.0 if (lit or not highlight) else 0.35,
                width=LANE_HEIGHT, customdata=custom, hovertemplate=hover,
                legendgroup=f"op:{cls}", text=[short_name(o) for o in sel["op"]],
                textposition="inside", insidetextanchor="middle", cliponaxis=True))
    return bars
