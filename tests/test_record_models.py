"""Recorder on the ops and call patterns of models popviz did not write: lists of views,
keyword arguments, fused attention, custom autograd Functions, attribution."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from popviz.recorder import flops, record_program
from tests.custom_function import Square


def _run_maybe_fake(run: Callable[[], Any], fake: bool) -> Any:
    """`run()` under FakeTensorMode (plan mode) or as is (record mode)."""
    if not fake:
        return run()
    with FakeTensorMode():
        return run()


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


class _KeywordModel(torch.nn.Module):
    """Called like a HuggingFace model: model(input_ids=..., labels=...)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.head = torch.nn.Linear(6, 11)

    def forward(self, input_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.head(self.embed(input_ids))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


@pytest.mark.parametrize("fake", [False, True], ids=["record", "plan"])
def test_micro_batch_from_keyword_arguments(fake: bool) -> None:
    def run() -> torch.nn.Module:
        model = _KeywordModel()
        ids = torch.randint(0, 11, (5, 3))

        def step() -> None:
            model(input_ids=ids, labels=ids).backward()

        return record_program(step, model=model, mode="plan" if fake else "measured")

    program = _run_maybe_fake(run, fake)
    assert program.model["batch_size"] == 5
    assert program.model["input_shape"] == [5, 3]


@pytest.mark.parametrize("fake", [False, True], ids=["record", "plan"])
def test_micro_batch_is_every_call_of_the_model_in_the_step(fake: bool) -> None:
    """Gradient accumulation inside the step (the model called on 3 then 5 samples, one
    positional, one by keyword) is 8 samples of work; a checkpoint's re-run of the model
    during backward is not another call."""
    def run() -> torch.nn.Module:
        model = _KeywordModel()
        a, b = torch.randint(0, 11, (3, 4)), torch.randint(0, 11, (5, 4))

        def step() -> None:
            model(a, a).backward()
            model(input_ids=b, labels=b).backward()
            torch.utils.checkpoint.checkpoint(model, b, b, use_reentrant=False).backward()

        return record_program(step, model=model, mode="plan" if fake else "measured")

    program = _run_maybe_fake(run, fake)
    assert (program.ops.phase == "recompute").any()  # the model did run again in backward
    assert program.model["batch_size"] == 3 + 5 + 5
    assert program.model["input_shape"] == [3, 4]  # the first call's


# ------------------------------------------------------------------ fused attention
B, H, L, E = 2, 4, 16, 8


def _eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2) / E ** 0.5
    if mask is not None:
        scores = scores + mask
    return torch.softmax(scores, -1) @ v


def _sdpa_backends() -> list[SDPBackend]:
    return [SDPBackend.MATH, *([SDPBackend.FLASH_ATTENTION] if not torch.cuda.is_available()
                               or torch.backends.cuda.flash_sdp_enabled() else [])]


@pytest.mark.parametrize("backend", _sdpa_backends(), ids=lambda b: b.name)
@pytest.mark.parametrize("variant", ["plain", "causal", "mask", "gqa"])
def test_fused_attention_flops_equal_eager_maths(backend: SDPBackend, variant: str) -> None:
    kv_heads = 2 if variant == "gqa" else H
    q = torch.randn(B, H, L, E, requires_grad=True)
    k = torch.randn(B, kv_heads, L, E, requires_grad=True)
    v = torch.randn(B, kv_heads, L, E, requires_grad=True)
    mask = torch.zeros(L, L) if variant == "mask" else None
    kwargs = {"is_causal": variant == "causal", "attn_mask": mask,
              "enable_gqa": variant == "gqa"}

    def step() -> None:
        with sdpa_kernel(backend):
            F.scaled_dot_product_attention(q, k, v, **kwargs).sum().backward()

    ops = record_program(step).ops
    fused = ops[ops.op.str.contains("attention")]
    if backend == SDPBackend.FLASH_ATTENTION:
        assert set(fused.phase) == {"forward", "backward"}
    repeat = H // kv_heads
    with FlopCounterMode(display=False) as counter:
        _eager_attention(q, k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1),
                         mask).sum().backward()
    ours = int(ops.loc[ops.op_class == "matmul", "flops"].sum())
    assert ours == pytest.approx(counter.get_total_flops(), rel=0.01)


@pytest.mark.parametrize("op", ["_scaled_dot_product_efficient_attention",
                                "_scaled_dot_product_flash_attention",
                                "_scaled_dot_product_cudnn_attention"])
def test_gpu_attention_kernels_count_the_eager_maths(op: str) -> None:
    """The CUDA kernels, on meta tensors: the same FLOPs as the CPU flash kernel."""
    func = getattr(torch.ops.aten, op).default
    q, k, v = (torch.empty(B, H, L, E, device="meta") for _ in range(3))
    args = (q, k, v) if "flash" in op else (q, k, v, None, True)
    out = func(*args)
    shapes = [t.shape for t in (q, k, v)]
    outs = [t.shape for t in out if isinstance(t, torch.Tensor)]
    assert flops.classify(func, flops.kind_of(func), args, {}, out, shapes, outs) == \
        ("matmul", 2 * B * H * L * L * (E + E))


def test_safe_softmax_counts_like_softmax() -> None:
    x = torch.randn(3, 7)
    ops = record_program(lambda: torch.ops.aten._safe_softmax(x, -1)).ops
    row = ops[ops.op == "aten._safe_softmax.default"].iloc[0]
    assert (row.op_class, row.flops) == ("reduction", 5 * x.numel())


# ------------------------------------------------------------------ attribution


class _Act(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Square.apply(x)


class _Net(torch.nn.Module):
    def __init__(self, checkpointing: str = "") -> None:
        super().__init__()
        self.l1, self.act, self.l2 = torch.nn.Linear(4, 8), _Act(), torch.nn.Linear(8, 3)
        self.checkpointing = checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l1(x)
        if self.checkpointing:
            h = torch.utils.checkpoint.checkpoint(
                self.act, h, use_reentrant=self.checkpointing == "reentrant")
        else:
            h = self.act(h)
        return self.l2(h)


@pytest.mark.parametrize("checkpointing", ["", "reentrant", "nonreentrant"])
def test_loss_and_custom_function_attribution(checkpointing: str) -> None:
    model = _Net(checkpointing)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    step()  # warm-up: the second step's optimiser reads state from the first
    ops = record_program(step, model=model).ops
    assert (ops.module != "").all(), ops[ops.module == ""][["op", "phase"]]
    loss = ops[ops.op.str.contains("log_softmax|nll_loss")]
    assert set(loss.module) == {"l2"} and set(loss.phase) == {"forward", "backward"}
    square = ops[(ops.module == "act") & (ops.op == "aten.mul.Tensor")]
    # forward x*x; backward 2*x and *grad; under checkpointing the forward is re-run
    phases = square.phase.tolist()
    assert phases.count("forward") == 1 and phases.count("backward") == 2
    assert phases.count("recompute") == (1 if checkpointing else 0)
    params = dict(model.named_parameters())
    opt_ops = ops[ops.phase == "optimiser"]
    assert set(opt_ops.module) == {name.rpartition(".")[0] for name in params}
    # Adam reads 2 moments per parameter: each parameter's updates sit with its module
    assert (opt_ops.groupby("module").size() >= 4).all()


def test_checkpoint_on_an_in_place_result_marks_the_last_writer() -> None:
    import popviz

    bn = torch.nn.BatchNorm1d(4)

    def block(x: torch.Tensor) -> torch.Tensor:
        out = bn(x)
        out += x
        return popviz.recomputation_checkpoint(torch.relu_(out))

    ops = record_program(block, torch.randn(3, 4)).ops
    assert ops.loc[ops.checkpoint, "op"].tolist() == ["aten.relu_.default"]


# ------------------------------------------------------------------ CUDA
def _program_on(device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16),
                                torch.nn.GELU(), torch.nn.Linear(16, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    x = torch.randn(6, 8).to(device)
    y = torch.randint(0, 4, (6,)).to(device)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    step()  # warm-up: momentum buffers exist, as in a real run
    return record_program(step, model=model)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_cuda_and_cpu_record_the_same_program() -> None:
    cpu, cuda = _program_on("cpu"), _program_on("cuda")
    pd.testing.assert_frame_equal(cpu.ops.drop(columns="host_ns"),
                                  cuda.ops.drop(columns="host_ns"))
    pd.testing.assert_frame_equal(cpu.tensors, cuda.tensors)
    assert cpu.model == cuda.model


def test_program_on_cpu_is_deterministic() -> None:
    """The comparison above on one device: two recordings agree but for host time."""
    a, b = _program_on("cpu"), _program_on("cpu")
    pd.testing.assert_frame_equal(a.ops.drop(columns="host_ns"), b.ops.drop(columns="host_ns"))
    pd.testing.assert_frame_equal(a.tensors, b.tensors)
