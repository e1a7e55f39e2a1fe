"""Small helpers of the recorder: the per-storage record and argument inspection."""

from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef


class Storage:
    """One tensor row: a storage seen during the step."""

    __slots__ = ("block", "dtype", "last", "layer", "module", "name", "nbytes", "producer",
                 "ref", "shape", "tid", "tid_str")

    def __init__(self, tid: int, t: torch.Tensor, storage: Any, producer: int, module: str | None,
                 layer: str | None, block: str | None, shape: str | None = None) -> None:
        self.tid = tid
        self.tid_str = str(tid)
        self.ref = StorageWeakRef(storage)
        self.nbytes = int(storage.nbytes())
        self.dtype = str(t.dtype).removeprefix("torch.")
        self.shape = shape if shape is not None else shape_str(t.shape)
        self.producer = producer
        self.last = producer
        # None = not known yet; set by the first op that reads it
        self.module, self.layer, self.block = module, layer, block
        self.name = ""


def shape_str(shape: Any) -> str:
    return "[" + ",".join(str(int(s)) for s in shape) + "]"


def tensors_in(values: Any) -> list[torch.Tensor]:
    """Tensors among op arguments or outputs, tensor lists flattened, in order."""
    found: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(x for x in v if isinstance(x, torch.Tensor))
    return found


def mutated_args(func: Any) -> tuple[int, ...]:
    """Positions of arguments an op writes in place but does not return."""
    schema = func._schema
    returned = {r.alias_info.before_set and next(iter(r.alias_info.before_set))
                for r in schema.returns if r.alias_info is not None}
    return tuple(i for i, a in enumerate(schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write
                 and not (a.alias_info.before_set & returned) and not a.kwarg_only)


def dummy_scalar(t: torch.Tensor) -> bool | int | float:
    """What `.item()` gives in plan mode, where there is no data: a neutral non-zero."""
    if t.dtype == torch.bool:
        return False
    return 1 if not (t.dtype.is_floating_point or t.dtype.is_complex) else 1.0
