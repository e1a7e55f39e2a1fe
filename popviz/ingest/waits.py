"""Waiting vs transfer: where a blocking send or recv stops waiting and starts moving data.

A p2p call blocks its rank from its post to its completion. Until the peer has posted the
matching call the rank waits for a peer that is not ready (trace kind `idle`); after it the
data moves (kind `exchange`). gloo sends rendezvous with the receiver, so a send splits
like a recv. `popviz import` and `popviz.measure` split here and nowhere else; `p2p`
(the matching) gives each call its peer's post.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

P2P_COLUMNS = ["rank", "peer", "direction", "kind", "stage", "microbatch", "step", "seq",
               "bytes", "post", "end", "peer_post", "waiting_ns", "transfer_ns", "matched"]


def split_at(start: np.ndarray, end: np.ndarray, peer_post: np.ndarray) -> np.ndarray:
    """The instant each call stops waiting: its peer's post, clipped into [start, end];
    a call whose peer is unknown (peer_post < 0) never waits."""
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    post = np.asarray(peer_post, np.int64)
    return np.where(post >= 0, np.clip(post, start, np.maximum(start, end)), start)


def label(direction: str, kind: str, microbatch: int, peer: int) -> str:
    way = "from" if direction == "recv" else "to"
    return f"{direction} {kind} mb{microbatch} {way} rank {peer}"


def p2p_table(p2p: pd.DataFrame) -> pd.DataFrame:
    """Every send / recv (matched calls, common clock) with its waiting / transfer split."""
    if p2p.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object if c in ("direction", "kind")
                                          else bool if c == "matched" else "int64")
                             for c in P2P_COLUMNS})
    split = split_at(p2p["start"].to_numpy(), p2p["end"].to_numpy(), p2p["peer_post"].to_numpy())
    end = np.maximum(p2p["start"].to_numpy(np.int64), p2p["end"].to_numpy(np.int64))
    frame = pd.DataFrame({
        "rank": p2p["rank"], "peer": p2p["peer"], "direction": p2p["direction"],
        "kind": np.where(p2p["pass"] == "B", "gradient", "activation"),
        "stage": p2p["stage"], "microbatch": p2p["microbatch"], "step": p2p["step"],
        "seq": p2p["seq"], "bytes": p2p["bytes"], "post": p2p["start"], "end": end,
        "peer_post": p2p["peer_post"], "waiting_ns": split - p2p["start"].to_numpy(),
        "transfer_ns": end - split, "matched": p2p["matched"].astype(bool)})
    frame = frame.astype({c: "int64" for c in P2P_COLUMNS
                          if c not in ("direction", "kind", "matched")})
    return frame.sort_values(["rank", "post"], kind="stable").reset_index(drop=True)


def p2p_events(p2p: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """A CPU rank's p2p calls as trace events (`columns`): an idle event while it waits
    for its peer, then an exchange event while the data moves (the sweep still counts
    compute under them as compute)."""
    if p2p.empty:
        return pd.DataFrame(columns=columns)
    start, end = p2p["start"].to_numpy(), p2p["end"].to_numpy()
    split = split_at(start, end, p2p["peer_post"].to_numpy())
    kind = np.where(p2p["pass"] == "B", "gradient", "activation")
    names = [label(d, k, m, p) for d, k, m, p in
             zip(p2p["direction"], kind, p2p["microbatch"], p2p["peer"])]
    common = {"ipu": p2p["rank"].to_numpy(), "stage": p2p["stage"].to_numpy(),
              "microbatch": p2p["microbatch"].to_numpy(), "pass": p2p["pass"].to_numpy(),
              "step": p2p["step"].to_numpy(), "peer": p2p["peer"].to_numpy()}
    wait = pd.DataFrame({**common, "start": start, "end": split, "kind": "idle",
                         "op": [f"wait: {x}" for x in names], "bytes": 0})
    move = pd.DataFrame({**common, "start": split, "end": np.maximum(split, end),
                         "kind": "exchange", "op": names, "bytes": p2p["bytes"].to_numpy()})
    wait["host_op"] = move["host_op"] = ""
    return pd.concat([wait[wait["end"] > wait["start"]], move],
                     ignore_index=True)[columns]


def transfers(p2p: pd.DataFrame) -> pd.DataFrame:
    """Each p2p transfer once (its recv): from the later of the two posts (data moves only
    once both sides are posted) to the receiver's completion, split as above."""
    recv = p2p[p2p["direction"] == "recv"]
    start = np.maximum(recv["start"], recv["peer_post"])
    end = np.maximum(start, recv["end"])
    return pd.DataFrame({
        "src": recv["peer"].astype(object), "dst": recv["rank"].astype(object),
        "bytes": recv["bytes"], "start": start, "end": end,
        "kind": np.where(recv["pass"] == "B", "gradient", "activation"),
        "stage": recv["stage"], "microbatch": recv["microbatch"], "step": recv["step"],
        "waiting_ns": start - recv["start"], "transfer_ns": end - start})
