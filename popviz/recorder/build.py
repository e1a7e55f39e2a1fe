"""Turning a finished recording into a Program (docs/internals.md columns)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from popviz.annotate import STATE
from popviz.recorder.program import OP_COLUMNS, TENSOR_COLUMNS, Program, frame
from popviz.recorder.tensors import Storage, shape_str

if TYPE_CHECKING:
    from popviz.recorder.recorder import Recorder

# indices into an op row (a list, so a checkpoint mark can be set after the fact)
OP_FIELDS = list(OP_COLUMNS)
CHECKPOINT = OP_FIELDS.index("checkpoint")
PHASE = OP_FIELDS.index("phase")
MODULE = OP_FIELDS.index("module")
INPUTS = OP_FIELDS.index("inputs")
OUTPUTS = OP_FIELDS.index("outputs")


def _all_params(recorder: Recorder) -> list[tuple[str, torch.Tensor]]:
    named: dict[int, tuple[str, torch.Tensor]] = {}
    for p in recorder._params:
        cd = p.untyped_storage()._cdata
        named.setdefault(cd, (recorder._param_names.get(cd, ""), p))
    for ref in recorder._optimisers:
        opt = ref()
        if opt is None:
            continue
        for group in opt.param_groups:
            for p in group["params"]:
                cd = p.untyped_storage()._cdata
                if cd not in named:
                    named[cd] = (recorder._param_names.get(cd, f"param{len(named)}"), p)
    return list(named.values())


def build_program(recorder: Recorder) -> Program:
    """The Program of a finished recording: categories, names and lifetimes of tensors."""
    last_op = len(recorder._ops) - 1
    category: dict[int, str] = {}
    persistent: set[int] = set()
    params = _all_params(recorder)
    for _, b in (recorder._root.named_buffers() if recorder._root is not None else []):
        category[b.untyped_storage()._cdata] = "parameter"
    for pname, p in params:
        cd = p.untyped_storage()._cdata
        category[cd] = "parameter"
        rec = recorder._storages.get(cd)
        if rec is not None and not rec.name:
            rec.name = pname
        if p.grad is not None:
            _name_owned(recorder, p.grad, f"{pname}.grad", rec, category, "gradient")
    by_cd = {p.untyped_storage()._cdata: (pname, p) for pname, p in params}
    for ref in recorder._optimisers:
        opt = ref()
        for p, state in (opt.state.items() if opt is not None else ()):
            pname = by_cd.get(p.untyped_storage()._cdata, ("", p))[0]
            owner = recorder._storages.get(p.untyped_storage()._cdata)
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    _name_owned(recorder, value, f"{pname}.{key}", owner, category,
                                     "optimiser_state")
    persistent.update(category)
    _own_optimiser_ops(recorder)
    _own_leading_forward_ops(recorder)
    rows: list[dict[str, Any]] = []
    ops = recorder._ops
    for cd, rec in recorder._storages.items():
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
        rows.append({
            "tensor_id": rec.tid, "name": name, "bytes": rec.nbytes, "dtype": rec.dtype,
            "shape": rec.shape, "category": cat, "module": rec.module or "",
            "layer": rec.layer or "", "block": rec.block or "", "producer": rec.producer,
            "last_use": max(last_op, rec.last) if alive else rec.last,
        })
    rows.sort(key=lambda r: r["tensor_id"])
    ops_df = frame([dict(zip(OP_FIELDS, row)) for row in ops], OP_COLUMNS)
    tensors_df = frame(rows, TENSOR_COLUMNS)
    return Program(ops=ops_df, tensors=tensors_df, model=_model_facts(recorder, ops_df, params),
                   mode=recorder.mode)


def _own_optimiser_ops(recorder: Recorder) -> None:
    """An optimiser op that read no tensor of a module when it ran (a new step count and
    its `.item()`) goes with the module its tensors were given since; one that read a
    tied parameter's state and a gradient made elsewhere, with its first tensor's. A
    foreach op over many modules keeps none: the compiler spreads it over the stages by
    parameter bytes."""
    rows = recorder._rows
    for row in recorder._ops:
        if row[PHASE] != "optimiser" or row[MODULE] or row[1].startswith("aten._foreach_"):
            continue
        tids = [t for t in f"{row[INPUTS]};{row[OUTPUTS]}".split(";") if t]
        rec = next((rows[int(t)] for t in tids if rows[int(t)].module), None)
        if rec is not None:
            row[MODULE:MODULE + 3] = [rec.module, rec.layer or "", rec.block or ""]


def _own_leading_forward_ops(recorder: Recorder) -> None:
    """Forward ops before any module ran and outside a Block (step set-up such as a loss
    accumulator) go with the module of the first forward op that has one."""
    following = None
    for row in reversed(recorder._ops):
        if row[PHASE] != "forward":
            continue
        if row[MODULE]:
            following = row[MODULE:MODULE + 3]
        elif following is not None and not row[MODULE + 2]:
            row[MODULE:MODULE + 3] = following


def _name_owned(recorder: Recorder, t: torch.Tensor, name: str, owner: Storage | None,
                category: dict[int, str], cat: str) -> None:
    """Name a gradient or optimiser state tensor after its parameter."""
    cd = t.untyped_storage()._cdata
    rec = recorder._storages.get(cd)
    if rec is None:  # never touched by an op in the step, but it exists
        rec = recorder._register_existing(t)
    rec.name = name
    rec.shape = shape_str(t.shape)  # e.g. a bias gradient made as [1,n], kept as [n]
    if owner is not None and (rec.producer < 0 or not rec.module):
        rec.module, rec.layer, rec.block = owner.module, owner.layer, owner.block
    category[cd] = cat


def _model_facts(recorder: Recorder, ops: Any, params: list[tuple[str, torch.Tensor]]
                 ) -> dict[str, Any]:
    fwd = ops[ops["phase"] == "forward"]
    layers = [x for x in dict.fromkeys(fwd["layer"].tolist()) if x]
    blocks = [b for b in dict.fromkeys(ops["block"].tolist()) if b]
    blocks += [b for b in STATE.block_ipus if b not in blocks]
    root = recorder._root
    split_names = getattr(root, "popviz_split_names", None) if root is not None else None
    name = recorder.name or (type(root).__name__ if root is not None else "model")
    facts: dict[str, Any] = {
        "name": name,
        "parameters": int(sum(p.numel() for _, p in params)),
        "parameter_bytes": int(sum(p.numel() * p.element_size() for _, p in params)),
        "batch_size": sum(recorder._batch_dims),
        "input_shape": list(recorder._input_shape or []),
        "layers": layers,
        "split_names": list(split_names) if split_names else list(layers),
        "blocks": blocks,
        "block_ipus": {b: STATE.block_ipus.get(b) for b in blocks},
        "torch_version": torch.__version__,
    }
    facts.update(recorder.model_info)
    return facts
