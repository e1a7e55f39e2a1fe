"""Per-rank micro-batches in flight on GPU pipelines, as Megatron-LM's schedules hold them
(docs/notes/gpu-plans-v2-research.md §6a: MLM `schedules.py`): 1F1B min(m, p - r);
interleaved min((p - r - 1) * 2 + (v - 1) * p, m * v) + 1 model-chunk micro-batches."""

from __future__ import annotations

import pandas as pd
import pytest

from popviz.compiler.schedule import build_schedule


def _in_flight(actions: pd.DataFrame, ranks: int) -> list[int]:
    """Most forwards whose backward has not run, per rank, in the rank's own order."""
    out = []
    for r in range(ranks):
        mine = actions[(actions["stage"] % ranks == r) & actions["pass"].isin(["F", "B"])]
        held = most = 0
        for kind in mine.sort_values("superstep", kind="stable")["pass"]:
            held += 1 if kind == "F" else -1
            most = max(most, held)
        out.append(most)
    return out


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 24), (8, 4)])
def test_1f1b_holds_min_m_p_minus_r(p: int, m: int) -> None:
    s = build_schedule(p, m, 1, True, "1F1B", 1, True, ranks=p)
    assert _in_flight(s.actions, p) == [min(m, p - r) for r in range(p)]
    # the reported depth counts micro-batches whose F and B are in different supersteps:
    # the last stage runs each F and B back to back (1 held, reported 0)
    assert s.stash_depth.tolist() == [min(m, p - r) for r in range(p - 1)] + [0]


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (8, 3, 24), (4, 3, 12)])
def test_interleaved_warm_up_as_megatron(p: int, v: int, m: int) -> None:
    s = build_schedule(p * v, m, 1, True, "Interleaved1F1B", 1, True, ranks=p)
    warm = [min((p - r - 1) * 2 + (v - 1) * p, m * v) for r in range(p)]
    assert _in_flight(s.actions, p) == [w + 1 for w in warm]
    # every micro-batch runs F and B once on every stage, F through the stages in order
    fb = s.actions[s.actions["pass"].isin(["F", "B"])]
    assert len(fb) == 2 * p * v * m
    f = fb[fb["pass"] == "F"].set_index(["microbatch", "stage"])["superstep"].sort_index()
    for b in range(m):
        assert f.loc[b].is_monotonic_increasing


def test_one_rank_or_one_stage_per_rank_keeps_the_old_order() -> None:
    """v = 1 is plain 1F1B; one GPU runs its stages in the looped 1F1B order as before."""
    for n, ranks in ((4, 4), (2, 1)):
        a = build_schedule(n, 4, 1, True, "Interleaved1F1B", 1, True, ranks=ranks)
        b = build_schedule(n, 4, 1, True, "1F1B", 1, True)
        pd.testing.assert_frame_equal(a.actions, b.actions)


def test_megatron_blocks_each_send_until_it_is_done() -> None:
    """Megatron-LM's batched p2p waits for every send (`_communicate`: req.wait(), then
    torch.cuda.synchronize()): a stage's next action starts when its send has finished,
    so an interleaved schedule, which sends at every chunk, pays for its sends; without
    blocking the sender goes on at once."""
    import numpy as np

    from popviz.compiler.bsp import StageCosts
    from popviz.compiler.gpu_timing import time_gpu_schedule
    from popviz.target.gpu import A100_80GB

    p, v, m = 2, 2, 4
    n = p * v
    costs = StageCosts(
        ipu=np.arange(n) % p, forward=np.full(n, 1_000_000), recompute=np.zeros(n),
        backward=np.full(n, 2_000_000), optimiser=np.zeros(n),
        boundary_bytes=np.array([0] + [64 << 20] * (n - 1)), grad_bytes=np.zeros(n),
        offload_bytes=np.zeros(n), input_bytes=0, output_bytes=0)
    schedule = build_schedule(n, m, 1, True, "Interleaved1F1B", 1, False, ranks=p)
    free = time_gpu_schedule(schedule, costs, A100_80GB, p, 1)
    held = time_gpu_schedule(schedule, costs, A100_80GB, p, 1, blocking_sends=True)
    send = A100_80GB.p2p_ns(64 << 20, "nvlink")
    assert send > 100_000
    assert held.total_ns > free.total_ns
    acts = held.actions.sort_values(["gpu", "start"])
    for _, rows in acts.groupby("gpu"):
        rows = rows.reset_index(drop=True)
        for k in range(len(rows) - 1):
            a = rows.iloc[k]
            sends = (a["pass"] == "F" and a["stage"] < n - 1) or \
                (a["pass"] == "B" and a["stage"] > 0)
            if sends:  # the next action waits at least for the send
                assert rows.iloc[k + 1]["start"] >= a["end"] + send - 1
