"""Advice for the whole pipeline: every split placed by a balanced partition of the stored
per-layer costs (checked against brute force), memory headroom per IPU, what bounds the
heavy stage, amber from TILE_AMBER tile use, nothing pipeline-ish for one IPU."""

from __future__ import annotations

import itertools
import re

import pandas as pd
import pytest

import popviz
from popviz import analysis
from popviz.analysis.pipeline_plan import (
    balanced_bounds,
    bound_by,
    host_io_by_ipu,
    profile_recomputes,
    segments,
    stage_costs,
)
from popviz.vocab import TILE_AMBER

LAYERS = [f"L{i}" for i in range(8)]
MOVE = re.compile(r"^(Part \d+ of \d+ of the plan|The plan): move split ")


def _is_move(text: str) -> bool:
    return bool(MOVE.match(text))


def _ops(costs: list[int], stage_of: list[int]) -> pd.DataFrame:
    """One forward and one backward op per layer; the backward op costs as much again."""
    rows = []
    for layer, cost, stage in zip(LAYERS, costs, stage_of):
        rows.append({"layer": layer, "cycles": cost, "stage": stage, "pass": "F"})
        rows.append({"layer": layer, "cycles": cost, "stage": stage, "pass": "B"})
    return pd.DataFrame(rows)


def _meta(amp: float = 0.6) -> dict:
    return {"options": {"strategy": "pipelined", "gradient_accumulation": 64,
                        "available_memory_proportion": {"all": amp}},
            "model": {"layers": LAYERS, "split_names": LAYERS[1:]}}


def _stage_table(costs: list[int], stage_of: list[int], first: list[str],
                 exchange: list[int] | None = None) -> pd.DataFrame:
    n = max(stage_of) + 1
    busy = [2 * sum(c for c, s in zip(costs, stage_of) if s == k) for k in range(n)]
    step = max(busy) * 2
    return pd.DataFrame({
        "stage": range(n), "ipu": range(n), "forward_cycles": [b // 2 for b in busy],
        "backward_cycles": [b - b // 2 for b in busy], "recompute_cycles": 0,
        "exchange_cycles": exchange or [0] * n,
        "idle_cycles": [step - b for b in busy], "stash_bytes": 0, "peak_bytes": 0,
        "first_layer": first, "optimiser_cycles": 0})


def _tiles(use: list[float], cap: int = 1000) -> pd.DataFrame:
    return pd.DataFrame({"ipu": range(len(use)), "tile": 0, "capacity_bytes": cap,
                         "total_bytes": [int(u * cap) for u in use],
                         "always_live": [int(u * cap) for u in use],
                         "not_always_live_peak": 0, "code": 0})


# stage 0 holds L0-L2 (heavy), stage 3 is light (0.67x of the mean would be "hand layers
# to stage 0" in the old neighbour rule): balancing moves every split, not one
COSTS = [50, 40, 30, 10, 10, 10, 10, 10]
STAGE_OF = [0, 0, 0, 1, 2, 3, 3, 3]
FIRST = ["L0", "L3", "L4", "L5"]


def _brute_force(costs: list[int], stages: int, frozen: dict[int, tuple[int, int]]) -> int:
    best = None
    for cut in itertools.combinations(range(1, len(costs)), stages - 1):
        edges = [0, *cut, len(costs)]
        if any(edges[k] < lo or edges[k + 1] > hi for k, (lo, hi) in frozen.items()):
            continue
        worst = max(sum(costs[a:b]) for a, b in itertools.pairwise(edges))
        best = worst if best is None else min(best, worst)
    return best


def test_balanced_bounds_match_brute_force_with_and_without_a_frozen_stage() -> None:
    segs = segments(_ops(COSTS, STAGE_OF), _meta())
    assert segs is not None and list(segs.cost) == [2 * c for c in COSTS]
    current = segs.bounds(FIRST[1:])
    assert current == [3, 4, 5]
    bounds = balanced_bounds(segs, 4, current)
    assert max(stage_costs(segs, bounds)) == 2 * _brute_force(COSTS, 4, {})
    # stage 1 frozen in its range [3, 4): it may not grow
    frozen = balanced_bounds(segs, 4, current, frozen={1})
    assert frozen[0] >= 3 and frozen[1] <= 4
    assert max(stage_costs(segs, frozen)) == 2 * _brute_force(COSTS, 4, {1: (3, 4)})


def test_advice_moves_every_split_that_should_move() -> None:
    stages = _stage_table(COSTS, STAGE_OF, FIRST)
    advice = analysis.advise(_meta(), stages, _tiles([0.5] * 4), _ops(COSTS, STAGE_OF))
    texts = [a.text for a in advice]
    assert any("Stage 0 on IPU0 is the bottleneck" in t and "compute-bound" in t
               for t in texts)
    moves = [t for t in texts if _is_move(t)]
    segs = segments(_ops(COSTS, STAGE_OF), _meta())
    proposed = balanced_bounds(segs, 4, [3, 4, 5])
    changed = sum(p != c for p, c in zip(proposed, [3, 4, 5]))
    assert len(moves) == changed >= 2
    # the light last stage never hands layers to stage 0 (the old neighbour rule)
    assert not any(_is_move(t) and "stage 0 (IPU0" in t for t in texts)
    assert all("earlier" in t for t in moves)
    summary = next(t for t in texts if t.startswith("One plan ("))
    assert f"from {2 * 120:,} to {max(stage_costs(segs, proposed)):,.0f}" in summary


def test_a_nearly_full_ipu_takes_no_layers_and_is_amber() -> None:
    stages = _stage_table(COSTS, STAGE_OF, FIRST)
    advice = analysis.advise(_meta(), stages, _tiles([0.5, 0.5, 0.95, 0.5]),
                             _ops(COSTS, STAGE_OF))
    takers = [a.ipu for a in advice if _is_move(a.text)]
    assert 2 not in takers and takers
    assert any("IPU2 take no layers" in a.text for a in advice)
    amber = [a for a in advice if a.topic == "memory"]
    assert [a.ipu for a in amber] == [2] and amber[0].severity == "warning"
    # stage 0 can only give layers through stage 1: a full IPU1 stops every move
    held = analysis.advise(_meta(), stages, _tiles([0.5, 0.95, 0.5, 0.5]),
                           _ops(COSTS, STAGE_OF))
    assert not any(_is_move(a.text) for a in held)
    assert any("cannot be balanced" in a.text and "IPU1 take no layers" in a.text
               for a in held)


def test_a_nearly_full_tile_is_never_nothing_to_change() -> None:
    stages = _stage_table([10] * 8, [0, 0, 0, 0, 1, 1, 1, 1], ["L0", "L4"])
    ops = _ops([10] * 8, [0, 0, 0, 0, 1, 1, 1, 1])
    calm = analysis.advise(_meta(), stages, _tiles([0.5, 0.5]), ops)
    assert [a.topic for a in calm] == ["ok"]
    full = analysis.advise(_meta(), stages, _tiles([0.5, 0.97]), ops)
    assert "ok" not in [a.topic for a in full]
    assert any(a.severity == "warning" and "97% used" in a.text for a in full)
    edge = analysis.advise(_meta(), stages, _tiles([0.5, TILE_AMBER]), ops)
    assert any(a.topic == "memory" for a in edge)


def test_host_io_bound_stage_gets_no_split_move() -> None:
    stages = _stage_table(COSTS, STAGE_OF, FIRST, exchange=[2000, 0, 0, 0])
    exchange = pd.DataFrame({"src": ["host", "0"], "dst": ["0", "1"], "bytes": [1, 1],
                             "start": [0, 0], "end": [1900, 100], "kind": ["host_in", "a"]})
    assert host_io_by_ipu(exchange) == {0: 1900.0}
    advice = analysis.advise(_meta(), stages, _tiles([0.5] * 4), _ops(COSTS, STAGE_OF),
                             exchange=exchange)
    texts = [a.text for a in advice]
    assert any("host I/O-bound" in t and "Moving splits does not shorten" in t
               for t in texts)
    assert not any(_is_move(t) for t in texts)


def test_bound_by_names_the_largest_share() -> None:
    row = pd.Series({"forward_cycles": 10, "backward_cycles": 10, "exchange_cycles": 100})
    assert bound_by(row, 10)[0] == "exchange"
    assert bound_by(row, 90)[0] == "host I/O"
    kind, shares = bound_by(pd.Series({"forward_cycles": 300, "exchange_cycles": 100}), 0)
    assert kind == "compute" and shares["compute"] == pytest.approx(0.75)


def test_one_ipu_gets_no_bottleneck_or_bubble_advice() -> None:
    stages = _stage_table([10] * 8, [0] * 8, ["L0"])
    stages["idle_cycles"] = 10 * stages["forward_cycles"]  # a huge idle share
    advice = analysis.advise(_meta(), stages, _tiles([0.5]), _ops([10] * 8, [0] * 8))
    assert [a.topic for a in advice] == ["ok"]
    # two stages on the same IPU: no bubble card either
    two = _stage_table([10] * 8, [0, 0, 0, 0, 1, 1, 1, 1], ["L0", "L4"])
    two["ipu"] = 0
    two["idle_cycles"] = 10 * two["forward_cycles"]
    assert "accumulation" not in [a.topic for a in analysis.advise(
        _meta(), two, _tiles([0.5]), _ops([10] * 8, [0, 0, 0, 0, 1, 1, 1, 1]))]


def test_the_tune_search_plan_replaces_the_balanced_split() -> None:
    stages = _stage_table(COSTS, STAGE_OF, FIRST)
    advice = analysis.advise(_meta(), stages, _tiles([0.5] * 4), _ops(COSTS, STAGE_OF),
                             proposed_splits=["L2", "L3", "L5"])
    texts = [a.text for a in advice]
    assert any(t.endswith("move split 'L3' earlier to 'L2': stage 1 (IPU1, fullest tile 50% "
                          "used) takes L2 from stage 0; with the whole plan stage 1 goes "
                          "from 20 to 60 cycles per micro-batch.") for t in texts)
    assert any("move split 'L4' earlier to 'L3'" in t for t in texts if _is_move(t))
    assert not any("'L5'" in t and _is_move(t) for t in texts)
    assert any("the tune search's best plan" in t for t in texts)


def test_bundled_profiles_segment_costs_equal_the_stage_table() -> None:
    p = popviz.open("profiles/rn50_pipeline")
    segs = segments(p.ops, p.meta)
    bounds = segs.bounds(list(p.stages["first_layer"].iloc[1:]))
    st = p.stages
    accumulation = p.meta["options"]["gradient_accumulation"]
    expected = (st["forward_cycles_per_microbatch"] + st["recompute_cycles_per_microbatch"]
                + st["backward_cycles_per_microbatch"] + st["optimiser_cycles"] / accumulation)
    # the stored recompute copies are left out of the segments and added back by the
    # planner's own rule (every stage but the last recomputes its forward)
    assert p.meta["options"]["recomputation"]
    assert stage_costs(segs, bounds, profile_recomputes(p.meta)) == pytest.approx(
        expected.tolist(), rel=1e-6)
    assert stage_costs(segs, bounds) != pytest.approx(expected.tolist(), rel=1e-6)
    texts = [a.text for a in analysis.insights(p)["advice"]]
    # IPU model v4 (each op class at PopLibs' estimates, bounded factors): the published
    # split is balanced, its busiest stage within 10% of the mean, so the advice moves no
    # split (v3, with a third of the cycles in the norms, moved two: issue 29)
    recompute = profile_recomputes(p.meta)
    costs = stage_costs(segs, bounds, recompute)
    assert max(costs) / (sum(costs) / len(costs)) < 1.1
    assert not any(_is_move(t) for t in texts)
    assert not any(t.startswith("One plan") for t in texts)
    amp = {a.ipu: a.text for a in analysis.insights(p)["advice"] if a.topic == "amp"}
    # re-planned per AMP step (analysis.amp): only IPUs whose plans change are named
    assert amp and all("raise availableMemoryProportion from 0.15 to" in t
                       for t in amp.values())


def test_bundled_single_block_stage_is_not_told_to_move_its_split() -> None:
    p = popviz.open("profiles/tutorial_pipelined/training")
    texts = [a.text for a in analysis.insights(p)["advice"]]
    assert not any("move split 'B2' earlier" in t for t in texts)
    assert any("cannot be balanced further" in t for t in texts)
    one = popviz.open("profiles/resnext101_inference_mk1")
    topics = [a.topic for a in analysis.insights(one)["advice"]]
    assert "accumulation" not in topics and "split" not in topics


def test_nothing_to_change_claims_a_fit_only_when_tiles_say_so() -> None:
    """A measured run has no tile data: its fit is unknown, so the all-clear must not say
    'Fits' (it did for an imported H100 trace)."""
    stages = _stage_table([10] * 8, [0] * 8, ["L0"])
    known = analysis.advise(_meta(), stages, _tiles([0.5]), _ops([10] * 8, [0] * 8))
    unknown = analysis.advise(_meta(), stages, _tiles([0.5]).iloc[0:0],
                              _ops([10] * 8, [0] * 8))
    # one stage on one device: nothing to balance, so no "balanced" claim (issue 21)
    assert known[-1].text.startswith("Fits on one device: no stages to balance")
    assert unknown[-1].text.startswith("One device: no stages to balance")


def test_split_moves_read_as_parts_of_one_plan() -> None:
    """effnet_b4_pipeline: the bottleneck (stage 1) takes a block in the first move while
    later moves take more from it; alone, that first line read as loading the bottleneck
    further. The plan comes first and every move says it is a part of it."""
    p = popviz.open("profiles/effnet_b4_pipeline")
    advice = analysis.insights(p)["advice"]
    texts = [a.text for a in advice if a.topic == "split"]
    plan = next(i for i, t in enumerate(texts) if t.startswith("One plan ("))
    moves = [i for i, t in enumerate(texts) if _is_move(t)]
    assert len(moves) >= 2 and plan < min(moves)
    assert all(f"of {len(moves)} of the plan" in texts[i] for i in moves)
    # the bottleneck's own line says where the whole plan leaves it: lower
    top = analysis.insights(p)["bottleneck"]["stage"]
    mine = [texts[i] for i in moves if f": stage {top} (" in texts[i]]
    for t in mine:
        got = re.search(rf"plan stage {top} goes from ([\d,]+) to ([\d,]+)", t)
        assert got and float(got[2].replace(",", "")) < float(got[1].replace(",", ""))
