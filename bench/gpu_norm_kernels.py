"""Batch norm's CUDA kernels timed over ResNet-50's shapes, in fp32 (cuDNN) and in bf16
(PyTorch's native kernels, which autocast's mixed batch norm runs), and layer norm's over
transformers' (rows x hidden): the measured half of the GPU model's norm terms.

    python bench/gpu_norm_kernels.py --out norms.json      # on a GPU machine (~30 s)

Per case (batch, channels, height, width, dtype; rows and hidden for layer norm): each
kernel the training-mode forward and the backward launch (name and median GPU time over the
timed calls, from torch.profiler's CUDA activity) and their sums. Needs only torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cuda_kernels import environment, kernel_times

# ResNet-50's batch-norm inputs per image (channels, side) at 224 x 224
SHAPES = ((64, 112), (64, 56), (256, 56), (128, 28), (512, 28), (256, 14), (1024, 14),
          (512, 7), (2048, 7))
BATCHES = (16, 64)
LAYER_NORMS = ((4096, 768), (8192, 768), (8192, 1024), (6144, 1600), (3072, 4096),
               (8192, 4096))  # (rows = tokens, hidden)


def measure(batch: int, channels: int, side: int, dtype: Any, reps: int) -> dict[str, Any]:
    """One training-mode batch norm's forward and backward kernels."""
    import torch

    bn = torch.nn.BatchNorm2d(channels).cuda()  # fp32 weights, as under autocast
    x = torch.randn(batch, channels, side, side, device="cuda", dtype=dtype,
                    requires_grad=True)
    dy = torch.randn_like(bn(x))

    def backward() -> None:
        torch.autograd.grad(bn(x), (x, bn.weight, bn.bias), dy)

    forward = kernel_times(lambda: bn(x), reps)
    back = kernel_times(backward, reps)[len(forward):]
    return {"dtype": str(dtype).removeprefix("torch."), "batch": batch,
            "channels": channels, "side": side,
            "forward_ns": sum(ns for _, ns in forward),
            "backward_ns": sum(ns for _, ns in back), "forward": forward, "backward": back}


def measure_layer_norm(rows: int, hidden: int, dtype: Any, reps: int) -> dict[str, Any]:
    """One layer norm's forward and backward kernels (weights in the input's dtype)."""
    import torch

    ln = torch.nn.LayerNorm(hidden).cuda().to(dtype)
    x = torch.randn(rows, hidden, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn_like(ln(x))

    def backward() -> None:
        torch.autograd.grad(ln(x), (x, ln.weight, ln.bias), dy)

    forward = kernel_times(lambda: ln(x), reps)
    back = kernel_times(backward, reps)[len(forward):]
    return {"dtype": str(dtype).removeprefix("torch."), "rows": rows, "hidden": hidden,
            "forward_ns": sum(ns for _, ns in forward),
            "backward_ns": sum(ns for _, ns in back), "forward": forward, "backward": back}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    doc: dict[str, Any] = {"environment": environment(), "cases": [], "errors": {}}
    for dtype in (torch.float32, torch.bfloat16):
        for batch in BATCHES:
            for channels, side in SHAPES:
                label = f"{str(dtype).removeprefix('torch.')} {batch}x{channels}x{side}x{side}"
                try:
                    row = measure(batch, channels, side, dtype, args.reps)
                    doc["cases"].append(row)
                    print(f"{label:28} F {row['forward_ns'] / 1e3:8.1f} us "
                          f"B {row['backward_ns'] / 1e3:8.1f} us  "
                          f"{' | '.join(n[:40] for n, _ in row['forward'])}", flush=True)
                    torch.cuda.empty_cache()
                except Exception as exc:  # recorded, not fatal
                    doc["errors"][label] = f"{type(exc).__name__}: {exc}"
                    print(f"{label}: {type(exc).__name__}: {exc}", flush=True)
    doc["layer_norm"] = []
    for dtype in (torch.float32, torch.bfloat16):
        for rows, hidden in LAYER_NORMS:
            label = f"layer norm {str(dtype).removeprefix('torch.')} {rows}x{hidden}"
            try:
                row = measure_layer_norm(rows, hidden, dtype, args.reps)
                doc["layer_norm"].append(row)
                print(f"{label:34} F {row['forward_ns'] / 1e3:8.1f} us "
                      f"B {row['backward_ns'] / 1e3:8.1f} us", flush=True)
            except Exception as exc:  # recorded, not fatal
                doc["errors"][label] = f"{type(exc).__name__}: {exc}"
                print(f"{label}: {type(exc).__name__}: {exc}", flush=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}: {len(doc['cases'])} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
