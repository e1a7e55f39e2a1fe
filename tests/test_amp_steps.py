"""Issue 20: lowering AMP from 0.6 to 0.1 changes the modelled cycles and temporary memory
of conv / matmul-heavy configurations monotonically and visibly, on a ResNet (the bundled
4-IPU ResNet-50 pipeline) and a matmul model (a plain MLP recorded here); the per-IPU step
table (popviz.analysis.amp) is what a compile at each AMP models; tune prints it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import popviz
from popviz.advise.tune import load_program
from popviz.analysis.amp import AMP_STEPS, amp_effect, amp_steps
from popviz.compiler import compile as compile_program
from popviz.options import Options
from popviz.recorder import record_program
from popviz.reporters.tune import render_amp_steps
from popviz.target.cost import AMP_CLASSES

RN50 = "profiles/rn50_pipeline"


def _monotone(steps: pd.DataFrame) -> None:
    """Per IPU, as AMP rises: cycles never up, temporary memory never down."""
    for ipu, g in steps[steps["amp"].isin(AMP_STEPS)].groupby("ipu"):
        g = g.sort_values("amp")
        assert g["amp"].tolist() == list(AMP_STEPS), ipu
        assert (np.diff(g["cycles"].to_numpy()) <= 0).all(), g
        assert (np.diff(g["temp_bytes"].to_numpy()) >= 0).all(), g


def _at(steps: pd.DataFrame, amp: float) -> pd.DataFrame:
    return steps[steps["amp"] == amp].set_index("ipu")


def _compiled_sums(ops: pd.DataFrame) -> pd.DataFrame:
    ops = ops[ops["op_class"].isin(AMP_CLASSES)]
    return ops.groupby("ipu").agg(cycles=("cycles", "sum"), temp_bytes=("temp_bytes", "max"))


@pytest.fixture(scope="module")
def rn50() -> tuple[pd.DataFrame, object]:
    p = popviz.open(RN50)
    return amp_steps(p.ops, p.meta), p


def test_resnet50_amp_steps_are_monotone_and_visible(rn50) -> None:
    steps, p = rn50
    _monotone(steps)
    low, high = _at(steps, 0.1), _at(steps, 0.6)
    assert sorted(low.index) == [0, 1, 2, 3]
    # visibly: every IPU's fullest-tile temporary falls by a fifth or more, one by over
    # half; the conv cycles of the whole pipeline rise by over 3%
    assert (low["temp_bytes"] <= 0.85 * high["temp_bytes"]).all()
    assert (low["temp_bytes"] <= 0.5 * high["temp_bytes"]).any()
    assert low["cycles"].sum() >= 1.03 * high["cycles"].sum()
    # serial slices where the bound bites (IPU0's convolutions fit 0.1 without them: each
    # slice's compute sets pay their start-up again, so the search slices only when it must)
    assert (low["serial_ops"] > 0).sum() >= 3 and (high["serial_ops"] == 0).all()
    # the rows at the AMP in force are the stored ops table's (the same planner)
    now = steps[steps["in_force"]].set_index("ipu")
    assert (now["amp"] == 0.15).all()
    stored = _compiled_sums(p.ops)
    assert now["cycles"].tolist() == stored["cycles"].tolist()
    assert now["temp_bytes"].tolist() == stored["temp_bytes"].tolist()


def test_resnet50_steps_are_what_a_compile_models(rn50) -> None:
    steps, p = rn50
    program, options = load_program(p)
    for amp in (0.1, 0.6):
        report = compile_program(program, options.copy().set_available_memory_proportion(amp))
        got = _compiled_sums(report.tables["ops"])
        want = _at(steps, amp)
        assert got["cycles"].tolist() == want["cycles"].tolist(), amp
        assert got["temp_bytes"].tolist() == want["temp_bytes"].tolist(), amp


def test_mlp_matmuls_trade_cycles_for_memory() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 1024))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(512, 1024), torch.randn(512, 1024)

    def step(m: nn.Module, o: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
        o.zero_grad(set_to_none=True)
        ((m(x) - y) ** 2).mean().backward()
        o.step()

    program = record_program(step, model, opt, x, y, model=model, mode="plan")
    options = Options(target="mk2", precision="16.16", half_partials=True,
                      available_memory_proportion=0.6)
    report = compile_program(program, options)
    steps = amp_steps(report.tables["ops"], report.meta)
    assert steps is not None and set(steps["ipu"]) == {0}
    _monotone(steps)
    low, high = _at(steps, 0.1).iloc[0], _at(steps, 0.6).iloc[0]
    assert low["cycles"] >= 1.1 * high["cycles"]  # +22% modelled: visibly slower
    assert low["temp_bytes"] <= 0.3 * high["temp_bytes"]  # 343 KB -> 63 KB
    assert low["temp_bytes"] <= 0.1 * 638_976  # within the bound at 0.1
    # every step between changes the plans: the advice has something to name both ways
    assert steps.loc[steps["amp"] > 0.1, "changes"].all()
    assert amp_effect(steps, 0, lower=True)[0] == 0.4
    low_report = compile_program(program, options.copy().set_available_memory_proportion(0.1))
    assert _compiled_sums(low_report.tables["ops"])["cycles"].iloc[0] == low["cycles"]


def test_amp_steps_table_and_edges(rn50) -> None:
    steps, _ = rn50
    lines = render_amp_steps(steps)
    assert lines[2].split() == ["AMP", "0.1", "0.15", "0.2", "0.3", "0.4", "0.6"]
    assert [line.split()[0] for line in lines[3:]] == ["IPU0", "IPU1", "IPU2", "IPU3"]
    assert all(line.count("*") == 1 for line in lines[3:])  # the AMP in force
    assert render_amp_steps(None) == []
    # nothing to re-plan: no conv / matmul, or no options to read the target from
    ops = popviz.open(RN50).ops
    assert amp_steps(ops[ops["op_class"] == "elementwise"], {"options": {}}) is None
    assert amp_steps(ops, {"options": {"target": "no-such-ipu"}}) is None
    assert amp_steps(pd.DataFrame(), {}) is None


def test_amp_steps_figure_merges_steps_that_change_nothing(rn50) -> None:
    from popviz.figures.tune import amp_steps_figure

    steps, _ = rn50
    fig = amp_steps_figure(steps)
    assert [t.name for t in fig.data] == ["IPU0", "IPU1", "IPU2", "IPU3"]
    ipu0 = fig.data[0]
    assert list(ipu0.text) == ["0.1", "0.15-0.6"]  # nothing changes above 0.15 on IPU0
    assert list(ipu0.marker.symbol) == ["circle", "star"]  # 0.15 is in force
    assert len(amp_steps_figure(None).data) == 0
    # labels go to the side with more room: the lines of two IPUs that run close label
    # away from each other (the highest above, the lowest below)
    level = steps.groupby("ipu")["cycles"].mean().sort_values()
    where = {int(t.name[3:]): str(t.textposition[0]).split()[0] for t in fig.data}
    assert where[int(level.index[-1])] == "top"
    assert where[int(level.index[0])] == "bottom"
    for low, high in zip(level.index[:-1], level.index[1:]):
        assert (where[int(low)], where[int(high)]) != ("top", "bottom")
    # issue 31: two AMP steps a few KiB apart (IPU1's 0.15 and 0.2 once were) had their
    # labels drawn on top of each other; neighbours that close label left and right
    from popviz.figures.tune import _apart

    near = pd.DataFrame({"temp_bytes": [93.5 * 1024, 95.7 * 1024, 180.0 * 1024],
                         "cycles": [2.61, 2.60, 2.40]})
    got = _apart(near, "top center", (200.0 * 1024, 1.0))
    assert got[:2] == ["top left", "top right"] and got[2] == "top center"
    # and in the real figure: every pair of neighbouring markers within 4% of both axes'
    # spans (here of the drawn points: never wider than the figure's own) is labelled apart
    xs = [x for t in fig.data for x in t.x]
    ys = [y for t in fig.data for y in t.y]
    span_x, span_y = max(xs) - min(xs) or 1.0, max(ys) - min(ys) or 1.0
    for t in fig.data:
        for i in range(1, len(t.x)):
            close = abs(t.x[i] - t.x[i - 1]) / span_x < 0.04 and \
                abs(t.y[i] - t.y[i - 1]) / span_y < 0.04
            sides = {t.textposition[i].split()[1], t.textposition[i - 1].split()[1]}
            assert sides == {"left", "right"} or not close, (t.name, i)


def test_tune_cli_prints_the_amp_steps(capsys) -> None:
    from popviz.cli.main import main

    assert main(["tune", RN50, "--max-compiles", "2", "--no-progress",
                 "--amp-steps", "0.1", "0.3"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("What each AMP step trades"):].splitlines()
    assert table[1].split() == ["AMP", "0.1", "0.15", "0.3"]  # 0.15: in force
    assert table[2].split()[0] == "IPU0" and table[2].count("*") == 1
    assert main(["tune", RN50, "--max-compiles", "2", "--no-progress", "--json"]) == 0
    import json

    steps = json.loads(capsys.readouterr().out)["amp_steps"]
    assert len(steps) == 4 * 6 and {s["ipu"] for s in steps} == {0, 1, 2, 3}


def test_amp_step_labels_print_over_no_other_label_or_marker(rn50) -> None:
    """The bundled ResNet-50: IPU1's and IPU3's AMP 0.1 points lie a few KiB apart, and
    their '0.1' labels printed over each other (and over the other line's marker); in a
    plot narrower than the page gives it, no label covers another label or a marker."""
    from popviz.figures.tune import PLOT_PX, KiB, _overlap, amp_steps_figure, label_box

    steps, _ = rn50
    fig = amp_steps_figure(steps)
    xs = np.array([x for t in fig.data for x in t.x], dtype=float)
    ys = np.array([y for t in fig.data for y in t.y], dtype=float)
    assert xs.max() <= steps["temp_bytes"].max() / KiB + 1

    def scale(v: np.ndarray, px: float) -> np.ndarray:
        pad = (v.max() - v.min()) * 0.05
        return (v - v.min() + pad) / (v.max() - v.min() + 2 * pad) * px

    sx, sy = scale(xs, PLOT_PX[0]), scale(ys, PLOT_PX[1])
    texts = [str(s) for t in fig.data for s in t.text]
    sizes = [float(s) for t in fig.data for s in t.marker.size]
    where = [str(p) for t in fig.data for p in t.textposition]
    labels = [label_box(x, y, s, m, p)
              for x, y, s, m, p in zip(sx, sy, texts, sizes, where, strict=True)]
    markers = [(x - m / 2, x + m / 2, y - m / 2, y + m / 2)
               for x, y, m in zip(sx, sy, sizes, strict=True)]
    for i, box in enumerate(labels):
        for j in range(len(labels)):
            if j != i:
                assert _overlap(box, labels[j]) == 0, (texts[i], texts[j])
                assert _overlap(box, markers[j]) == 0, (texts[i], j)
