"""Shared look: colours per trace category and memory category, units, empty figures."""

from __future__ import annotations

import plotly.graph_objects as go

from popviz.units import KiB, MiB, fmt_bytes  # noqa: F401 - re-exported for figures

# trace: forward / backward / recompute / weight update are distinct hues of compute
CATEGORY_COLOURS = {
    "F": "#3b75af", "B": "#ef8636", "R": "#8e6bbf", "WU": "#519e3e", "compute": "#56a3c9",
    "exchange": "#1b9e8f", "host_io": "#8d6e63", "sync": "#6d6d6d", "idle": "#dcdcdc",
}  # exchange is teal: red means capacity, out of memory and the bottleneck
CATEGORY_NAMES = {
    "F": "compute: forward", "B": "compute: backward", "R": "compute: recompute",
    "WU": "compute: weight update", "compute": "compute", "exchange": "exchange",
    "host_io": "host I/O", "sync": "sync", "idle": "idle",
}
# a zero-bubble schedule's W, the backward's deferred weight gradients: B's hue, darker
WEIGHT_GRAD_COLOUR = "#b35a1f"
MEMORY_COLOURS = {
    "code": "#7f7f7f", "always_live": "#3b75af", "not_always_live_peak": "#ef8636",
    "exchange": "#1b9e8f",
}
_EXTRA = ["#519e3e", "#8e6bbf", "#8d6e63", "#e377c2", "#bcbd22", "#17becf"]
OOM_COLOUR = "#d62728"
CAPACITY_COLOUR = "#b22222"


def memory_colour(category: str, index: int) -> str:
    return MEMORY_COLOURS.get(category, _EXTRA[index % len(_EXTRA)])


# tile categories: "always-live" alone means the whole-program total (popviz.vocab), so
# the variables' category says what it is
_CATEGORY_NAMES = {"always_live": "always-live variables",
                   "not_always_live_peak": "not-always-live peak"}


def pretty(name: str) -> str:
    """'vertex_state' -> 'vertex state'; tile categories by their names above."""
    return _CATEGORY_NAMES.get(name, name.replace("_", " "))


def byte_unit(largest: float) -> tuple[float, str]:
    """(divisor, name) that shows byte counts up to `largest` as readable numbers: MiB for
    large ones, KiB for a measured run's few-KiB messages (never '0.0025 MiB')."""
    for name, size in (("MiB", MiB), ("KiB", KiB)):
        if largest >= size:
            return float(size), name
    return 1.0, "B"


def base_layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 16}},
        template="plotly_white", height=height,
        margin={"l": 70, "r": 20, "t": 60, "b": 50},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 1, "xanchor": "right"},
        font={"family": "Inter, Segoe UI, Helvetica, Arial, sans-serif", "size": 12},
        hoverlabel={"namelength": -1},
    )
    return fig


def add_row_lines(fig: go.Figure, lines: list[tuple[float, str]]) -> None:
    """Horizontal lines across the plot at (y, colour), added as one list: `add_hline`
    per line re-validates every shape so far (511 lines between a 128-rank job's lanes
    took 160 s)."""
    fig.layout.shapes = (*fig.layout.shapes, *(
        {"type": "line", "xref": "x domain", "x0": 0, "x1": 1, "yref": "y", "y0": y,
         "y1": y, "line": {"color": colour, "width": 1}} for y, colour in lines))


def empty_figure(message: str, title: str = "") -> go.Figure:
    """A figure that says why there is nothing to draw (never blank axes)."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper",
                       yref="paper", font={"size": 14, "color": "#555"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return base_layout(fig, title, height=240)
