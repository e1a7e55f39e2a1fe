"""A convolution's backward in a zero-bubble GPU plan: torch's split backward runs
ConvolutionBackward twice (the input gradient in I, the weight and bias gradients in W),
so the plan runs cuDNN's dgrad in B and its wgrad in W. Checked against the convolution's
algebra (dX and dW each cost one forward's FLOPs; dX reads dY and the weight, dW reads dY
and the forward's input) and against the schedule: the wgrad runs after its dgrad, the
forward's input is held until the wgrad, and a CNN gains from a zero-bubble schedule."""

from __future__ import annotations

import numpy as np
import pytest

from popviz.compiler import compile
from popviz.compiler.grad_parts import split_conv_backward
from popviz.options import Options
from tooling.gpu_programs import gpu_program

SPLITS = ["b3/0/relu"]


@pytest.fixture(scope="module")
def program():  # type: ignore[no-untyped-def]
    return gpu_program("resnet", 18, 4, "sgd", image=64)


def _ids(cell: object) -> list[int]:
    return [int(x) for x in str(cell).split(";") if x]


def test_each_call_that_makes_both_gradients_becomes_two(program) -> None:  # type: ignore[no-untyped-def]
    split = split_conv_backward(program)
    before, after = program.ops, split.ops
    conv = before[before["op"].astype(str).str.contains("convolution_backward")]
    t = program.tensors.set_index("tensor_id")
    both = [r for r in conv.itertuples() if len(_ids(r.outputs)) > 1
            and {t.loc[i, "category"] for i in _ids(r.outputs)} > {"gradient"}]
    assert both and len(both) < len(conv)  # the stem makes no input gradient
    assert len(after) == len(before) + len(both)
    assert after["op_id"].is_unique
    new = after.iloc[len(before):].set_index("op_id")
    for r in both:
        grad_out, x, w = _ids(r.inputs)[:3]
        dgrad = after[after["op_id"] == r.op_id].iloc[0]
        (wgrad_id,) = [k for k, row in new.iterrows() if _ids(row["inputs"]) == [grad_out, x]]
        wgrad = new.loc[wgrad_id]
        assert _ids(dgrad["inputs"]) == [grad_out, w]
        assert dgrad["flops"] + wgrad["flops"] == r.flops
        assert dgrad["flops"] == wgrad["flops"]  # one pass each, as the recorder counts
        assert wgrad["bytes_read"] == t.loc[grad_out, "bytes"] + t.loc[x, "bytes"]
        assert dgrad["bytes_read"] == t.loc[grad_out, "bytes"] + t.loc[w, "bytes"]
        made = split.tensors.set_index("tensor_id")
        for g in _ids(wgrad["outputs"]):
            assert t.loc[g, "category"] == "gradient" and made.loc[g, "producer"] == wgrad_id
        for g in _ids(dgrad["outputs"]):
            assert made.loc[g, "producer"] == r.op_id
        if t.loc[x, "last_use"] == r.op_id:  # the forward's input now lives to the wgrad
            assert made.loc[x, "last_use"] == wgrad_id


def test_a_zero_bubble_plan_of_a_cnn_runs_the_wgrad_in_w(
        program, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    options = Options(target="h100", splits=SPLITS, num_ipus=2, gradient_accumulation=6,
                      schedule="ZB1P")
    split = compile(program, options)
    ops = split.tables["ops"]
    conv = ops[ops["op"].astype(str).str.contains("convolution_backward")
               & (ops["stage"] == 1)]
    parts = conv.groupby("grad_part").size()
    assert parts["input"] == parts["weight"]  # every stage-1 conv: one dgrad, one wgrad
    stages = split.tables["stages"].set_index("stage")
    w = stages.loc[1, "weight_grad_cycles_per_microbatch"]
    assert 0.2 < w / stages.loc[1, "backward_cycles_per_microbatch"] < 0.6
    trace = split.tables["trace"]
    back = trace[(trace["kind"] == "compute") & (trace["pass"] == "B") & (trace["stage"] == 1)]
    first = back.groupby(["microbatch", "grad_part"])["start"].min().unstack()
    assert (first["input"] < first["weight"]).all()  # each wgrad after its dgrad
    # against the same plan with each convolution's backward one call (as eager runs it)
    import popviz.compiler.gpu_compile as gpu_compile

    monkeypatch.setattr(gpu_compile, "split_conv_backward", lambda program: program)
    whole = compile(program, options)
    whole_stages = whole.tables["stages"].set_index("stage")
    assert whole_stages.loc[1, "weight_grad_cycles_per_microbatch"] < w / 5
    # deferring the wgrads fills bubbles; holding each conv's input until them costs memory
    assert split.summary["step_ms"] < whole.summary["step_ms"]
    peak = {k: int(v) for k, v in split.summary["max_memory_allocated"].items()}
    peak_whole = {k: int(v) for k, v in whole.summary["max_memory_allocated"].items()}
    assert peak["1"] > peak_whole["1"]


def test_other_schedules_keep_one_call(program) -> None:  # type: ignore[no-untyped-def]
    report = compile(program, Options(target="h100", splits=SPLITS, num_ipus=2,
                                      gradient_accumulation=6, schedule="1F1B"))
    ops = report.tables["ops"]
    conv = ops[ops["op"].astype(str).str.contains("convolution_backward")]
    assert len(conv) == int(program.ops["op"].astype(str)
                            .str.contains("convolution_backward").sum())
    assert np.all(ops["op_id"].to_numpy() < len(program.ops))
