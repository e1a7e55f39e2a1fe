"""Calibration: the published points of tooling/calibration_points.json, modelled.

Each point names a target, a model and a configuration. `prepare` plans it once (record
in plan mode, place stages, build the schedule); `Prepared.predict(cost)` then re-costs its
ops with another CostModel and re-times the schedule in about a millisecond, which is what
makes the fit (bench/fit_cost_model.py) and its leave-one-out check cheap. The prediction
is exactly what `compile` reports for the same cost model (a test checks it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from popviz.actions import CONTRACT_PASSES
from popviz.compiler.bsp import group_busy, grouped_clocks, time_schedule
from popviz.compiler.compiler import _stage_costs, compile, costed_plan
from popviz.compiler.plan_common import compute_target
from popviz.compiler.schedule import build_schedule
from popviz.options import Options
from popviz.recorder.program import Program
from popviz.target.cost import (
    CostTerms,
    OpFeatures,
    Precision,
    cost_cycles,
    cost_terms,
    op_costs,
    op_features,
)
from popviz.target.costmodel import CostModel
from popviz.target.machines import Target, ipu_target

POINTS_FILE = Path(__file__).with_name("calibration_points.json")
PASSES = CONTRACT_PASSES  # the index order of `pass_code`
FITTED = ("amp_efficiency", "conv_efficiency", "vector_efficiency")
QUANTITATIVE = ("throughput", "bandwidth")


def load_points(path: Path = POINTS_FILE) -> list[dict[str, Any]]:
    """The published points: source, figure, configuration, tolerance, use (fit, check,
    holdout)."""
    return list(json.loads(Path(path).read_text())["points"])


@lru_cache(maxsize=16)
def plan_program(name: str, size: Any, batch: int, image: int = 224,
                 classes: int = 1000, variant: tuple[tuple[str, Any], ...] = ()) -> Program:
    """A full-size model's training step recorded in plan mode (fake tensors: no compute;
    inference points drop the backward in `compile`). Cached per process: a fit and a test
    session record each model once."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from popviz.models import build
    from popviz.models.training import settle_optimiser, train_step
    from popviz.recorder import record_program

    with FakeTensorMode():
        torch.manual_seed(0)
        model = build(name, size, variant=dict(variant))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        settle_optimiser(opt)  # a steady-state update: momentum scaled, gradient added
        x = torch.randn(batch, 3, image, image)
        y = torch.randint(0, classes, (batch,))
        return record_program(train_step, model, opt, x, y, model=model, mode="plan",
                              progress=False)


TRANSFORMERS = ("bert", "vit")  # built with the optional package `transformers`


@lru_cache(maxsize=8)
def plan_transformer(name: str, size: str, batch: int,
                     variant: tuple[tuple[str, Any], ...] = ()) -> Program:
    """A transformer's training step (popviz.models.hf, needs `transformers`) recorded in
    plan mode, as `plan_program`; AdamW stands in for LAMB (same per-weight passes)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from popviz.models.hf import build_transformer, loss_step
    from popviz.models.training import settle_optimiser
    from popviz.recorder import record_program

    with FakeTensorMode():
        torch.manual_seed(0)
        model, inputs = build_transformer(name, size, batch, init_weights=False,
                                          **dict(variant))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        settle_optimiser(opt)  # a steady-state update: the moments exist already
        return record_program(loss_step, model, opt, inputs, model=model, mode="plan",
                              progress=False)


def point_options(point: dict[str, Any]) -> Options:
    cfg = point["config"]
    return Options(target=cfg["target"], training=bool(cfg.get("training", True)),
                   **cfg.get("options", {}))


def point_program(point: dict[str, Any]) -> Program:
    cfg = point["config"]
    if cfg["model"] in TRANSFORMERS:  # list values (layers_per_ipu) as tuples: cache keys
        variant = {k: tuple(v) if isinstance(v, list) else v
                   for k, v in cfg.get("variant", {}).items()}
        return plan_transformer(cfg["model"], cfg["size"], int(cfg["batch"]),
                                tuple(sorted(variant.items())))
    return plan_program(cfg["model"], cfg["size"], int(cfg["batch"]), int(cfg.get("image", 224)),
                        variant=tuple(sorted(cfg.get("variant", {}).items())))


@dataclass
class Prepared:
    """One throughput point, planned: re-costing and re-timing need no pandas."""

    point: dict[str, Any]
    target: Target
    precision: Precision
    ops: pd.DataFrame
    amp: np.ndarray
    features: OpFeatures
    stage: np.ndarray
    pass_code: np.ndarray  # index into PASSES per op; -1 for host I/O (exchange, not compute)
    n_stages: int
    actions: np.ndarray  # (superstep, ipu, stage, pass index) per compute action
    extra: np.ndarray  # per superstep: sync + exchange (independent of op cycles)
    shape: tuple[int, int]  # supersteps, IPUs
    samples: float
    grouped: bool = False  # bsp.grouped_clocks: forwards, then recompute and backward
    terms: CostTerms | None = None

    def op_cycles(self, cost: CostModel) -> np.ndarray:
        """Cycles of each op with `cost`: the cached terms when only the fitted
        efficiencies differ from the target's cost model, else a full re-costing."""
        base = {k: v for k, v in self.target.cost.to_dict().items() if k not in FITTED}
        if {k: v for k, v in cost.to_dict().items() if k not in FITTED} != base:
            c = op_costs(self.ops, self.target, self.precision, self.amp, cost, self.features)
            return c["cycles"].to_numpy(np.float64)
        if self.terms is None:
            self.terms = cost_terms(self.ops, self.target, self.precision, self.amp,
                                    self.target.cost, self.features)
        return np.ceil(cost_cycles(self.terms, self.features, self.target, cost)[2])

    def stage_cycles(self, cost: CostModel) -> np.ndarray:
        """(pass, stage) cycles of one micro-batch (WU: one weight update)."""
        cycles = self.op_cycles(cost)
        out = np.zeros((len(PASSES), self.n_stages))
        ok = self.pass_code >= 0
        np.add.at(out, (self.pass_code[ok], self.stage[ok]), cycles[ok])
        return out

    def compute_cycles(self, cost: CostModel) -> np.ndarray:
        """Per superstep, the compute part of its length, as bsp.time_schedule lays it
        out: the busiest IPU's passes, or with Grouped clocks the busiest forward plus
        the busiest recompute and backward (their sync is in `extra`)."""
        per = self.stage_cycles(cost)
        a = self.actions
        forward = (a[:, 3] == PASSES.index("F")) & self.grouped
        busy_f, busy_rb = group_busy(a[:, 0], a[:, 1], per[a[:, 3], a[:, 2]], forward,
                                     self.shape)
        return busy_f.max(axis=1) + busy_rb.max(axis=1)

    def step_cycles(self, cost: CostModel) -> float:
        return float((self.compute_cycles(cost) + self.extra).sum())

    def predict(self, cost: CostModel) -> float:
        """Samples per second with `cost`."""
        return self.samples / (self.step_cycles(cost) / self.target.clock_hz)


def prepare(point: dict[str, Any]) -> Prepared:
    """Plan a throughput point as `compile` does, keeping what re-costing needs."""
    options = point_options(point).copy()
    target = compute_target(ipu_target(options.target), options.io_tiles)
    precision = Precision.of(options)
    program, micro_batch, plan, ops, amp = costed_plan(point_program(point), options,
                                                       target, precision)
    amp = ops["amp_used"].fillna(0.6).to_numpy(np.float64) if len(ops) else amp
    n = len(plan.stages)
    costs = _stage_costs(ops, program, plan, options, precision, n)
    microbatches, iterations = options.gradient_accumulation, options.device_iterations
    if not options.training:
        microbatches, iterations = microbatches * iterations, 1
    kind = "Sequential" if options.strategy == "sharded" else options.schedule
    has_wu = options.training and bool((ops["pass"] == "WU").any())
    schedule = build_schedule(n, microbatches, iterations, options.training, kind,
                              options.replication_factor, has_wu, costs.recompute > 0)
    timing = time_schedule(schedule, costs, target, plan.num_ipus, options.replication_factor,
                           overlap_host=options.io_tiles > 0)
    raw = ops.drop(columns=[c for c in ("tiles_used", "compute_cycles", "memory_cycles",
                                        "exchange_cycles_internal", "passes", "cycles",
                                        "temp_bytes", "temp_total_bytes", "amp_used",
                                        "amp_ignored", "plan") if c in ops.columns])
    code = {p: i for i, p in enumerate(PASSES)}
    pass_code = np.array([code.get(p, -1) for p in ops["pass"].astype(str)], dtype=np.int64)
    pass_code[(ops["phase"] == "host_io").to_numpy()] = -1
    a = schedule.actions
    stage_ipu = plan.stages["ipu"].to_numpy(np.int64)
    actions = np.stack([a["superstep"].to_numpy(np.int64),
                        stage_ipu[a["stage"].to_numpy(np.int64)],
                        a["stage"].to_numpy(np.int64),
                        np.array([code[p] for p in a["pass"].astype(str)], dtype=np.int64)],
                       axis=1)
    prepared = Prepared(point, target, precision, raw.reset_index(drop=True), amp,
                        op_features(raw), ops["stage"].to_numpy(np.int64),
                        pass_code, n, actions, np.zeros(schedule.num_supersteps),
                        (schedule.num_supersteps, plan.num_ipus),
                        float(micro_batch * microbatches * iterations
                              * options.replication_factor), grouped_clocks(schedule))
    prepared.extra = (timing.superstep_end - timing.superstep_start) \
        - prepared.compute_cycles(target.cost)
    return prepared


def bandwidth(point: dict[str, Any], cost: CostModel) -> float:
    """Bytes per second one large vector op reaches on the point's target (a read
    microbenchmark: every tile streams its slice of a fp32 tensor and sums it)."""
    cfg = point["config"]
    target = ipu_target(cfg["target"])
    nbytes = float(cfg["bytes"])
    op = pd.DataFrame([{"op": "aten.sum.default", "op_class": "reduction",
                        "phase": "forward", "flops": nbytes / 4,
                        "bytes_read": nbytes, "bytes_written": 4 * target.tiles_per_ipu,
                        "shapes": "", "out_shape": f"[{target.tiles_per_ipu}]",
                        "dtype": "float32"}])
    c = op_costs(op, target, Precision.parse("32.32", False), np.array([0.6]), cost)
    return nbytes / (float(c["cycles"].iloc[0]) / target.clock_hz)


def fits(point: dict[str, Any]) -> bool:
    """Whether the point's configuration fits, from a full compile (memory included)."""
    report = compile(point_program(point), point_options(point))
    return bool(report.summary["fits"])


def quantitative(points: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    points = load_points() if points is None else points
    return [p for p in points if p["kind"] in QUANTITATIVE]


class Evaluator:
    """Predictions for the quantitative points; throughput points are planned once."""

    def __init__(self, points: list[dict[str, Any]]) -> None:
        self.points = points
        self.prepared = {p["id"]: prepare(p) for p in points if p["kind"] == "throughput"}

    def predict(self, point: dict[str, Any], cost: CostModel) -> float:
        if point["kind"] == "bandwidth":
            return bandwidth(point, cost)
        return self.prepared[point["id"]].predict(cost)

    def errors(self, cost: CostModel, points: list[dict[str, Any]] | None = None
               ) -> np.ndarray:
        """Relative error (modelled / published - 1) of each point."""
        pts = self.points if points is None else points
        return np.array([self.predict(p, cost) / float(p["value"]) - 1 for p in pts])


BOUNDS = {"amp_efficiency": (0.7, 1.0), "conv_efficiency": (0.7, 1.0),
          "vector_efficiency": (0.7, 1.0)}  # docs/cost-model.md


def fit(evaluator: Evaluator, points: list[dict[str, Any]], start: CostModel,
        bounds: dict[str, tuple[float, float]] = BOUNDS) -> CostModel:
    """Least squares on log(modelled / published), each point weighted by 1 / its
    tolerance, over the FITTED constants within `bounds` (BOUNDS: the documented ones),
    from `start` (deterministic: scipy's trust-region reflective method, fixed
    tolerances)."""
    from scipy.optimize import least_squares

    lo = np.array([bounds[k][0] for k in FITTED])
    hi = np.array([bounds[k][1] for k in FITTED])
    scale = hi - lo
    weights = np.array([1.0 / float(p["tolerance"]) for p in points])
    values = np.array([float(p["value"]) for p in points])

    def model(x: np.ndarray) -> CostModel:
        return start.with_values(**dict(zip(FITTED, lo + x * scale, strict=True)))

    def residuals(x: np.ndarray) -> np.ndarray:
        cost = model(x)
        pred = np.array([evaluator.predict(p, cost) for p in points])
        return weights * np.log(pred / values)

    x0 = np.clip((np.array([getattr(start, k) for k in FITTED]) - lo) / scale, 1e-3, 1 - 1e-3)
    result = least_squares(residuals, x0, bounds=(0.0, 1.0), method="trf", x_scale=1.0,
                           diff_step=1e-4, xtol=1e-10, ftol=1e-10, max_nfev=200)
    fitted = model(result.x)
    rounded = {k: float(f"{getattr(fitted, k):.4g}") for k in FITTED}
    return start.with_values(**rounded)


def leave_one_out(evaluator: Evaluator, points: list[dict[str, Any]], start: CostModel
                  ) -> np.ndarray:
    """Relative error of each point predicted by a fit made without it."""
    out = []
    for i, p in enumerate(points):
        rest = points[:i] + points[i + 1:]
        cost = fit(evaluator, rest, start)
        out.append(evaluator.predict(p, cost) / float(p["value"]) - 1)
    return np.array(out)
