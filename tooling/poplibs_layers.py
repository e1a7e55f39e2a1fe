"""PopLibs' layer benchmarks (tooling/poplibs_benchmarks.json) through popviz: each layer
is recorded as PyTorch runs it (a Conv2d or a matmul without bias, its input requiring a
gradient, one SGD step) in plan mode, compiled for the IPU model the benchmark ran on
(IpuModel1: mk1, IpuModel2: mk2) at half precision with float partials and PopLibs'
default availableMemoryProportion 0.6, and its forward, gradient and weight-update ops'
cycles summed: what Poplar's cycle estimate of the same program counted. The loss's own
ops (the sum and its gradient's broadcast) are left out; single_conv_layer has none.

    frame = compare(load_layers(), ("mk2",), at_estimates=True)  # a row per layer, target
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

DATA = Path(__file__).with_name("poplibs_benchmarks.json")
MODELS = {"mk1": "IpuModel1", "mk2": "IpuModel2"}
LOSS_OPS = ("aten.sum", "aten.ones_like", "aten.expand")


def load_layers(path: Path = DATA) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["layers"])


def _pair(text: str | None, default: int) -> tuple[int, int]:
    if text is None or text == "":
        return default, default
    values = [int(v) for v in text.strip("{}").split(",")]
    return (values[0], values[-1])


def layer_class(layer: dict[str, Any]) -> str:
    """What kind of op a layer is, for per-class errors."""
    p = layer["params"]
    if layer["tool"] == "fully_connected_layer":
        return "grouped matmul" if int(p.get("num-groups", "1")) > 1 else "matmul"
    if int(p.get("conv-groups", "1")) > 1:
        return "depthwise" if int(p["input-channels"]) == 1 else "grouped conv"
    if int(p["input-channels"]) <= 4:
        return "stem conv"
    return "1x1 conv" if _pair(p.get("kernel-size"), 1) == (1, 1) else "kxk conv"


def _conv_step(p: dict[str, str]) -> tuple[Any, Any]:
    import torch

    groups = int(p.get("conv-groups", "1"))
    cin, cout = int(p["input-channels"]) * groups, int(p["output-channels"]) * groups
    kernel, stride = _pair(p.get("kernel-size"), 1), _pair(p.get("stride"), 1)
    pad = _pair(p.get("padding") or p.get("padding-lower"), 0)
    field = _pair(p["field"], 1)
    module = torch.nn.Conv2d(cin, cout, kernel, stride=stride, padding=pad, groups=groups,
                             bias=False)
    x = torch.randn(int(p.get("batch-size", "1")), cin, *field, requires_grad=True)
    return module, x


def _fc_step(p: dict[str, str]) -> tuple[Any, Any]:
    import torch

    groups, batch = int(p.get("num-groups", "1")), int(p["batch-size"])
    n_in, n_out = int(p["input-size"]), int(p["output-size"])
    if groups == 1:
        module: Any = torch.nn.Linear(n_in, n_out, bias=False)
        return module, torch.randn(batch, n_in, requires_grad=True)

    class Grouped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(groups, n_in, n_out))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.bmm(x, self.weight)

    return Grouped(), torch.randn(groups, batch, n_in, requires_grad=True)


def _step(model: Any, opt: Any, x: Any) -> None:
    model(x).sum().backward()
    opt.step()


@cache
def _program(name: str) -> Any:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from popviz.recorder import record_program

    layer = {entry["name"]: entry for entry in load_layers()}[name]
    build = _conv_step if layer["tool"] == "single_conv_layer" else _fc_step
    with FakeTensorMode():
        model, x = build(layer["params"])
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        return record_program(_step, model, opt, x, model=model, mode="plan", progress=False)


def modelled(layer: dict[str, Any], target_name: str, at_estimates: bool = False,
             **cost_values: float) -> dict[str, Any]:
    """popviz's cycles of one layer's training step on `target_name` (loss ops left out),
    per pass, with the plans it chose; `at_estimates`: every fitted factor at 1;
    `cost_values`: cost model constants changed (CostModel.with_values)."""
    from dataclasses import replace

    from popviz.compiler.compiler import costed_plan
    from popviz.options import Options
    from popviz.target.cost import Precision
    from popviz.target.machines import ipu_target

    float_data = layer["params"].get("data-type") == "float"
    options = Options(target=target_name, precision="32.32" if float_data else "16.16")
    target = ipu_target(options.target)
    if at_estimates:
        target = replace(target, cost=target.cost.at_estimates())
    if cost_values:
        target = replace(target, cost=target.cost.with_values(**cost_values))
    precision = Precision.parse(options.precision, False)
    _, _, _, ops, _ = costed_plan(_program(layer["name"]), options, target, precision)
    kept = ops[~ops["op"].astype(str).str.startswith(LOSS_OPS)]
    per_pass = kept.groupby(kept["pass"].astype(str))["cycles"].sum()
    plans = [p for p in kept["plan"].astype(str) if p]
    return {"cycles": float(kept["cycles"].sum()), "passes": per_pass.to_dict(),
            "plans": plans}


def compare(layers: list[dict[str, Any]], targets: tuple[str, ...] = ("mk1", "mk2"),
            at_estimates: bool = False) -> pd.DataFrame:
    """One row per (layer, target): PopLibs' cycles, popviz's, their ratio and log error."""
    rows = []
    for layer in layers:
        for name in targets:
            ours = modelled(layer, name, at_estimates)
            theirs = layer["models"][MODELS[name]]["cycles"]
            rows.append({"layer": layer["name"], "class": layer_class(layer), "target": name,
                         "poplibs": theirs, "popviz": ours["cycles"],
                         "ratio": ours["cycles"] / theirs,
                         "log_error": math.log(ours["cycles"] / theirs)})
    return pd.DataFrame(rows)


def class_errors(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (target, class): layers, mean |log error|, the geometric-mean ratio and the
    worst layer's ratio."""
    g = frame.assign(abs_log=frame["log_error"].abs()).groupby(["target", "class"])
    out = g.agg(layers=("layer", "size"), mean_abs_log=("abs_log", "mean"),
                mean_log=("log_error", "mean"))
    out["geomean_ratio"] = np.exp(out["mean_log"])
    out["worst_ratio"] = g["ratio"].agg(lambda r: r.iloc[np.argmax(np.abs(np.log(r)))])
    return out.drop(columns="mean_log")


COARSE_GRID = range(0, 1501, 50)  # plan_compute_set_cycles tried by `fit_set_cycles` first
FINE_STEP = 10  # then every 10 cycles within 40 of the best


def set_cycles_error(layers: list[dict[str, Any]], value: int,
                     targets: tuple[str, ...] = ("mk1", "mk2")) -> float:
    """Mean |log(popviz / PopLibs)| over every (layer, target) with every fitted factor 1
    and plan_compute_set_cycles at `value` (the planner counts it, so each value plans)."""
    errors = [abs(math.log(modelled(layer, name, True, plan_compute_set_cycles=value)["cycles"]
                           / layer["models"][MODELS[name]]["cycles"]))
              for layer in layers for name in targets]
    return float(np.mean(errors))


def fit_set_cycles(layers: list[dict[str, Any]], targets: tuple[str, ...] = ("mk1", "mk2")
                   ) -> tuple[int, pd.DataFrame]:
    """The CostModel `plan_compute_set_cycles` that brings popviz's plans at PopLibs'
    estimates (every fitted factor 1) nearest PopLibs' simulated cycles of its benchmark
    layers: the least mean |log(popviz / PopLibs)| over every (layer, target), searched
    every 50 cycles from 0 to 1,500, then every 10 within 40 of the best (ties: the
    smaller). Returns the value and every value tried (columns `cycles`,
    `mean_abs_log`)."""
    tried: dict[int, float] = {}

    def error(value: int) -> float:
        if value not in tried:
            tried[value] = set_cycles_error(layers, value, targets)
        return tried[value]

    coarse = min(COARSE_GRID, key=lambda v: (error(v), v))
    fine = range(max(0, coarse - 40), coarse + 41, FINE_STEP)
    best = min(fine, key=lambda v: (error(v), v))
    grid = pd.DataFrame(sorted(tried.items()), columns=["cycles", "mean_abs_log"])
    return best, grid
