"""Convolution parameters of each pass of a recorded conv / matmul, as PopLibs plans them.

PopLibs plans every convolution and matmul as a convolution (`poplin::ConvParams`): a
batch, conv groups, input and output channels per group, an output field and a kernel. A
matmul [M, K] x [K, N] is a 1 x 1 convolution with M positions (its "batch"), K input
channels and N output channels (poplin/MatMul.cpp); a batched matmul adds groups.

Three passes of a training step are planned separately (poplin/ConvUtil.cpp):
- FWD: the recorded convolution;
- BWD (gradient of the input): a convolution of the output gradient with the flipped
  weights, input and output channels swapped, over the output field (a stride dilates the
  result afterwards, as PopLibs does: the MACs are FWD's);
- WU (gradient of the weights): the activations convolved with the output gradient; the
  batch and output positions are its reduction, its "output field" is the kernel. PopLibs
  folds the reduction into input channels (its expandDims / swap transforms), which we
  take as given: a 1 x 1 convolution with N x Ho x Wo input channels, Ci x Kh x Kw
  positions and Co output channels per group.

Shapes come from the ops table's `shapes` text (one `[d0,d1,...]` per tensor input, `;`
separated), so parsing is a pure function of the recorded program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FWD, BWD, WU = "fwd", "bwd", "wu"


@dataclass(frozen=True)
class ConvParams:
    """One pass of one convolution, canonical: what a plan is searched for."""

    batch: int  # N (a matmul's M rows; a WU pass: Ci x Kh x Kw)
    groups: int  # conv groups (a batched matmul's batch)
    in_chans: int  # per group: the reduction over channels
    out_chans: int  # per group
    field: tuple[int, int]  # output field (H, W)
    kernel: tuple[int, int]  # (Kh, Kw): more reduction, and a halo on the input field
    stride: tuple[int, int] = (1, 1)
    kind: str = FWD
    # elements of an input PopLibs' expandDims gathered over the kernel before the pass
    # (its rearrangement: convplan's expand variants), all groups; 0: none
    expanded: int = 0

    @property
    def positions(self) -> int:
        return self.batch * self.field[0] * self.field[1]

    @property
    def macs(self) -> int:
        return (self.positions * self.groups * self.in_chans * self.out_chans
                * self.kernel[0] * self.kernel[1])




def dims_of(shapes: str) -> list[list[int]]:
    """'[16,3,224,224];[64,3,7,7]' -> [[16, 3, 224, 224], [64, 3, 7, 7]] (non-numbers 0)."""
    out: list[list[int]] = []
    for part in str(shapes).split(";"):
        body = part.strip().strip("[]() ")
        if not body:
            out.append([])
            continue
        out.append([int(x) if x.strip().isdigit() else 0 for x in body.split(",")])
    return out


def _spatial(x: list[int]) -> tuple[int, int]:
    s = x[2:] or [1]
    return (s[0], s[1] if len(s) > 1 else 1) if len(s) <= 2 else \
        (s[0], math.prod(s[1:]))  # a 3-D conv: depth x height folded into one field dim


def _stride(inp: tuple[int, int], out: tuple[int, int], kernel: tuple[int, int]
            ) -> tuple[int, int]:
    return tuple(max(1, round((i - k) / max(o - 1, 1))) if o > 1 else 1  # type: ignore
                 for i, o, k in zip(inp, out, kernel, strict=True))


def conv_passes(op: str, shapes: str, out_shape: str, flops: float) -> list[ConvParams]:
    """The passes a recorded convolution op computes: its FWD, or the BWD and / or WU of
    a `convolution_backward` (which of them: its FLOPs against one pass's)."""
    dims = dims_of(shapes)
    if "convolution_backward" in op:
        if len(dims) < 3 or len(dims[0]) < 3 or len(dims[1]) < 3 or len(dims[2]) < 3:
            return []
        grad_out, x, w = dims[0], dims[1], dims[2]
        fwd = _forward(x, w, grad_out)
        if fwd is None:
            return []
        one = 2 * fwd.macs
        count = max(1, min(2, round(flops / one))) if one > 0 else 2
        passes = [backward_data(fwd), weight_update(fwd)]
        if count == 2:
            return passes
        # one gradient only: the stem (input needs none) computes only WU
        return [passes[1]] if _is_first_layer(x) else [passes[0]]
    weights = [d for d in dims if len(d) >= 3]
    if len(dims) < 2 or len(dims[0]) < 3 or not weights:
        return []
    x, w = dims[0], dims[1] if len(dims[1]) >= 3 else weights[0]
    out = dims_of(out_shape)[0]
    if len(out) < 3:  # no output shape recorded: 'valid' padding at stride 1
        out = [x[0], w[0], *(max(1, i - k + 1) for i, k in
                             zip(_spatial(x), _spatial(w), strict=True))]
    fwd = _forward(x, w, out)
    return [fwd] if fwd else []


def _is_first_layer(x: list[int]) -> bool:
    return len(x) > 1 and x[1] <= 4  # an image's 1-4 channels: nothing upstream to train


def _forward(x: list[int], w: list[int], out: list[int]) -> ConvParams | None:
    if min(len(x), len(w), len(out)) < 3 or w[1] <= 0 or x[1] <= 0:
        return None
    groups = max(1, x[1] // w[1])
    field_in, field_out, kernel = _spatial(x), _spatial(out), _spatial(w)
    return ConvParams(batch=max(1, x[0]), groups=groups, in_chans=max(1, w[1]),
                      out_chans=max(1, w[0] // groups), field=field_out, kernel=kernel,
                      stride=_stride(field_in, field_out, kernel), kind=FWD)


def backward_data(fwd: ConvParams) -> ConvParams:
    """Gradient of the input: channels swapped, the same taps over the output gradient's
    field; a stride becomes a dilation of the result, which PopLibs applies after the conv
    (its dilatePostConv), so the MACs are FWD's."""
    return ConvParams(fwd.batch, fwd.groups, fwd.out_chans, fwd.in_chans, fwd.field,
                      fwd.kernel, (1, 1), BWD)


def weight_update(fwd: ConvParams) -> ConvParams:
    """Gradient of the weights, with the reduction (batch x output field) folded into
    input channels: Ci x Kh x Kw positions, N x Ho x Wo input channels."""
    reduction = fwd.batch * fwd.field[0] * fwd.field[1]
    return ConvParams(fwd.in_chans * fwd.kernel[0] * fwd.kernel[1], fwd.groups, reduction,
                      fwd.out_chans, (1, 1), (1, 1), (1, 1), WU)


def matmul_passes(op: str, shapes: str, flops: float) -> list[ConvParams]:
    """A recorded matmul as a 1 x 1 convolution (each recorded matmul is one pass: the
    backward's matmuls are recorded as their own ops)."""
    dims = [d for d in dims_of(shapes) if d]
    name = op.split(".")[1] if op.startswith("aten.") else op
    mats = [d for d in dims if len(d) >= 2]
    if "attention" in name and len(mats) >= 3:
        q, k, v = mats[0], mats[1], mats[2]
        heads = max(1, math.prod(q[:-2]))
        scores = ConvParams(q[-2], heads, q[-1], k[-2], (1, 1), (1, 1))
        values = ConvParams(q[-2], heads, k[-2], v[-1], (1, 1), (1, 1))
        per_pass = 2 * (scores.macs + values.macs)
        reps = max(1, round(flops / per_pass)) if per_pass else 1
        return [scores, values] * reps
    if len(mats) < 2:
        return _from_flops(flops)
    a, b = mats[-2], mats[-1]
    if name in ("linear",):  # weight is [N, K]
        b = [b[-1], b[-2]]
    m, k, n = a[-2], a[-1], b[-1]
    if k != b[-2] and len(b) >= 2:  # a transposed operand recorded as given
        k = min(k, b[-2])
    batch = math.prod(a[:-2]) if len(a) > 2 else 1
    if len(b) == 2 and batch > 1:  # [B, M, K] x [K, N]: one matmul with B x M rows
        m, batch = m * batch, 1
    if min(m, k, n) <= 0:
        return _from_flops(flops)
    return [ConvParams(m, max(1, batch), k, n, (1, 1), (1, 1))]


def _from_flops(flops: float) -> list[ConvParams]:
    """A matmul whose shapes cannot be read: a cube of the same MACs."""
    if flops <= 0:
        return []
    side = max(1, round((flops / 2) ** (1 / 3)))
    return [ConvParams(side, 1, side, side, (1, 1), (1, 1))]


def op_passes(op: str, op_class: str, shapes: str, out_shape: str, flops: float
              ) -> list[ConvParams]:
    """The passes of a recorded conv / matmul; an op whose input shapes were not recorded
    is one pass read off its output shape and FLOPs (its reduction = FLOPs / 2 / outputs)."""
    passes = matmul_passes(op, shapes, flops) if op_class == "matmul" and shapes.strip() \
        else conv_passes(op, shapes, out_shape, flops) if shapes.strip() else []
    return passes or _from_output(op_class, out_shape, flops)


def _from_output(op_class: str, out_shape: str, flops: float) -> list[ConvParams]:
    out = dims_of(out_shape)[0] if out_shape else []
    if len(out) < 2 or min(out) <= 0 or flops <= 0:
        return _from_flops(flops)
    outputs = math.prod(out)
    reduction = max(1, round(flops / (2 * outputs)))
    if op_class == "matmul" or len(out) < 3:  # [..., N]: rows x N
        return [ConvParams(outputs // out[-1], 1, reduction, out[-1], (1, 1), (1, 1))]
    return [ConvParams(out[0], 1, reduction, out[1], _spatial(out), (1, 1))]
