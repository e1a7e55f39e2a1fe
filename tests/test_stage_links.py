"""What crosses each stage boundary (`analysis.exchange.stage_links`, /exchange's "Between
stages"): p2p calls paired send to recv, by stage rather than rank, checked against hand
sums and against the exchange table the import builds on its own."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import popviz
from popviz.analysis.exchange import stage_links
from popviz.figures.exchange import stage_links_figure

PROFILES = Path(__file__).resolve().parents[1] / "profiles"


def _call(rank: int, peer: int, direction: str, kind: str, stage: int, seq: int,
          nbytes: int, wait: int, wire: int) -> dict:
    return {"rank": rank, "peer": peer, "direction": direction, "kind": kind, "stage": stage,
            "microbatch": seq, "step": 0, "seq": seq, "bytes": nbytes, "post": 0, "end": 0,
            "peer_post": 0, "waiting_ns": wait, "transfer_ns": wire, "matched": True}


def test_an_interleaved_pair_of_ranks_has_three_boundaries_by_hand() -> None:
    # 2 ranks, stages 0 and 2 on rank 0, 1 and 3 on rank 1: 0 -> 1 and 2 -> 3 go from
    # rank 0 to 1, 1 -> 2 from rank 1 back to 0; one gradient 1 -> 0; a send never received
    calls = [
        _call(0, 1, "send", "activation", 0, 0, 100, 5, 7),
        _call(1, 0, "recv", "activation", 1, 0, 100, 11, 13),
        _call(0, 1, "send", "activation", 2, 1, 300, 0, 2),
        _call(1, 0, "recv", "activation", 3, 1, 300, 4, 6),
        _call(1, 0, "send", "activation", 1, 0, 200, 1, 3),
        _call(0, 1, "recv", "activation", 2, 0, 200, 20, 30),
        _call(1, 0, "send", "gradient", 1, 1, 50, 2, 2),
        _call(0, 1, "recv", "gradient", 0, 1, 50, 3, 9),
        _call(0, 1, "send", "activation", 0, 2, 999, 0, 0),  # its recv is not in the trace
    ]
    exchange = pd.DataFrame({"src": ["1", "1"], "dst": ["1", "1"], "bytes": [64, 36],
                             "start": [0, 10], "end": [4, 16], "kind": "collective",
                             "stage": [3, 3], "microbatch": -1, "step": 0,
                             "waiting_ns": 0, "transfer_ns": [4, 6]})
    got = stage_links(pd.DataFrame(calls), exchange)
    want = pd.DataFrame([
        (0, 1, "activation", 1, 100, 13, 11, 5),
        (1, 0, "gradient", 1, 50, 9, 3, 2),
        (1, 2, "activation", 1, 200, 30, 20, 1),
        (2, 3, "activation", 1, 300, 6, 4, 0),
        (3, 3, "collective", 2, 100, 10, 0, 0),
    ], columns=["src_stage", "dst_stage", "kind", "transfers", "bytes", "transfer_ns",
                "receiver_wait_ns", "sender_wait_ns"])
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    fig = stage_links_figure(got)
    hover = fig.data[0].customdata
    assert "stage 1 → stage 2" in hover[1][2] and "receiver waited 0.0 µs" in hover[1][2]
    assert "collective: 2 ×" in hover[3][3]
    assert fig.data[0].text[2][3] != "" and fig.data[0].text[3][0] == ""


def test_the_bundled_run_matches_its_exchange_table() -> None:
    """Each boundary's transfers, bytes, time on the wire and receiver's wait are the
    exchange table's (waits.transfers, a separate path) for the same kind."""
    with popviz.open(PROFILES / "tutorial_measured_2ranks") as p:
        links, exchange = stage_links(p.table("p2p"), p.exchange), p.exchange
    assert sorted(zip(links["src_stage"], links["dst_stage"], links["kind"])) == \
        [(0, 1, "activation"), (1, 0, "gradient")]
    for row in links.itertuples(index=False):
        same = exchange[exchange["kind"] == row.kind]
        assert row.transfers == len(same)
        assert row.bytes == same["bytes"].sum()
        assert row.transfer_ns == same["transfer_ns"].sum()
        assert row.receiver_wait_ns == same["waiting_ns"].sum()


def test_a_modelled_profile_has_no_stage_links() -> None:
    """No p2p table; its exchange's all-reduces are the compiler's, not NCCL kernels."""
    with popviz.open(PROFILES / "rn50_pipeline") as p:
        assert "p2p" not in p.table_names and len(p.exchange)
        assert stage_links(pd.DataFrame(), p.exchange).empty


def test_an_exchange_table_without_stages_and_nccl_send_kernels() -> None:
    """A profile whose exchange has only the contract's columns: no collectives row, no
    error. An NCCL send / recv kernel is the p2p transfer's own kernel, not a collective:
    the import names it apart (`device_transfers`), so it is not counted twice."""
    from popviz.ingest.import_merge import device_transfers, exchange_table

    bare = pd.DataFrame({"src": ["0"], "dst": ["0"], "bytes": [8], "start": [0], "end": [1],
                         "kind": ["collective"]})
    assert stage_links(pd.DataFrame(), bare).empty
    trace = pd.DataFrame({
        "ipu": [0, 0], "start": [0, 10], "end": [5, 20], "kind": "exchange",
        "stage": [0, 0], "microbatch": -1, "pass": "", "step": 0, "bytes": [4096, 512],
        "op": ["ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
               "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"]})
    rows = exchange_table([device_transfers(trace)])
    assert rows["kind"].tolist() == ["p2p_kernel", "collective"]
    links = stage_links(pd.DataFrame(), rows)
    assert links[["src_stage", "dst_stage", "kind", "bytes"]].values.tolist() == \
        [[0, 0, "collective", 512]]
