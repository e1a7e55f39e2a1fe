"""Fit the GPU roofline's per-path element costs (`GpuCost.unrolled_cycles` ...
`cat_dim_cycles`, popviz/target/gpu.py) to bench/gpu_kernel_paths.py's measurements.

    PYTHONPATH=. python bench/fit_gpu_paths.py [bench/data/gpu_kernel_paths_h200.json]

Each case ran at two sizes; the slope between them is its time per element (the intercept,
10-30 us, is the host's launch of one op under CUDA events, not the kernel). Converted to
SM cycles (x SMs x clock), the cases of each path are fitted by least squares:
unrolled = base + per operand; strided = per thread / elements per thread + per element +
per merged dimension (+ a conversion); transpose = a constant; cat = per dimension. Prints
the constants beside the ones in GpuCost and each case's measured against modelled cycles.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # gpu_kernel_paths: the measured cases

from popviz.target.gpu import DEFAULT_GPU_COST, H200_SXM  # noqa: E402
from popviz.target.gpu_cost import ITEMSIZE, path_cycles  # noqa: E402

DEFAULT = ROOT / "bench" / "data" / "gpu_kernel_paths_h200.json"


def current_paths() -> dict[tuple[str, str], str]:
    """(case, output dtype) -> the path popviz's recorder predicts today, from the same
    cases made small on the CPU (a path depends on strides and dtypes, not sizes)."""
    import torch
    from gpu_kernel_paths import cases, op_name

    from popviz.recorder.kernel_path import kernel_path

    out = {}
    for dtype in (torch.float16, torch.float32):
        for name, make in cases(dtype, 256, device="cpu"):
            fn, inputs = make()
            result = fn()
            out[(name, str(result.dtype).removeprefix("torch."))] = kernel_path(
                op_name(name), inputs, [result])
    return out


def slopes(doc: dict) -> list[dict]:
    """One row per (case, dtype) off the vectorized path: its cycles per element from the
    two sizes, with the path the recorder predicts now (the file keeps the one it
    predicted when measured)."""
    paths = current_paths()
    pairs: dict[tuple[str, str], dict[int, dict]] = {}
    for row in doc["cases"]:
        key = (row["case"], "/".join(row["in_dtypes"]) + ">" + row["dtype"])
        pairs.setdefault(key, {})[row["scale"]] = row
    rate = H200_SXM.sms * H200_SXM.sm_clock_hz / 1e9  # SM cycles per ns
    out = []
    for (case, dtypes), by_scale in sorted(pairs.items()):
        big, small = by_scale.get(1), by_scale.get(16)
        if big is None or small is None:
            continue
        path = paths.get((case, big["dtype"]), big["path"])
        if not path:
            continue
        ns_per = (big["ns"] - small["ns"]) / (big["elements"] - small["elements"])
        operands = 1 + sum(1 for d in big["in_dtypes"])
        out.append({"case": case, "dtypes": dtypes, "path": path,
                    "itemsize": ITEMSIZE.get(big["dtype"], 4), "operands": operands,
                    "cycles": ns_per * rate, "kernel": big["kernels"][0][:60]})
    return out


def fit(rows: list[dict]) -> dict[str, float]:
    """Least-squares constants per path family (module docstring)."""
    got: dict[str, float] = {}
    cast = [r for r in rows if r["path"] == "cast"]
    if len(cast) >= 2:
        a = np.array([[1.0, r["operands"]] for r in cast])
        base, per = np.linalg.lstsq(a, np.array([r["cycles"] for r in cast]), rcond=None)[0]
        got["unrolled_cycles"], got["unrolled_operand_cycles"] = float(base), float(per)
    strided = [r for r in rows if r["path"].startswith("strided:")]
    if len(strided) >= 3:
        a = np.array([[1 / (4 if r["itemsize"] < 4 else 2), 1.0, int(r["path"].split(":")[1])]
                      for r in strided])
        thread, element, dim = np.linalg.lstsq(a, np.array([r["cycles"] for r in strided]),
                                               rcond=None)[0]
        got.update(strided_thread_cycles=float(thread), strided_element_cycles=float(element),
                   strided_dim_cycles=float(dim))
        mixed = [r for r in rows if r["path"].startswith("strided-cast:")]
        if mixed:
            base = [thread / 4 + element + dim * int(r["path"].split(":")[1]) for r in mixed]
            got["strided_cast_cycles"] = float(np.mean([r["cycles"] - b
                                                        for r, b in zip(mixed, base)]))
    for family, name, per_dim in (("transpose", "transpose_cycles", False),
                                  ("cat", "cat_dim_cycles", True)):
        picked = [r for r in rows if r["path"].startswith(family + ":")]
        if picked:
            got[name] = float(np.mean([r["cycles"] / (int(r["path"].split(":")[1])
                                                      if per_dim else 1) for r in picked]))
    return got


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    path = Path(args[0]) if args else DEFAULT
    doc = json.loads(path.read_text())
    rows = slopes(doc)
    got = fit(rows)
    env = doc["environment"]
    print(f"{path.name}: {env['device']}, torch {env['torch']}, {env['date']}, "
          f"clocks {env.get('clocks_after', env.get('clocks'))}")
    print(f"{'constant':<26}{'fitted':>8}{'GpuCost':>9}")
    for name, value in got.items():
        print(f"{name:<26}{value:8.3f}{getattr(DEFAULT_GPU_COST, name):9.2f}")
    print(f"\n{'case':<19}{'dtypes':<24}{'path':<16}{'cycles/el':>9}{'model':>7}{'err':>6}  kernel")
    errors = []
    for r in rows:
        model = path_cycles(r["path"], r["itemsize"], r["operands"], DEFAULT_GPU_COST)
        err = model / r["cycles"] - 1
        errors.append(abs(err))
        print(f"{r['case']:<19}{r['dtypes']:<24}{r['path']:<16}{r['cycles']:9.2f}{model:7.2f}"
              f"{err:+6.0%}  {r['kernel']}")
    print(f"mean |error| {np.mean(errors):.1%} over {len(errors)} cases (GpuCost's constants)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
