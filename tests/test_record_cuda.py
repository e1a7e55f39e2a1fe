"""popviz.record around a training step that runs on a CUDA GPU: the same program as the
step on the CPU (ops, bytes, FLOPs, tensors), a profile that opens, and GPU plans of it.
Needs a GPU: skipped (visibly) where torch.cuda.is_available() is False, as on CI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import popviz
from popviz.models import build
from popviz.options import Options

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (torch.cuda.is_available() is False)")


def _step_on(device: str, tmp: Path, options: Options) -> Any:
    torch.manual_seed(0)
    model = build("resnet", 18, num_classes=10, image_size=32).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (4,), device=device)
    with popviz.record(options, profile_dir=tmp / device, model=model, progress=False) as rec:
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
    return rec.program


def test_a_cuda_step_records_the_same_program(tmp_path: Path) -> None:
    options = Options(target="h100")
    cpu = _step_on("cpu", tmp_path, options)
    cuda = _step_on("cuda", tmp_path, options)
    # the convolutions and the classifier are the same aten ops on both devices (cuDNN
    # runs below the dispatcher); batch norm may be another overload (cudnn_batch_norm)
    for op_class in ("conv", "matmul"):
        assert cuda.ops.loc[cuda.ops["op_class"] == op_class, "flops"].sum() == \
            cpu.ops.loc[cpu.ops["op_class"] == op_class, "flops"].sum(), op_class
    # the forward and backward are the same ops but for batch norm: cuDNN's takes no
    # `empty` output op as the CPU kernel does (ResNet-18: 476 ops on the CPU, 395 on an
    # H200, 20 of them this, the rest the optimiser's)
    cpu_fb, cuda_fb = (p.ops[p.ops["phase"] != "optimiser"] for p in (cpu, cuda))
    norms = int((cpu_fb["op_class"] == "norm").sum() / 2)  # a forward and a backward each
    assert abs(len(cuda_fb) - len(cpu_fb)) <= norms, (
        cpu_fb["op"].value_counts().to_dict(), cuda_fb["op"].value_counts().to_dict())
    # SGD steps CUDA parameters with foreach ops (one per list), CPU ones one by one
    cpu_opt, cuda_opt = (p.ops[p.ops["phase"] == "optimiser"] for p in (cpu, cuda))
    assert cuda_opt["op"].str.contains("_foreach_").any(), cuda_opt["op"].value_counts()
    assert len(cuda_opt) < len(cpu_opt)
    params = cpu.tensors[cpu.tensors["category"] == "parameter"]["bytes"].sum()
    assert cuda.tensors[cuda.tensors["category"] == "parameter"]["bytes"].sum() == params
    profile = popviz.open(tmp_path / "cuda")
    assert profile.meta["kind"] == "modelled" and len(profile.ops) == len(cuda.ops)
    assert (profile.ops["host_ns"] > 0).any()  # measured host time, kernels launched async
