"""Recorder: FLOPs, phases, recompute, tensors and their lifetimes, plan mode."""

from __future__ import annotations

import weakref

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.checkpoint import checkpoint

import popviz
from popviz.recorder import Recorder, record_program, train_step
from popviz.recorder.program import OP_COLUMNS, OP_EXTRA_COLUMNS, TENSOR_COLUMNS


def _ids(cell: str) -> list[int]:
    return [int(x) for x in cell.split(";") if x]


def _forward_only(fn, *args) -> pd.DataFrame:
    with Recorder(progress=False) as rec:
        fn(*args)
    return rec.program.ops


# ------------------------------------------------------------------ FLOPs
@pytest.mark.parametrize(("cin", "cout", "groups", "op_class"), [
    (4, 6, 1, "conv"), (4, 6, 2, "grouped_conv"), (6, 6, 6, "depthwise_conv"),
])
def test_conv_flops_and_class(cin: int, cout: int, groups: int, op_class: str) -> None:
    n, h, w, k, stride = 2, 9, 7, 3, 2
    conv = nn.Conv2d(cin, cout, k, stride=stride, padding=1, groups=groups, bias=False)
    x = torch.randn(n, cin, h, w, requires_grad=True)
    with Recorder(conv, progress=False) as rec:
        conv(x).sum().backward()
    ops = rec.program.ops
    fwd = ops[ops.op == "aten.convolution.default"].iloc[0]
    hout, wout = (h + 2 - k) // stride + 1, (w + 2 - k) // stride + 1
    expected = 2 * n * cout * hout * wout * (cin // groups) * k * k
    assert fwd.flops == expected
    assert fwd.op_class == op_class
    assert fwd.out_shape == f"[{n},{cout},{hout},{wout}]"
    bwd = ops[ops.op == "aten.convolution_backward.default"].iloc[0]
    assert bwd.phase == "backward"
    assert bwd.op_class == op_class
    assert bwd.flops == 2 * expected  # grad of input and grad of weight


def test_linear_and_matmul_flops() -> None:
    lin = nn.Linear(7, 5)
    a, b = torch.randn(3, 4), torch.randn(4, 6)
    ba, bb = torch.randn(2, 3, 4), torch.randn(2, 4, 5)

    def run() -> None:
        lin(torch.randn(8, 7))
        a @ b
        torch.bmm(ba, bb)

    ops = _forward_only(run)
    addmm = ops[ops.op == "aten.addmm.default"].iloc[0]
    assert (addmm.flops, addmm.op_class, addmm.module) == (2 * 8 * 7 * 5, "matmul", "")
    mm = ops[ops.op == "aten.mm.default"].iloc[0]
    assert mm.flops == 2 * 3 * 4 * 6
    bmm = ops[ops.op == "aten.bmm.default"].iloc[0]
    assert bmm.flops == 2 * 2 * 3 * 4 * 5
    assert bmm.shapes == "[2,3,4];[2,4,5]"
    assert bmm.bytes_read == (24 + 40) * 4 and bmm.bytes_written == 30 * 4


def test_elementwise_reduction_norm_flops() -> None:
    x = torch.randn(4, 3, 5, 5)
    bn = nn.BatchNorm2d(3)
    ops = _forward_only(lambda: (torch.relu(x), x.sum(), bn(x), torch.softmax(x, -1)))
    by_op = ops.set_index("op")
    assert by_op.loc["aten.relu.default", "flops"] == x.numel()
    assert by_op.loc["aten.relu.default", "op_class"] == "elementwise"
    assert by_op.loc["aten.sum.default", "flops"] == x.numel()
    assert by_op.loc["aten.native_batch_norm.default", "flops"] == 7 * x.numel()
    assert by_op.loc["aten.native_batch_norm.default", "op_class"] == "norm"
    assert by_op.loc["aten._softmax.default", "flops"] == 5 * x.numel()


# ------------------------------------------------------------------ a small model
class Small(nn.Module):
    def __init__(self, mode: str | None = None) -> None:
        super().__init__()
        self.mode = mode  # None, "nonreentrant", "reentrant"
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(4, 4, 1), nn.ReLU())
        self.fc = nn.Linear(4, 3)
        self.popviz_layer_names = {"stem": "s0", "body": "b1", "body.3": "b1/relu", "fc": "fc"}
        self.popviz_split_names = ["b1", "b1/relu", "fc"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        if self.mode is None:
            x = self.body(x)
        else:
            x = checkpoint(self.body, x, use_reentrant=self.mode == "reentrant")
        return self.fc(x.mean((2, 3)))


def _program(mode: str | None = None, optimiser=torch.optim.Adam, fake: bool = False):
    torch.manual_seed(0)
    model = Small(mode)
    opt = optimiser(model.parameters(), lr=0.01)
    x, y = torch.randn(2, 3, 6, 6), torch.tensor([0, 2])
    return record_program(train_step, model, opt, x, y, model=model,
                          mode="plan" if fake else "measured"), model


def test_program_has_exactly_the_documented_columns() -> None:
    program, _ = _program()
    assert list(program.ops.columns) == [*OP_COLUMNS, *OP_EXTRA_COLUMNS]
    assert list(program.tensors.columns) == list(TENSOR_COLUMNS)
    assert program.ops.op_id.tolist() == list(range(len(program.ops)))
    assert program.mode == "measured"
    assert (program.ops.host_ns > 0).all()


def test_phases_in_order_forward_backward_optimiser() -> None:
    program, _ = _program()
    ops = program.ops
    last = ops.groupby("phase").op_id.agg(["min", "max"])
    assert set(last.index) == {"forward", "backward", "optimiser"}
    assert last.loc["forward", "max"] < last.loc["backward", "min"]
    assert last.loc["backward", "max"] < last.loc["optimiser", "min"]
    # backward ops carry the module (and layer) of the forward op they differentiate
    bwd = ops[ops.phase == "backward"]
    conv_bwd = bwd[bwd.op == "aten.convolution_backward.default"]
    assert conv_bwd.module.tolist() == ["body.2", "body.0", "stem.0"]
    assert conv_bwd.layer.tolist() == ["b1", "b1", "s0"]
    # SGD/Adam on CPU update one parameter at a time: its module is known
    opt = ops[(ops.phase == "optimiser") & (ops.op == "aten.addcdiv_.default")]
    assert opt.module.tolist() == ["stem.0", "stem.0", "stem.1", "stem.1", "body.0", "body.0",
                                   "body.2", "body.2", "fc", "fc"]


def test_layers_from_longest_prefix_and_model_facts() -> None:
    program, model = _program()
    fwd = program.ops[program.ops.phase == "forward"]
    layer_of = dict(zip(fwd.module, fwd.layer, strict=False))
    assert layer_of["stem.1"] == "s0" and layer_of["body.1"] == "b1"
    assert layer_of["body.3"] == "b1/relu" and layer_of["fc"] == "fc"
    # the root's own ops go with the module that wrote their input: the mean with body.3,
    # the loss with fc
    assert "" not in layer_of
    root_ops = fwd[fwd.op.isin(["aten.mean.dim", "aten._log_softmax.default"])]
    assert root_ops.module.tolist() == ["body.3", "fc"]
    facts = program.model
    assert facts["layers"] == ["s0", "b1", "b1/relu", "fc"]
    assert facts["split_names"] == model.popviz_split_names
    assert facts["batch_size"] == 2 and facts["input_shape"] == [2, 3, 6, 6]
    assert facts["parameters"] == sum(p.numel() for p in model.parameters())
    assert facts["name"] == "Small"


@pytest.mark.parametrize("mode", ["nonreentrant", "reentrant"])
def test_recompute_only_for_checkpointed_sections(mode: str) -> None:
    plain, _ = _program(None)
    assert "recompute" not in set(plain.ops.phase)
    program, _ = _program(mode)
    ops = program.ops
    rec = ops[ops.phase == "recompute"]
    assert len(rec) > 0
    # every recomputed op belongs to the checkpointed `body`, and its convolutions rerun
    assert all(m.startswith("body") for m in rec.module)
    convs = rec[rec.op == "aten.convolution.default"].module.tolist()
    assert convs[0] == "body.0"
    fwd_body = ops[(ops.phase == "forward") & ops.module.str.startswith("body")]
    assert set(rec.op) <= set(fwd_body.op) | {"aten.detach.default"}
    # recompute happens inside the backward pass, before the body's own backward
    bwd = ops[ops.phase == "backward"]
    body_bwd = bwd[bwd.module.str.startswith("body")]
    assert bwd.op_id.min() < rec.op_id.min() and rec.op_id.max() < body_bwd.op_id.max()


def test_every_tensor_dies_after_its_last_use() -> None:
    program, _ = _program("nonreentrant")
    ops, tensors = program.ops, program.tensors.set_index("tensor_id")
    last_op = int(ops.op_id.max())
    used_by: dict[int, list[int]] = {}
    for op_id, inputs, outputs in zip(ops.op_id, ops.inputs, ops.outputs, strict=True):
        for tid in _ids(inputs) + _ids(outputs):
            used_by.setdefault(tid, []).append(int(op_id))
    assert set(used_by) <= set(tensors.index)
    for tid, uses in used_by.items():
        row = tensors.loc[tid]
        assert row.last_use >= max(uses), tid  # never read after it is dead
        assert row.producer <= min(uses), tid  # nor before it exists
        if row.category in ("activation", "temporary"):
            # freed right after the last use unless it is still alive after the step
            assert row.last_use in (max(uses), last_op), tid
    persistent = tensors[tensors.category.isin(["parameter", "gradient", "optimiser_state"])]
    assert (persistent.last_use == last_op).all()
    # temporaries of the backward pass are dead long before the step ends
    assert (tensors[tensors.category == "temporary"].last_use < last_op).sum() > 5


def test_categories_adam_sgd() -> None:
    program, model = _program(optimiser=torch.optim.Adam)
    t = program.tensors
    params = list(model.named_parameters())
    cats = t.groupby("category").size()
    assert cats["gradient"] == len(params)
    assert set(t[t.category == "gradient"].name) == {f"{n}.grad" for n, _ in params}
    state = t[t.category == "optimiser_state"]
    for name, p in params:  # exp_avg and exp_avg_sq, plus Adam's scalar step counter
        mine = state[state.name.str.startswith(name + ".")]
        assert len(mine[mine["shape"] == "[" + ",".join(map(str, p.shape)) + "]"]) == 2, name
        assert (mine.module == name.rpartition(".")[0]).all()
    # parameters and buffers exist before the step; gradients and state are made in it
    assert (t[t.category == "parameter"].producer == -1).all()
    assert (t[t.category == "gradient"].producer >= 0).all()
    grads = t[t.category == "gradient"]
    assert set(program.ops.loc[grads.producer, "phase"]) == {"backward"}
    assert int(t[t.category == "parameter"].bytes.sum()) == sum(
        x.numel() * x.element_size() for x in [*model.parameters(), *model.buffers()])
    assert set(t.category) == {"parameter", "gradient", "optimiser_state", "activation",
                               "temporary", "input"}
    sgd, _ = _program(optimiser=torch.optim.SGD)
    assert "optimiser_state" not in set(sgd.tensors.category)  # plain SGD keeps no state


def test_plan_mode_equals_measured_except_host_time() -> None:
    measured, _ = _program("nonreentrant")
    with FakeTensorMode():
        planned, _ = _program("nonreentrant", fake=True)
    assert planned.mode == "plan" and (planned.ops.host_ns == 0).all()
    pd.testing.assert_frame_equal(measured.ops.drop(columns="host_ns"),
                                  planned.ops.drop(columns="host_ns"))
    pd.testing.assert_frame_equal(measured.tensors, planned.tensors)
    assert measured.model == planned.model


def test_plan_context_records_a_fake_step_without_computing(tmp_path) -> None:
    with popviz.plan(popviz.Options(), profile_dir=None, progress=False) as session:
        torch.manual_seed(0)
        model = Small()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 3, (64,))
        assert isinstance(x, torch._subclasses.fake_tensor.FakeTensor)
        with session.step(model=model):
            F.cross_entropy(model(x), y).backward()
            opt.step()
    program = session.program
    assert program.mode == "plan" and program.model["batch_size"] == 64
    assert session.recording.options.micro_batch_size == 64
    assert set(program.ops.phase) == {"forward", "backward", "optimiser"}


def test_host_io_copies_and_scope() -> None:
    model = nn.Linear(4, 2)
    x64 = torch.randn(3, 4, dtype=torch.float64)

    def step() -> None:
        x = x64.to(torch.float32)  # the input copied into the step
        model(x).sum().backward()
        with popviz.host_io():
            model.weight.grad.clone()

    program = record_program(step, model=model)
    ops = program.ops
    host = ops[ops.phase == "host_io"]
    assert host.op.tolist() == ["aten._to_copy.default", "aten.clone.default"]
    copied = program.tensors.set_index("tensor_id").loc[_ids(host.outputs.iloc[0])[0]]
    assert copied.category == "input"


def test_recorder_keeps_no_tensor_alive() -> None:
    seen: list[weakref.ref] = []

    def step() -> None:
        a = torch.randn(100) * 2
        seen.append(weakref.ref(a))
        b = a + 1
        del a
        assert seen[0]() is None  # dead as soon as the program drops it
        b.sum()

    program = record_program(step)
    t = program.tensors
    mul = t[t.name.str.startswith("aten.mul.Tensor")].iloc[0]
    add_op = program.ops[program.ops.op == "aten.add.Tensor"].op_id.iloc[0]
    assert mul.last_use == add_op  # not extended to the end of the step


def test_interrupted_step_writes_nothing(tmp_path) -> None:
    model = Small()
    with pytest.raises(KeyboardInterrupt), popviz.record(
            popviz.Options(), profile_dir=tmp_path, model=model, progress=False) as rec:
        F.cross_entropy(model(torch.randn(2, 3, 6, 6)), torch.tensor([0, 1])).backward()
        raise KeyboardInterrupt
    assert rec.program is None and rec.profile_path is None
    assert list(tmp_path.iterdir()) == []
    # and the hooks are gone: a later step runs unrecorded
    model(torch.randn(1, 3, 6, 6))


def test_record_writes_a_profile(tmp_path) -> None:
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with popviz.record(popviz.Options(), profile_dir=tmp_path / "run", model=model,
                       progress=False) as rec:
        train_step(model, opt, torch.randn(2, 3, 6, 6), torch.tensor([0, 1]))
    assert rec.profile_path == tmp_path / "run" / "profile.h5"
    assert rec.profile_path.exists()
    profile = popviz.open(rec.profile_path)
    assert len(profile.ops) >= len(rec.program.ops)


def test_submodules_import_and_the_public_names_stay_functions() -> None:
    import inspect

    import popviz.compiler.compiler
    import popviz.recorder.recorder  # the package is not named `record`: nothing is hidden

    assert inspect.isfunction(popviz.record) and inspect.isfunction(popviz.plan)
    assert inspect.isfunction(popviz.compile)
    assert popviz.recorder.recorder.Recorder is Recorder


def test_without_model_the_first_module_called_is_the_model(capsys) -> None:
    torch.manual_seed(0)
    net = Small()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(2, 3, 6, 6), torch.tensor([0, 1])
    with Recorder(progress=True) as rec:  # no model given
        train_step(net, opt, x, y)
    ops = rec.program.ops
    assert {"stem.0", "body.2", "fc"} <= set(ops.module)
    assert rec.program.model["layers"][0] == "s0"  # its popviz_layer_names were found
    assert str(len(ops)) in capsys.readouterr().err  # tqdm counted every op on stderr


def test_plan_step_helper() -> None:
    recording = popviz.plan_step(Small, lambda: (torch.randn(4, 3, 6, 6),
                                                        torch.tensor([0, 1, 2, 0])),
                                        profile_dir=None, progress=False,
                                        optimiser=lambda p: torch.optim.SGD(p, lr=0.1,
                                                                            momentum=0.9))
    program = recording.program
    assert program.mode == "plan" and program.model["batch_size"] == 4
    assert set(program.tensors.category) >= {"parameter", "gradient", "optimiser_state"}


def test_gradient_clipping_is_optimiser_work_and_foreach_ops_have_no_module() -> None:
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    x, y = torch.randn(2, 3, 6, 6), torch.tensor([0, 1])

    def step() -> None:
        F.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()

    ops = record_program(step, model=model).ops
    first_opt = ops[ops.phase == "optimiser"].op_id.min()
    assert ops[ops.phase == "backward"].op_id.max() < first_opt
    clip = ops[ops.op.str.startswith("aten._foreach_norm")]
    assert len(clip) == 1 and clip.phase.iloc[0] == "optimiser"
    foreach = ops[(ops.phase == "optimiser") & ops.op.str.startswith("aten._foreach_")]
    assert len(foreach) >= 2 and set(foreach.module) == {""}  # one op over many modules
    update = foreach[foreach.op == "aten._foreach_add_.List"]
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params in set(update.flops)
