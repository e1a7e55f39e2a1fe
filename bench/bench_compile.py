"""Benchmark: compile a recorded ResNet-50 training step for a 4-IPU Mk2 pipeline.

    .venv/bin/python bench/bench_compile.py [--batch 16] [--image-size 224] [--repeat 3]
    .venv/bin/python bench/bench_compile.py --synthetic      # no recorder: ~3000-op chain
    .venv/bin/python bench/bench_compile.py --calibrate      # modelled vs published table

Prints the best-of-N compile time (4 IPUs x 1472 tiles, per-tile liveness included) as a
ratio to the time of recording that step (target: < 0.2), and the profile's sizes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from popviz.compiler import compile as compile_program
from popviz.options import Options

SPLITS = ["b1/2/relu", "b2/3/relu", "b3/3/relu"]  # Graphcore's 4-stage ResNet-50 splits


def record_resnet50(batch: int, image_size: int) -> tuple[object, float]:
    import torch

    from popviz.models import build
    from popviz.models.training import train_step
    from popviz.recorder import record_program

    torch.manual_seed(0)
    model = build("resnet", 50)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 3, image_size, image_size)
    y = torch.randint(0, 1000, (batch,))
    train_step(model, opt, x, y)  # warm-up: first-call costs are not recording
    start = time.perf_counter()
    program = record_program(train_step, model, opt, x, y, model=model, progress=False)
    return program, time.perf_counter() - start


def synthetic(layers: int) -> tuple[object, float]:
    from popviz.compiler.synthetic import synthetic_program

    program = synthetic_program(layers=layers, batch=16, channels=64, hw=56)
    n = len(program.model["layers"])
    splits = [program.model["layers"][n * k // 4] for k in (1, 2, 3)]
    return (program, splits), float("nan")


def plan_program(name: str, size: int, batch: int, image: int = 224, classes: int = 1000):
    """A full-size model's training step recorded in plan mode (fake tensors: no compute)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from popviz.models import build
    from popviz.models.training import train_step
    from popviz.recorder import record_program

    with FakeTensorMode():
        torch.manual_seed(0)
        model = build(name, size)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(batch, 3, image, image)
        y = torch.randint(0, classes, (batch,))
        return record_program(train_step, model, opt, x, y, model=model, mode="plan",
                              progress=False)


def calibrate() -> int:
    """Print docs/cost-model.md's calibration table: modelled vs published figures."""
    import numpy as np
    import pandas as pd

    from popviz.target import get_target
    from popviz.target.cost import Precision, op_costs

    rows = []
    amp = {"precision": "16.16", "half_partials": True, "available_memory_proportion": 0.15}
    rn20 = plan_program("resnet", 50, 20)
    ckpts = ["b1/0/relu", "b1/2/relu", "b2/0/relu", "b2/2/relu", "b3/0/relu", "b3/3/relu"]
    r = compile_program(rn20, Options(splits=ckpts, num_ipus=1, recomputation=True,
                                      gradient_accumulation=16, replication_factor=16, **amp))
    rows.append(("RN50 train, 16 x 1 IPU, recompute, mb 20 (MLPerf v1.1)", "~30,000 img/s",
                 f"{r.summary['throughput']:,.0f} img/s, fits={r.summary['fits']}"))
    r = compile_program(rn20, Options(num_ipus=1, gradient_accumulation=16,
                                      replication_factor=16, **amp))
    peak = max(r.summary["peak_liveness_bytes"].values()) / 2**20
    rows.append(("  same without recomputation", "needed recompute to fit",
                 f"fits={r.summary['fits']}, peak {peak:,.0f} MiB"))
    rn16 = plan_program("resnet", 50, 16)
    pipe = Options(splits=SPLITS, gradient_accumulation=64, replication_factor=4,
                   recomputation=True, **{**amp, "precision": "16.32"})
    r = compile_program(rn16, pipe)
    st = r.tables["stages"]
    rows.append(("RN50 train, 4-IPU pipeline x 4 replicas, mb 16", "~16,000 img/s",
                 f"{r.summary['throughput']:,.0f} img/s, fits={r.summary['fits']}"))
    r = compile_program(rn16, pipe.copy(recomputation=False))
    st = r.tables["stages"]
    rows.append(("  same without recomputation: stash per IPU (MiB)", "IPU0 holds the most",
                 " ".join(f"{b / 2**20:.0f}" for b in st["stash_bytes"])))
    busy = (st["forward_cycles"] + st["backward_cycles"] + st["recompute_cycles"])
    rows.append(("  compute per IPU / mean", "clearly imbalanced",
                 " ".join(f"{b / busy.mean():.2f}" for b in busy)))
    rx = plan_program("resnext", 101, 4)
    r = compile_program(rx, Options(target="mk1", training=False, precision="16.16"))
    rows.append(("ResNeXt-101 32x4d inference, 1 Mk1 IPU, fp16, batch 4", "fits",
                 f"fits={r.summary['fits']}, {r.meta['model']['parameters'] / 1e6:.1f} M "
                 "params (published 44 M)"))
    n = 4096  # one big fp16 GEMM: the cost model's best case against the published peak
    gemm = pd.DataFrame([{"op_class": "matmul", "flops": 2 * n**3, "bytes_read": 4 * n * n,
                          "bytes_written": 2 * n * n, "out_shape": f"[{n},{n}]",
                          "dtype": "float16"}])
    for name in ("mk1", "mk2", "bow"):
        t = get_target(name)
        c = op_costs(gemm, t, Precision.parse("16.16", True), np.array([0.6]))
        tflops = 2 * n**3 / (c["cycles"].iloc[0] / t.clock_hz) / 1e12
        rows.append((f"{n}^3 fp16 matmul on {name}", f"peak {t.peak_fp16_flops / 1e12:.1f} "
                     "TFLOPS", f"{tflops:.1f} TFLOPS"))
    width = max(len(r[0]) for r in rows)
    print(f"| {'case'.ljust(width)} | published | modelled |")
    print(f"|{'-' * (width + 2)}|---|---|")
    for case, pub, mod in rows:
        print(f"| {case.ljust(width)} | {pub} | {mod} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="micro-batch (default 16)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--recompute", action="store_true", help="enable recomputation")
    parser.add_argument("--synthetic", action="store_true",
                        help="a synthetic ~3000-op program instead of a recorded ResNet-50")
    parser.add_argument("--calibrate", action="store_true",
                        help="print the calibration table of docs/cost-model.md")
    args = parser.parse_args()
    if args.calibrate:
        return calibrate()

    if args.synthetic:
        (program, splits), record_s = synthetic(375)
    else:
        program, record_s = record_resnet50(args.batch, args.image_size)
        splits = SPLITS
    options = Options(target="mk2", splits=splits, gradient_accumulation=16,
                      recomputation=args.recompute, precision="16.32", half_partials=True,
                      available_memory_proportion=0.15)
    best = float("inf")
    report = None
    for _ in range(args.repeat):
        start = time.perf_counter()
        report = compile_program(program, options)
        best = min(best, time.perf_counter() - start)
    assert report is not None
    live = report.arrays["tile_liveness"]
    s = report.summary
    print(f"program: {len(program.ops)} ops, {len(program.tensors)} tensors "
          f"({program.model.get('name')}, micro-batch {program.model.get('batch_size')})")
    print(f"record:  {record_s:.3f} s")
    print(f"compile: {best:.3f} s (best of {args.repeat}); tile_liveness {live.shape} "
          f"{live.nbytes / 2**20:.1f} MiB; trace {len(report.tables['trace'])} events")
    if record_s == record_s:  # not NaN
        print(f"ratio compile/record: {best / record_s:.3f} (target < 0.2)")
    print(f"modelled: {s['throughput']:.0f} samples/s on {s['total_ipus']} IPUs, "
          f"fits={s['fits']}, bottleneck stage {s['bottleneck_stage']}, "
          f"idle {s['idle_fraction']:.1%}, peak per IPU (MiB) "
          + " ".join(f"{v / 2**20:.0f}" for v in s["peak_liveness_bytes"].values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
