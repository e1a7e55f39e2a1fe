"""popviz import + idle breakdown vs Holistic Trace Analysis on the same Kineto traces.

    python bench/bench_import.py                      # 4 ranks x 300k events (~64 MB each)
    python bench/bench_import.py --ranks 2 --events 20000 --dir /tmp/small

Writes synthetic torch.profiler traces shaped like HTA's own test traces (ProfilerStep
annotations, aten ops nested two deep, cudaLaunchKernel with correlation ids and ac2g flow
events, compute kernels on one stream, NCCL kernels on another, memcpy / memset, [memory]
instant events), then runs, each in its own fresh subprocess:

  popviz: `popviz.import_trace` (parse, tables, write the .h5), open it, and the per-rank
          timeline sweep (popviz.metrics.rank_time) over each rank's GPU span;
  HTA:    `TraceAnalysis(trace_dir=...)` + `get_temporal_breakdown()` (HolisticTraceAnalysis,
          the `bench` extra: pip install -e '.[bench]').

It prints the seconds and the peak memory of each (the process tree's summed RSS, sampled,
since HTA parses ranks in worker processes; and the main process's own peak), their
ratios, and each rank's idle / compute / non-compute shares side by side; exit status 1 if
any share differs by more than 1 percentage point.

On the 2-core development machine, quiet: popviz 3.9-4.5 s of work, 4.2-4.9 CPU-s,
~365 MiB against HTA 0.5.0's 13.8-14.1 s, 25.6-25.7 CPU-s, 1,098 MiB summed over its
processes (~408 MiB in its main one): 3.1-3.6x less work time, 5.3-6.1x less CPU, 0.33x
the tree's memory; the issue's target (20x) is not met. bench/bench_import_floors.py shows
where the time goes and why (docs/import.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BASE_NS = 1_790_857_026_000_000_000
EVENTS_PER_UNIT = 8  # cpu_op x2, cudaLaunchKernel, GPU op, flow s + f, [memory] x2


# ---- synthetic traces ----
def _unit_events(rng: np.random.Generator, n: int, t0: float) -> tuple[list[str], float]:
    """`n` launch units of one rank as JSON texts; times in µs from t0."""
    cpu_gap = rng.exponential(6.0, n) + 1.0
    cpu_dur = rng.exponential(12.0, n) + 4.0
    gpu_dur = rng.lognormal(2.5, 1.0, n)  # µs
    kind = rng.choice(4, n, p=[0.86, 0.06, 0.05, 0.03])  # kernel, nccl, memcpy, memset
    out: list[str] = []
    t = t0
    free = {7: t0, 20: t0}
    step = 0
    per_step = max(1, n // 4)
    step_start = t
    for i in range(n):
        if i % per_step == 0:
            if i:
                out.append(_x("user_annotation", f"ProfilerStep#{step}", 1, step_start,
                              t - step_start, {"External id": 10 * n + step}))
                step += 1
            step_start = t
        t += cpu_gap[i]
        ext, corr = 3 * i + 1, 5 * i + 7
        launch = t + cpu_dur[i] * 0.4
        stream = 20 if kind[i] == 1 else 7
        start = max(free[stream], launch + 5.0)
        free[stream] = start + gpu_dur[i]
        op = ("aten::linear", "c10d::allreduce_", "aten::copy_", "aten::zero_")[kind[i]]
        inner = ("aten::addmm", "record_param_comms", "aten::_to_copy", "aten::fill_")[kind[i]]
        out.append(_x("cpu_op", op, 1, t, cpu_dur[i], {
            "External id": ext, "Record function id": 0, "Sequence number": i,
            "Input Dims": [[64, 1024], [1024, 1024]], "Input type": ["float", "float"],
            "Concrete Inputs": ["", ""]}))
        out.append(_x("cpu_op", inner, 1, t + 1.0, cpu_dur[i] - 2.0, {
            "External id": ext + 1, "Record function id": 0,
            "Input Dims": [[64, 1024]], "Input type": ["float"]}))
        out.append(_x("cuda_runtime", "cudaLaunchKernel", 1, launch, 3.0,
                      {"External id": ext + 1, "cbid": 211, "correlation": corr}))
        gpu_args = {"External id": ext + 1, "device": 0, "context": 1, "stream": stream,
                    "correlation": corr}
        if kind[i] == 0:
            out.append(_x("kernel", f"void gemm_kernel_{i % 37}<float>(Params)", 0, start,
                          gpu_dur[i], {**gpu_args, "registers per thread": 96,
                                       "grid": [128, 1, 1], "block": [256, 1, 1]},
                          tid=stream))
        elif kind[i] == 1:
            out.append(_x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)",
                          0, start, gpu_dur[i] * 3, gpu_args, tid=stream))
            free[stream] = start + gpu_dur[i] * 3
        elif kind[i] == 2:
            out.append(_x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 0, start,
                          gpu_dur[i], {**gpu_args, "bytes": 262144}, tid=stream))
        else:
            out.append(_x("gpu_memset", "Memset (Device)", 0, start, gpu_dur[i] * 0.2,
                          {**gpu_args, "bytes": 4096}, tid=stream))
            free[stream] = start + gpu_dur[i] * 0.2
        out.append(json.dumps({"ph": "s", "id": corr, "pid": 1, "tid": 1, "ts": launch,
                               "cat": "ac2g", "name": "ac2g"}))
        out.append(json.dumps({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": start,
                               "cat": "ac2g", "name": "ac2g", "bp": "e"}))
        for sign in (1, -1):
            out.append(json.dumps({"ph": "i", "cat": "cpu_instant_event", "s": "t",
                                   "name": "[memory]", "pid": 1, "tid": 1,
                                   "ts": t + (2.0 if sign > 0 else cpu_dur[i] - 1.0),
                                   "args": {"Total Reserved": 1 << 30,
                                            "Total Allocated": int(5e8 + sign * 1e6 + i),
                                            "Bytes": 1 << 20, "Device Id": 0,
                                            "Device Type": 1, "Addr": 1000 + i}}))
        t += cpu_dur[i]
    out.append(_x("user_annotation", f"ProfilerStep#{step}", 1, step_start, t - step_start,
                  {"External id": 10 * n + step}))
    return out, t


def _x(cat: str, name: str, pid: int, ts: float, dur: float, args: dict,
       tid: int = 1) -> str:
    # whole µs, as in HTA's test traces: HTA rounds finer times down to µs (start and
    # duration apiece), which alone moves its idle share by a few percent
    return json.dumps({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
                       "ts": int(ts), "dur": max(1, int(dur)), "args": args})


def write_traces(folder: Path, ranks: int, events: int, seed: int = 0) -> list[Path]:
    """One trace per rank of about `events` events; reused when already written."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"rank{r}.json" for r in range(ranks)]
    stamp = folder / "made.stamp"  # not .json: HTA reads every .json in the folder
    want = {"ranks": ranks, "events": events, "seed": seed, "version": 3}
    if stamp.exists() and json.loads(stamp.read_text()) == want \
            and all(p.exists() for p in paths):
        return paths
    for r, path in enumerate(paths):
        rng = np.random.default_rng(seed + r)
        evs, _ = _unit_events(rng, events // EVENTS_PER_UNIT, 4_561_953_772_000.0 + 37.0 * r)
        head = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Synthetic GPU"}],
                "distributedInfo": {"backend": "nccl", "rank": r, "world_size": ranks},
                "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS}
        text = json.dumps(head)[:-1] + ', "traceEvents": [\n' + ",\n".join(evs) \
            + '\n], "traceName": "' + str(path) + '"}'
        path.write_text(text)
    stamp.write_text(json.dumps(want))
    return paths


# ---- the two tools, each run in its own process ----
def run_popviz(folder: Path, out: Path, workers: int = 1) -> dict:
    import popviz
    from popviz.metrics import COMPUTE, rank_time

    t0 = time.perf_counter()
    files = sorted(folder.glob("rank*.json"))
    path = popviz.import_trace(files, out / "profile.h5", workers=workers)
    with popviz.open(path) as p:
        trace = p.trace
    shares = {}
    for rank, events in trace.groupby("ipu"):
        times = rank_time(events).iloc[0]  # the window is this rank's own GPU span
        step = times["step_time"]
        shares[int(rank)] = {
            "idle": float((times["idle"] + times["sync"]) / step),
            "compute": float(sum(times[c] for c in COMPUTE) / step),
            "non_compute": float((times["exchange"] + times["host_io"]) / step)}
    return {"seconds": time.perf_counter() - t0, "shares": shares}


def run_hta(folder: Path) -> dict:
    from hta.trace_analysis import TraceAnalysis

    t0 = time.perf_counter()
    analysis = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
    loaded = time.perf_counter() - t0
    frame = analysis.get_temporal_breakdown(visualize=False)
    shares = {int(row["rank"]): {
        "idle": row["idle_time(us)"] / row["kernel_time(us)"],
        "compute": row["compute_time(us)"] / row["kernel_time(us)"],
        "non_compute": row["non_compute_time(us)"] / row["kernel_time(us)"]}
        for _, row in frame.iterrows()}
    return {"seconds": time.perf_counter() - t0, "load_seconds": loaded, "shares": shares}


def _child(tool: str, folder: Path, result: Path, workers: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = run_popviz(folder, Path(tmp), workers) if tool == "popviz" else run_hta(folder)
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["self_peak_rss"] = me.ru_maxrss * 1024
    out["child_peak_rss"] = kids.ru_maxrss * 1024
    # CPU seconds of the whole tree (imports included): steadier than wall time when
    # other work shares the machine
    out["cpu_seconds"] = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    result.write_text(json.dumps(out))


def sampled_tree_peak(proc: subprocess.Popen, every: float = 0.02) -> int:
    """The peak of a running process tree's summed RSS until it ends, sampled every
    `every` s with psutil (0 without psutil)."""
    peak = 0
    try:
        import psutil
    except ImportError:
        return 0
    try:
        root = psutil.Process(proc.pid)
    except psutil.Error:  # gone already
        return 0
    while proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, sum(p.memory_info().rss
                                 for p in [root, *root.children(recursive=True)]))
        time.sleep(every)
    return peak


def measure(tool: str, folder: Path, workers: int = 1) -> dict:
    """Run one tool in a fresh interpreter; add wall seconds and the peak of the process
    tree's summed RSS (sampled every 20 ms with psutil when it is installed)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = Path(f.name)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", tool, "--dir", str(folder),
                             "--result", str(result),
                             "--workers", str(workers)])
    tree_peak = sampled_tree_peak(proc)
    if proc.wait() != 0:
        raise SystemExit(f"{tool} run failed (exit {proc.returncode})")
    out = json.loads(result.read_text())
    result.unlink()
    out["wall_seconds"] = time.perf_counter() - t0
    out["tree_peak_rss"] = tree_peak or max(out["self_peak_rss"], out["child_peak_rss"])
    return out


def trace_arguments(parser: argparse.ArgumentParser) -> None:
    """The synthetic traces' size and folder (shared with bench_import_floors.py)."""
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--events", type=int, default=300_000, help="events per rank")
    parser.add_argument("--dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "popviz_bench_import")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    trace_arguments(parser)
    parser.add_argument("--workers", type=int, default=1,
                        help="popviz import's worker processes (default 1; 0: one per CPU)")
    parser.add_argument("--child", choices=["popviz", "hta"], help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.dir, args.result, args.workers)
        return 0
    t0 = time.perf_counter()
    files = write_traces(args.dir, args.ranks, args.events)
    size = sum(f.stat().st_size for f in files)
    print(f"traces: {args.ranks} ranks x ~{args.events:,} events, {size / 1e6:.0f} MB of "
          f"JSON in {args.dir} (ready in {time.perf_counter() - t0:.1f} s)")
    pv = measure("popviz", args.dir, args.workers)
    try:
        hta = measure("hta", args.dir)
    except SystemExit as exc:
        print(f"HTA: {exc} (pip install -e '.[bench]')")
        return 1
    mib = 1 << 20
    print(f"{'':8}{'work s':>9}{'wall s':>9}{'CPU s':>9}{'tree peak MiB':>15}"
          f"{'main peak MiB':>15}")
    for name, r in (("popviz", pv), ("HTA", hta)):
        print(f"{name:8}{r['seconds']:9.2f}{r['wall_seconds']:9.2f}{r['cpu_seconds']:9.2f}"
              f"{r['tree_peak_rss'] / mib:15.0f}{r['self_peak_rss'] / mib:15.0f}")
    print(f"HTA load alone: {hta['load_seconds']:.2f} s; load average now "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"speed-up (work): {hta['seconds'] / pv['seconds']:.1f}x   (wall): "
          f"{hta['wall_seconds'] / pv['wall_seconds']:.1f}x   (CPU): "
          f"{hta['cpu_seconds'] / pv['cpu_seconds']:.1f}x")
    print(f"memory: popviz / HTA tree peak {pv['tree_peak_rss'] / hta['tree_peak_rss']:.2f}, "
          f"main-process peak {pv['self_peak_rss'] / hta['self_peak_rss']:.2f}")
    worst = 0.0
    print(f"{'rank':>4}  {'share':12}{'popviz':>9}{'HTA':>9}")
    for rank in sorted(hta["shares"], key=int):
        for key in ("idle", "compute", "non_compute"):
            a, b = pv["shares"][str(rank)][key], hta["shares"][rank][key]
            worst = max(worst, abs(a - b))
            print(f"{rank:>4}  {key:12}{a:9.2%}{b:9.2%}")
    print(f"largest share difference: {worst:.3%} (limit 1 percentage point)")
    return 0 if worst <= 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
