"""cuDNN convolutions timed kernel by kernel over ResNet-50's layers: the measured half of a
shape-aware convolution term.

    python bench/gpu_conv_shapes.py --out convs.json      # on a GPU machine (~1 min)

Every distinct convolution of ResNet-50 at 224 x 224 (stride, padding, kernel size,
channels, side), at batch 32 and 64, in fp32 (cuDNN may use TF32: PyTorch's default) and
bf16, NCHW as PyTorch's models run: the forward, the input gradient and the weight
gradient (aten.convolution_backward with one output each). Per case: every kernel it
launched (name and median GPU time over the timed calls, from torch.profiler's CUDA
activity) and their sum. Needs only torch.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cuda_kernels import environment, kernel_times

# (in channels, out channels, kernel, stride, input side) of ResNet-50's convolutions
LAYERS = ((3, 64, 7, 2, 224),
          (64, 64, 1, 1, 56), (64, 64, 3, 1, 56), (64, 256, 1, 1, 56), (256, 64, 1, 1, 56),
          (256, 128, 1, 1, 56), (128, 128, 3, 2, 56), (128, 512, 1, 1, 28),
          (256, 512, 1, 2, 56), (512, 128, 1, 1, 28), (128, 128, 3, 1, 28),
          (512, 256, 1, 1, 28), (256, 256, 3, 2, 28), (256, 1024, 1, 1, 14),
          (512, 1024, 1, 2, 28), (1024, 256, 1, 1, 14), (256, 256, 3, 1, 14),
          (1024, 512, 1, 1, 14), (512, 512, 3, 2, 14), (512, 2048, 1, 1, 7),
          (1024, 2048, 1, 2, 14), (2048, 512, 1, 1, 7), (512, 512, 3, 1, 7))
BATCHES = (32, 64)


def measure(layer: tuple[int, int, int, int, int], batch: int, dtype: Any, reps: int
            ) -> list[dict[str, Any]]:
    import torch

    cin, cout, k, stride, side = layer
    pad = k // 2
    x = torch.randn(batch, cin, side, side, device="cuda", dtype=dtype)
    w = torch.randn(cout, cin, k, k, device="cuda", dtype=dtype)
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)
    dy = torch.randn_like(y)
    conv = torch.ops.aten.convolution_backward

    def backward(mask: list[bool]) -> Callable[[], Any]:
        return lambda: conv(dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0],
                            1, mask)

    rows = []
    for kind, fn in (("forward", lambda: torch.nn.functional.conv2d(x, w, stride=stride,
                                                                    padding=pad)),
                     ("input_grad", backward([True, False, False])),
                     ("weight_grad", backward([False, True, False]))):
        if kind == "input_grad" and cin == 3:
            continue  # the stem's input needs no gradient
        kernels = kernel_times(fn, reps)
        rows.append({"dtype": str(dtype).removeprefix("torch."), "batch": batch, "cin": cin,
                     "cout": cout, "kernel": k, "stride": stride, "side": side,
                     "out_side": int(y.shape[-1]), "kind": kind,
                     "flops": 2 * batch * cout * cin * k * k * int(y.shape[-1]) ** 2,
                     "ns": sum(ns for _, ns in kernels), "kernels": kernels})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    torch.backends.cudnn.benchmark = False  # PyTorch's default: cuDNN's heuristics choose
    doc: dict[str, Any] = {"environment": environment(
        cudnn=torch.backends.cudnn.version(),
        cudnn_allow_tf32=bool(torch.backends.cudnn.allow_tf32)), "cases": [], "errors": {}}
    for dtype in (torch.float32, torch.bfloat16):
        for batch in BATCHES:
            for layer in LAYERS:
                label = f"{str(dtype).removeprefix('torch.')} b{batch} {layer}"
                try:
                    for row in measure(layer, batch, dtype, args.reps):
                        doc["cases"].append(row)
                        tflops = row["flops"] / row["ns"] / 1e3
                        print(f"{label:40} {row['kind']:12} {row['ns'] / 1e3:8.1f} us "
                              f"{tflops:6.1f} TFLOPS {len(row['kernels'])} kernel(s) "
                              f"{max(row['kernels'], key=lambda kn: kn[1])[0][:50]}",
                              flush=True)
                    torch.cuda.empty_cache()
                except Exception as exc:  # recorded, not fatal
                    doc["errors"][label] = f"{type(exc).__name__}: {exc}"
                    print(f"{label}: {type(exc).__name__}: {exc}", flush=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}: {len(doc['cases'])} cases, {len(doc['errors'])} errors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
