"""cuBLAS GEMMs timed kernel by kernel over the shapes training runs: the measured half of
the GPU roofline's shape-aware GEMM term (popviz/target/gpu_gemm.py).

    python bench/gpu_gemm_shapes.py --out gemm.json      # on a GPU machine (~1 min)

For a Linear layer of K inputs and N outputs on M rows, the three GEMMs autograd runs
(forward x @ W.T, input gradient dy @ W, weight gradient dy.T @ x, each in the operand
layouts autograd passes) plus the batched GEMMs of eager attention, in fp32 (PyTorch's
default: no TF32 for matmuls) and bf16, from M = 8 (a pipeline's micro-batch of one
token row each) to M = 8192. Per case: the GEMM's dimensions as cuBLAS sees them (out
rows x out cols, inner), every kernel it launched (name and median GPU time over the
timed calls, from torch.profiler's CUDA activity: no launch gaps), and their sum.
Needs only torch.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cuda_kernels import environment, kernel_times

LINEARS = ((1024, 1024), (768, 2304), (768, 3072), (3072, 768), (4096, 4096),
           (4096, 16384), (768, 50257))
ROWS = (8, 32, 128, 512, 2048, 8192)
ATTENTION = ((96, 1024, 64), (96, 512, 64), (32, 1024, 128))  # (batch x heads, seq, head dim)


def linear_cases(m: int, k: int, n: int, dtype: Any) -> list[tuple[str, tuple[int, int, int],
                                                                    Callable[[], Any]]]:
    """(kind, (rows, cols, inner) of the product, the call) for one Linear's GEMMs."""
    import torch

    x = torch.randn(m, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    return [("forward", (m, n, k), lambda: torch.mm(x, w.t())),
            ("input_grad", (m, k, n), lambda: torch.mm(dy, w)),
            ("weight_grad", (n, k, m), lambda: torch.mm(dy.t(), x))]


def attention_cases(bh: int, s: int, d: int, dtype: Any) -> list[
        tuple[str, tuple[int, int, int], Callable[[], Any]]]:
    import torch

    q = torch.randn(bh, s, d, device="cuda", dtype=dtype)
    kt = torch.randn(bh, d, s, device="cuda", dtype=dtype)
    p = torch.randn(bh, s, s, device="cuda", dtype=dtype)
    return [("bmm_scores", (s, s, d), lambda: torch.bmm(q, kt)),
            ("bmm_context", (s, d, s), lambda: torch.bmm(p, q))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    p.add_argument("--reps", type=int, default=10, help="timed calls per case")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    doc: dict[str, Any] = {"environment": environment(
        tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32)), "cases": [], "errors": {}}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        groups = [(f"linear {k}->{n} rows {m}", lambda m=m, k=k, n=n, dt=dtype: linear_cases(
            m, k, n, dt)) for k, n in LINEARS for m in ROWS]
        groups += [(f"attention {bh}x{s}x{d}", lambda bh=bh, s=s, d=d, dt=dtype: attention_cases(
            bh, s, d, dt)) for bh, s, d in ATTENTION]
        for label, make in groups:
            try:
                cases = make()
                batch = 1 if label.startswith("linear") else int(label.split()[1].split("x")[0])
                for kind, (rows, cols, inner), fn in cases:
                    kernels = kernel_times(fn, args.reps)
                    total = sum(ns for _, ns in kernels)
                    doc["cases"].append({"case": label, "kind": kind, "dtype": name,
                                         "batch": batch, "rows": rows, "cols": cols,
                                         "inner": inner, "ns": total, "kernels": kernels})
                    tflops = 2 * batch * rows * cols * inner / total / 1e3
                    print(f"{name:9} {label:34} {kind:12} {total / 1e3:9.1f} us "
                          f"{tflops:7.1f} TFLOPS {len(kernels)} kernel(s) {kernels[0][0][:60]}",
                          flush=True)
                del cases
                torch.cuda.empty_cache()
            except Exception as exc:  # one failed case is recorded, not fatal
                doc["errors"][f"{name} {label}"] = f"{type(exc).__name__}: {exc}"
                print(f"{name} {label}: {type(exc).__name__}: {exc}", flush=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}: {len(doc['cases'])} cases, {len(doc['errors'])} errors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
