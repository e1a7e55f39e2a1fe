"""Recorder on the ops and call patterns of models popviz did not write: lists of views,
keyword arguments, fused attention, custom autograd Functions, attribution."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from popviz.record import record_program


@pytest.mark.parametrize("op", ["split", "chunk", "unbind"])
@pytest.mark.parametrize("fake", [False, True], ids=["record", "plan"])
def test_ops_returning_lists_of_views(op: str, fake: bool) -> None:
    def step(x: torch.Tensor) -> list[torch.Tensor]:
        parts = {"split": lambda: x.split(2), "chunk": lambda: x.chunk(3),
                 "unbind": lambda: x.unbind(0)}[op]()
        return [p * 2 for p in parts]

    if fake:
        with FakeTensorMode():
            program = record_program(step, torch.randn(6, 4), mode="plan")
    else:
        program = record_program(step, torch.randn(6, 4))
    ops = program.ops
    # chunk is split underneath (a composite op)
    view = ops[ops.op.str.startswith("aten.unbind" if op == "unbind" else "aten.split")]
    assert len(view) == 1 and view.iloc[0].op_class == "data_movement"
    assert len(ops[ops.op == "aten.mul.Tensor"]) == (6 if op == "unbind" else 3)
