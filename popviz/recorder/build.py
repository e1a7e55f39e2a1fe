"""Turning a finished recording into a Program's tables and model facts (docs/internals.md
columns). Plain functions: the Recorder (recorder.py) passes in what it recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pandas as pd
import torch

from popviz.annotate import STATE
from popviz.recorder.program import OP_COLUMNS, OP_EXTRA_COLUMNS, TENSOR_COLUMNS, frame
from popviz.recorder.tensors import Storage, shape_str

Register = Callable[[torch.Tensor], Storage]  # the Recorder's row for a pre-existing tensor

# indices into an op row (a list, so a checkpoint mark can be set after the fact)
OP_FIELDS = [*OP_COLUMNS, *OP_EXTRA_COLUMNS]
CHECKPOINT = OP_FIELDS.index("checkpoint")
PHASE = OP_FIELDS.index("phase")
MODULE = OP_FIELDS.index("module")
INPUTS = OP_FIELDS.index("inputs")
OUTPUTS = OP_FIELDS.index("outputs")


def all_params(params: list[torch.nn.Parameter], param_names: dict[int, str],
               optimisers: list[torch.optim.Optimizer]) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) of the model's parameters, then the optimisers' others."""
    named: dict[int, tuple[str, torch.Tensor]] = {}
    for p in params:
        cd = p.untyped_storage()._cdata
        named.setdefault(cd, (param_names.get(cd, ""), p))
    for opt in optimisers:
        for group in opt.param_groups:
            for p in group["params"]:
                cd = p.untyped_storage()._cdata
                if cd not in named:
                    named[cd] = (param_names.get(cd, f"param{len(named)}"), p)
    return list(named.values())


def build_tables(ops: list[list[Any]], storages: dict[int, Storage], rows: list[Storage],
                 params: list[tuple[str, torch.Tensor]], buffers: list[torch.Tensor],
                 optimisers: list[torch.optim.Optimizer], register: Register
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The `ops` and `tensors` tables of a finished recording: categories, names and
    lifetimes of tensors. The op rows (OP_COLUMNS order) get their owners completed."""
    last_op = len(ops) - 1
    category: dict[int, str] = {}
    persistent: set[int] = set()
    for b in buffers:
        category[b.untyped_storage()._cdata] = "parameter"
    for pname, p in params:
        cd = p.untyped_storage()._cdata
        category[cd] = "parameter"
        rec = storages.get(cd)
        if rec is not None and not rec.name:
            rec.name = pname
        if p.grad is not None:
            _name_owned(storages, register, p.grad, f"{pname}.grad", rec, category, "gradient")
    by_cd = {p.untyped_storage()._cdata: (pname, p) for pname, p in params}
    for opt in optimisers:
        for p, state in opt.state.items():
            pname = by_cd.get(p.untyped_storage()._cdata, ("", p))[0]
            owner = storages.get(p.untyped_storage()._cdata)
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    _name_owned(storages, register, value, f"{pname}.{key}", owner, category,
                                "optimiser_state")
    persistent.update(category)
    _own_optimiser_ops(ops, rows)
    _own_leading_forward_ops(ops)
    tensor_rows = []
    for cd, rec in storages.items():
        cat = category.get(cd)
        if cat is None:
            if rec.producer < 0:
                cat = "input"
            else:
                cat = {"forward": "activation", "recompute": "activation",
                       "host_io": "input"}.get(ops[rec.producer][PHASE], "temporary")
        alive = cd in persistent or not rec.ref.expired()
        name = rec.name or (f"{ops[rec.producer][1]}#{rec.producer}" if rec.producer >= 0
                            else f"input#{rec.tid}")
        tensor_rows.append({
            "tensor_id": rec.tid, "name": name, "bytes": rec.nbytes, "dtype": rec.dtype,
            "shape": rec.shape, "category": cat, "module": rec.module or "",
            "layer": rec.layer or "", "block": rec.block or "", "producer": rec.producer,
            "last_use": max(last_op, rec.last) if alive else rec.last,
        })
    tensor_rows.sort(key=lambda r: cast(int, r["tensor_id"]))
    ops_df = frame([dict(zip(OP_FIELDS, row)) for row in ops],
                   {**OP_COLUMNS, **OP_EXTRA_COLUMNS})
    return ops_df, frame(tensor_rows, TENSOR_COLUMNS)


def _own_optimiser_ops(ops: list[list[Any]], rows: list[Storage]) -> None:
    """An optimiser op that read no tensor of a module when it ran (a new step count and
    its `.item()`) goes with the module its tensors were given since; one that read a
    tied parameter's state and a gradient made elsewhere, with its first tensor's. A
    foreach op over many modules keeps none: the compiler spreads it over the stages by
    parameter bytes."""
    for row in ops:
        if row[PHASE] != "optimiser" or row[MODULE] or row[1].startswith("aten._foreach_"):
            continue
        tids = [t for t in f"{row[INPUTS]};{row[OUTPUTS]}".split(";") if t]
        rec = next((rows[int(t)] for t in tids if rows[int(t)].module), None)
        if rec is not None:
            row[MODULE:MODULE + 3] = [rec.module, rec.layer or "", rec.block or ""]


def _own_leading_forward_ops(ops: list[list[Any]]) -> None:
    """Forward ops before any module ran and outside a Block (step set-up such as a loss
    accumulator) go with the module of the first forward op that has one."""
    following = None
    for row in reversed(ops):
        if row[PHASE] != "forward":
            continue
        if row[MODULE]:
            following = row[MODULE:MODULE + 3]
        elif following is not None and not row[MODULE + 2]:
            row[MODULE:MODULE + 3] = following


def _name_owned(storages: dict[int, Storage], register: Register, t: torch.Tensor, name: str,
                owner: Storage | None, category: dict[int, str], cat: str) -> None:
    """Name a gradient or optimiser state tensor after its parameter."""
    cd = t.untyped_storage()._cdata
    rec = storages.get(cd)
    if rec is None:  # never touched by an op in the step, but it exists
        rec = register(t)
    rec.name = name
    rec.shape = shape_str(t.shape)  # e.g. a bias gradient made as [1,n], kept as [n]
    if owner is not None and (rec.producer < 0 or not rec.module):
        rec.module, rec.layer, rec.block = owner.module, owner.layer, owner.block
    category[cd] = cat


def model_facts(ops: pd.DataFrame, params: list[tuple[str, torch.Tensor]],
                root: torch.nn.Module | None, name: str | None, batch_dims: list[int],
                input_shape: list[int] | None, model_info: dict[str, Any]) -> dict[str, Any]:
    """The Program's `model` dict: names, sizes and the step's batch; `model_info` wins."""
    fwd = ops[ops["phase"] == "forward"]
    layers = [x for x in dict.fromkeys(fwd["layer"].tolist()) if x]
    blocks = [b for b in dict.fromkeys(ops["block"].tolist()) if b]
    blocks += [b for b in STATE.block_ipus if b not in blocks]
    split_names = getattr(root, "popviz_split_names", None) if root is not None else None
    facts: dict[str, Any] = {
        "name": name or (type(root).__name__ if root is not None else "model"),
        "parameters": int(sum(p.numel() for _, p in params)),
        "parameter_bytes": int(sum(p.numel() * p.element_size() for _, p in params)),
        "batch_size": sum(batch_dims),
        "input_shape": list(input_shape or []),
        "layers": layers,
        "split_names": list(split_names) if split_names else list(layers),
        "blocks": blocks,
        "block_ipus": {b: STATE.block_ipus.get(b) for b in blocks},
        "torch_version": torch.__version__,
    }
    facts.update(model_info)
    return facts
