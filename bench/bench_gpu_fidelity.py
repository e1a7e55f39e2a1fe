"""How close is a GPU plan to the real run? Records each model on the CPU in plan mode (fake
tensors), predicts its step time and peak memory on a GPU target, then, only where CUDA is
available, runs the same step for real and measures it.

    PYTHONPATH=. python bench/bench_gpu_fidelity.py                  # every model, 3 batches
    PYTHONPATH=. python bench/bench_gpu_fidelity.py --models resnet gpt2-small --target h100
    PYTHONPATH=. python bench/bench_gpu_fidelity.py --models mlp --batches 8 16 32  # quick
    PYTHONPATH=. python bench/bench_gpu_fidelity.py --measured bench/data/gpu_measured_h200*.json

`--measured FILE...` plans each case that bench/gpu_runs.py measured on a GPU (the file
names the device; bench/data/gpu_measured_h200.json, _run2.json and _run3.json: three
H200 machines, 2026-11-28 and -29) and prints predicted against measured step time,
forward / backward time (a recomputed forward counts in the backward, as CUDA events around
`backward()` see it) and peak allocated memory per case, with the mean errors. That
table needs no GPU: the measurements are in the file.

Per model and batch: predicted vs measured step time (ms), max_memory_allocated and
max_memory_reserved (GiB) and their errors; a two-stage torch.distributed.pipelining-style
run (GPT-2 small split in two, 1F1B over 4 micro-batches) with both stages on one GPU; and
the largest batch each model fits, predicted vs found (doubling, then bisection until
CUDA runs out of memory). Without CUDA the measured columns say "needs a GPU" and the script
exits 0 after printing the predictions. AdamW (foreach), fp32, as PyTorch runs by default.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # gpu_runs, the measured cases

from popviz.compiler import compile  # noqa: E402
from popviz.options import Options  # noqa: E402
from tooling.gpu_programs import gpu_program  # noqa: E402

GIB = 1 << 30
NEEDS_GPU = "needs a GPU"
LARGEST = 1 << 14  # the largest-batch search stops here ("at least")
# name -> (gpu_program model, size, sequence length, batches)
MODELS: dict[str, tuple[str, Any, int, tuple[int, ...]]] = {
    "resnet50": ("resnet", 50, 0, (32, 64, 128)),
    "gpt2-small": ("gpt2", "small", 1024, (4, 8, 16)),
    "gpt2-medium": ("gpt2", "medium", 1024, (2, 4, 8)),
    "bert-base": ("bert", "base", 128, (16, 32, 64)),
    "vit-b16": ("vit", "base-16", 0, (32, 64, 128)),
    "mlp": ("mlp", 512, 0, (8, 16, 32)),  # tiny: the test's model
}
ALIASES = {"resnet": "resnet50", "gpt2": "gpt2-small", "bert": "bert-base", "vit": "vit-b16"}


@dataclass
class Row:
    name: str
    batch: int
    step_ms: float
    allocated: int
    reserved: int
    fits: bool
    real_ms: float | None = None
    real_allocated: int | None = None
    real_reserved: int | None = None


def program_of(name: str, batch: int) -> Any:
    model, size, seq, _ = MODELS[name]
    return gpu_program(model, size, batch, "adamw", sequence_length=seq or 128)


def predict(name: str, batch: int, target: str, options: dict[str, Any] | None = None) -> Row:
    report = compile(program_of(name, batch), Options(target=target, **(options or {})))
    s = report.summary
    return Row(name, batch, float(s["step_ms"]), max(map(int, s["max_memory_allocated"]
                                                        .values())),
               max(map(int, s["max_memory_reserved"].values())), bool(s["reserved_fits"]))


def largest_predicted(name: str, target: str, start: int) -> int:
    """The largest batch whose plan's reserved memory fits the GPU (doubling, bisection).
    One recording at `start`, re-planned at each batch (`micro_batch_size` rescales the
    per-sample work and tensors): compiles only."""
    program = program_of(name, start)

    def fits(batch: int) -> bool:
        options = Options(target=target, micro_batch_size=batch)
        return bool(compile(program, options).summary["reserved_fits"])

    lo, hi = 0, start
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > LARGEST:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


# ---- the measured half (CUDA only) ----------------------------------------------------
def _real_model(name: str, batch: int) -> tuple[Any, dict[str, Any]]:
    model, size, seq, _ = MODELS[name]
    if model == "mlp":
        from tooling.gpu_programs import _mlp

        return _mlp(int(size), batch)
    from gpu_runs import Case, build  # the measured cases' builder (bench/gpu_runs.py)

    return build(Case(name, model, str(size), batch, seq))


def measure(name: str, batch: int, steps: int = 10) -> tuple[float, int, int]:
    """Mean step ms, max_memory_allocated and max_memory_reserved of real steps."""
    import torch

    torch.cuda.empty_cache()
    net, inputs = _real_model(name, batch)
    net = net.cuda()
    inputs = {k: v.cuda() for k, v in inputs.items()}
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=True)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        net(**inputs).backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    # the model, inputs and optimiser go when this returns; the next call empties the cache
    return (start.elapsed_time(end) / steps, torch.cuda.max_memory_allocated(),
            torch.cuda.max_memory_reserved())


def largest_found(name: str, start: int) -> int:
    import torch

    def ok(batch: int) -> bool:
        try:
            measure(name, batch, steps=1)
            return True
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            return False

    lo, hi = 0, start
    while ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


# ---- the table --------------------------------------------------------------------------
def _err(pred: float, real: float | None) -> str:
    return f"{pred / real - 1:+6.1%}" if real else "-"


def _cell(value: float | None, fmt: str) -> str:
    return NEEDS_GPU if value is None else format(value, fmt)


def render(rows: list[Row]) -> str:
    head = (f"{'model':<14}{'batch':>6}  {'step ms':>9} {'real':>11} {'err':>7}  "
            f"{'alloc GiB':>9} {'real':>11} {'err':>7}  {'resv GiB':>8} {'real':>11} {'err':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.name:<14}{r.batch:>6}  {r.step_ms:>9.2f} {_cell(r.real_ms, '11.2f'):>11} "
            f"{_err(r.step_ms, r.real_ms):>7}  {r.allocated / GIB:>9.2f} "
            f"{_cell(None if r.real_allocated is None else r.real_allocated / GIB, '11.2f'):>11}"
            f" {_err(r.allocated, r.real_allocated):>7}  {r.reserved / GIB:>8.2f} "
            f"{_cell(None if r.real_reserved is None else r.real_reserved / GIB, '11.2f'):>11}"
            f" {_err(r.reserved, r.real_reserved):>7}")
    return "\n".join(lines)


# ---- stored measurements (bench/gpu_runs.py) ----------------------------------------
DEVICE_TARGETS = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100",
                  "NVIDIA A100-SXM4-80GB": "a100"}


def case_plan(case: dict[str, Any], target: str) -> Any:
    """Compile the plan of one measured case (bench/gpu_runs.py's Case, as a dict)."""
    model, batch, seq = case["model"], int(case["batch"]), int(case["sequence"] or 128)
    options: dict[str, Any] = {"target": target}
    if case["precision"] == "amp-bf16":
        options["gpu_precision"] = "amp"
    if case.get("recompute"):  # HF gradient checkpointing: every block, as a GPU plan does
        options["recomputation"] = True
    if model == "gpt2-custom":
        shape = (case["layers"], case["hidden"], case["heads"], case["vocab"])
        program = gpu_program("gpt2", shape, batch, "adamw", sequence_length=seq,
                              attn=case["attn"], dtype="float16")
    elif model == "gpt2":
        program = gpu_program("gpt2", case["size"], batch, "adamw", sequence_length=seq,
                              attn=case["attn"])
    elif model == "resnet":
        program = gpu_program("resnet", int(case["size"]), batch, "adamw")
    else:
        program = gpu_program(model, case["size"], batch, "adamw", sequence_length=seq)
    return compile(program, Options(**options))


def measured_table(path: Path) -> tuple[str, dict[str, float]]:
    """Predicted vs measured per stored case; the mean |error| of each column."""
    import json

    doc = json.loads(path.read_text())
    env = doc["environment"]
    target = DEVICE_TARGETS.get(env["device"], "h100")
    head = (f"{'case':<31}{'step ms':>8}{'real':>8}{'err':>7}  {'fwd err':>7}{'bwd err':>8}  "
            f"{'alloc GiB':>9}{'real':>7}{'err':>7}")
    lines = [f"measured on {env['device']} (torch {env['torch']}, {env['date']}); planned on "
             f"the {target} target", head, "-" * len(head)]
    errors: dict[str, list[float]] = {"step": [], "forward": [], "backward": [], "alloc": []}
    for case in doc["cases"]:
        report = case_plan(case, target)
        s = report.summary
        passes = report.tables["ops"].groupby("pass")["cycles"].sum() / 1e6
        # a measured backward includes its recomputed forwards (CUDA events around it)
        fwd = float(passes.get("F", 0.0))
        bwd = float(passes.get("B", 0.0)) + float(passes.get("R", 0.0))
        e_f, e_b = fwd / case["forward_ms"] - 1, bwd / case["backward_ms"] - 1
        errors["forward"].append(abs(e_f))
        errors["backward"].append(abs(e_b))
        half = case["precision"] == "half-fp16"  # no optimiser ran: passes only
        step = (f"{s['step_ms']:8.1f}{case['step_ms']:8.1f}"
                f"{s['step_ms'] / case['step_ms'] - 1:+7.0%}")
        alloc = max(map(int, s["max_memory_allocated"].values()))
        mem = (f"{alloc / GIB:9.2f}{case['peak_allocated'] / GIB:7.2f}"
               f"{alloc / case['peak_allocated'] - 1:+7.0%}")
        if half:
            step, mem = f"{'-':>8}{case['step_ms']:8.1f}{'-':>7}", f"{'-':>9}{'-':>7}{'-':>7}"
        else:
            errors["step"].append(abs(s["step_ms"] / case["step_ms"] - 1))
            errors["alloc"].append(abs(alloc / case["peak_allocated"] - 1))
        lines.append(f"{case['name']:<31}{step}  {e_f:+7.0%}{e_b:+8.0%}  {mem}")
    means = {k: sum(v) / len(v) for k, v in errors.items() if v}
    lines.append("mean |error|: " + ", ".join(f"{k} {v:.1%}" for k, v in means.items()))
    for name, err in doc.get("errors", {}).items():
        lines.append(f"{name}: not measured ({err})")
    return "\n".join(lines), means


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=[m for m in MODELS if m != "mlp"],
                   help=f"models ({', '.join(MODELS)}; default: all but mlp)")
    p.add_argument("--batches", type=int, nargs="+", help="batch sizes (default: 3 each)")
    p.add_argument("--target", default="h100", help="GPU target (h100, h100-pcie, a100)")
    p.add_argument("--no-largest", action="store_true", help="skip the largest-batch search")
    p.add_argument("--no-pipeline", action="store_true", help="skip the two-stage run")
    p.add_argument("--measured", type=Path, metavar="FILE", nargs="+",
                   help="plan the cases bench/gpu_runs.py measured (JSON files, one table "
                   "each) and print predicted against measured; nothing else runs")
    args = p.parse_args(argv)
    if args.measured:
        for path in args.measured:
            if not path.is_file():
                p.error(f"{path}: no such file")
        t0 = time.perf_counter()
        for path in args.measured:
            print(f"{path}:")
            print(measured_table(path)[0])
        print(f"({time.perf_counter() - t0:.1f} s)")
        return 0
    names = [ALIASES.get(m, m) for m in args.models]
    bad = [m for m in names if m not in MODELS]
    if bad:
        p.error(f"unknown model(s) {bad}; valid: {', '.join(MODELS)}")
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    device = torch.cuda.get_device_name() if cuda else None
    print(f"target {args.target}; measured on: {device or 'no CUDA device: ' + NEEDS_GPU}")
    rows: list[Row] = []
    t0 = time.perf_counter()
    for name in names:
        for batch in args.batches or MODELS[name][3]:
            row = predict(name, batch, args.target)
            if cuda:
                row.real_ms, row.real_allocated, row.real_reserved = measure(name, batch)
            rows.append(row)
    print(render(rows))
    if cuda:
        steps = [abs(r.step_ms / r.real_ms - 1) for r in rows if r.real_ms]
        mem = [abs(r.allocated / r.real_allocated - 1) for r in rows if r.real_allocated]
        print(f"mean |error|: step time {sum(steps) / len(steps):.1%}, max_memory_allocated "
              f"{sum(mem) / len(mem):.1%} over {len(rows)} runs")
    else:
        print(f"measured columns: {NEEDS_GPU} (torch.cuda.is_available() is False); the "
              "predictions above need none")
    if not args.no_pipeline and "gpt2-small" in names:
        pipe = predict("gpt2-small", 8, args.target,
                       {"splits": ["lm.transformer.h.6.ln_1"], "stage_ipus": [0, 0],
                        "gradient_accumulation": 4, "micro_batch_size": 2, "schedule": "1F1B"})
        print(f"two stages on one GPU (GPT-2 small split at h.6, 1F1B, 4 x 2): predicted "
              f"{pipe.step_ms:.2f} ms, {pipe.allocated / GIB:.2f} GiB allocated; measured: "
              + ("run torch.distributed.pipelining's Schedule1F1B with both stages on this "
                 "GPU (not automated here)" if cuda else NEEDS_GPU))
    if not args.no_largest:
        for name in names:
            start = (args.batches or MODELS[name][3])[-1]
            guess = largest_predicted(name, args.target, start)
            found = largest_found(name, start) if cuda else None
            shown = f"at least {guess}" if guess * 2 > LARGEST else str(guess)
            print(f"largest batch {name}: predicted {shown}, found "
                  f"{found if found is not None else NEEDS_GPU}")
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
