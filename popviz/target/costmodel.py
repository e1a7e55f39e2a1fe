"""The cost model's constants, each with its provenance.

Every number the compiler uses beyond the machine's published figures lives in one
`CostModel` (a target carries one, `Target.cost`). Each field has a `Provenance`:

- published: a public figure (source and the figure),
- derived: computed from other figures (from which),
- fitted: set by `bench/fit_cost_model.py` to the calibration points of
  `tooling/calibration_points.json` (which points; the values land in calibration.json),
- assumed: no measurement behind it (why this value; docs/cost-model.md says which
  measurement would settle it).

The fitted values are read from calibration.json, so re-running the fit script is the only
way they change. docs/cost-model.md's constants table is generated from this module
(`python -m tooling.costdoc --write`); a test checks that it is current.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

Kind = Literal["published", "derived", "fitted", "assumed"]
KINDS: tuple[str, ...] = ("published", "derived", "fitted", "assumed")
CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
KIB = 1024


@dataclass(frozen=True)
class Provenance:
    kind: Kind
    note: str  # source and figure / from which / to which points / why this value
    unit: str = ""


@dataclass(frozen=True)
class CostModel:
    """Modelling constants shared by every target (a target may override any of them)."""

    # ---- fitted (bench/fit_cost_model.py; values in calibration.json) ----
    amp_efficiency: float = 1.0
    conv_efficiency: float = 1.0
    vector_efficiency: float = 0.35
    # ---- tiles an op spreads over, and its fixed costs ----
    grain_bytes: int = 128
    min_flops_per_tile: int = 2048
    sync_cycles_internal: int = 90
    plan_compute_set_cycles: int = 550
    exchange_fixed_cycles: int = 100
    sync_cycles: int = 600
    host_call_s: float = 20e-6
    # ---- memory a program needs besides its tensors ----
    vertex_code_bytes_per_type: int = 1024
    control_code_bytes_per_op_per_tile: int = 32
    exchange_code_bytes_per_op_per_tile: int = 64
    vertex_state_bytes_per_op_per_tile: int = 64
    exchange_buffer_fraction: float = 0.25
    tile_overhead_bytes: int = 8 * KIB

    def with_values(self, **values: Any) -> CostModel:
        unknown = sorted(set(values) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"unknown cost model constants {unknown}; valid: "
                             f"{', '.join(sorted(f.name for f in fields(self)))}")
        return replace(self, **values)

    def at_estimates(self) -> CostModel:
        """This model with every fitted factor at 1: PopLibs' own estimate of each plan and
        popops' of each vertex (what the factors scale)."""
        return replace(self, amp_efficiency=1.0, conv_efficiency=1.0, vector_efficiency=1.0)

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_JIA = ("Jia et al. 2019, 'Dissecting the Graphcore IPU Architecture via Microbenchmarking' "
        "(arXiv:1912.03413)")

PROVENANCE: dict[str, Provenance] = {
    "amp_efficiency": Provenance(
        "fitted", "fraction of PopLibs' estimate of its plan that a conv / matmul reaches "
        "(popviz/target/convplan.py: PopLibs' partition search with its vertex estimates); "
        "bounded to [0.7, 1]: the plan's estimate is PopLibs' own, what it leaves out is "
        "layout rearrangement around the plan and exchange congestion, never work the "
        "plan does not do; scales the matmuls (transformers' work); fitted to the "
        "throughput points of tooling/calibration_points.json"),
    "conv_efficiency": Provenance(
        "fitted", "amp_efficiency's counterpart for convolutions (dense, grouped, "
        "depthwise), bounded to [0.7, 1] likewise; fitted with the others on the CNN "
        "training points. At 1 the planner (with expandDims and the padding and "
        "weight-update rearrangements) is PopLibs' own estimate of each dense layer within "
        "12% (bench/bench_poplibs_layers.py: 81 layers against PopLibs' pinned IpuModel "
        "cycles), and ResNet-50 inference on a C600 runs at that estimate (the held-out "
        "PopRT / ByteMLPerf points: -1% to -5% at 1, -13% to -20% as fitted). So "
        "the fitted factor is not the convolutions' own rate on hardware: it carries "
        "training work the model misses outside them (vector_efficiency sits at its 0.7 "
        "bound), the open mechanism of docs/cost-model.md section 6"),
    "vector_efficiency": Provenance(
        "fitted", "fraction of their popops vertex estimates (popviz/target/popops.py, "
        "supersteps.py: a 64-bit path, six workers, PopLibs' cycles per op, a norm's and a "
        "reduction's compute sets) that vector ops reach; bounded to [0.7, 1]: what the "
        "estimates leave out is operands placed away from their consumer and rearranging "
        "copies between layouts; fitted to the throughput points (the Mk1 read-bandwidth "
        "microbenchmark is checked, not fitted: a compiler-generated C++ loop, not a popops "
        "vertex)"),
    "grain_bytes": Provenance(
        "assumed", "smallest slice of a tensor mapped to one tile (Poplar maps in grains of "
        "a few vectors; 128 B = 64 fp16 values)", "bytes"),
    "min_flops_per_tile": Provenance(
        "assumed", "an op is not spread thinner than this much work per tile", "FLOPs"),
    "sync_cycles_internal": Provenance(
        "published", "the sync before each compute set's exchange within one IPU, as "
        "PopLibs' own planners charge it ('approximately the same cost each time': "
        "graphcore/poplibs lib/popnn/CTCLossPlan.cpp, 7eac0f2, lines 349-351); every "
        "compute set of an op pays it (supersteps.py counts an op's compute sets)",
        "cycles"),
    "plan_compute_set_cycles": Provenance(
        "fitted", "what each compute set of a planned convolution or matmul pass costs "
        "beyond PopLibs' planner estimate of it and the sync: on every tile, the vertices' "
        "start-up (the supervisor's worklist set-up and each worker's launch and prologue) "
        "and the exchange code's set-up, which PopLibs' cycle simulation of the running "
        "program counts and its planner leaves out. The planner counts it in the plan it "
        "searches for (convgrid.py: the partials' compute set, each reduction stage or the "
        "partials' cast, per serial slice) and the fitted factor scales it with the plan. "
        "Fitted to PopLibs' own simulated cycles of its 146 benchmark layers on IpuModel1 "
        "and IpuModel2 (graphcore/poplibs tests/benchmark_results.csv; "
        "`bench/bench_poplibs_layers.py --fit`, every efficiency factor 1), not to the "
        "hardware points: without it the 115 layers under 40k cycles modelled 0.80x of "
        "PopLibs' cycles and the larger 1.05x (mean |log error| 0.183), with it 1.01x and "
        "1.10x (0.130). Vector ops' compute sets do not pay it (popops' vertex estimates "
        "include their start-up)", "cycles"),
    "exchange_fixed_cycles": Provenance(
        "published", "fixed overhead of one exchange phase besides its bytes "
        "(fixedOverheadExchangeCycles, graphcore/poplibs lib/popnn/CTCLossPlan.cpp, "
        "7eac0f2, line 312); paid by each compute set whose operands come from other "
        "tiles", "cycles"),
    "sync_cycles": Provenance(
        "assumed", "one BSP sync across IPUs per superstep (settle with a PopVision trace "
        "of a pipelined program's sync steps)", "cycles"),
    "host_call_s": Provenance(
        "assumed", "fixed cost of one host call (stream setup, program start, link "
        "round trip) on top of the transfer itself; keeps small-batch inference latency "
        "from coming out too low (settle with a published batch-1 inference latency)", "s"),
    "vertex_code_bytes_per_type": Provenance(
        "assumed", "machine code of one vertex type (a PopLibs codelet: a few hundred "
        "instructions), loaded once on every tile that runs a vertex of that type however "
        "many ops use it (popviz/compiler/tilecode.py: conv / matmul plans name their "
        "vertex per pass, vector ops one type per op and dtype); settle with the 'vertex "
        "code' of a PopVision memory report", "bytes"),
    "control_code_bytes_per_op_per_tile": Provenance(
        "assumed", "control code of one compute set on each tile it uses (the supervisor's "
        "call, sync and exchange set-up: a few instructions); with outlining, once per "
        "outlined op", "bytes"),
    "exchange_code_bytes_per_op_per_tile": Provenance(
        "assumed", "internal exchange code per op per tile used", "bytes"),
    "vertex_state_bytes_per_op_per_tile": Provenance(
        "assumed", "vertex instance state (pointers, sizes) per op per tile used", "bytes"),
    "exchange_buffer_fraction": Provenance(
        "assumed", "a conv/matmul's incoming-operand exchange buffer on each of its tiles, as "
        "a fraction of its input bytes per tile (live while the op runs)"),
    "tile_overhead_bytes": Provenance("assumed", "control code and stack per tile", "bytes"),
}


def load_calibration(path: Path = CALIBRATION_FILE) -> dict[str, Any]:
    """The fitted constants (`fit`: procedure, the points fitted, values); the published
    points are tooling's (tooling.calibration.load_points)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"calibration file {path} cannot be read: {exc}") from None


def default_cost_model() -> CostModel:
    """The CostModel with the fitted constants of calibration.json."""
    fit = load_calibration().get("fit", {}).get("values", {})
    return CostModel().with_values(**{k: float(v) for k, v in fit.items()})


DEFAULT_COST = default_cost_model()
