"""What an aten overload is, found once per overload (the Recorder caches the answer)."""

from __future__ import annotations

from typing import Any

import torch

from popviz.recorder import flops as _flops
from popviz.recorder.tensors import mutated_args

aten = torch.ops.aten
# record_function markers and tensor-metadata queries (fake tensors answer `.device`,
# `.is_contiguous()` ... through dispatch): not work, and absent from real runs
_NOT_WORK = {"profiler", "prim"}
_METADATA_QUERIES = {
    aten.is_contiguous.default, aten.is_contiguous.memory_format,
    aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default,
    aten.size.default, aten.sym_size.default, aten.stride.default, aten.sym_stride.default,
    aten.storage_offset.default, aten.sym_storage_offset.default, aten.numel.default,
    aten.sym_numel.default, aten.dim.default, aten.sym_is_contiguous.default,
}

FuncInfo = tuple[str, str, str, bool, tuple[int, ...], bool, Any]


def func_info(func: Any) -> FuncInfo:
    """(kind, packet name, overload name, is a view, mutated args, not work, the overload).
    The tuple holds the overload, so a cache keyed by its id keeps that id its own."""
    if func.namespace in _NOT_WORK or func in _METADATA_QUERIES:
        return ("", "", "", False, (), True, func)
    kind = _flops.kind_of(func)
    return (kind, func._overloadpacket.__name__, str(func),
            kind == "data_movement" and func.is_view, mutated_args(func), False, func)
