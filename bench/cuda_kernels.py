"""What the GPU microbenchmarks share (bench/gpu_*.py): each kernel a call launches, timed
from torch.profiler's CUDA activity, and the machine they ran on. Needs only torch."""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any


def kernel_times(fn: Callable[[], Any], reps: int) -> list[tuple[str, float]]:
    """(name, median ns over `reps` calls) of each kernel one call of `fn` launches, in
    launch order, after 3 warm-up calls: GPU time only, no launch gaps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.elapsed_us() * 1e3) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    per_call = len(kernels) // reps if reps else 0
    if not per_call or len(kernels) % reps:  # calls that launched different kernels
        return kernels[:1]
    return [(kernels[j][0], statistics.median(ns for _, ns in kernels[j::per_call]))
            for j in range(per_call)]


def environment(**extra: Any) -> dict[str, Any]:
    """The GPU, its SMs, torch and CUDA, the date and the SM clocks nvidia-smi reads."""
    import torch

    props = torch.cuda.get_device_properties(0)
    env: dict[str, Any] = {"device": torch.cuda.get_device_name(0),
                           "sms": int(props.multi_processor_count), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"),
                           **extra}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20)
        env["clocks"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        env["clocks"] = f"unread: {exc}"
    return env
