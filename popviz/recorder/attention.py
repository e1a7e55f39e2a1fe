"""Scaled-dot-product attention recorded as the one fused kernel a GPU runs.

On the CPU, `F.scaled_dot_product_attention` with dropout (every transformer in training)
or with a mask the CPU kernel refuses runs PyTorch's math path: a causal mask, the score
matrix, softmax, a dropout mask and two batched matmuls, each saved for backward, i.e.
[batch, heads, seq, seq] tensors per layer. On CUDA the same call runs one fused kernel
(FlashAttention for fp16 / bf16, the memory-efficient kernel for fp32) that keeps only its
output and the log-sum-exp ([batch, heads, seq], fp32), regenerates the dropout from an RNG
state and recomputes the scores in its backward (PyTorch `sdp_utils.cpp` selects them;
the kernels' names in a CUDA trace: `fmha_cutlassF_f32_...`, `flash_fwd_...`).

In plan mode (fake tensors: nothing is computed, so no numbers change), the recorder routes
each call to the fused CPU op `aten._scaled_dot_product_flash_attention_for_cpu` with the
same shapes, whose saved tensors are the GPU kernels' (output and log-sum-exp) and whose
backward is one op. The dropout probability is kept in the op's arguments as the GPU kernel
takes it; the CPU op's meta function does not refuse it. Grouped-query attention
(`enable_gqa`: fewer key / value heads, dividing the query heads) goes to the same op with
the keys and values unexpanded, as FlashAttention and Transformer Engine take them: what is
saved is their own [batch, groups, seq, dim], and the key / value gradients come out at that
shape (the meta function checks no head counts). Calls the fused op cannot express (inputs
that are not [batch, heads, seq, dim], a bool mask, a mask that needs a gradient such as
T5's learned position bias) run as recorded.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

FUSED = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


class FusedAttentionMode(TorchFunctionMode):
    """Routes `F.scaled_dot_product_attention` to the fused op (plan mode only)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            fused = _fused(*args, **kwargs)
            if fused is not None:
                return fused
        return func(*args, **kwargs)


def _fused(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
           is_causal: bool = False, scale: float | None = None,
           enable_gqa: bool = False) -> torch.Tensor | None:
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 \
            or not query.shape[0] == key.shape[0] == value.shape[0] \
            or not 0 < key.shape[1] == value.shape[1] or query.shape[1] % key.shape[1] \
            or (key.shape[1] != query.shape[1] and not enable_gqa):
        return None
    if attn_mask is not None and (attn_mask.dtype == torch.bool or attn_mask.requires_grad):
        # the fused CPU op takes an additive float mask only, and no gradient for it (T5's
        # learned position bias): those calls keep the math path
        return None
    out, _ = FUSED(query, key, value, float(dropout_p), bool(is_causal),
                   attn_mask=attn_mask, scale=scale)
    return out
