"""Exchange between IPUs and the host: a src x dst matrix and bytes over time."""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz.vocab import ipu_label


def endpoint(value: object) -> str:
    """'host' or 'IPU<k>' for an exchange endpoint (an IPU index or the string 'host')."""
    text = str(value)
    if text.lower() == "host":
        return "host"
    try:
        return ipu_label(int(float(text)))
    except ValueError:
        return text


def _order(labels: set[str]) -> list[str]:
    ipus = sorted((x for x in labels if x.startswith("IPU") and x[3:].isdigit()),
                  key=lambda x: int(x[3:]))
    return ipus + sorted(x for x in labels if x not in ipus)


def exchange_matrix(exchange: pd.DataFrame, num_ipus: int | None = None) -> pd.DataFrame:
    """Total bytes sent from each source (rows) to each destination (columns)."""
    labels: set[str] = {ipu_label(i) for i in range(num_ipus or 0)}
    if exchange.empty:
        order = _order(labels | ({"host"} if labels else set()))
        return pd.DataFrame(0, index=order, columns=order, dtype="int64")
    src = exchange["src"].map(endpoint)
    dst = exchange["dst"].map(endpoint)
    labels |= set(src) | set(dst) | {"host"}
    order = _order(labels)
    table = (pd.DataFrame({"src": src, "dst": dst, "bytes": exchange["bytes"].astype("int64")})
             .pivot_table(index="src", columns="dst", values="bytes", aggfunc="sum",
                          fill_value=0))
    return table.reindex(index=order, columns=order, fill_value=0).astype("int64")


def exchange_over_time(exchange: pd.DataFrame, bins: int = 100) -> pd.DataFrame:
    """Bytes per time bin per kind; each transfer counts in the bin of its midpoint.
    Columns: bin_start, bin_end, kind, bytes (bins with nothing are omitted)."""
    cols = ["bin_start", "bin_end", "kind", "bytes"]
    if exchange.empty:
        return pd.DataFrame(columns=cols)
    lo, hi = float(exchange["start"].min()), float(exchange["end"].max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1, bins + 1)
    mid = (exchange["start"].to_numpy(float) + exchange["end"].to_numpy(float)) / 2
    which = np.clip(np.searchsorted(edges, mid, side="right") - 1, 0, bins - 1)
    frame = pd.DataFrame({"bin": which, "kind": exchange["kind"].astype(str),
                          "bytes": exchange["bytes"].astype("int64")})
    agg = frame.groupby(["bin", "kind"], sort=True)["bytes"].sum().reset_index()
    agg["bin_start"] = edges[agg["bin"]]
    agg["bin_end"] = edges[agg["bin"] + 1]
    return agg[cols]


def exchange_by_kind(exchange: pd.DataFrame) -> pd.DataFrame:
    """Transfers, bytes and busy time per kind (column `time`: in the profile's unit,
    cycles when modelled, ns when measured)."""
    if exchange.empty:
        return pd.DataFrame(columns=["kind", "transfers", "bytes", "time"])
    frame = exchange.assign(time=exchange["end"] - exchange["start"],
                            kind=exchange["kind"].astype(str))
    out = frame.groupby("kind", sort=True).agg(transfers=("bytes", "size"),
                                                bytes=("bytes", "sum"),
                                                time=("time", "sum"))
    return out.reset_index()


def trace_traffic(trace: pd.DataFrame) -> pd.DataFrame:
    """The trace's exchange and host I/O events (what /trace and the time split count as
    exchange) per kind and name, with the time each takes: for an import without
    transfers between ranks these are the device's own memory operations (memsets,
    device copies). Columns: kind, op, events, bytes, time (the profile's unit)."""
    cols = ["kind", "op", "events", "bytes", "time"]
    if trace.empty or "kind" not in trace.columns:
        return pd.DataFrame(columns=cols)
    moved = trace[trace["kind"].astype(str).isin(["exchange", "host_io"])]
    if moved.empty:
        return pd.DataFrame(columns=cols)
    frame = pd.DataFrame({
        "kind": moved["kind"].astype(str).to_numpy(),
        "op": moved["op"].astype(str).to_numpy() if "op" in moved.columns else "",
        "bytes": pd.to_numeric(moved["bytes"], errors="coerce").fillna(0).astype("int64")
        .to_numpy() if "bytes" in moved.columns else 0,
        "time": (moved["end"] - moved["start"]).to_numpy()})
    out = frame.groupby(["kind", "op"], sort=True).agg(
        events=("time", "size"), bytes=("bytes", "sum"), time=("time", "sum")).reset_index()
    return out.sort_values("time", ascending=False, kind="stable").reset_index(drop=True)[cols]
