"""Autocast's per-op dtypes in a GPU plan (popviz/compiler/gpu_autocast.py), against the
kernels of a real bf16 autocast step on an H200 (tests/fixtures/*amp*_h200*) and the
measured steps in bench/data/gpu_measured_h200*.json (third machine: run3)."""

from __future__ import annotations

import gzip
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from popviz.compiler.gpu_lowering import lower_for_cuda
from popviz.compiler.gpu_recipe import apply_recipe, recipe_named
from tooling.gpu_programs import gpu_program

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]


def _measured(run: str) -> dict[str, dict[str, Any]]:
    doc = json.loads((ROOT / "bench" / "data" / f"gpu_measured_h200{run}.json").read_text())
    return {c["name"]: c for c in doc["cases"]}


def _plan(case: dict[str, Any]) -> Any:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_gpu_fidelity import case_plan

    return case_plan(case, "h200")


def _amp_tiny() -> Any:
    program = gpu_program("gpt2", "tiny", 2, "adamw", sequence_length=64, attn="sdpa")
    recipe = recipe_named("amp")
    return lower_for_cuda(apply_recipe(program, recipe), recipe)


def test_autocast_runs_each_op_in_its_lists_dtype() -> None:
    ops = _amp_tiny().ops
    fwd = ops[ops["phase"] == "forward"]
    by_op = fwd.groupby("op")["dtype"].agg(lambda d: set(d))
    assert by_op["aten.addmm.default"] == {"bfloat16"}  # GEMMs: half
    assert by_op["aten.native_layer_norm.default"] == {"float32"}  # the fp32 list
    assert by_op["aten.embedding.default"] == {"float32"}  # on no list: the weight's dtype
    assert by_op["aten.pow.Tensor_Scalar"] == {"float32"}
    # GELU's tanh after pow runs in fp32 (promoted), the residual stream too
    assert by_op["aten.tanh.default"] == {"float32"}
    # an op with a half and an fp32 operand converts one per element: the unrolled kernel
    mixed = fwd[fwd["kernel_path"].isin(["cast", "strided-cast:2", "strided-cast:3"])]
    assert (mixed["dtype"] == "float32").all() and len(mixed) >= 2 * 2  # 2 layers
    # a half input of an fp32-list op is cast up first (pow's, the logits' for log-softmax)
    widened = fwd[fwd["widen_kernels"] > 0]["op"].tolist()
    assert widened.count("aten.pow.Tensor_Scalar") == 2
    assert "aten._log_softmax.default" in widened
    # activations saved in the dtype that made them
    t = _amp_tiny().tensors
    act = t[t["category"] == "activation"]
    assert {"float32", "bfloat16"} <= set(act["dtype"])


def _copy_kernels(trace: Path) -> Counter[tuple[str, str]]:
    """(pass, widen | narrow) -> how many cast kernels the trace's step launched."""
    with gzip.open(trace) as raw:
        doc = json.loads(raw.read())
    events = doc["traceEvents"]
    host = [e for e in events if e.get("cat") == "cpu_op"]
    first_backward = min(e["ts"] for e in host if "Backward" in e["name"])
    optimiser = min((e["ts"] for e in host if e["name"].startswith("Optimizer.step")),
                    default=float("inf"))
    launch = {e["args"].get("correlation"): e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    kinds: Counter[tuple[str, str]] = Counter()
    for e in events:
        if e.get("cat") != "kernel" or "copy_kernel" not in e["name"]:
            continue
        at = launch.get(e["args"].get("correlation"), float("inf"))
        step_pass = "F" if at < first_backward else "B" if at < optimiser else "WU"
        if "unrolled_elementwise_kernel" in e["name"]:
            kinds[(step_pass, "widen")] += 1  # half to fp32: the unrolled kernel
        elif "bfloat16_copy_kernel_cuda" in e["name"]:
            kinds[(step_pass, "narrow")] += 1  # fp32 to bf16: its own vectorized kernel
    return kinds


@pytest.mark.parametrize(("name", "expected"), [
    ("gpt2-small-sdpa-amp-s1024-b8", {("F", "widen"): 13, ("F", "narrow"): 134,
                                      ("B", "widen"): 134, ("B", "narrow"): 61}),
    ("resnet50-amp-b64", {("F", "widen"): 1, ("F", "narrow"): 56, ("B", "widen"): 55,
                          ("B", "narrow"): 1}),
])
def test_the_casts_are_the_traces(name: str, expected: dict[tuple[str, str], int]) -> None:
    """bf16 autocast steps on the H200 (GPT-2 small s1024 b8, ResNet-50 b64): the plan
    launches exactly the casts each trace shows, forward and backward, each kind on its
    own kernel: autocast's (weights once per forward, the convolutions' too), and the
    autograd engine's mirror of each (every gradient cast to its tensor's dtype), of the
    fp32 ops' inputs and of the mixed-dtype ops'."""
    case = _measured("")[name]
    ops = _plan(case).tables["ops"]
    kinds = _copy_kernels(ROOT / "tests" / "fixtures" / f"kineto_{name}_h200.json.gz")
    assert kinds == expected
    for step_pass in ("F", "B"):
        mine = ops[ops["pass"] == step_pass]
        assert int(mine["widen_kernels"].sum()) == kinds[(step_pass, "widen")], step_pass
        assert int(mine["cast_kernels"].sum()) == kinds[(step_pass, "narrow")], step_pass


@pytest.mark.parametrize(("run", "name", "step_bound", "alloc_bound"), [
    # -10.2% / -10.3% since the GEMM wave model (docs/cost-model.md)
    ("", "gpt2-small-sdpa-amp-s1024-b8", 0.12, 0.04),
    ("_run3", "gpt2-small-sdpa-amp-s1024-b8", 0.12, 0.04),  # another machine, same case
    ("", "resnet50-amp-b64", None, 0.02),  # batch norm runs mixed: half activations
    # full recomputation as HF runs it (checkpoint per block), never fitted
    ("_run3", "gpt2-small-sdpa-s1024-b8-recompute", 0.05, 0.02),
    ("_run3", "gpt2-small-eager-s1024-b8-recompute", 0.06, 0.02),
])
def test_plans_against_held_out_steps(run: str, name: str, step_bound: float | None,
                                      alloc_bound: float) -> None:
    case = _measured(run)[name]
    summary = _plan(case).summary
    alloc = int(summary["max_memory_allocated"]["0"]) / case["peak_allocated"] - 1
    assert abs(alloc) <= alloc_bound, (name, alloc)
    if step_bound is not None:  # ResNet-50 under autocast is host-bound (cuDNN, casts)
        step = summary["step_ms"] / case["step_ms"] - 1
        assert abs(step) <= step_bound, (name, step)
