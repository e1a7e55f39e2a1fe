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


STAGE_LINK_COLUMNS = ["src_stage", "dst_stage", "kind", "transfers", "bytes", "transfer_ns",
                      "receiver_wait_ns", "sender_wait_ns"]


def stage_links(p2p: pd.DataFrame, exchange: pd.DataFrame | None = None) -> pd.DataFrame:
    """What crosses each stage boundary of a measured or imported job: per (sending stage,
    receiving stage, kind) the transfers, bytes, time on the wire and the time each side
    waited for the other to post, from the `p2p` table's calls paired as the import pairs
    them (the k-th send a -> b meets the k-th recv at b from a). Stages, not ranks: an
    interleaved schedule's stage 1 -> 2 runs between two ranks that also carry 0 -> 1.
    `exchange`'s collectives (NCCL kernels on a rank) add a row per stage with src_stage
    == dst_stage and kind "collective". Rows ordered by stages, then kind."""
    parts = []
    if len(p2p) and "seq" in p2p:
        cols = ["rank", "peer", "kind", "seq", "stage", "bytes", "waiting_ns", "transfer_ns"]
        sends = p2p.loc[p2p["direction"] == "send", cols]
        recvs = p2p.loc[p2p["direction"] == "recv", cols]
        pairs = recvs.merge(sends, left_on=["peer", "rank", "seq"],
                            right_on=["rank", "peer", "seq"], suffixes=("", "_send"))
        if len(pairs):
            parts.append(pd.DataFrame({
                "src_stage": pairs["stage_send"].to_numpy(np.int64),
                "dst_stage": pairs["stage"].to_numpy(np.int64),
                "kind": pairs["kind"].astype(str).to_numpy(), "transfers": 1,
                "bytes": pairs["bytes"].to_numpy(np.int64),
                "transfer_ns": pairs["transfer_ns"].to_numpy(np.int64),
                "receiver_wait_ns": pairs["waiting_ns"].to_numpy(np.int64),
                "sender_wait_ns": pairs["waiting_ns_send"].to_numpy(np.int64)}))
    if exchange is not None and len(exchange) and {"kind", "stage", "start", "end",
                                                   "bytes"} <= set(exchange.columns):
        coll = exchange[exchange["kind"].astype(str) == "collective"]
        if len(coll):
            stage = coll["stage"].to_numpy(np.int64)
            parts.append(pd.DataFrame({
                "src_stage": stage, "dst_stage": stage, "kind": "collective",
                "transfers": 1, "bytes": coll["bytes"].to_numpy(np.int64),
                "transfer_ns": (coll["end"] - coll["start"]).to_numpy(np.int64),
                "receiver_wait_ns": 0, "sender_wait_ns": 0}))
    if not parts:
        return pd.DataFrame({c: pd.Series([], dtype=object if c == "kind" else "int64")
                             for c in STAGE_LINK_COLUMNS})
    frame = pd.concat(parts, ignore_index=True)
    frame = frame[(frame["src_stage"] >= 0) & (frame["dst_stage"] >= 0)]
    out = frame.groupby(["src_stage", "dst_stage", "kind"], as_index=False, sort=True)[
        STAGE_LINK_COLUMNS[3:]].sum()
    return out[STAGE_LINK_COLUMNS].reset_index(drop=True)
