"""Which CUDA element-wise kernel an op runs (popviz/recorder/kernel_path.py), checked
against the kernels CUDA itself ran on an H200 (bench/data/gpu_kernel_paths_h200.json), and
the GPU roofline's time for each path (popviz/target/gpu_cost.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from popviz.recorder.kernel_path import kernel_path, merged_dims
from popviz.target.gpu import A100_80GB, DEFAULT_GPU_COST, H200_SXM
from popviz.target.gpu_cost import gpu_op_costs, path_cycles

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "bench" / "data" / "gpu_kernel_paths_h200.json"


def test_paths_of_common_layouts() -> None:
    x = torch.randn(2, 16, 4, 8, dtype=torch.float16)  # [b, s, heads, d]
    heads = x.transpose(1, 2)  # [b, heads, s, d], a view
    assert kernel_path("clone", [heads], [heads.contiguous()]) == "strided:4"
    # an element-wise op keeps its input's layout: the vectorized kernel
    assert kernel_path("mul", [heads], [heads * 2]) == ""
    scores, mask = torch.randn(2, 4, 16, 16), torch.randn(2, 1, 16, 16)
    assert kernel_path("add", [scores, mask], [scores + mask]) == "strided:3"
    rows, bias = torch.randn(32, 64), torch.randn(64)
    assert kernel_path("add", [rows, bias], [rows + bias]) == "strided:2"
    assert kernel_path("add", [rows, rows], [rows + rows]) == ""
    assert kernel_path("mul", [rows, torch.tensor(2.0)], [rows * 2]) == ""  # a scalar
    t = rows.t()
    assert kernel_path("clone", [t], [t.contiguous()]) == "transpose:2"
    half = x.reshape(-1)
    assert kernel_path("_to_copy", [half], [half.float()]) == "cast"  # widening: unrolled
    assert kernel_path("_to_copy", [half.float()], [half]) == ""  # narrowing: vectorized
    assert kernel_path("add", [half, half.float()], [half + half.float()]) == "cast"
    empty = torch.empty(2, 4, 0, 8, dtype=torch.float16)
    cat = torch.cat([empty, heads], dim=-2)
    assert kernel_path("cat", [empty, heads], [cat]) == "cat:4"
    assert kernel_path("cat", [rows, rows], [torch.cat([rows, rows])]) == ""


def test_merged_dims_follows_tensor_iterator() -> None:
    # a contiguous [4, 8] with its output: one dimension, dense
    assert merged_dims((4, 8), [(8, 1), (8, 1)]) == (1, True, True)
    # a column broadcast: two dimensions, the input's fastest stride 0 (coalesced loads)
    assert merged_dims((4, 8), [(8, 1), (1, 0)]) == (2, False, True)
    # size-1 dimensions drop out
    assert merged_dims((1, 4, 1, 8), [(32, 8, 8, 1), (32, 8, 8, 1)]) == (1, True, True)


def _family(kernel: str) -> str:
    """The path a CUDA kernel name belongs to."""
    if kernel.startswith("Memcpy") or "vectorized_elementwise_kernel" in kernel or \
            "CatArrayBatchedCopy_vectorized" in kernel or "CatArrayBatchedCopy_contig" in kernel:
        return ""
    if "unrolled_elementwise_kernel" in kernel:
        return "cast"
    if "CatArrayBatchedCopy" in kernel:
        return "cat"
    if "elementwise_kernel<128" in kernel:
        return "strided"
    return "?"


def test_predicted_paths_are_the_kernels_cuda_ran() -> None:
    """Every case measured on the H200, rebuilt small on the CPU: the path the recorder
    predicts is the family of the kernel CUDA launched for it (torch.profiler's names)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_kernel_paths import cases, op_name

    doc = json.loads(MEASURED.read_text())
    ran = {(r["case"], r["dtype"]): r["kernels"][0] for r in doc["cases"] if r["scale"] == 1}
    checked = 0
    for dtype in (torch.float16, torch.float32):
        for name, make in cases(dtype, 256, device="cpu"):
            fn, inputs = make()
            out = fn()
            path = kernel_path(op_name(name), inputs, [out])
            family = path.split(":")[0].replace("transpose", "strided") \
                .replace("strided-cast", "strided")
            kernel = ran[(name, str(out.dtype).removeprefix("torch."))]
            assert family == _family(kernel), (name, dtype, path, kernel)
            checked += 1
    assert checked == 30


def _ops(path: str, shape: str, dtype: str = "float16") -> pd.DataFrame:
    numel = 1
    for n in shape.strip("[]").split(","):
        numel *= int(n)
    size = 2 if dtype == "float16" else 4
    return pd.DataFrame({
        "op": ["aten.add.Tensor"], "op_class": ["elementwise"], "phase": ["forward"],
        "flops": [numel], "bytes_read": [2 * numel * size], "bytes_written": [numel * size],
        "dtype": [dtype], "shapes": [f"{shape};{shape}"], "out_shape": [shape],
        "kernel_path": [path]})


def test_strided_kernels_cost_their_instructions() -> None:
    shape = "[6,24,1024,1024]"  # the Zero Bubble-shape attention mask add
    vector = gpu_op_costs(_ops("", shape), H200_SXM)
    strided = gpu_op_costs(_ops("strided:3", shape), H200_SXM)
    numel = 6 * 24 * 1024 * 1024
    cycles = path_cycles("strided:3", 2, 3, DEFAULT_GPU_COST)
    expected = numel * cycles / (H200_SXM.sms * H200_SXM.sm_clock_hz) * 1e9
    assert strided["compute_ns"].iloc[0] == pytest.approx(expected)
    # the H200 trace of that stage ran each such add in 0.42 ms (vectorized bytes: 0.22)
    assert 380e3 < strided["cycles"].iloc[0] < 460e3
    assert vector["cycles"].iloc[0] < 0.6 * strided["cycles"].iloc[0]
    # an A100 runs the same instructions on fewer, slower SMs
    a100 = gpu_op_costs(_ops("strided:3", shape), A100_80GB)
    ratio = (H200_SXM.sms * H200_SXM.sm_clock_hz) / (A100_80GB.sms * A100_80GB.sm_clock_hz)
    assert a100["compute_ns"].iloc[0] == pytest.approx(expected * ratio)


def test_a_program_without_kernel_paths_costs_as_before() -> None:
    ops = _ops("strided:3", "[64,64]").drop(columns="kernel_path")
    assert gpu_op_costs(ops, H200_SXM)["compute_ns"].iloc[0] == 0.0


def test_a_recording_names_each_ops_path() -> None:
    """A plan-mode recording (fake tensors) keeps the strides a GPU would see."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from popviz.recorder import record_program

    class Heads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(32, 32)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            q = self.proj(x).view(2, 16, 4, 8).transpose(1, 2).contiguous()
            scores = q @ q.transpose(-1, -2) + mask  # [2, 4, 16, 16] + [2, 1, 16, 16]
            return scores.float().sum()

    def step(net: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor) -> None:
        net(x, mask).backward()

    with FakeTensorMode():
        net = Heads()
        program = record_program(step, net, torch.randn(2, 16, 32), torch.randn(2, 1, 16, 16),
                                 model=net, mode="plan", progress=False)
    forward = program.ops[program.ops["phase"] == "forward"]
    paths = dict(zip(forward["op"], forward["kernel_path"], strict=False))
    assert paths["aten.clone.default"] == "strided:4"
    assert paths["aten.add.Tensor"] == "strided:3"
    assert forward["kernel_path"].isin(["", "strided:4", "strided:3"]).all()


def test_tensors_without_strides_record_no_path() -> None:
    sparse = torch.eye(4).to_sparse()
    assert kernel_path("add", [sparse, sparse], [sparse + sparse]) == ""
    dense = torch.eye(4)
    assert kernel_path("add", [dense, sparse], [dense + sparse]) == ""
    assert kernel_path("mul", [sparse, dense], [sparse * dense]) == ""

    class NoStrides(torch.Tensor):  # a subclass whose strides cannot be read
        def stride(self, *args: object) -> tuple[int, ...]:  # type: ignore[override]
            raise RuntimeError("no strides")

    odd = torch.randn(4, 4).as_subclass(NoStrides)
    assert kernel_path("add", [odd, dense], [torch.randn(4, 4).t()]) == ""
