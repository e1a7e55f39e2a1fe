"""Small helpers of the recorder: the per-storage record, the hot path's reads and writes
of it (state passed in by the Recorder), and argument inspection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode


class Storage:
    """One tensor row: a storage seen during the step."""

    __slots__ = ("block", "dtype", "last", "layer", "module", "name", "nbytes", "producer",
                 "ref", "shape", "tid", "tid_str", "writer")

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
        self.writer = producer  # the last op that wrote it (not through a view)
        # None = not known yet; set by the first op that reads it
        self.module, self.layer, self.block = module, layer, block
        self.name = ""


Owner = tuple[str, str, str]  # (module, layer, block) of the op being recorded


def read_inputs(inputs: list[torch.Tensor], storages: dict[int, Storage],
                register: Callable[[torch.Tensor], Storage], op_id: int, owner: Owner,
                forward: bool, is_view: bool) -> tuple[list[str], int, torch.dtype | None]:
    """An op reads `inputs`: their rows' last use and first owner; returns the tensor ids
    read, the bytes read (none through a view) and the first floating dtype."""
    bytes_read = 0
    dtype = None
    read: list[str] = []
    for t in inputs:
        rec = storages.get(t.untyped_storage()._cdata)
        if rec is None:  # exists from before the step
            rec = register(t)
        rec.last = op_id
        read.append(rec.tid_str)
        if rec.module is None:
            rec.module, rec.layer, rec.block = owner
        elif rec.block is None and forward:
            rec.block = owner[2]
        if not is_view:
            bytes_read += t.nbytes
        if dtype is None and t.dtype.is_floating_point:
            dtype = t.dtype
    return read, bytes_read, dtype


def write_outputs(outputs: list[torch.Tensor], storages: dict[int, Storage],
                  rows: list[Storage], op_id: int, owner: Owner, is_view: bool,
                  shape: Callable[[torch.Size], str], grads: set[int] | None
                  ) -> tuple[list[str], int]:
    """An op writes `outputs`: new rows, or the last use and writer of existing ones (a view
    writes nothing); `grads`, when given, collects their storages. Returns the tensor ids
    written and the bytes written."""
    bytes_written = 0
    written: list[str] = []
    for t in outputs:
        storage = t.untyped_storage()
        cd = storage._cdata
        rec = storages.get(cd)
        if rec is None:
            rec = Storage(len(rows), t, storage, op_id, *owner, shape(t.shape))
            storages[cd] = rec
            rows.append(rec)
        else:
            rec.last = op_id
            if not is_view:
                rec.writer = op_id
        written.append(rec.tid_str)
        if grads is not None:
            grads.add(cd)
        if not is_view:
            bytes_written += t.nbytes
    return written, bytes_written


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
    returned: set[str] = set()
    for r in schema.returns:  # a list of views (split, unbind) has an empty alias set
        if r.alias_info is not None:
            returned.update(r.alias_info.before_set)
    return tuple(i for i, a in enumerate(schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write
                 and not (a.alias_info.before_set & returned) and not a.kwarg_only)


def dummy_scalar(t: torch.Tensor) -> bool | int | float:
    """What `.item()` gives in plan mode, where there is no data: a neutral non-zero."""
    if t.dtype == torch.bool:
        return False
    return 1 if not (t.dtype.is_floating_point or t.dtype.is_complex) else 1.0


class PlanScalars(TorchDispatchMode):
    """Inside `popviz.plan`, outside the step too: `.item()` on a fake tensor gives the
    placeholder instead of failing, so models whose constructors read a scalar
    (HF ViT's trunc_normal_ init) build."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            return dummy_scalar(args[0])
        return func(*args, **(kwargs or {}))
