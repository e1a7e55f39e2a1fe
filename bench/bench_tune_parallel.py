"""`popviz tune` one fit after another against its independent layouts fitted side by side
(a process pool and a local Dask cluster of `--workers` each), on an 8-layer GPT planned
on 4 A100s (the search also tries the zero-bubble and two-stages-per-GPU schedules).
Printed side by side in one run: wall seconds of the search (the pool's or cluster's start
apart), compiles, and whether the result is the same.

    PYTHONPATH=. python bench/bench_tune_parallel.py
    PYTHONPATH=. python bench/bench_tune_parallel.py --workers 4 --repeat 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from popviz.advise.tune import tune
from popviz.options import Options
from tooling.gpu_programs import gpu_program


def _search(executor: Any) -> tuple[float, dict[str, Any]]:
    program = gpu_program("gpt2", (8, 512, 8, 8000), batch=4, sequence_length=256)
    options = Options(target="a100", splits=[f"lm.transformer.h.{i}.ln_1" for i in (2, 4, 6)],
                      num_ipus=4, schedule="1F1B", gradient_accumulation=8,
                      gpu_precision="megatron-fp16")
    t = time.perf_counter()
    result = tune(program, options, 4, top=50, executor=executor).to_dict()
    seconds = time.perf_counter() - t
    result.pop("seconds")
    return seconds, result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2, help="searches per way (best kept)")
    args = p.parse_args()
    _search(None)  # the program recorded once, outside the timings
    rows = []
    here = [_search(None) for _ in range(args.repeat)]
    rows.append(("one after another", 0.0, min(s for s, _ in here), here[0][1]))
    t = time.perf_counter()
    with ProcessPoolExecutor(args.workers,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(int, range(args.workers)))  # every worker started
        start = time.perf_counter() - t
        runs = [_search(pool) for _ in range(args.repeat)]
    rows.append((f"process pool, {args.workers}", start, min(s for s, _ in runs), runs[0][1]))
    try:
        from popviz.ingest.import_dask import dask_client

        t = time.perf_counter()
        with dask_client("local", args.workers) as client:
            start = time.perf_counter() - t
            runs = [_search(client) for _ in range(args.repeat)]
        rows.append((f"local Dask, {args.workers}", start, min(s for s, _ in runs), runs[0][1]))
    except Exception as exc:  # the bench reports what it could not run
        print(f"local Dask: not run ({exc})")
    base = rows[0][2]
    print(f"{'way':<22}{'start s':>9}{'search s':>10}{'speed-up':>10}{'compiles':>10}  same")
    for name, start, seconds, result in rows:
        print(f"{name:<22}{start:>9.1f}{seconds:>10.1f}{base / seconds:>9.2f}x"
              f"{result['compiles']:>10}  {result == rows[0][3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
