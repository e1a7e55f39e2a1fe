"""FLOPs and op classes of aten ops (a multiply-add counts 2).

Matmuls and attention use torch.utils.flop_counter's registered formulas; convolutions
(forward and backward, grouped and depthwise) and the rest use the formulas below.
Normalisation counts, per element: forward in training 7 (mean 1, variance 2, normalise 2,
scale and shift 2), forward with running stats 4, backward 8. Softmax forward 5 (max,
subtract, exp, sum, divide), backward 4. Pooling: one op per window element per output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from popviz.op_names import DATA_MOVEMENT

aten = torch.ops.aten

_CONV = {"convolution", "_convolution", "convolution_overrideable", "_slow_conv2d_forward",
         "cudnn_convolution", "mkldnn_convolution", "convolution_backward"}
_TRANSPOSABLE = {"convolution", "_convolution", "convolution_overrideable"}
_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "mv", "addmv", "dot", "vdot",
           "addbmm", "_scaled_dot_product_efficient_attention",
           "_scaled_dot_product_flash_attention", "_scaled_dot_product_cudnn_attention",
           "_scaled_dot_product_efficient_attention_backward",
           "_scaled_dot_product_flash_attention_backward",
           "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_forward",
           "_efficient_attention_forward", "_flash_attention_backward",
           "_efficient_attention_backward"}
# fused attention torch registers no formula for (CPU flash, the overrideable backend):
# counted as the eager maths, 2·Lq·Lk·(E + Ev) per batch and head forward, twice that
# backward (the softmax inside is left out, as torch's registered formulas do)
_ATTENTION = {"_scaled_dot_product_flash_attention_for_cpu": False,
              "_scaled_dot_product_fused_attention_overrideable": False,
              "_scaled_dot_product_flash_attention_for_cpu_backward": True,
              "_scaled_dot_product_fused_attention_overrideable_backward": True}
# per-element cost, and which tensor's elements: "in" (first input) or "out" (first output)
_NORM = {
    "native_batch_norm": (7, "in"), "_native_batch_norm_legit": (7, "in"),
    "_native_batch_norm_legit_functional": (7, "in"),
    "_native_batch_norm_legit_no_training": (4, "in"),
    "native_layer_norm": (7, "in"), "native_group_norm": (7, "in"),
    "_batch_norm_with_update": (7, "in"), "_batch_norm_no_update": (4, "in"),
    "_fused_rms_norm": (4, "in"),
    "native_batch_norm_backward": (8, "in"), "batch_norm_backward": (8, "in"),
    "native_layer_norm_backward": (8, "in"), "native_group_norm_backward": (8, "in"),
    "_fused_rms_norm_backward": (6, "in"),
}
_SOFTMAX = {"_softmax": 5, "_safe_softmax": 5, "_log_softmax": 5, "_softmax_backward_data": 4,
            "_log_softmax_backward_data": 4}
_LOSS = {"nll_loss_forward", "nll_loss2d_forward", "nll_loss_backward", "nll_loss2d_backward",
         "mse_loss", "mse_loss_backward", "binary_cross_entropy",
         "binary_cross_entropy_backward", "binary_cross_entropy_with_logits", "smooth_l1_loss",
         "smooth_l1_loss_backward", "l1_loss", "huber_loss", "huber_loss_backward"}
_POOL = {"max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool2d", "avg_pool3d",
         "max_pool2d", "avg_pool1d", "max_pool1d"}
_POOL_BACKWARD = {"max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward",
                  "avg_pool2d_backward", "avg_pool3d_backward", "_adaptive_avg_pool2d",
                  "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d",
                  "adaptive_max_pool2d", "adaptive_max_pool2d_backward",
                  "embedding_dense_backward", "_adaptive_avg_pool3d_backward"}
_ELEMENTWISE_EXTRA = {"native_dropout", "native_dropout_backward", "where", "masked_fill",
                      "clamp", "_foreach_sqrt", "bernoulli", "rand_like", "randn_like"}


def numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def kind_of(func: Any) -> str:
    """How an op is costed, decided once per overload (the recorder caches it)."""
    name = func._overloadpacket.__name__
    if name in _CONV:
        return "conv"
    if name in _MATMUL or name in _ATTENTION or func._overloadpacket in flop_registry:
        return "matmul"
    if name in _NORM:
        return "norm"
    if name in _SOFTMAX:
        return "softmax"
    if name in _LOSS:
        return "loss"
    if name in _POOL:
        return "pool"
    if name in _POOL_BACKWARD:
        return "pool_backward"
    if func.is_view or name in DATA_MOVEMENT:  # shared with an import's (popviz.op_names)
        return "data_movement"
    tags = func.tags
    if torch.Tag.reduction in tags:
        return "reduction"
    if torch.Tag.pointwise in tags or name in _ELEMENTWISE_EXTRA:
        return "elementwise"
    if name.startswith("_foreach_"):
        return "foreach"
    return "other"


def _transposed(name: str, args: Sequence[Any]) -> bool:
    if name == "convolution_backward":
        return bool(args[7])
    return name in _TRANSPOSABLE and len(args) > 6 and bool(args[6])


def _conv_groups(name: str, args: Sequence[Any], in_shapes: list[tuple[int, ...]]
                 ) -> tuple[int, int]:
    """(groups, input channels) of a convolution or its backward."""
    backward = name == "convolution_backward"
    x, w = (in_shapes[1], in_shapes[2]) if backward else (in_shapes[0], in_shapes[1])
    channels = int(x[1]) if len(x) > 1 else 1
    if not _transposed(name, args):  # weight is [out, in / groups, *kernel]
        return max(1, channels // max(1, int(w[1]))), channels
    return int(args[9] if backward else args[8]), channels


def _conv_flops(name: str, args: Sequence[Any], in_shapes: list[tuple[int, ...]],
                out_shapes: list[tuple[int, ...]]) -> int:
    """2 x (output elements) x (input channels per group x kernel area) for the forward;
    the backward costs as much again for each of grad-input and grad-weight it computes
    (torch's registered backward formula ignores groups, so it is not used here)."""
    transposed = _transposed(name, args)
    if name == "convolution_backward":
        grad_out, x, w = in_shapes[0], in_shapes[1], in_shapes[2]
        mask = args[10]
        per_output = 2 * numel(w[1:]) * numel(x if transposed else grad_out)
        return per_output * (int(bool(mask[0])) + int(bool(mask[1])))
    x, w = in_shapes[0], in_shapes[1]
    return 2 * numel(w[1:]) * numel(x if transposed else out_shapes[0])


def _registered(func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> int:
    formula = flop_registry.get(func._overloadpacket)
    if formula is None:
        return 0
    return int(formula(*args, **kwargs, out_val=out))


def _attention_flops(in_shapes: list[tuple[int, ...]], backward: bool) -> int:
    """Matmul FLOPs of fused attention on q [.., Hq, Lq, E], k [.., Hk, Lk, E], v [.., Lk, Ev]
    (the backward's tensors follow grad_out); grouped-query heads count per query head."""
    q, k, v = in_shapes[1:4] if backward else in_shapes[:3]
    batch_heads = numel(q[:-2])
    forward = 2 * batch_heads * int(q[-2]) * int(k[-2]) * (int(q[-1]) + int(v[-1]))
    return 2 * forward if backward else forward


def _kernel_area(args: Sequence[Any]) -> int:
    kernel = args[1] if len(args) > 1 else 1
    if isinstance(kernel, int):
        return kernel * kernel
    return numel(kernel) if len(kernel) > 1 else int(kernel[0]) ** 2


def classify(func: Any, kind: str, args: Sequence[Any], kwargs: dict[str, Any], out: Any,
             in_shapes: list[tuple[int, ...]], out_shapes: list[tuple[int, ...]]
             ) -> tuple[str, int]:
    """(op_class, flops) of one call. `in_shapes` / `out_shapes` list the tensors in
    argument order (tensor lists flattened)."""
    first_in = numel(in_shapes[0]) if in_shapes else 0
    first_out = numel(out_shapes[0]) if out_shapes else 0
    name = func._overloadpacket.__name__
    if kind == "conv":
        groups, channels = _conv_groups(name, args, in_shapes)
        op_class = "conv"
        if groups > 1:
            op_class = "depthwise_conv" if groups == channels else "grouped_conv"
        return op_class, _conv_flops(name, args, in_shapes, out_shapes)
    if kind == "matmul":
        # the common ones from shapes (torch's registered formulas tree-map every call)
        if name == "mm" or name == "bmm":  # [(b,) m, k] @ [(b,) k, n]
            return "matmul", 2 * numel(in_shapes[0]) * int(in_shapes[1][-1])
        if name == "addmm" or name == "baddbmm":  # bias, a, b
            return "matmul", 2 * numel(in_shapes[1]) * int(in_shapes[2][-1])
        if name in _ATTENTION:
            return "matmul", _attention_flops(in_shapes, _ATTENTION[name])
        if func._overloadpacket in flop_registry:
            return "matmul", _registered(func, args, kwargs, out)
        if name in ("mv", "addmv"):  # (n, k) @ (k,)
            mat = in_shapes[1] if name == "addmv" else in_shapes[0]
            return "matmul", 2 * numel(mat)
        if name == "addbmm":
            b, n, k = in_shapes[1]
            return "matmul", 2 * b * n * k * int(in_shapes[2][-1])
        return "matmul", 2 * first_in  # dot / vdot
    if kind == "norm":
        per, which = _NORM[name]
        return "norm", per * (first_in if which == "in" else first_out)
    if kind == "softmax":
        return "reduction", _SOFTMAX[name] * max(first_in, first_out)
    if kind == "loss":
        return "reduction", max(first_in, first_out)
    if kind == "pool":  # one compare or add per window element per output
        return "reduction", first_out * _kernel_area(args)
    if kind == "pool_backward":
        return "reduction", max(numel(s) for s in in_shapes + out_shapes)
    if kind == "reduction":
        return "reduction", first_in
    if kind == "elementwise":
        return "elementwise", first_out or first_in
    if kind == "foreach":  # one op per element of every tensor in the first list
        first_list = args[0] if args and isinstance(args[0], (list, tuple)) else []
        return "elementwise", sum(numel(t.shape) for t in first_list
                                  if isinstance(t, torch.Tensor))
    if kind == "data_movement":
        return "data_movement", 0
    return "other", 0
