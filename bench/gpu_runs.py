"""Real training steps on a CUDA GPU: the measured half of bench/bench_gpu_fidelity.py.

Needs only torch (and transformers for the HF models) and popviz.models, so it runs on a
GPU machine whose torch differs from the CPU one that plans (no compile, no h5py). Each
case is one model, batch, attention path and precision, run as PyTorch runs it by default:
AdamW (foreach), `zero_grad(set_to_none=True)`, fp32 matmuls without TF32, cuDNN with it.

    python bench/gpu_runs.py --out measured.json                 # every case
    python bench/gpu_runs.py --out m.json --cases gpt2-small-sdpa-s512-b8 --trace DIR

Per case it writes (ms, bytes): `step_ms` (mean of timed steps after 3 warm-ups), the
forward / backward / optimiser split of those steps (CUDA events), `first_peak_allocated`
(max_memory_allocated from before the model is built through its first step: what a
one-step run since process start reports, Adam state included), and the steady peaks
(`peak_allocated`, `peak_reserved`, reset after the warm-ups). `--trace DIR` also writes a
torch.profiler trace of one steady step and a caching-allocator snapshot of the first step
of the cases named by `--trace-cases`. Results are written after every case, so a run cut
short keeps what it measured.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Case:
    """One measured configuration; `precision` is fp32, amp-bf16 (autocast around the
    forward, fp32 weights) or half-fp16 (the model's weights in fp16, forward + backward
    only: the per-pass times of a Megatron-style fp16 stage, no optimiser)."""

    name: str
    model: str  # resnet, gpt2, bert, vit, gpt2-custom
    size: str
    batch: int
    sequence: int = 0
    attn: str = "eager"
    precision: str = "fp32"
    layers: int = 0  # gpt2-custom: (layers, hidden, heads, vocab)
    hidden: int = 0
    heads: int = 0
    vocab: int = 50257
    recompute: bool = False  # HF gradient checkpointing: each block's forward run again


CASES: tuple[Case, ...] = (
    Case("gpt2-small-sdpa-s512-b8", "gpt2", "small", 8, 512, "sdpa"),
    Case("gpt2-small-sdpa-s1024-b8", "gpt2", "small", 8, 1024, "sdpa"),
    Case("gpt2-small-sdpa-amp-s1024-b8", "gpt2", "small", 8, 1024, "sdpa", "amp-bf16"),
    Case("gpt2-small-eager-s1024-b4", "gpt2", "small", 4, 1024),
    Case("gpt2-small-eager-s1024-b8", "gpt2", "small", 8, 1024),
    Case("gpt2-small-eager-s1024-b16", "gpt2", "small", 16, 1024),
    Case("gpt2-medium-eager-s1024-b4", "gpt2", "medium", 4, 1024),
    Case("resnet50-b32", "resnet", "50", 32),
    Case("resnet50-b64", "resnet", "50", 64),
    Case("resnet50-b128", "resnet", "50", 128),
    Case("resnet50-amp-b64", "resnet", "50", 64, precision="amp-bf16"),
    Case("bert-base-s128-b32", "bert", "base", 32, 128),
    Case("vit-b16-b64", "vit", "base-16", 64),
    # Zero Bubble's 1.5B GPT shape (h 2304, 24 heads, s 1024, vocab 32,000), 4 layers, fp16
    # weights: per-pass forward / backward times of a Megatron-style stage at b = 6
    Case("zb1.5b-4layers-fp16-eager-b6", "gpt2-custom", "zb1.5b", 6, 1024, "eager",
         "half-fp16", layers=4, hidden=2304, heads=24, vocab=32000),
    Case("zb1.5b-4layers-fp16-sdpa-b6", "gpt2-custom", "zb1.5b", 6, 1024, "sdpa",
         "half-fp16", layers=4, hidden=2304, heads=24, vocab=32000),
    # Zero Bubble's 6.2B shape (h 4096, 32 heads), 4 layers, fp16, b = 3: the same at the
    # other published size
    Case("zb6.2b-4layers-fp16-eager-b3", "gpt2-custom", "zb6.2b", 3, 1024, "eager",
         "half-fp16", layers=4, hidden=4096, heads=32, vocab=32000),
    # full recomputation as HF runs it (torch.utils.checkpoint per block, non-reentrant)
    Case("gpt2-small-sdpa-s1024-b8-recompute", "gpt2", "small", 8, 1024, "sdpa",
         recompute=True),
    Case("gpt2-small-eager-s1024-b8-recompute", "gpt2", "small", 8, 1024, recompute=True),
    # small steps, where the host (eager PyTorch issuing kernels) sets the pace
    Case("resnet50-b8", "resnet", "50", 8),
    Case("gpt2-small-sdpa-s256-b2", "gpt2", "small", 2, 256, "sdpa"),
    # held out from the convolution and batch-norm microbenchmarks (ResNet-50's shapes):
    # basic blocks' 3x3 convolutions, strided 3x3 ones, other batches, a deeper ResNet
    Case("resnet18-b128", "resnet", "18", 128),
    Case("resnet34-b64", "resnet", "34", 64),
    Case("resnet18-amp-b128", "resnet", "18", 128, precision="amp-bf16"),
    Case("resnet101-b32", "resnet", "101", 32),
)
TRACE_CASES = ("gpt2-small-sdpa-s512-b8", "resnet50-b32")  # --trace's default


def build(case: Case) -> tuple[Any, dict[str, Any]]:
    import torch

    if case.model == "resnet":
        from popviz.models import build as build_cnn

        net = build_cnn("resnet", int(case.size))

        class Step(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = net

            def forward(self, x: Any, y: Any) -> Any:
                return self.net(x, y)[1]

        return Step(), {"x": torch.randn(case.batch, 3, 224, 224),
                        "y": torch.randint(0, 1000, (case.batch,))}
    if case.model == "gpt2":
        from popviz.models.gpt2 import build_gpt2

        net, inputs = build_gpt2(case.size, case.batch, sequence_length=case.sequence,
                                 attn=case.attn)
        if case.recompute:
            net.lm.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        return net, inputs
    if case.model == "gpt2-custom":
        from popviz.models.gpt2 import build_gpt2_shape

        return build_gpt2_shape(case.layers, case.hidden, case.heads, case.vocab, case.batch,
                                sequence_length=case.sequence, attn=case.attn)
    from popviz.models.hf import build_transformer

    return build_transformer(case.model, case.size, case.batch,
                             sequence_length=case.sequence or 128)


def run_case(case: Case, steps: int, trace_dir: Path | None,
             trace_cases: tuple[str, ...] = TRACE_CASES, snapshots: bool = True
             ) -> dict[str, Any]:
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base_allocated = torch.cuda.memory_allocated()
    snapshot = snapshots and trace_dir is not None and case.name in trace_cases
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        return _run_case(case, steps, trace_dir, trace_cases, snapshot, base_allocated)
    finally:  # a failed case must not leave the next one recording its allocations
        if snapshot:
            torch.cuda.memory._record_memory_history(enabled=None)


def _run_case(case: Case, steps: int, trace_dir: Path | None, trace_cases: tuple[str, ...],
              snapshot: bool, base_allocated: int) -> dict[str, Any]:
    import torch

    net, inputs = build(case)
    half = case.precision == "half-fp16"
    net = net.cuda().half() if half else net.cuda()
    inputs = {k: v.cuda() for k, v in inputs.items()}
    opt = None if half else torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=True)
    amp = case.precision == "amp-bf16"
    events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]

    def step(timed: bool = False) -> None:
        if timed:
            events[0].record()
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        else:
            net.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = net(**inputs)
        if timed:
            events[1].record()
        loss.backward()
        if timed:
            events[2].record()
        if opt is not None:
            opt.step()
        if timed:
            events[3].record()

    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - t0) * 1e3
    first_peak = torch.cuda.max_memory_allocated() - base_allocated
    if snapshot:
        assert trace_dir is not None
        path = trace_dir / f"memsnap_{case.name}.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        _gzip(path)
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    split = [0.0, 0.0, 0.0]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step(timed=True)
        torch.cuda.synchronize()  # one step's events read before the next records them
        split = [s + events[i].elapsed_time(events[i + 1]) for i, s in enumerate(split)]
    end.record()
    torch.cuda.synchronize()
    result = {**asdict(case),
              "step_ms": start.elapsed_time(end) / steps,
              "forward_ms": split[0] / steps, "backward_ms": split[1] / steps,
              "optimiser_ms": split[2] / steps, "first_step_wall_ms": first_ms,
              "first_peak_allocated": int(first_peak),
              "peak_allocated": int(torch.cuda.max_memory_allocated() - base_allocated),
              "peak_reserved": int(torch.cuda.max_memory_reserved()),
              "parameters": int(sum(p.numel() for p in net.parameters())),
              "steps": steps}
    if trace_dir is not None and case.name in trace_cases:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     record_shapes=True, profile_memory=True) as prof:
            step()
            torch.cuda.synchronize()
        path = trace_dir / f"kineto_{case.name}.json"
        prof.export_chrome_trace(str(path))
        _gzip(path)
    return result  # the model, inputs and optimiser go with this frame


def _gzip(path: Path) -> None:
    with path.open("rb") as src, gzip.open(f"{path}.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()


def environment() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0), "total_memory": int(props.total_memory),
        "sms": int(props.multi_processor_count), "torch": torch.__version__,
        "cuda": torch.version.cuda, "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "date": time.strftime("%Y-%m-%d")}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    p.add_argument("--cases", nargs="+", help=f"cases (default all: "
                   f"{', '.join(c.name for c in CASES)})")
    p.add_argument("--steps", type=int, default=10, help="timed steps per case (default 10)")
    p.add_argument("--trace", type=Path, help="folder for a kineto trace and a memory "
                   "snapshot of the --trace-cases")
    p.add_argument("--trace-cases", nargs="+", default=list(TRACE_CASES),
                   help=f"cases --trace records (default {', '.join(TRACE_CASES)})")
    p.add_argument("--no-snapshot", action="store_true",
                   help="--trace writes the kineto traces only, no allocator snapshots")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    known = {c.name: c for c in CASES}
    bad = sorted((set(args.cases or ()) | set(args.trace_cases)) - set(known))
    if bad:
        p.error(f"unknown case(s) {bad}; valid: {', '.join(known)}")
    cases = [known[n] for n in args.cases] if args.cases else list(CASES)
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"environment": environment(), "cases": [], "errors": {}}
    for case in cases:
        t0 = time.perf_counter()
        try:
            row = run_case(case, args.steps, args.trace, tuple(args.trace_cases),
                           snapshots=not args.no_snapshot)
            doc["cases"].append(row)
            print(f"{case.name:<34} {row['step_ms']:9.2f} ms  first peak "
                  f"{row['first_peak_allocated'] / 2**30:7.2f} GiB  steady "
                  f"{row['peak_allocated'] / 2**30:7.2f} GiB  ({time.perf_counter() - t0:.1f} s)",
                  flush=True)
        except Exception as exc:  # one case's failure is a row, not the run's end
            doc["errors"][case.name] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"{case.name:<34} FAILED {doc['errors'][case.name]}", flush=True)
            torch.cuda.empty_cache()
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
