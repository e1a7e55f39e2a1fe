"""Point-to-point matching: every rank's send and recv calls paired with their peer's.

The k-th send from rank a to rank b meets the k-th recv at b from a (gloo and NCCL match
in order between one pair of ranks on one tag), so calls pair on (rank, peer, direction,
seq). Each call gets the peer's post time (`peer_post`, -1 when the peer's side is not in
the traces) and whether the pair agrees on bytes (`matched`). Both `popviz import` and
`popviz.measure` pair their calls here; `waits` then splits each call's blocking time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# rank, direction, peer, start (post), end (done), bytes, stage, pass, microbatch, seq
CALL_COLUMNS = ["rank", "direction", "peer", "start", "end", "bytes", "stage", "pass",
                "microbatch", "seq"]


def match_p2p(calls: list[pd.DataFrame]) -> pd.DataFrame:
    """All ranks' p2p calls with the peer's post (`peer_post`) and end (`peer_end`), -1
    where unmatched, and `matched` (the peer's call found, same bytes)."""
    frames = [c for c in calls if len(c)]
    if not frames:
        cols = [*(calls[0].columns if calls else CALL_COLUMNS), "peer_post", "peer_end",
                "matched"]
        return pd.DataFrame(columns=cols)
    p2p = pd.concat(frames, ignore_index=True)
    other = p2p.rename(columns={"rank": "peer", "peer": "rank", "start": "peer_post",
                                "end": "peer_end", "bytes": "peer_bytes"})
    other["direction"] = other["direction"].map({"send": "recv", "recv": "send"})
    p2p = p2p.merge(other[["rank", "peer", "direction", "seq", "peer_post", "peer_end",
                           "peer_bytes"]],
                    on=["rank", "peer", "direction", "seq"], how="left")
    found = p2p["peer_post"].notna().to_numpy()
    p2p["matched"] = found & (p2p["peer_bytes"].fillna(-1).to_numpy() == p2p["bytes"])
    p2p["peer_post"] = p2p["peer_post"].fillna(-1).astype(np.int64)
    p2p["peer_end"] = p2p["peer_end"].fillna(-1).astype(np.int64)
    # gloo reports a send done only when the sender next waits on it; the data is over
    # once its receiver has it
    send = (p2p["direction"] == "send") & (p2p["peer_end"] >= p2p["start"])
    p2p.loc[send, "end"] = np.minimum(p2p.loc[send, "end"], p2p.loc[send, "peer_end"])
    return p2p.drop(columns="peer_bytes")
