"""PyTorch's element-wise kernel paths timed on a CUDA GPU: the measured half of the GPU
roofline's per-path terms (popviz/recorder/kernel_path.py, popviz/target/gpu_cost.py).

    python bench/gpu_kernel_paths.py --out paths.json      # on a GPU machine (~1 min)

Each case is one op on tensors of a few hundred MB (well past the L2 and the launch cost)
in fp16 and fp32: contiguous arithmetic and copies (the vectorized kernel), cast copies
(the unrolled kernel), broadcast adds and transposed copies with 2-4 merged dimensions
(the offset-computing kernel), `cat` of contiguous and of transposed inputs, each at two
sizes. Per case it writes the path popviz's recorder predicts, the kernel CUDA ran (its
name, from torch.profiler), the elements, the bytes moved, and the median time of 20
launches (CUDA events, after 3 warm-ups). Needs only torch and popviz.recorder.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cuda_kernels import environment  # noqa: E402  (bench/, beside this file)

Case = tuple[str, Callable[[], tuple[Callable[[], Any], list[Any]]]]


def cases(dtype: Any, scale: int, device: str = "cuda") -> list[Case]:
    """(name, make) per op; make() returns (the op as a callable, its input tensors)."""
    import torch

    def t(*shape: int, dt: Any = dtype) -> Any:
        return torch.randn(*shape, device=device).to(dt)

    n = (1 << 27) // scale  # 128 Mi elements at scale 1
    b, s, a, d = 8, 1024 // max(1, scale // 4), 16, 128  # attention-like 4-D tensors
    h = 4096
    rows = n // h
    other = torch.float32 if dtype != torch.float32 else torch.float16

    def vec_add() -> Any:
        x, y = t(n), t(n)
        return (lambda: x + y), [x, y]

    def scalar_mul() -> Any:
        x = t(n)
        return (lambda: x * 2.0), [x]

    def clone() -> Any:
        x = t(n)
        return (lambda: x.clone()), [x]

    def cast() -> Any:
        x = t(n)
        return (lambda: x.to(other)), [x]

    def mixed_add() -> Any:  # type promotion: the narrower operand converted per element
        x, y = t(n), t(n, dt=other)
        return (lambda: x + y), [x, y]

    def bias_add() -> Any:  # [rows, h] + [h]: 2 merged dimensions
        x, y = t(rows, h), t(h)
        return (lambda: x + y), [x, y]

    def column_mul() -> Any:  # [rows, h] * [rows, 1]
        x, y = t(rows, h), t(rows, 1)
        return (lambda: x * y), [x, y]

    def mask_add() -> Any:  # [b, a, s, s] + [b, 1, s, s]: 3 merged dimensions
        ss = int((n // (b * a)) ** 0.5)
        x, y = t(b, a, ss, ss), t(b, 1, ss, ss)
        return (lambda: x + y), [x, y]

    def transpose_2d() -> Any:
        x = t(rows, h).t()
        return (lambda: x.contiguous()), [x]

    def transpose_3d() -> Any:
        x = t(rows // 16, 16, h).transpose(0, 1)
        return (lambda: x.contiguous()), [x]

    def transpose_4d() -> Any:  # [b, s, a, d] -> [b, a, s, d] (heads split, as HF's)
        x = t(b, n // (b * a * d), a, d).transpose(1, 2)
        return (lambda: x.contiguous()), [x]

    def transpose_4d_cast() -> Any:
        x = t(b, n // (b * a * d), a, d).transpose(1, 2)
        return (lambda: x.to(other, memory_format=torch.contiguous_format)), [x]

    def layout_mul() -> Any:  # a transposed input, output in its layout: vectorized
        x = t(b, n // (b * a * d), a, d).transpose(1, 2)
        return (lambda: x * 2.0), [x]

    def cat_dense() -> Any:
        x, y = t(n // 2), t(n // 2)
        return (lambda: torch.cat([x, y])), [x, y]

    def cat_transposed() -> Any:  # HF's cache: cat([empty, key.transpose(1, 2)], -2)
        e = t(b, a, 0, d)
        x = t(b, n // (b * a * d), a, d).transpose(1, 2)
        return (lambda: torch.cat([e, x], dim=-2)), [e, x]

    del s
    return [(f.__name__.replace("_", "-"), f) for f in (
        vec_add, scalar_mul, clone, cast, mixed_add, bias_add, column_mul, mask_add,
        transpose_2d, transpose_3d, transpose_4d, transpose_4d_cast, layout_mul, cat_dense,
        cat_transposed)]


def op_name(case: str) -> str:
    """The aten op a case runs, as kernel_path names it."""
    if case.startswith("cat"):
        return "cat"
    return "_to_copy" if case.startswith(("cast", "transpose", "clone")) else case


def _kernel_names(fn: Callable[[], Any]) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return list(dict.fromkeys(names))


def measure(name: str, make: Callable[[], Any], reps: int) -> dict[str, Any]:
    import torch

    from popviz.recorder.kernel_path import kernel_path

    fn, inputs = make()
    out = fn()
    path = kernel_path(op_name(name), inputs, [out])
    moved = sum(x.numel() * x.element_size() for x in inputs) + out.numel() * out.element_size()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e6)  # ns
    times.sort()
    ns = times[len(times) // 2]
    row = {"case": name, "dtype": str(out.dtype).removeprefix("torch."),
           "in_dtypes": [str(x.dtype).removeprefix("torch.") for x in inputs],
           "shape": list(out.shape), "elements": int(out.numel()), "bytes": int(moved),
           "path": path, "ns": ns, "min_ns": times[0], "kernels": _kernel_names(fn)}
    del fn, inputs, out
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    p.add_argument("--reps", type=int, default=20, help="timed launches per case")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    doc: dict[str, Any] = {"environment": environment(), "cases": [], "errors": {}}
    for dtype in (torch.float16, torch.float32):
        for scale in (1, 16):
            for name, make in cases(dtype, scale):
                key = f"{name}/{dtype}/{scale}"
                try:
                    row = measure(name, make, args.reps)
                    row["scale"] = scale
                    doc["cases"].append(row)
                    gbs = row["bytes"] / row["ns"]
                    print(f"{key:<36} {row['path']:<16} {row['ns'] / 1e3:9.1f} us "
                          f"{gbs:7.0f} GB/s {row['elements'] / row['ns']:7.1f} elem/ns  "
                          f"{(row['kernels'] or ['?'])[0][:70]}", flush=True)
                except Exception as exc:  # one case's failure is a row, not the run's end
                    doc["errors"][key] = f"{type(exc).__name__}: {exc}"[:300]
                    print(f"{key} FAILED {doc['errors'][key]}", flush=True)
                    torch.cuda.empty_cache()
        doc["environment"]["clocks_after"] = environment()["clocks"]
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
