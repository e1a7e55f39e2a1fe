"""The cost model against its published calibration points (tooling/calibration_points.json).

Full-size models are recorded in plan mode once per session (fake tensors, a few seconds
each); each throughput point is then re-costed in about a millisecond."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from popviz.compiler import compile
from popviz.target import get_target, make_target
from popviz.target.cost import op_costs
from popviz.target.costmodel import DEFAULT_COST, PROVENANCE, CostModel, load_calibration
from tooling.calibration import (
    FITTED,
    TRANSFORMERS,
    Evaluator,
    fit,
    fits,
    leave_one_out,
    load_points,
    point_options,
    point_program,
    prepare,
)
from tooling.costdoc import DOC, missing_provenance, render

POINTS = load_points()
FIT_POINTS = [p for p in POINTS if p["use"] == "fit"]
CHECKS = [p for p in POINTS if p["kind"] == "fits"]
MISSED = [p for p in POINTS if p["use"] == "check" and p["kind"] == "throughput"]
HELD_OUT = [p for p in POINTS if p["use"] == "holdout"]


def _needs(point: dict) -> None:
    """Skip a point whose model needs an optional package that is not installed."""
    if point["config"].get("requires"):
        pytest.importorskip(point["config"]["requires"])


@pytest.fixture(scope="module")
def evaluator() -> Evaluator:
    for point in FIT_POINTS:  # BERT-Large needs transformers
        _needs(point)
    return Evaluator(FIT_POINTS)


def test_the_calibration_set_is_documented_and_broad() -> None:
    assert len(POINTS) >= 12
    for p in POINTS:
        assert p["source"] and p["figure"] and p["config"], p["id"]
        assert p["kind"] in ("throughput", "bandwidth", "fits")
        assert p["use"] in ("fit", "check", "holdout"), p["id"]
    published = [p for p in POINTS if p["kind"] != "fits"]
    assert len(published) >= 37
    # the roles as committed (issue 20's evidence): a change of role is a deliberate edit.
    # Issue 20 counts leave-one-out over >= 25 published throughput / latency figures: the
    # fit holds 25 of them; 5 are held out (ViT, the MLPerf v2.0 BERT Pod64, and the three
    # multi-rack points within tolerance), 6 multi-rack ResNet-50 figures are documented
    # misses, and the Mk1 bandwidth microbenchmark is checked, not fitted (another program).
    # Issue 29: 7 inference figures (PopRT and ByteMLPerf on a C600), held out: inference
    # is never fitted
    assert (len(FIT_POINTS), len(HELD_OUT), len(MISSED)) == (25, 12, 6)
    inference = [p for p in HELD_OUT if not p["config"].get("training", True)]
    assert len(inference) >= 6 and {"resnet", "bert"} <= {p["config"]["model"]
                                                          for p in inference}
    assert all(p["kind"] == "throughput" for p in FIT_POINTS)
    assert len(CHECKS) >= 19
    throughput = [p for p in published if p["kind"] == "throughput"]
    assert {"mk2", "bow"} <= {p["config"]["target"] for p in throughput}
    for model in ("resnet", "bert"):  # convolutional and transformer, on Mk2 and Bow
        assert {"mk2", "bow"} <= {p["config"]["target"] for p in throughput
                                  if p["config"]["model"] == model}, model
    targets = {p["config"]["target"] for p in POINTS}
    models = {p["config"].get("model") for p in POINTS} - {None}
    assert {"mk1", "mk2", "bow"} <= targets
    assert {"resnet", "resnext", "efficientnet", "bert", "vit"} <= models
    for p in POINTS:  # transformers is optional: the points that need it say so
        if p["config"].get("model") in TRANSFORMERS:
            assert p["config"]["requires"] == "transformers", p["id"]
    assert {True, False} <= {p["config"].get("training", True) for p in CHECKS}
    assert not any("kacher" in (p["source"] + p["note"]).lower() for p in POINTS)


@pytest.mark.parametrize("point", FIT_POINTS, ids=lambda p: p["id"])
def test_each_point_is_within_its_tolerance(evaluator: Evaluator, point: dict) -> None:
    error = evaluator.predict(point, DEFAULT_COST) / point["value"] - 1
    if point.get("known_miss"):  # documented: noticed when the model stops missing it
        assert abs(error) > point["tolerance"], f"{point['id']} is now within tolerance"
    else:
        assert abs(error) <= point["tolerance"], f"{point['id']}: {error:+.1%}"


def test_mean_in_sample_error_is_pinned(evaluator: Evaluator) -> None:
    # over issue 20's 25 fitted throughput points: 5.4% in sample under IPU model v4.5
    # (each planned compute set's start-up; 5.9% under v4.2, 7.3% under v4.1, 8.5% under
    # v3.1); a change that makes it worse fails here
    assert np.mean(np.abs(evaluator.errors(DEFAULT_COST))) <= 0.06


def test_resnext_is_inside_ten_percent(evaluator: Evaluator) -> None:
    """Issue #29's target for the one grouped-convolution training point: ResNeXt-101 on
    a 2-IPU pipeline within 10% of its published throughput (+8.4% under IPU model v4.5,
    +10.0% before each compute set paid its start-up)."""
    point = next(p for p in FIT_POINTS if p["id"] == "bow-resnext101-train-pod16-2stage-mb6")
    assert abs(evaluator.predict(point, DEFAULT_COST) / point["value"] - 1) <= 0.10


def test_the_docs_table_of_fitted_points_is_the_models(evaluator: Evaluator) -> None:
    """docs/cost-model.md's table of the fitted points shows what the committed constants
    model and the in-sample error: a refit without `python -m tooling.costdoc --write
    --results` leaves it stale and fails here (the leave-one-out column is the fit's)."""
    from tooling.costdoc_results import FIT_HEADER

    table = DOC.read_text().split(FIT_HEADER, 1)[1].split("\n\n", 1)[0]
    rows = {c[0]: c for c in ([x.strip() for x in line.split("|")[1:-1]]
                              for line in table.splitlines()[2:]) if c and c[1] == "fit"}
    assert set(rows) == {p["id"] for p in FIT_POINTS}
    for point, error in zip(FIT_POINTS, evaluator.errors(DEFAULT_COST), strict=True):
        got = evaluator.predict(point, DEFAULT_COST)
        assert rows[point["id"]][3] == f"{got:,.1f}", point["id"]
        assert rows[point["id"]][4] == f"{error:+.1%}", point["id"]


def test_the_committed_constants_are_what_the_fit_gives(evaluator: Evaluator) -> None:
    refit = fit(evaluator, FIT_POINTS, CostModel())
    for name in FITTED:
        assert getattr(refit, name) == pytest.approx(getattr(DEFAULT_COST, name), rel=0.02)
        assert PROVENANCE[name].kind == "fitted"


def test_leave_one_out_mean_error_is_pinned(evaluator: Evaluator) -> None:
    loo = leave_one_out(evaluator, FIT_POINTS, CostModel())  # as the fit itself starts
    inside = np.abs(evaluator.errors(DEFAULT_COST))
    # issue 20's target: <= 10% over >= 25 published throughput / latency figures
    assert len(FIT_POINTS) >= 25
    assert np.mean(np.abs(loo)) <= 0.065  # 5.6% under IPU model v4.5 (6.3% under v4.2,
    # 7.8% under v4.1, 9.1% under v3.1)
    # the fit minimises weighted squared log error, not mean |error|: out of sample may read
    # a fraction of a percent better, never much better (that would mean a leak)
    assert np.mean(np.abs(loo)) >= np.mean(inside) - 0.01


@pytest.mark.parametrize("index", [0, 1], ids=["data-parallel", "grouped-pipeline"])
def test_fast_prediction_equals_compile(evaluator: Evaluator, index: int) -> None:
    # the second: a 4-IPU TensorFlow pipeline, its clocks every forward then every backward
    point = FIT_POINTS[index]
    assert (index == 1) == (point["config"]["options"].get("schedule") == "Grouped")
    report = compile(point_program(point), point_options(point))
    assert evaluator.predict(point, DEFAULT_COST) == pytest.approx(
        report.summary["throughput"], rel=1e-9)


def test_cached_terms_give_the_same_cycles_as_a_full_costing(evaluator: Evaluator) -> None:
    other = DEFAULT_COST.with_values(amp_efficiency=0.6, vector_efficiency=0.3)
    for prepared in evaluator.prepared.values():
        full = op_costs(prepared.ops, prepared.target, prepared.precision, prepared.amp,
                        other, prepared.features)["cycles"].to_numpy(np.float64)
        assert np.array_equal(prepared.op_cycles(other), full), prepared.point["id"]


def test_held_out_points_are_never_fitted() -> None:
    fitted = set(load_calibration()["fit"]["points"])
    assert HELD_OUT and not fitted & {p["id"] for p in HELD_OUT}
    assert fitted == {p["id"] for p in FIT_POINTS}


@pytest.mark.parametrize("point", HELD_OUT, ids=lambda p: p["id"])
def test_held_out_points_are_predicted_within_their_tolerance(point: dict) -> None:
    _needs(point)
    error = prepare(point).predict(DEFAULT_COST) / point["value"] - 1
    if point.get("known_miss"):
        assert abs(error) > point["tolerance"], f"{point['id']} is now within tolerance"
    else:
        assert abs(error) <= point["tolerance"], f"{point['id']}: {error:+.1%} out of sample"


@pytest.mark.parametrize("point", CHECKS, ids=lambda p: p["id"])
def test_published_configurations_fit_or_not(point: dict) -> None:
    if point.get("known_miss"):  # documented miss: noticed when the model stops missing it
        assert fits(point) is not point["value"], f"{point['id']} no longer missed"
    else:
        assert fits(point) is point["value"]


@pytest.mark.parametrize("point", MISSED, ids=lambda p: p["id"])
def test_documented_throughput_misses_are_still_missed(point: dict) -> None:
    assert point["known_miss"]
    _needs(point)
    error = prepare(point).predict(DEFAULT_COST) / point["value"] - 1
    assert abs(error) > point["tolerance"], f"{point['id']} is now within tolerance"


def test_every_constant_has_a_provenance_and_the_doc_is_current() -> None:
    assert missing_provenance() == []
    assert render(DOC.read_text()) == DOC.read_text(), \
        "run python -m tooling.costdoc --write"


def test_cost_constants_override_per_target() -> None:
    slow = make_target({"base": "mk2", "name": "mk2-slow-sync", "sync_cycles": 6000,
                        "cost": {"vector_efficiency": 0.1}})
    assert slow.sync_cycles == 6000 and slow.cost.vector_efficiency == 0.1
    assert slow.cost.amp_efficiency == get_target("mk2").cost.amp_efficiency
    with pytest.raises(ValueError, match="unknown cost model constant"):
        make_target({"base": "mk2", "name": "x", "cost": {"warp_speed": 1}})
    with pytest.raises(ValueError, match="unknown cost model constants"):
        CostModel().with_values(warp_speed=1)


def test_a_transformer_without_transformers_is_one_clear_error(monkeypatch) -> None:
    from popviz.models.hf import build_transformer

    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(ImportError, match="optional package 'transformers'"):
        build_transformer("bert", "large", 1)
    with pytest.raises(ValueError, match="unknown transformer 'bert' size 'huge'"):
        build_transformer("bert", "huge", 1)
    with pytest.raises(ValueError, match="unknown vit task 'squad'; valid: pretraining"):
        build_transformer("vit", "base-16", 1, task="squad")


def test_bert_large_is_planned_as_graphcore_runs_it() -> None:
    point = next(p for p in POINTS if p["config"].get("model") == "bert")
    _needs(point)
    program = point_program(point)
    ops = program.ops
    assert 330e6 < program.model["parameters"] < 340e6  # BERT-Large, vocab 30,400
    layers = ops["module"].astype(str).str.extract(r"^bert\.encoder\.layer\.(\d+)\.")[0]
    assert set(layers.dropna().astype(int)) == set(range(24))
    # the MLM head only on the masked positions: micro-batch 8 x 20 masked tokens, the
    # vocabulary projection in 5 serial steps (embedding_serialization_vocab_steps 5)
    head = ops[(ops["module"] == "cls.predictions.decoder") & (ops["phase"] == "forward")
               & (ops["op_class"] == "matmul")]
    assert head["out_shape"].tolist() == ["[160,6080]"] * 5


def test_bert_squad_is_the_encoder_and_a_span_head() -> None:
    point = next(p for p in POINTS if p["config"].get("variant", {}).get("task") == "squad")
    _needs(point)
    program = point_program(point)
    ops = program.ops
    assert 330e6 < program.model["parameters"] < 340e6  # BERT-Large without pooler and MLM
    assert not ops["module"].astype(str).str.startswith(("cls.", "bert.pooler")).any()
    head = ops[(ops["module"] == "qa_outputs") & (ops["phase"] == "forward")
               & (ops["op_class"] == "matmul")]
    # start and end logits of every token: micro-batch 4 x 384 positions
    assert head["out_shape"].tolist() == ["[1536,2]"]
