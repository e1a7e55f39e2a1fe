"""Links between views by URL query: `/trace?profile=..&t0=..&t1=..&ipu=..` opens the trace
on a range (from a liveness step, an op, a program-tree box), and `/operations` or
`/liveness` with `t0` / `t1` follow a range picked on the trace. Only numbers travel."""

from __future__ import annotations

import math
from urllib.parse import parse_qs, urlencode

from dash import dcc

Window = tuple[float, float, int | None]


def href(page: str, rel: str, t0: float, t1: float, ipu: int | None = None,
         **extra: str) -> str:
    """`page?profile=rel&t0=..&t1=..[&ipu=..]` (times rounded to whole units)."""
    args: dict[str, str] = {"profile": rel, **extra, "t0": f"{math.floor(t0)}",
                            "t1": f"{math.ceil(t1)}"}
    if ipu is not None:
        args["ipu"] = str(int(ipu))
    return f"{page}?{urlencode(args)}"


def window_of(search: str | None) -> Window | None:
    """(t0, t1, ipu or None) of a link's query; None without a valid t0 < t1."""
    q = parse_qs((search or "").lstrip("?"))
    try:
        t0, t1 = float(q["t0"][0]), float(q["t1"][0])
    except (KeyError, IndexError, ValueError):
        return None
    if not (math.isfinite(t0) and math.isfinite(t1)) or t1 <= t0:
        return None
    try:
        ipu = int(q["ipu"][0]) if "ipu" in q else None
    except ValueError:
        ipu = None
    return t0, t1, ipu


def link(text: str, to: str, id_: str) -> dcc.Link:
    return dcc.Link(text, href=to, id=id_, className="download")
