"""Aten op names that move, view or allocate data rather than compute on it, without
torch: the recorder's op classes (recorder/flops.py `kind_of`) and an imported trace's,
which has only the names (ingest/kineto_ops.py), are read off the same lists, so an op
is in the same class on a modelled profile and an imported one."""

from __future__ import annotations

# ops that copy, fill, allocate or index: no arithmetic on their values
DATA_MOVEMENT = frozenset({
    "_foreach_copy_", "_foreach_zero_", "_local_scalar_dense", "_to_copy", "_unsafe_view",
    "arange", "cat", "clone", "constant_pad_nd", "contiguous", "copy_", "embedding", "empty",
    "empty_like", "empty_strided", "fill_", "flip", "full", "full_like", "gather", "index",
    "index_put", "index_put_", "index_select", "lift_fresh_copy", "narrow", "new_empty",
    "new_empty_strided", "new_full", "new_ones", "new_zeros", "ones", "ones_like", "repeat",
    "resize_", "roll", "scalar_tensor", "scatter", "select_scatter", "set_", "slice_scatter",
    "split", "split_with_sizes", "stack", "tensor", "unbind", "zero_", "zeros", "zeros_like",
})

# views and their wrappers: the recorder sees torch's `is_view` on the op itself; a trace
# has only the name (and the user-level calls a view sits under: reshape, to, item, pad)
VIEWS = frozenset({
    "alias", "as_strided", "as_strided_", "chunk", "detach", "detach_", "diagonal",
    "expand", "expand_as", "flatten", "item", "movedim", "pad", "permute", "reshape",
    "select", "slice", "squeeze", "squeeze_", "t", "to", "transpose", "transpose_",
    "unflatten", "unfold", "unsqueeze", "unsqueeze_", "view", "view_as", "_reshape_alias",
})
