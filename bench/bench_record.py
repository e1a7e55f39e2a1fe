"""Recording overhead on ResNet-50 and GPT-2 small training steps, beside torch.profiler.

    .venv/bin/python bench/bench_record.py                  # both models, 5 rounds
    .venv/bin/python bench/bench_record.py --models resnet50 --batch 32 --image 64
    .venv/bin/python bench/bench_record.py --models gpt2 --gpt2-batch 8 --gpt2-seq 512
    python bench/bench_record.py --device cuda --batch 32 --gpt2-batch 8 --gpt2-seq 512

GPT-2 small is built from transformers' GPT2Config (random weights, no download) and
called as its users call it, model(input_ids=..., labels=...), with AdamW.

Each round runs, in turn, a plain step, a step under popviz's Recorder and a step under
torch.profiler(record_shapes=True, profile_memory=True, with_flops=True), so that load from
other processes hits all three alike; the order rotates from round to round. Reported:
median wall time of the step inside the context; the same including entering and leaving
it (popviz builds its Program on exit, torch.profiler post-processes its trace); median
and minimum CPU time of this process for the step (on a shared machine wall time mostly
measures the neighbours; the minimum is the least disturbed round); each round's ratio to
that round's plain step (median and quartiles). "dispatch floor" is a TorchDispatchMode
that only calls each op: what any recorder built on one pays before it records anything.
"popviz+write" is record, compile and write the profile (one .h5 per round); the compile
and write seconds of the recorded program are given apart (best of 5, and medians). Then
plan mode: ResNet-50 at batch 64 on fake tensors, against one real step at the bench
batch size.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from popviz.api import compile_options, plan_step, record
from popviz.compiler import compile as compile_program
from popviz.format.writer import write_report
from popviz.models import build
from popviz.options import Options
from popviz.recorder import Recorder


def _sync(device: str) -> None:
    if device == "cuda":  # a step ends when its kernels do
        torch.cuda.synchronize()


def make(batch: int, image: int, classes: int = 1000, device: str = "cpu"
         ) -> tuple[Any, Callable[[], None], str]:
    torch.manual_seed(0)
    model = build("resnet", 50, num_classes=classes, image_size=image).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, image, image, device=device)
    y = torch.randint(0, classes, (batch,), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        _sync(device)

    return model, step, f"ResNet-50 training step, batch {batch} at {image}x{image} on {device}"


def make_gpt2(batch: int, seq: int, device: str = "cpu") -> tuple[Any, Callable[[], None], str]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(attn_implementation="sdpa")  # GPT-2 small, 124M
    model = transformers.GPT2LMHeadModel(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        _sync(device)

    return model, step, f"GPT-2 small training step, batch {batch} x {seq} tokens on {device}"


def timed(context: Callable[[], Any], run: Callable[[], None]) -> tuple[float, float, float]:
    """Wall seconds inside the context, wall seconds including enter and exit, and CPU
    seconds of this process inside the context (steadier when other jobs share the cores)."""
    # garbage of the step before (GPT-2 4x256: GBs in reference cycles) is freed first,
    # outside the timing: else it piles up over the rounds and lands on whichever step
    # the collector happens to run in
    gc.collect()
    t0 = time.perf_counter()
    with context():
        t1, c1 = time.perf_counter(), time.process_time()
        run()
        t2, c2 = time.perf_counter(), time.process_time()
    t3 = time.perf_counter()
    return t2 - t1, t3 - t0, c2 - c1


def profiler(device: str = "cpu") -> Any:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    return profile(activities=activities, record_shapes=True, profile_memory=True,
                   with_flops=True)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _Passthrough(TorchDispatchMode):
    """A dispatch mode that only calls each op: the floor of any recorder built on one
    (every op, and every tensor of its arguments, crosses into Python and back)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def bench(model: Any, run: Callable[[], None], title: str, rounds: int, out: Path,
          device: str = "cpu") -> float:
    """Print the table for one model; return the plain step's median wall seconds."""
    for _ in range(2):  # warm-up: oneDNN primitives, optimiser state, allocator
        run()
    options = Options()
    contexts: dict[str, Callable[[], Any]] = {
        "plain": _Null,
        "dispatch floor": _Passthrough,
        "popviz": lambda: Recorder(model, progress=False),
        "popviz+write": lambda: record(options, profile_dir=out, model=model, progress=False),
        "torch.profiler": lambda: profiler(device),
    }
    times: dict[str, list[tuple[float, float, float]]] = {k: [] for k in contexts}
    names = list(contexts)
    for r in range(rounds):  # each round starts with another context: no place is favoured
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed(contexts[name], run))
    med = {k: tuple(statistics.median(x[i] for x in v) for i in range(3))
           for k, v in times.items()}
    low = {k: min(x[2] for x in v) for k, v in times.items()}
    with Recorder(model, progress=False, count_bookkeeping=True) as rec:
        run()
    program = rec.program
    n_ops = len(program.ops)
    bookkeeping = rec.bookkeeping_ns / 1e9
    compile_s, write_s, both_s = [], [], []
    opts = compile_options(options, program)
    for _ in range(5):
        t0 = time.perf_counter()
        report = compile_program(program, opts)
        t1 = time.perf_counter()
        write_report(report, out)
        t2 = time.perf_counter()
        compile_s.append(t1 - t0)
        write_s.append(t2 - t1)
        both_s.append(t2 - t0)
    print(f"{title}, {n_ops} ops recorded, {rounds} rounds, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    base_step, base_total, base_cpu = med["plain"]
    print(f"{'':16}{'median wall':>12}{'ratio':>7}{'+enter/exit':>12}{'ratio':>7}"
          f"{'median cpu':>11}{'ratio':>7}{'min cpu':>9}{'ratio':>7}")
    for name, (s, t, c) in med.items():
        print(f"{name:16}{s:12.3f}{s / base_step:7.3f}{t:12.3f}{t / base_total:7.3f}"
              f"{c:11.3f}{c / base_cpu:7.3f}{low[name]:9.3f}{low[name] / low['plain']:7.3f}")
    # paired: each round's step against the plain step of the same round, so a busy
    # moment of the machine hits both sides of a ratio
    for col, label in ((0, "wall"), (2, "cpu")):
        parts = []
        for name in ("dispatch floor", "popviz", "torch.profiler"):
            ratios = sorted(x[col] / p[col] for x, p in zip(times[name], times["plain"],
                                                            strict=True))
            q1, q3 = _quartiles(ratios)
            parts.append(f"{name} {statistics.median(ratios):.3f} [{q1:.3f}-{q3:.3f}]")
        wins = sum(a[col] < b[col] for a, b in zip(times["popviz"], times["torch.profiler"],
                                                   strict=True))
        print(f"per-round ratio to plain ({label}), median [quartiles]: {'; '.join(parts)}; "
              f"popviz below torch.profiler in {wins} of {rounds} rounds")
    overhead_us = (low["popviz"] - low["plain"]) / n_ops * 1e6
    print(f"popviz overhead per op (min cpu): {overhead_us:.1f} us; CPU time in the "
          f"recorder's own bookkeeping (measured inside it): {bookkeeping * 1e3:.0f} ms = "
          f"{bookkeeping / n_ops * 1e6:.1f} us per op = {bookkeeping / low['plain']:.1%} of a "
          f"plain step")
    print(f"compile + write of the recorded step: {min(both_s):.3f} s (best of 5; compile "
          f"{min(compile_s):.3f} s, write {min(write_s):.3f} s; medians "
          f"{statistics.median(both_s):.3f} / {statistics.median(compile_s):.3f} / "
          f"{statistics.median(write_s):.3f} s); load average {os.getloadavg()[0]:.2f}\n")
    return base_step


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=("resnet50", "gpt2"),
                        default=["resnet50", "gpt2"])
    parser.add_argument("--batch", type=int, default=8, help="ResNet-50 batch")
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--gpt2-batch", type=int, default=4)
    parser.add_argument("--gpt2-seq", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--plan-batch", type=int, default=64)
    parser.add_argument("--skip-plan", action="store_true")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (default: torch's choice)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the steps run (cuda: each step synchronised at its end; "
                             "torch.profiler also records CUDA kernels)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU (torch.cuda.is_available() is False)")
    if args.threads:
        torch.set_num_threads(args.threads)

    base_step = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        if "resnet50" in args.models:
            base_step = bench(*make(args.batch, args.image, device=args.device), args.rounds,
                              Path(tmp) / "rn50", args.device)
        if "gpt2" in args.models:
            bench(*make_gpt2(args.gpt2_batch, args.gpt2_seq, args.device), args.rounds,
                  Path(tmp) / "gpt2", args.device)

    if not args.skip_plan and base_step:
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
