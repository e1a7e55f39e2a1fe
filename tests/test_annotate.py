"""Annotation API: blocks, stages, executions, checkpoints; numerics never change."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popviz
from popviz.annotate import STATE, auto_stages, check_stages
from popviz.api import compile_options
from popviz.recorder import record_program, train_step


class Annotated(nn.Module):
    """Two blocks via `Block` scopes, a checkpoint, and an optional BeginBlock on `head`."""

    def __init__(self, annotate: bool) -> None:
        super().__init__()
        self.annotate = annotate
        self.body = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU())
        self.mid = nn.Conv2d(6, 6, 3, padding=1, groups=3)
        self.head = nn.Linear(6, 4)
        if annotate:
            popviz.BeginBlock(self.head, "B3", ipu_id=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.annotate:
            with popviz.Block("B1", ipu_id=0):
                x = self.body(x)
                x = popviz.recomputation_checkpoint(x)
            with popviz.Block("B2", ipu_id=1):
                x = self.mid(x).mean((2, 3))
        else:
            x = self.mid(self.body(x)).mean((2, 3))
        return self.head(x)


def _step(annotate: bool, recorded: bool) -> tuple[float, list[torch.Tensor], object]:
    torch.manual_seed(3)
    model = Annotated(annotate)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    program = None
    if recorded:
        program = record_program(train_step, model, opt, x, y, model=model)
        loss = F.cross_entropy(model(x), y)  # after the recorded step, same for all runs
    else:
        train_step(model, opt, x, y)
        loss = F.cross_entropy(model(x), y)
    grads = [p.grad.clone() for p in model.parameters()]
    return loss.item(), [*grads, *(p.detach().clone() for p in model.parameters())], program


def test_numerics_identical_with_or_without_annotations_and_recording() -> None:
    base_loss, base_tensors, _ = _step(annotate=False, recorded=False)
    for annotate in (False, True):
        for recorded in (False, True):
            loss, tensors, _ = _step(annotate, recorded)
            assert loss == base_loss, (annotate, recorded)
            for a, b in zip(tensors, base_tensors, strict=True):
                assert torch.equal(a, b), (annotate, recorded)


def test_blocks_and_checkpoint_reach_the_program() -> None:
    _, _, program = _step(annotate=True, recorded=True)
    ops = program.ops
    fwd = ops[ops.phase == "forward"]
    assert set(fwd[fwd.module.str.startswith("body")].block) == {"B1"}
    assert set(fwd[fwd.module == "mid"].block) == {"B2"}
    assert set(fwd[fwd.module == "head"].block) == {"B3"}
    # backward ops inherit the block of the forward module they differentiate
    bwd = ops[ops.phase == "backward"]
    assert set(bwd[bwd.module == "mid"].block) == {"B2"}
    assert set(bwd[bwd.module == "body.0"].block) == {"B1"}
    # the checkpoint marks exactly the op that produced the ReLU output
    marked = ops[ops.checkpoint]
    assert marked.op.tolist() == ["aten.relu.default"]
    assert marked.module.tolist() == ["body.2"]
    assert program.model["blocks"] == ["B1", "B2", "B3"]
    assert program.model["block_ipus"] == {"B1": 0, "B2": 1, "B3": 2}


def test_checkpoint_and_block_are_inert_outside_recording() -> None:
    t = torch.randn(3)
    assert popviz.recomputation_checkpoint(t) is t
    STATE.reset()
    with popviz.Block("X"):
        assert STATE.current_block() == "X"
    assert STATE.current_block() == ""

    @popviz.Block("Deco", ipu_id=1)
    def f(v: torch.Tensor) -> str:
        return STATE.current_block()

    assert f(t) == "Deco"


def test_auto_staging_one_stage_per_block_on_its_ipu() -> None:
    _, _, program = _step(annotate=True, recorded=True)
    opts = compile_options(popviz.Options(), program)
    assert opts.stages == [["B1"], ["B2"], ["B3"]]
    assert opts.stage_ipus == [0, 1, 2]
    assert opts.micro_batch_size == 4
    # pipelined stages own their IPU: consecutive blocks on one IPU share a stage
    o = popviz.Options()
    auto_stages(o, ["A", "B", "C"], {"A": 0, "B": 0, "C": 1})
    assert (o.stages, o.stage_ipus) == ([["A", "B"], ["C"]], [0, 1])
    o = popviz.Options(strategy="sharded")
    auto_stages(o, ["A", "B", "C"], {"A": 0, "B": 0, "C": 1})
    assert (o.stages, o.stage_ipus) == ([["A"], ["B"], ["C"]], [0, 0, 1])


def test_explicit_stages_fill_options() -> None:
    opts = popviz.Options().set_execution_strategy(popviz.PipelinedExecution(
        popviz.Stage("B1").ipu(0), popviz.Stage("B2", "B3").ipu(1)))
    assert (opts.strategy, opts.stages, opts.stage_ipus) == ("pipelined", [["B1"], ["B2", "B3"]],
                                                            [0, 1])
    opts = popviz.Options().set_execution_strategy(popviz.ShardedExecution("B1", "B2"))
    assert (opts.strategy, opts.stages, opts.stage_ipus) == ("sharded", [["B1"], ["B2"]], [0, 1])


def test_a_strategy_by_name_keeps_the_blocks_placement_and_a_wrong_kind_is_one_line() -> None:
    opts = popviz.Options().set_execution_strategy("sharded")
    assert (opts.strategy, opts.stages) == ("sharded", [])
    with pytest.raises(ValueError, match="strategy 'pipelind' is not one of pipelined"):
        popviz.Options().set_execution_strategy("pipelind")
    with pytest.raises(TypeError, match=r"takes popviz.PipelinedExecution.*got int"):
        popviz.Options().set_execution_strategy(2)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: popviz.PipelinedExecution(popviz.Stage("A").ipu(1), popviz.Stage("B").ipu(0)),
     "out of order"),
    (lambda: popviz.PipelinedExecution(popviz.Stage("A").ipu(0), popviz.Stage("B").ipu(0)),
     "IPU of its own"),
    (lambda: popviz.ShardedExecution(popviz.Stage("A"), popviz.Stage("A")), "'A'"),
    (lambda: popviz.Stage(), "at least one block"),
    (lambda: popviz.Stage("A").ipu(-1), "-1"),
    (lambda: popviz.Block("B", ipu_id=1.5), "1.5"),
    (lambda: popviz.Block(""), "''"),
    (lambda: popviz.BeginBlock(torch.randn(2), "B"), "Tensor"),
    (lambda: popviz.Options().set_available_memory_proportion({"IPU0": 1.5}), "1.5"),
])
def test_invalid_annotations_raise_value_error_naming_the_value(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        execution = make()
        if isinstance(execution, popviz.PipelinedExecution | popviz.ShardedExecution):
            execution.apply_to(popviz.Options())


def test_more_stages_than_ipus() -> None:
    execution = popviz.PipelinedExecution(popviz.Stage("A"), popviz.Stage("B"), popviz.Stage("C"))
    with pytest.raises(ValueError, match="IPU2 but only 2"):
        popviz.Options(num_ipus=2).set_execution_strategy(execution)


def test_unknown_block_in_stage_is_reported_at_record_time() -> None:
    _, _, program = _step(annotate=True, recorded=True)
    opts = popviz.Options().set_execution_strategy(
        popviz.PipelinedExecution(popviz.Stage("B1"), popviz.Stage("B9")))
    with pytest.raises(ValueError, match=r"unknown block 'B9'.*'B1', 'B2', 'B3'"):
        compile_options(opts, program)
    check_stages(popviz.Options(stages=[["B1", "B2"]]), ["B1", "B2"])  # known: fine


def test_record_raises_on_unknown_stage_block(tmp_path) -> None:
    torch.manual_seed(0)
    model = Annotated(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opts = popviz.Options().set_execution_strategy(popviz.ShardedExecution("B1", "nope"))
    with pytest.raises(ValueError, match="'nope'"), popviz.record(
            opts, profile_dir=tmp_path, model=model, progress=False):
        train_step(model, opt, torch.randn(2, 3, 8, 8), torch.tensor([0, 1]))
    assert list(tmp_path.iterdir()) == []
