"""Which of PyTorch's CUDA element-wise kernels an op would run, from its tensors' strides.

PyTorch runs element-wise ops and copies through TensorIterator (aten/src/ATen/native/cuda/
CUDALoops.cuh), which merges ("coalesces") the dimensions that every operand walks alike
and then picks one of three kernels:
- `vectorized_elementwise_kernel`: every operand contiguous in one dimension, no dtype
  conversion: 16-byte loads and stores, memory-bound;
- `unrolled_elementwise_kernel`: contiguous but an operand needs a dtype conversion (a
  cast copy, mixed-dtype arithmetic): one element per load, each converted;
- `elementwise_kernel<128, 4>`: any operand strided or broadcast (a transposed copy, a
  bias or mask added across a dimension): each element's offset in every operand is
  computed from its index, one integer division per merged dimension.
`cat` has its own kernel (`CatArrayBatchedCopy`), which takes a slow path, computing
each element's offset dimension by dimension, when an input is not contiguous.

The recorder sees the same strides the GPU would (fake tensors keep them), so it records
the path per op as a short string (`kernel_path` in the ops table):
"" the vectorized kernel (or not an element-wise op), "cast", "strided:N" (N merged
dimensions; "strided-cast:N" when it also converts), "transpose:N" (strided, and the
output's fastest dimension is not an input's: each element a memory sector of its own) or
"cat:N". The GPU roofline (popviz/target/gpu_cost.py) times all but the first by their
per-element work, measured per path on an H200 (bench/gpu_kernel_paths.py).
"""

from __future__ import annotations

import torch

CAT_OPS = ("cat",)
COPY_OPS = ("_to_copy", "copy_", "clone", "to", "contiguous", "_copy_from")
HALF = (torch.float16, torch.bfloat16)


def _broadcast_strides(t: torch.Tensor, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """`t`'s strides seen through broadcasting to `shape` (0 where it repeats), or None
    where `t` does not broadcast to it."""
    nd, td = len(shape), t.dim()
    if td > nd:
        return None
    strides = [0] * nd
    tshape, tstride = t.shape, t.stride()
    for i in range(td):
        d = nd - td + i
        size = tshape[i]
        if size == shape[d]:
            strides[d] = tstride[i] if size != 1 else 0
        elif size != 1:
            return None
    return tuple(strides)


def merged_dims(shape: tuple[int, ...], operands: list[tuple[int, ...]]
                ) -> tuple[int, bool, bool]:
    """(dimensions after TensorIterator's coalescing, whether every operand is then dense
    with unit stride, whether every operand walks the output's fastest dimension with unit
    or zero stride: coalesced loads) for operands of `shape` with the given strides (the
    output first). Dimensions are ordered by the output's strides, fastest first, as
    TensorIterator orders them; size-1 dimensions drop out."""
    out = operands[0]
    dims = [d for d in sorted(range(len(shape)), key=lambda d: (out[d], -d)) if shape[d] != 1]
    if not dims:
        return 1, True, True
    groups = 1
    inner = dims[0]
    span = {i: s[inner] * shape[inner] for i, s in enumerate(operands)}  # next stride expected
    for d in dims[1:]:
        if all(s[d] == span[i] for i, s in enumerate(operands)):
            for i, s in enumerate(operands):
                span[i] = span[i] * shape[d] if s[d] else 0
        else:
            groups += 1
            span = {i: s[d] * shape[d] for i, s in enumerate(operands)}
    unit = all(s[inner] == 1 for s in operands)
    return groups, groups == 1 and unit, all(s[inner] in (0, 1) for s in operands)


def kernel_path(name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> str:
    """The CUDA kernel family `name` (an aten op's base name) runs with these tensors
    (module docstring); "" for the vectorized kernel or an op it does not apply to, and
    for tensors without plain strides (sparse, nested, some subclasses): the recording
    goes on whatever they are."""
    try:
        return _kernel_path(name, inputs, outputs)
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AttributeError):
        return ""


def _kernel_path(name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> str:
    if not outputs:
        return ""
    out = outputs[0]
    shape = tuple(out.shape)
    if name in CAT_OPS:
        dense = all(t.is_contiguous() for t in inputs if t.numel())
        return "" if dense else f"cat:{max(1, out.dim())}"
    if out.numel() <= 1 or out.is_sparse or any(t.is_sparse for t in inputs):
        return ""  # sparse kernels are their own
    tensors = [t for t in inputs if t.dim() > 0]  # 0-dim: a scalar argument on CUDA
    if out.is_contiguous() and all(t.shape == out.shape and t.dtype == out.dtype
                                   and t.is_contiguous() for t in tensors):
        return ""  # the common case, decided without walking strides
    operands = [out.stride()]
    for t in tensors:
        strides = _broadcast_strides(t, shape)
        if strides is None:  # not a TensorIterator op over these shapes (gather, embedding)
            return ""
        operands.append(strides)
    dims, dense, coalesced = merged_dims(shape, [tuple(s) for s in operands])
    floats = [t.dtype for t in tensors if t.dtype.is_floating_point]
    cast = out.dtype.is_floating_point and any(d != out.dtype for d in floats)
    if dense:
        # a copy from fp32 to half has its own vectorized kernel (float16_copy_kernel_cuda,
        # bfloat16_copy_kernel_cuda); every other conversion runs the unrolled one
        narrowing = name in COPY_OPS and out.dtype in HALF and set(floats) == {torch.float32}
        return "cast" if cast and not narrowing else ""
    if not coalesced:  # the fastest dimension transposed: one memory sector per element
        return f"transpose:{dims}"
    return f"strided-cast:{dims}" if cast else f"strided:{dims}"
