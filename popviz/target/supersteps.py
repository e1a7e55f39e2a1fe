"""Vector work that PopLibs runs as several compute sets (IPU model v4): reductions with
their cross-tile stages, norms as popnn / poplin run them, and softmax.

An IPU runs a program as compute sets: each is a sync, an exchange phase (the operands a
tile needs from other tiles) and a compute phase (one vertex per tile). popviz charges
every compute set its fixed cost (CostModel `sync_cycles_internal` and, when it exchanges,
`exchange_fixed_cycles`: PopLibs' own planning figures), the exchange's bytes at the tile's
exchange rate, and its vertex (popops.py's rates). What each op's compute sets are comes
from graphcore/poplibs at 7eac0f2 (docs/notes/ipu-model-v4-research.md section 2):

- a reduction (popops `reduction/ReductionPlan.cpp`): every tile first reduces what it
  holds; the partials of an output that sit on `s` tiles then go straight to the output
  stage when `s < 2 sqrt(tiles)`, else through an intermediate stage (its depth about
  sqrt(s): the plan minimises the messages of both stages), each stage an exchange of
  float partials, a sync and a reduce vertex;
- a norm's forward (poplin `Norms.cpp` `normStatisticsImpl`): both statistics (sum and
  sum of squares) in one pass, their cross-tile stages, the inverse standard deviation,
  then as PopART and TensorFlow call PopLibs (popart `batchnormx.cpp`, tensorflow
  `popnn/norm.cc`): a batch norm's gamma, beta and statistics folded over the channels
  into one scale and one shift, two broadcast ops (popnn `batchNormalise` with a combined
  multiplicand); a group or layer norm whitened per statistic then scaled and shifted per
  channel (popnn `groupNormalise`: `normWhiten`, `normalise`), four;
- in inference, with running statistics (popnn `batchNormalise`), the statistics and the
  affine folded into one scale and one shift: two broadcast ops;
- its backward (`normGradients`, `normStatisticsGradientsImpl`), as the frameworks call
  it: the whitened input recomputed (two broadcast ops), gamma times the gradient, the
  gradient times the whitened input, one reduction of both products, a copy and four
  more broadcast / scaled-add steps; then gamma's and beta's gradients on their own
  (`normParamGradients` on the unscaled gradient: one more product and one more
  reduction, per channel);
- a broadcast of a per-channel operand (popops `BroadcastVectorInner2D`): a channel-grouped
  activation (16 channels innermost, as a convolution lays out its output) runs the
  vertex's 8-wide path, 2 cycles per 8 halves (`vectorInnerAddCoreCycles_half`);
- softmax: a max and a sum along each row, each a reduction with its stages, and two
  element-wise passes.

How many statistics (`groups`) a norm computes and how they sit on tiles depends on its
kind: batch norm one per channel (channels grouped 16 to a vector run), layer norm one
per row of its last dimension, group norm one per (sample, group) with 32 groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WORKERS = 6  # worker contexts per tile
WORKER_START_CYCLES = 20  # a worker's set-up before its loop (popops estimators)
SUPERVISOR_CYCLES = 11  # basicOpSupervisorOverhead
VERTEX_CYCLES = WORKERS * WORKER_START_CYCLES + SUPERVISOR_CYCLES  # per compute set, per tile
CHANNEL_GROUP = 16  # channels innermost in a conv's output layout (AMP's partials per group)
GROUP_NORM_GROUPS = 32  # aten's group norm does not record its group count in the shapes
STATISTICS = 2  # a norm's statistics: sum and sum of squares (mean and variance)
PARTIAL_BYTES = 4  # reductions keep float partials
BROADCAST_HALF = 2 / 8  # BroadcastVectorInner2D's 8-wide path: 2 cycles per 8 halves
BROADCAST_FLOAT = 2 / 4
SCALAR_BROADCAST_HALF = 2 / 4  # a per-row scalar (BroadcastScalar2D): load, op, store
SCALAR_BROADCAST_FLOAT = 2 / 2
REDUCE_HALF = 1 / 2  # one vector of float partials a worker step (popops.py REDUCE)
REDUCE_FLOAT = 1 / 2
BINARY_HALF = 3 / 4  # popops.py FAST_BINARY
BINARY_FLOAT = 3 / 2
COPY_HALF = 2 / 4  # an on-tile copy: one 64-bit load and store per vector
COPY_FLOAT = 2 / 2


@dataclass(frozen=True)
class ComputeSets:
    """Cycles of one op on its busiest tile, split the way the cost model scales them:
    `vertex` (popops' estimates: scaled by the fitted vector_efficiency), `exchange`
    (bytes in over the exchange, published rate), and the counts of compute sets and of
    those that exchange (each charged its sync and the exchange's fixed cost)."""

    vertex: float
    exchange: float
    sets: int
    exchanging: int

    def __add__(self, other: ComputeSets) -> ComputeSets:
        return ComputeSets(self.vertex + other.vertex, self.exchange + other.exchange,
                           self.sets + other.sets, self.exchanging + other.exchanging)


NONE = ComputeSets(0.0, 0.0, 0, 0)


def one_set(vertex: float, exchange_bytes: float = 0.0, exchange_rate: float = 4.0
            ) -> ComputeSets:
    exchanges = exchange_bytes > 0
    return ComputeSets(vertex, exchange_bytes / exchange_rate, 1, int(exchanges))


def sources_per_output(elements: float, groups: float, per_tile: float, groups_on_tile: float,
                       tiles: int) -> int:
    """Tiles holding partials of one output: a group's elements, `elements / groups`, of
    which each tile holds `per_tile / groups_on_tile`."""
    if groups <= 0 or per_tile <= 0:
        return 1
    held = per_tile / max(groups_on_tile, 1.0)
    return int(min(tiles, max(1, math.ceil(elements / groups / held))))


def stage_depths(sources: int, tiles: int) -> list[int]:
    """The cross-tile stages after each tile has reduced its own elements, as PopLibs
    plans them: none when one tile holds an output's inputs, one (depth `sources`) when
    fewer than 2 sqrt(tiles) tiles do, else an intermediate stage then the output stage,
    their depths near sqrt(sources) (popops ReductionPlan.cpp `calculateNextStep`; more
    than 64 partials per output adds the intermediate stage)."""
    if sources <= 1:
        return []
    if sources < 2 * math.sqrt(tiles) or sources <= 64:
        return [sources]
    first = math.ceil(math.sqrt(sources))
    return [first, math.ceil(sources / first)]


def cross_tile(outputs: float, sources: int, tiles: int, fp16: bool,
               exchange_rate: float) -> ComputeSets:
    """The cross-tile stages of reducing `outputs` values held as partials on `sources`
    tiles each: per stage, each tile receives the partials of its share of the stage's
    results, adds them, and keeps its results."""
    total = NONE
    remaining = sources
    for depth in stage_depths(sources, tiles):
        results = outputs * math.ceil(remaining / depth)
        per_tile = math.ceil(results / min(tiles, max(results, 1)))
        rate = REDUCE_HALF if fp16 else REDUCE_FLOAT
        vertex = VERTEX_CYCLES + per_tile * depth * rate
        total += one_set(vertex, per_tile * depth * PARTIAL_BYTES, exchange_rate)
        remaining = math.ceil(remaining / depth)
    return total


@dataclass(frozen=True)
class Layout:
    """How an op's statistics sit on its tiles: `groups` statistics over `elements`
    elements, `per_tile` elements and `groups_on_tile` statistics on the busiest tile,
    the partials of each statistic on `sources` tiles."""

    elements: float
    groups: float
    per_tile: float
    groups_on_tile: float
    sources: int
    per_channel: bool = False  # statistics vary along the innermost run (batch norm)


def dims(shape: str) -> tuple[int, ...]:
    """'[20,64,112,112]' -> (20, 64, 112, 112); () for a scalar or an unknown shape."""
    body = str(shape).strip().strip("[]")
    try:
        return tuple(int(x) for x in body.split(",") if x.strip())
    except ValueError:
        return ()


def norm_layout(name: str, out_shape: str, elements: float, tiles: int) -> Layout:
    """Where a norm's statistics sit. Batch norm: one per channel, channels grouped
    CHANNEL_GROUP to a run over the positions (a tile holds whole runs of one group, or a
    share of one); layer norm: one per row of the last dimension; group norm: one per
    (sample, group)."""
    shape = dims(out_shape)
    per_tile = math.ceil(elements / max(tiles, 1))
    if "batch_norm" in name and len(shape) >= 2:
        channels = shape[1]
        positions = math.prod(shape[2:]) if len(shape) > 2 else 1
        group = min(channels, CHANNEL_GROUP)
        runs = math.ceil(per_tile / max(positions * group, 1))
        on_tile = min(channels, group * runs)
        groups = float(channels)
    else:
        if "group_norm" in name and len(shape) >= 2:
            groups = float(shape[0] * min(GROUP_NORM_GROUPS, shape[1]))
        else:
            groups = float(elements / shape[-1]) if shape and shape[-1] else 1.0
        row = elements / max(groups, 1.0)
        on_tile = min(groups, math.ceil(per_tile / max(row, 1.0)))
    sources = sources_per_output(elements, groups, per_tile, on_tile, tiles)
    return Layout(elements, groups, per_tile, on_tile, sources, "batch_norm" in name)


def _broadcast(layout: Layout, fp16: bool, per_channel: bool, rate: float) -> ComputeSets:
    """One broadcast op: the operand's values for the tile's statistics come over the
    exchange, then the vertex runs over the tile's elements."""
    if per_channel:
        per = BROADCAST_HALF if fp16 else BROADCAST_FLOAT
    else:
        per = SCALAR_BROADCAST_HALF if fp16 else SCALAR_BROADCAST_FLOAT
    return one_set(VERTEX_CYCLES + layout.per_tile * per,
                   layout.groups_on_tile * PARTIAL_BYTES, rate)


def _elementwise(layout: Layout, per_element: float) -> ComputeSets:
    return one_set(VERTEX_CYCLES + layout.per_tile * per_element)


def _statistics(layout: Layout, count: int, tiles: int, fp16: bool, rate: float
                ) -> ComputeSets:
    """`count` sums over each group in one pass (reduceMany), then their cross-tile
    stages."""
    per = REDUCE_HALF if fp16 else REDUCE_FLOAT
    local = one_set(VERTEX_CYCLES + count * layout.per_tile * per)
    return local + cross_tile(count * layout.groups, layout.sources, tiles, fp16, rate)


def _small(values: float, tiles: int, per_element: float) -> ComputeSets:
    """An op over the statistics themselves (a few values per tile)."""
    per_tile = math.ceil(values / min(tiles, max(values, 1)))
    return one_set(VERTEX_CYCLES + per_tile * per_element)


def norm_forward(layout: Layout, tiles: int, fp16: bool, rate: float,
                 stable: bool = False) -> ComputeSets:
    """Statistics and the inverse standard deviation, then the normalisation as the
    frameworks call PopLibs. Batch norm (PopART's and TensorFlow's BatchNormOpx /
    NormTrainingOp): gamma x inv-std and beta - mean x that, two ops over the channels,
    folded into one scale and one shift (popnn `batchNormalise` with a combined
    multiplicand): two broadcast ops over the values. Group and layer norm (popnn
    `groupNormalise`): whiten (subtract the mean, scale by the inverse std, per
    statistic) then gamma and beta per channel: four. `stable`: the statistics as
    `stable_statistics` computes them."""
    stats = (stable_statistics(layout, tiles, fp16, rate) if stable
             else _statistics(layout, STATISTICS, tiles, fp16, rate))
    inv_std = _small(layout.groups, tiles, 19 / 4 if fp16 else 8 / 2)  # rsqrt
    total = stats + inv_std
    if layout.per_channel:
        binary = BINARY_HALF if fp16 else BINARY_FLOAT
        steps = [_small(layout.groups, tiles, binary), _small(layout.groups, tiles, binary)]
    else:
        steps = [_broadcast(layout, fp16, False, rate) for _ in range(2)]
    steps += [_broadcast(layout, fp16, True, rate) for _ in range(2)]
    for step in steps:
        total += step
    return total


def stable_statistics(layout: Layout, tiles: int, fp16: bool, rate: float) -> ComputeSets:
    """The statistics with stable statistics on (poplin `normStatisticsImpl` with
    `stableAlgo`, TensorFlow's `norms.use_stable_statistics`): the mean reduced first,
    subtracted from every value (a broadcast op writing a new tensor), then the sum of
    squares of that reduced: two reductions with their own cross-tile stages and one
    more pass over the values, where the default reduces both sums in one pass."""
    mean = _statistics(layout, 1, tiles, fp16, rate)
    centred = _broadcast(layout, fp16, layout.per_channel, rate)
    return mean + centred + _statistics(layout, 1, tiles, fp16, rate)


def norm_inference(layout: Layout, fp16: bool, rate: float) -> ComputeSets:
    """Inference with running statistics (popnn `batchNormalise`): the statistics and
    gamma, beta folded into one per-channel scale and shift, so two broadcast ops and no
    reduction."""
    return _broadcast(layout, fp16, True, rate) + _broadcast(layout, fp16, True, rate)


def bias_add(layout: Layout, fp16: bool, rate: float) -> ComputeSets:
    """A batch norm folded into its convolution (an ONNX export in eval mode): the scale
    is in the weights, the shift the convolution's bias, one per-channel broadcast add
    (poplin addBias)."""
    return _broadcast(layout, fp16, True, rate)


def norm_backward(layout: Layout, tiles: int, fp16: bool, rate: float,
                  params: Layout | None = None) -> ComputeSets:
    """As TensorFlow's and PopART's norm gradients call PopLibs: the whitened input again
    (subtract, scale), then the input's gradient (`normGradients`,
    `normStatisticsGradients`: gamma x dy, x-hat x that, one reduction of both, the
    deltas scaled, a copy of the gradient, x-hat x var-delta, + mean-delta, the scaled add
    and the inverse std), then gamma's and beta's gradients apart (`normParamGradients` on
    the unscaled dy: x-hat x dy and one reduction of both per channel, over `params`,
    the layout of one value per channel; the statistics' own layout by default)."""
    per_channel = layout.per_channel
    binary = BINARY_HALF if fp16 else BINARY_FLOAT
    copy = COPY_HALF if fp16 else COPY_FLOAT
    steps = [
        _broadcast(layout, fp16, per_channel, rate),  # x - mean
        _broadcast(layout, fp16, per_channel, rate),  # x inv-std
        _broadcast(layout, fp16, True, rate),  # gamma x dy
        _elementwise(layout, binary),  # x-hat x g
        _statistics(layout, STATISTICS, tiles, fp16, rate),  # sums of x-hat g and g
        _small(STATISTICS * layout.groups, tiles, binary),  # scale the deltas
        _elementwise(layout, copy),  # the gradient's copy
        _broadcast(layout, fp16, per_channel, rate),  # x-hat x var-delta
        _broadcast(layout, fp16, per_channel, rate),  # + mean-delta
        _elementwise(layout, binary),  # scaled add of the gradient
        _broadcast(layout, fp16, per_channel, rate),  # x inv-std
        _elementwise(layout, binary),  # x-hat x dy (gamma's gradient)
        _statistics(params or layout, STATISTICS, tiles, fp16, rate),  # and beta's
    ]
    total = NONE
    for step in steps:
        total += step
    return total


def param_layout(name: str, out_shape: str, elements: float, tiles: int) -> Layout:
    """Where a norm's per-channel parameter gradients reduce: batch norm's statistics
    already are per channel; a group norm's channels (dimension 1) are laid out as batch
    norm's; a layer norm's are its last dimension, each summed over the rows (a tile's
    values are distinct channels of a few rows)."""
    shape = dims(out_shape)
    if "batch_norm" in name or ("group_norm" in name and len(shape) >= 3):
        return norm_layout("batch_norm", out_shape, elements, tiles)
    channels = float(shape[-1]) if shape else 1.0
    per_tile = math.ceil(elements / max(tiles, 1))
    on_tile = min(channels, per_tile)
    return Layout(elements, channels, per_tile, on_tile,
                  sources_per_output(elements, channels, per_tile, on_tile, tiles))


def row_layout(out_shape: str, elements: float, tiles: int) -> Layout:
    """Rows of the last dimension (softmax): one statistic per row, as a layer norm's."""
    return norm_layout("rows", out_shape, elements, tiles)


def softmax(layout: Layout, tiles: int, fp16: bool, rate: float, backward: bool
            ) -> ComputeSets:
    """Forward: the row max (a reduction), subtract and exp, the row sum, scale by its
    reciprocal. Backward: the row sum of y x dy, then dy - sum, times y."""
    binary = BINARY_HALF if fp16 else BINARY_FLOAT
    exp = 4 / 4 if fp16 else 6 / 2
    if backward:
        steps = [_elementwise(layout, binary), _statistics(layout, 1, tiles, fp16, rate),
                 _broadcast(layout, fp16, False, rate), _elementwise(layout, binary)]
    else:
        steps = [_statistics(layout, 1, tiles, fp16, rate),
                 _broadcast(layout, fp16, False, rate), _elementwise(layout, exp),
                 _statistics(layout, 1, tiles, fp16, rate),
                 _broadcast(layout, fp16, False, rate)]
    total = NONE
    for step in steps:
        total += step
    return total


def reduction(in_shape: str, out_shape: str, elements_in: float, elements_out: float,
              tiles: int, fp16: bool, rate: float) -> ComputeSets:
    """A reduction of `elements_in` to `elements_out`: each tile reduces its own inputs,
    then the cross-tile stages. Which dimensions are reduced decides how many outputs a
    tile's inputs feed: the leading ones (a bias gradient's sum over rows) leave a tile
    a run of distinct outputs, the trailing ones whole rows."""
    outputs = max(elements_out, 1.0)
    per_tile = math.ceil(elements_in / max(tiles, 1))
    row = elements_in / outputs
    shape_in, shape_out = dims(in_shape), dims(out_shape)
    leading = bool(shape_in and shape_out and shape_in[-1] == shape_out[-1] and row > 1)
    on_tile = min(outputs, per_tile) if leading else min(outputs,
                                                         math.ceil(per_tile / max(row, 1.0)))
    layout = Layout(elements_in, outputs, per_tile, on_tile,
                    sources_per_output(elements_in, outputs, per_tile, on_tile, tiles))
    return _statistics(layout, 1, tiles, fp16, rate)
