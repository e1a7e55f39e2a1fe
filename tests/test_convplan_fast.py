"""The planner's fast search (popviz/target/convgrid.py: pruned enumeration, tabled
factors, the frontier peeled without a sort) against the plain reference
(tests/convplan_reference.py): the same grids bit for bit, the same plans at every AMP, on
random convolution parameters."""

from __future__ import annotations

import random

import numpy as np
import pytest

from popviz.target import convgrid, convplan, get_target
from popviz.target.convparams import BWD, FWD, WU, ConvParams
from popviz.target.cost import Precision, tile_arch
from tests.convplan_reference import reference_frontier, reference_grid

ARCHS = [tile_arch(get_target(t), Precision.parse(p, hp)) for t in ("mk1", "mk2")
         for p, hp in (("16.16", True), ("16.16", False), ("32.32", False))]


def _random_params(rng: random.Random) -> ConvParams:
    return ConvParams(
        batch=rng.choice([1, 2, 3, 7, 16, 48, 100, 576, 4096]),
        groups=rng.choice([1, 1, 1, 2, 4, 32, 64]),
        in_chans=rng.choice([1, 3, 4, 8, 16, 64, 100, 512, 2048, 50176]),
        out_chans=rng.choice([1, 3, 16, 64, 128, 1000, 4096]),
        field=(rng.choice([1, 7, 14, 28, 56, 112]), rng.choice([1, 7, 14, 56, 112])),
        kernel=rng.choice([(1, 1), (3, 3), (7, 7), (1, 4)]),
        stride=rng.choice([(1, 1), (2, 2)]), kind=rng.choice([FWD, BWD, WU]))


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in b:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_fast_grid_matches_the_reference_bit_for_bit() -> None:
    rng = random.Random(20)
    for _ in range(120):
        p, arch = _random_params(rng), rng.choice(ARCHS)
        g = rng.choice(arch.in_groups)
        _same(convgrid.grid.__wrapped__(p, arch, g), reference_grid(p, arch, g))


def test_frontier_matches_a_sort_with_ties() -> None:
    rng = np.random.default_rng(20)
    for n in (1, 2, 5, 40, 500):
        for _ in range(20):  # small integers: many equal cycles and equal temps
            grid = {k: rng.integers(0, 6, n).astype(np.float64)
                    for k in ("compute", "exchange", "reduce", "start", "temp")}
            grid["used"] = np.arange(n)
            rows = convgrid._frontier(grid)
            _same({k: v[rows] for k, v in grid.items()}, reference_frontier(grid))


@pytest.fixture()
def reference_planner(monkeypatch: pytest.MonkeyPatch):
    """plan_conv as it is, and plan_conv searching the reference grids (caches off)."""
    def plan(p: ConvParams, arch, amp: float, grid) -> convplan.Plan:
        monkeypatch.setattr(convplan, "_grid", grid)
        return convplan.plan_conv.__wrapped__(p, arch, amp)
    return plan


def test_plans_match_the_reference_at_every_amp(reference_planner) -> None:
    rng = random.Random(21)
    fast = convgrid.grid.__wrapped__
    for _ in range(25):
        p, arch = _random_params(rng), rng.choice(ARCHS)
        for amp in (0.05, 0.1, 0.3, 0.6):
            assert reference_planner(p, arch, amp, fast) == \
                reference_planner(p, arch, amp, reference_grid), (p, amp)


def test_repeated_shapes_are_planned_once() -> None:
    """ResNet-50 repeats its conv shapes: a compile plans each distinct pass once per AMP
    (plan_conv's cache), and costing the same ops again plans nothing."""
    import popviz
    from popviz.target.cost import op_costs, op_features

    ops = popviz.open("profiles/rn50_pipeline").ops
    features = op_features(ops)
    distinct = {p for passes in features.passes for p in passes}
    total = sum(len(passes) for passes in features.passes)
    assert total > 2 * len(distinct)  # the repeats a cache saves
    mk2, precision = get_target("mk2"), Precision.parse("16.32", True)
    convplan.clear_caches()
    amp = np.full(len(ops), 0.15)
    first = op_costs(ops, mk2, precision, amp, features=features)
    assert convplan.plan_conv.cache_info().misses == len(distinct)
    again = op_costs(ops, mk2, precision, amp, features=features)
    assert convplan.plan_conv.cache_info().misses == len(distinct)
    assert first.equals(again)  # deterministic
