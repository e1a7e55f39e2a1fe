"""The timeline sweep (popviz.metrics): overlapping events count once, parts add up
to the step time, modelled traces keep their plain sums, and the three idle figures of a
measured run (/stages per rank, summary card, compare) are one number."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import popviz
from popviz.analysis.balance import ipu_balance, profile_stages, stage_balance, timed_stages
from popviz.analysis.compare.sides import load_side
from popviz.analysis.insights import insights
from popviz.analysis.ranks import rank_shares
from popviz.figures.stages import ipu_time_figure, stage_load_figure
from popviz.metrics import CATEGORIES, idle_fractions, rank_time, stage_idle_fraction
from popviz.vocab import MEASURED as MEASURED_WORDS

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "profiles" / "tutorial_measured_2ranks"
MODELLED = ROOT / "profiles" / "tutorial_pipelined" / "training"


def _trace(rows: list[tuple[int, int, int, int, str, str]]) -> pd.DataFrame:
    """(ipu, step, start, end, kind, pass) rows -> a trace."""
    t = pd.DataFrame(rows, columns=["ipu", "step", "start", "end", "kind", "pass"])
    t["stage"] = t["ipu"]
    return t


# step 0, window [0, 20]:
#   rank 0: forward [0,10], exchange [5,15] (async, under compute), idle [12,20]
#     -> forward 10, exchange 10..15 = 5, idle 15..20 = 5
#   rank 1: backward [2,6], sync [4,8] -> untraced 0..2 + 8..20 = 14, backward 4, sync 2
# step 1, window [100, 110]: rank 0 forward [100,104], exchange [100,110]
#     -> forward 4, exchange 6; rank 1 untraced 10
OVERLAP = _trace([(0, 0, 0, 10, "compute", "F"), (0, 0, 5, 15, "exchange", ""),
                  (0, 0, 12, 20, "idle", ""), (1, 0, 2, 6, "compute", "B"),
                  (1, 0, 4, 8, "sync", ""), (0, 1, 100, 104, "compute", "F"),
                  (0, 1, 100, 110, "exchange", "")])


def test_overlapping_events_count_once_in_priority_order() -> None:
    t = rank_time(OVERLAP)
    assert t.loc[0, "forward"] == 7.0 and t.loc[0, "exchange"] == 5.5
    assert t.loc[0, "idle"] == 2.5 and t.loc[0, "untraced"] == 0.0
    assert t.loc[1, "backward"] == 2.0 and t.loc[1, "sync"] == 1.0
    assert t.loc[1, "untraced"] == 12.0
    assert (t["step_time"] == 15.0).all() and (t["steps"] == 2).all()
    parts = t[[*CATEGORIES, "untraced"]].sum(axis=1)
    assert parts.tolist() == [15.0, 15.0]  # parts sum to the step time, on every rank
    per, overall = idle_fractions(t)
    assert per.tolist() == [2.5 / 15, 1.0 / 15]
    assert overall == pytest.approx(3.5 / 30)


def test_compute_beats_exchange_beats_host_io_beats_sync_beats_idle() -> None:
    # five nested events all covering [4,5]; each outer one owns one more unit
    t = rank_time(_trace([(0, 0, 0, 9, "idle", ""), (0, 0, 1, 8, "sync", ""),
                          (0, 0, 2, 7, "host_io", ""), (0, 0, 3, 6, "exchange", ""),
                          (0, 0, 4, 5, "compute", "WU")]))
    row = t.loc[0]
    assert (row["weight_update"], row["exchange"], row["host_io"], row["sync"],
            row["idle"]) == (1.0, 2.0, 2.0, 2.0, 2.0)


def test_modelled_trace_gives_the_plain_sums() -> None:
    p = popviz.open(MODELLED)
    tr = p.trace
    t = rank_time(tr)
    sums = (tr.assign(d=(tr["end"] - tr["start"]).astype(float))
            .pivot_table(index="ipu", columns="kind", values="d", aggfunc="sum", fill_value=0))
    for kind in ("exchange", "host_io", "sync", "idle"):
        got = t[kind].to_numpy()
        want = sums[kind].to_numpy() if kind in sums else np.zeros(len(t))
        assert np.array_equal(got, want), kind
    assert np.array_equal(t[["forward", "backward", "recompute", "weight_update",
                             "compute"]].sum(axis=1).to_numpy(), sums["compute"].to_numpy())
    assert (t["untraced"] == 0).all()
    # the comparison's side: same figures as summing durations (the old computation)
    side = load_side(p, "B")
    clock = float(p.meta["target"]["clock_hz"])
    per = float(side.metrics["samples_per_step"]) / side.facts["replicas"]
    idle = float(sums["idle"].sum() + sums["sync"].sum())
    assert side.time_per_sample["idle"] == pytest.approx(idle / clock * 1e6 / per, rel=1e-12)
    # idle by hand: plain sums of idle + sync durations over IPUs x the trace's span
    span = float(tr["end"].max() - tr["start"].min())
    assert side.metrics["idle_fraction"] == pytest.approx(idle / (len(sums) * span), rel=1e-12)
    # and the stage table of a modelled run is left alone
    assert timed_stages(p.stages, tr, measured=False) is p.stages


def test_measured_idle_is_one_number_everywhere() -> None:
    p = popviz.open(MEASURED)
    times = rank_time(p.trace)
    per_rank, overall = idle_fractions(times)
    stages_view = ipu_balance(profile_stages(p)).set_index("ipu")["bubble_fraction"]
    assert stages_view.to_numpy() == pytest.approx(per_rank.to_numpy(), rel=1e-12)
    assert insights(p)["bubble_fraction"] == pytest.approx(overall, rel=1e-12)
    side = load_side(p, "A")
    assert side.metrics["idle_fraction"] == pytest.approx(overall, rel=1e-12)
    # per rank, the compare table's ms add up to the step time (no double counting)
    step_ms = float(p.summary["step_ms"])
    assert side.ipus[["compute_ms", "exchange_ms", "idle_ms"]].sum(axis=1).max() <= step_ms
    assert side.time_per_sample["untraced"] >= 0
    assert side.time_per_sample.sum() == pytest.approx(side.metrics["ipu_us_per_sample"])


def test_timed_stages_count_an_async_send_once() -> None:
    stages = pd.DataFrame({"stage": [0, 1], "ipu": [0, 1], "forward_cycles": [99.0, 0.0],
                           "backward_cycles": [0.0, 99.0], "exchange_cycles": [99.0, 0.0],
                           "idle_cycles": [99.0, 99.0], "optimiser_cycles": [0.0, 0.0],
                           "other_cycles": [0.0, 0.0]})
    out = ipu_balance(timed_stages(stages, OVERLAP, measured=True)).set_index("ipu")
    assert out["total_cycles"].tolist() == [15.0, 15.0]
    assert out.loc[0, "forward_cycles"] == 7.0 and out.loc[0, "exchange_cycles"] == 5.5
    assert out["bubble_fraction"].tolist() == [2.5 / 15, 1.0 / 15]
    # rank 1's 12 untraced (mean of 14 and 10) is neither busy nor compute: only its
    # backward (2) is, as the ranks heat map and /compare count it
    assert out.loc[1, "untraced_cycles"] == 12.0 and out.loc[1, "other_cycles"] == 0.0
    assert out.loc[1, "busy_cycles"] == 2.0
    assert out["busy_cycles"].tolist() == rank_shares(OVERLAP)["busy"].sort_index().tolist()


def test_timed_stages_split_untraced_from_passless_compute_on_a_shared_rank() -> None:
    # rank 0 holds stages 0 and 1 (interleaved), window [0, 10]: forward 4 (stage 0),
    # forward 2 and compute of no pass 1 (stage 1), idle 1, nothing on [4, 6]
    trace = pd.DataFrame({"ipu": 0, "step": 0, "stage": [0, 1, 1, 1],
                          "start": [0, 6, 8, 9], "end": [4, 8, 9, 10],
                          "kind": ["compute", "compute", "compute", "idle"],
                          "pass": ["F", "F", "", ""]})
    stages = pd.DataFrame({"stage": [0, 1], "ipu": [0, 0], "forward_cycles": [0.0, 0.0],
                           "backward_cycles": 0.0, "exchange_cycles": 0.0,
                           "idle_cycles": 0.0, "optimiser_cycles": 0.0, "other_cycles": 0.0})
    out = timed_stages(stages, trace, measured=True).set_index("stage")
    assert out["untraced_cycles"].tolist() == [1.0, 1.0]  # the rank's 2, shared equally
    assert out["other_cycles"].tolist() == [0.5, 0.5]  # the compute of no pass, likewise
    assert stage_idle_fraction(out) == pytest.approx(0.1)  # idle 1 of the step's 10
    bal = ipu_balance(out.reset_index())
    assert bal["busy_cycles"].tolist() == [7.0] and bal["total_cycles"].tolist() == [10.0]


def test_measured_stages_call_untraced_time_untraced_as_trace_and_compare_do() -> None:
    """tutorial_measured_2ranks: a fifth to a third of each rank's step (it varies from
    one recording to the next) is host Python between ops (no event). /stages counted it as
    busy 'other compute'; the ranks heat map, /trace's range statistics and /compare call
    it untraced."""
    p = popviz.open(MEASURED)
    timed = profile_stages(p)
    times = rank_time(p.trace)
    per_ipu = ipu_balance(timed).set_index("ipu")
    assert per_ipu["untraced_cycles"].to_numpy() == pytest.approx(times["untraced"].to_numpy())
    assert (per_ipu["untraced_cycles"] > 0.1 * times["step_time"]).all()
    shares = rank_shares(p.trace, p.stages).sort_index()
    assert per_ipu["busy_cycles"].to_numpy() == pytest.approx(shares["busy"].to_numpy())
    assert per_ipu["total_cycles"].to_numpy() == pytest.approx(times["step_time"].to_numpy())
    side = load_side(p, "A")  # /compare: untraced ms per step
    assert side.ipus["untraced_ms"].to_numpy() * 1e6 == pytest.approx(
        per_ipu["untraced_cycles"].to_numpy())
    fig = ipu_time_figure(timed, naming=MEASURED_WORDS)
    names = [t.name for t in fig.data if t.name]
    assert "untraced (no event)" in names and "other compute" not in names
    load = stage_load_figure(timed, naming=MEASURED_WORDS)
    busy = stage_balance(timed)["busy_cycles"]
    assert list(load.data[0].y) == pytest.approx((busy / busy.mean()).tolist())


def test_verdict_speaks_ranks_for_measured_and_ipus_for_modelled() -> None:
    from popviz.api import compare

    mixed = compare(popviz.open(MEASURED), popviz.open(MODELLED)).verdict
    text = " ".join([mixed["headline"], *mixed["reasons"]])
    assert "IPU-us" not in text and "between IPUs and" not in text and "IPU0" not in text
    assert "per device" in text and "device-µs" in text and "most on rank " in text
    assert "2 ranks" in text and "(s)" not in text
    modelled = compare(popviz.open(MODELLED), popviz.open(ROOT / "profiles" / "rn50_pipeline"))
    text = " ".join([modelled.verdict["headline"], *modelled.verdict["reasons"]])
    assert "IPU-us" in text and "per IPU" in text and "rank" not in text
    assert "most on IPU" in text


def test_advice_names_ranks_for_a_measured_bottleneck() -> None:
    from popviz.analysis.advice import advise

    stages = pd.DataFrame({"stage": [0, 1], "ipu": [0, 1], "forward_cycles": [10.0, 40.0],
                           "backward_cycles": [0.0, 0.0], "exchange_cycles": [0.0, 0.0],
                           "idle_cycles": [30.0, 0.0]})
    empty = pd.DataFrame(columns=["ipu", "tile", "total_bytes", "capacity_bytes"])
    measured = [a.text for a in advise({"kind": "measured"}, stages, empty)
                if a.topic == "split"]
    modelled = [a.text for a in advise({}, stages, empty) if a.topic == "split"]
    assert measured and "rank 1" in measured[0] and "busy time" in measured[0]
    assert "IPU" not in measured[0] and "cycles" not in measured[0]
    assert modelled and "IPU1" in modelled[0] and "busy cycles" in modelled[0]


def test_exchange_by_kind_names_its_time_column_neutrally() -> None:
    from popviz.analysis.exchange import exchange_by_kind

    ex = pd.DataFrame({"kind": ["p2p", "p2p", "host"], "bytes": [4, 6, 8],
                       "start": [0, 10, 5], "end": [3, 17, 6]})
    out = exchange_by_kind(ex).set_index("kind")
    assert "cycles" not in out.columns
    assert out.loc["p2p", "time"] == 10 and out.loc["host", "time"] == 1
    assert list(exchange_by_kind(ex.iloc[:0]).columns) == ["kind", "transfers", "bytes", "time"]
