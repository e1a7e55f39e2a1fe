"""Recording overhead on a ResNet-50 training step, side by side with torch.profiler.

    .venv/bin/python bench/bench_record.py                  # batch 8 at 224x224, 5 rounds
    .venv/bin/python bench/bench_record.py --batch 32 --image 64 --rounds 7

Each round runs, in turn, a plain step, a step under popviz's Recorder and a step under
torch.profiler(record_shapes=True, profile_memory=True, with_flops=True), so that load from
other processes hits all three alike. Reported: median wall time of the step inside the
context; the same including entering and leaving it (popviz builds its Program on exit,
torch.profiler post-processes its trace); median and minimum CPU time of this process for
the step (on a shared machine wall time mostly measures the neighbours; the minimum is the
least disturbed round). Then plan mode: ResNet-50 at batch 64 on fake
tensors, against one real step at the bench batch size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from popviz.api import plan_step
from popviz.models import build
from popviz.recorder import Recorder


def make(batch: int, image: int, classes: int = 1000) -> tuple[Any, Any, Any, Any]:
    torch.manual_seed(0)
    model = build("resnet", 50, num_classes=classes, image_size=image)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, image, image)
    y = torch.randint(0, classes, (batch,))
    return model, opt, x, y


def step(model: Any, opt: Any, x: Any, y: Any) -> None:
    opt.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward()
    opt.step()


def timed(context: Callable[[], Any], run: Callable[[], None]) -> tuple[float, float, float]:
    """Wall seconds inside the context, wall seconds including enter and exit, and CPU
    seconds of this process inside the context (steadier when other jobs share the cores)."""
    t0 = time.perf_counter()
    with context():
        t1, c1 = time.perf_counter(), time.process_time()
        run()
        t2, c2 = time.perf_counter(), time.process_time()
    t3 = time.perf_counter()
    return t2 - t1, t3 - t0, c2 - c1


def profiler() -> Any:
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                   with_flops=True)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--plan-batch", type=int, default=64)
    parser.add_argument("--skip-plan", action="store_true")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, opt, x, y = make(args.batch, args.image)
    run = lambda: step(model, opt, x, y)  # noqa: E731
    for _ in range(2):  # warm-up: oneDNN primitives, optimiser state, allocator
        run()
    contexts: dict[str, Callable[[], Any]] = {
        "plain": _Null,
        "popviz": lambda: Recorder(model, progress=False),
        "torch.profiler": profiler,
    }
    times: dict[str, list[tuple[float, float, float]]] = {k: [] for k in contexts}
    for _ in range(args.rounds):
        for name, ctx in contexts.items():
            times[name].append(timed(ctx, run))
    med = {k: tuple(statistics.median(x[i] for x in v) for i in range(3))
           for k, v in times.items()}
    low = {k: min(x[2] for x in v) for k, v in times.items()}
    with Recorder(model, progress=False, count_bookkeeping=True) as rec:
        run()
    n_ops = len(rec.program.ops)
    bookkeeping = rec.bookkeeping_ns / 1e9
    print(f"ResNet-50 training step, batch {args.batch} at {args.image}x{args.image}, "
          f"{n_ops} ops recorded, {args.rounds} rounds, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    base_step, base_total, base_cpu = med["plain"]
    print(f"{'':16}{'median wall':>12}{'ratio':>7}{'+enter/exit':>12}{'ratio':>7}"
          f"{'median cpu':>11}{'ratio':>7}{'min cpu':>9}{'ratio':>7}")
    for name, (s, t, c) in med.items():
        print(f"{name:16}{s:12.3f}{s / base_step:7.3f}{t:12.3f}{t / base_total:7.3f}"
              f"{c:11.3f}{c / base_cpu:7.3f}{low[name]:9.3f}{low[name] / low['plain']:7.3f}")
    overhead_us = (low["popviz"] - low["plain"]) / n_ops * 1e6
    print(f"popviz overhead per op (min cpu): {overhead_us:.1f} us; CPU time in the "
          f"recorder's own bookkeeping (measured inside it): {bookkeeping * 1e3:.0f} ms = "
          f"{bookkeeping / n_ops * 1e6:.1f} us per op = {bookkeeping / low['plain']:.1%} of a "
          f"plain step")

    if not args.skip_plan:
        t0 = time.perf_counter()
        recording = plan_step(lambda: build("resnet", 50, num_classes=1000,
                                            image_size=224),
                              lambda: (torch.randn(args.plan_batch, 3, 224, 224),
                                       torch.randint(0, 1000, (args.plan_batch,))),
                              profile_dir=None, progress=False,
                              optimiser=lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9))
        plan_s = time.perf_counter() - t0
        program = recording.program
        gflop = program.ops.flops.sum() / 1e9
        print(f"plan mode ResNet-50 batch {args.plan_batch} at 224x224: {plan_s:.2f} s "
              f"({len(program.ops)} ops, {gflop:.0f} GFLOP, nothing computed) = "
              f"{plan_s / base_step:.2f} x one real step at batch {args.batch}"
              f"x{args.image}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
