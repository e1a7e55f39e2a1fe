"""Vector work on a tile as PopLibs' popops vertices do it (IPU model v3).

Elementwise ops, norms, reductions, casts and copies are not planned like convolutions:
their tensor is spread over tiles in grains and every tile runs one vertex over its own
slice. What such a vertex costs comes from graphcore/poplibs (read at 7eac0f2 and
neighbours: `lib/popops/ExprOpUtil.hpp` / `popopsCycleEstimators.cpp` for the unary and
binary op tables, `lib/popops/PerformanceEstimation.cpp` for casts and supervisor
overheads, `lib/popops/PerformanceEstimation.hpp` for reductions). The facts used, not the
code:

- a 64-bit data path: a loop step handles one vector of 4 halves or 2 floats;
- a "MultiVertex" splits its elements over the tile's six worker contexts, each starting
  in about 20 cycles; the tile is barrel-threaded, so a worker issues every sixth cycle
  and the tile's time is six times the slowest worker's, plus a supervisor's ~11;
- each op has its own cycles per loop step: ADD / SUBTRACT / MULTIPLY 1 (+2 for load,
  store and loop), other vectorised ops +5, and a table for the rest (RELU 3 per 4
  halves, EXPONENT 4 per 4 halves and 6 per 2 floats, DIVIDE 21 per 4 halves, SQRT 23,
  RSQRT 19, TANH 4, SIGMOID 6, MAXIMUM 4, ...);
- a cast between half and float moves 2 elements a cycle (one 64-bit load, one store);
- a reduction adds one vector of partials a cycle, partials in float;
- a copy between tiles moves 4 bytes a cycle per tile (the exchange).

Each op is one or more compute sets, each charged a sync, and an exchange's fixed cost
where its operands come from other tiles (CostModel `sync_cycles_internal`,
`exchange_fixed_cycles`). Reductions, norms and softmax run several compute sets with
cross-tile stages: supersteps.py models them as PopLibs runs them. What this still leaves
out (rearranging copies between layouts, operands placed away from their consumer) is
what the fitted `vector_efficiency`, bounded to [0.7, 1], absorbs.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from popviz.target import supersteps
from popviz.target.supersteps import VERTEX_CYCLES


@dataclass(frozen=True)
class VectorKind:
    """Tile cycles per element of one kind of vector work, for half and for float data,
    with what an element is counted over ('out': elements written, 'in': elements read,
    'byte': bytes written), and how many vertex passes (compute sets) it takes."""

    name: str
    half: float
    float: float
    basis: str = "out"
    passes: int = 1  # compute sets of a plain op
    exchanges: int = 0  # of them, those whose operands come over the exchange
    steps: str = "plain"  # or a supersteps.py model: reduce, norm, norm backward, softmax


def _per(cycles_per_loop: float, elements_per_loop: int) -> float:
    return cycles_per_loop / elements_per_loop


# Tile cycles per element = the worker's cycles per loop step / elements per step (six
# workers share the elements, each issues every sixth cycle: the sixes cancel).
FAST_BINARY = VectorKind("fast binary (add, sub, mul)", _per(1 + 2, 4), _per(1 + 2, 2))
BINARY = VectorKind("binary (vectorised, +5 per step)", _per(1 + 5, 4), _per(1 + 5, 2))
SELECT = VectorKind("select / max / min", _per(4, 4), _per(4, 2))
RELU = VectorKind("relu", _per(3, 4), _per(3, 2))
EXP = VectorKind("exp / log", _per(4, 4), _per(6, 2))
TANH = VectorKind("tanh", _per(4, 4), _per(12, 2))
SIGMOID = VectorKind("sigmoid", _per(6, 4), _per(12, 2))
DIVIDE = VectorKind("divide", _per(21, 4), _per(10, 2))
SQRT = VectorKind("sqrt", _per(23, 4), _per(10, 2))
RSQRT = VectorKind("rsqrt", _per(19, 4), _per(8, 2))
# GELU (tanh form): a tanh and four multiply-adds
GELU = VectorKind("gelu", TANH.half + 4 * FAST_BINARY.half,
                  TANH.float + 4 * FAST_BINARY.float, passes=2)
GELU_BACKWARD = VectorKind("gelu backward", 2 * GELU.half, 2 * GELU.float, passes=3)
CAST = VectorKind("cast", _per(1, 2), _per(1, 2))
# a reduction adds one vector of float partials per worker step, counted over its inputs
REDUCE = VectorKind("reduction", _per(1, 2), _per(1, 2), basis="in", steps="reduce")
# a pooling window or a gather-add: reduced where its inputs sit (a halo at most)
LOCAL_REDUCE = VectorKind("local reduction (pooling)", _per(1, 2), _per(1, 2), basis="in")
# softmax: max, subtract and exp, sum, scale by the reciprocal
SOFTMAX = VectorKind("softmax", 2 * REDUCE.half + FAST_BINARY.half + EXP.half
                     + FAST_BINARY.half, 2 * REDUCE.float + FAST_BINARY.float + EXP.float
                     + FAST_BINARY.float, passes=4, steps="softmax")
SOFTMAX_BACKWARD = VectorKind("softmax backward", REDUCE.half + 3 * FAST_BINARY.half,
                              REDUCE.float + 3 * FAST_BINARY.float, passes=3,
                              steps="softmax backward")
# a norm: statistics (square, then sums of x and x^2) and normalising (scale, shift)
NORM = VectorKind("norm", FAST_BINARY.half + 2 * REDUCE.half + 2 * FAST_BINARY.half,
                  FAST_BINARY.float + 2 * REDUCE.float + 2 * FAST_BINARY.float, passes=3,
                  steps="norm")
# its gradient: the normalised input again (subtract, scale), its product with the
# incoming gradient, two sums (of dy and of dy x x-hat), then dx = gamma x invstd x (dy -
# mean dy - x-hat x mean(dy x x-hat)): four more elementwise terms
NORM_BACKWARD = VectorKind("norm backward", 7 * FAST_BINARY.half + 2 * REDUCE.half,
                           7 * FAST_BINARY.float + 2 * REDUCE.float, passes=4,
                           steps="norm backward")
# inference: the running statistics folded into one scale and one shift (popnn
# batchNormalise): two per-channel broadcast ops
NORM_INFERENCE = VectorKind("norm, inference (running statistics)", 2 * 2 / 8, 2 * 2 / 4,
                            passes=2, steps="norm inference")
# a batch norm folded into its convolution (Options.fold_batch_norms): the bias it leaves
BIAS_ADD = VectorKind("bias add (a folded batch norm)", 2 / 8, 2 / 4, passes=1,
                      steps="bias add")
COPY = VectorKind("copy (exchange, per byte)", 0.25, 0.25, basis="byte", exchanges=1)
OTHER = BINARY

KINDS = (FAST_BINARY, BINARY, SELECT, RELU, EXP, TANH, SIGMOID, DIVIDE, SQRT, RSQRT, GELU,
         GELU_BACKWARD, CAST, REDUCE, LOCAL_REDUCE, SOFTMAX, SOFTMAX_BACKWARD, NORM,
         NORM_BACKWARD, NORM_INFERENCE, BIAS_ADD, COPY)

# aten op base names (no namespace, overload or trailing underscore; `_foreach_` and
# `native_` prefixes dropped) -> kind
_BY_NAME: dict[str, VectorKind] = {}
for _kind, _names in (
    (FAST_BINARY, "add sub rsub mul neg addcmul addcdiv lerp axpby scale mul_scalar "
                  "add_scalar zero fill ones_like zeros_like full_like accumulate_gradient"),
    (SELECT, "maximum minimum max_pool2d_with_indices_backward threshold_backward where "
             "masked_fill clamp clamp_min clamp_max hardtanh hardtanh_backward "
             "leaky_relu_backward abs sign"),
    (RELU, "relu relu6 leaky_relu threshold"),
    (EXP, "exp log log1p expm1 pow"),
    (TANH, "tanh tanh_backward"),
    (SIGMOID, "sigmoid sigmoid_backward silu silu_backward hardswish hardsigmoid"),
    (DIVIDE, "div reciprocal"),
    (SQRT, "sqrt"),
    (RSQRT, "rsqrt"),
    (GELU, "gelu"),
    (GELU_BACKWARD, "gelu_backward"),
    (CAST, "to_copy to type_as"),
    (REDUCE, "sum mean amax amin max min adaptive_avg_pool2d nll_loss_forward nll_loss "
             "norm linalg_vector_norm var std argmax"),
    (LOCAL_REDUCE, "max_pool2d_with_indices avg_pool2d avg_pool2d_backward "
                   "adaptive_avg_pool2d_backward nll_loss_backward embedding_dense_backward "
                   "index_add scatter_add"),
    (SOFTMAX, "softmax log_softmax"),
    (SOFTMAX_BACKWARD, "softmax_backward_data log_softmax_backward_data"),
    (NORM, "batch_norm layer_norm group_norm"),
    (NORM_BACKWARD, "batch_norm_backward layer_norm_backward group_norm_backward"),
    (NORM_INFERENCE, "batch_norm_legit_no_training"),
    (BIAS_ADD, "folded_batch_norm"),
    (COPY, "clone copy cat stack contiguous index_select gather embedding index "
           "slice_scatter select_scatter constant_pad_nd pad repeat roll flip "
           "new_zeros split_with_sizes_copy unbind_copy dropout bernoulli"),
):
    for _name in _names.split():
        _BY_NAME[_name] = _kind

_PREFIX = re.compile(r"^(?:_foreach_|native_|_fused_|_)+")


def base_name(op: str) -> str:
    """`aten.add_.Tensor` / `aten::native_batch_norm` -> `add` / `batch_norm`."""
    name = re.split(r"::|\.", str(op))
    name = [part for part in name if part and part not in ("aten", "popviz")]
    core = name[0] if name else ""
    return _PREFIX.sub("", core).rstrip("_")


@functools.lru_cache(maxsize=4096)  # a program has a few hundred distinct ops
def kind_of(op: str, op_class: str) -> VectorKind:
    """The popops kind of work an op does (by its aten name; norms by class)."""
    kind = _BY_NAME.get(base_name(op))
    if kind is not None:
        return kind
    if op_class == "norm":
        return NORM_BACKWARD if "backward" in str(op) else NORM
    if op_class == "reduction":
        return REDUCE
    if op_class == "data_movement":
        return COPY
    return OTHER


@dataclass(frozen=True)
class VectorCost:
    """Per op, on its busiest tile: popops vertex cycles (what `vector_efficiency`
    scales), exchange cycles, compute sets and those of them that exchange."""

    vertex: np.ndarray
    exchange: np.ndarray
    sets: np.ndarray
    exchanging: np.ndarray


def vector_cycles(kinds: list[VectorKind], elements_in: np.ndarray, elements_out: np.ndarray,
                  bytes_out: np.ndarray, tiles: np.ndarray, fp16: bool,
                  names: list[str] | None = None, in_shapes: list[str] | None = None,
                  out_shapes: list[str] | None = None, exchange_rate: float = 4.0,
                  stable_statistics: bool = False) -> VectorCost:
    """Each op's work on its busiest tile: its elements spread evenly over `tiles`, each
    compute set a MultiVertex (six workers and a supervisor); norms, softmax and
    reductions as supersteps.py's compute sets (their shapes say how the statistics sit);
    `stable_statistics`: norms' statistics as TensorFlow's stable statistics run them."""
    n = len(kinds)
    per_element = np.array([k.half if fp16 else k.float for k in kinds], dtype=np.float64)
    basis = np.array([k.basis for k in kinds])
    passes = np.array([k.passes for k in kinds], dtype=np.float64)
    count = np.where(basis == "in", elements_in,
                     np.where(basis == "byte", bytes_out, elements_out))
    per_tile = np.ceil(np.asarray(count, dtype=np.float64) / np.maximum(tiles, 1))
    # each worker takes a sixth; its loop runs in whole vectors. A copy between layouts
    # is the exchange itself (no vertex)
    moved = basis == "byte"
    vertex = np.where(moved, 0.0, per_tile * per_element + passes * VERTEX_CYCLES)
    exchange = np.where(moved, per_tile * per_element, 0.0)
    sets = passes.copy()
    exchanging = np.array([k.exchanges for k in kinds], dtype=np.float64)
    names = names or [""] * n
    in_shapes = in_shapes or [""] * n
    out_shapes = out_shapes or [""] * n
    for i in [j for j, k in enumerate(kinds) if k.steps != "plain"]:
        got = _stepped(kinds[i].steps, names[i], in_shapes[i], out_shapes[i],
                       float(elements_in[i]), float(elements_out[i]), int(tiles[i]), fp16,
                       exchange_rate, stable_statistics)
        vertex[i], exchange[i], sets[i], exchanging[i] = (got.vertex, got.exchange, got.sets,
                                                          got.exchanging)
    return VectorCost(vertex, exchange, sets, exchanging)


@functools.lru_cache(maxsize=8192)  # a program repeats its layers' shapes
def _stepped(steps: str, name: str, in_shape: str, out_shape: str, elements_in: float,
             elements_out: float, tiles: int, fp16: bool, rate: float,
             stable_statistics: bool = False) -> supersteps.ComputeSets:
    if steps == "reduce":
        return supersteps.reduction(in_shape, out_shape, elements_in, elements_out, tiles,
                                    fp16, rate)
    if steps.startswith("softmax"):
        layout = supersteps.row_layout(out_shape, elements_out, tiles)
        return supersteps.softmax(layout, tiles, fp16, rate, steps.endswith("backward"))
    layout = supersteps.norm_layout(name, out_shape, elements_out, tiles)
    if steps == "norm inference":
        return supersteps.norm_inference(layout, fp16, rate)
    if steps == "bias add":
        return supersteps.bias_add(layout, fp16, rate)
    if steps == "norm backward":
        params = supersteps.param_layout(name, out_shape, elements_out, tiles)
        return supersteps.norm_backward(layout, tiles, fp16, rate, params)
    return supersteps.norm_forward(layout, tiles, fp16, rate, stable_statistics)
