"""Benchmark: what live measuring (torch.profiler) costs a real 2-rank gloo pipeline step.

    .venv/bin/python bench/bench_measure.py [--schedule 1F1B] [--steps 5] [--rounds 3]
    .venv/bin/python bench/bench_measure.py --p2p     # plain gloo posting cost, no popviz

Both ranks run blocks of `--steps` training steps of the tutorial CNN, alternately without
and under the torch.profiler that `popviz.measure.record` runs (ops, shapes, memory
events); rank 0 times each block between barriers. Prints the median step time of each
and their ratio (target: <= 1.15; the machine's other load moves both).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from popviz.measure.runner import MeasureConfig, build_rank, end_spawned_rank, free_port


def _rank(rank: int, config: MeasureConfig, port: int, steps: int, rounds: int) -> None:
    import torch.distributed as dist

    from popviz.measure.live import profiler

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=config.ranks)
    pipe = build_rank(config, rank, config.ranks)
    pipe.train_step()  # warm-up: stage set-up
    times: dict[str, list[float]] = {"plain": [], "probe": []}
    for _ in range(rounds):
        for mode in ("plain", "probe"):
            prof = profiler() if mode == "probe" else None
            if prof is not None:
                prof.start()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                pipe.train_step()
                if prof is not None:
                    prof.step()
            dist.barrier()
            times[mode].append((time.perf_counter() - start) / steps)
            if prof is not None:
                prof.stop()
    if rank == 0:
        plain, probed = statistics.median(times["plain"]), statistics.median(times["probe"])
        print(f"{config.schedule}, {config.ranks} ranks, {config.microbatches} micro-batches: "
              f"step {plain * 1e3:.2f} ms plain, {probed * 1e3:.2f} ms under torch.profiler, "
              f"ratio {probed / plain:.3f}")
    dist.destroy_process_group()
    end_spawned_rank()


def _p2p(rank: int, port: int, rounds: int) -> None:
    """Plain torch.distributed, no popviz: both ranks post a send and a recv together
    (as 1F1B's steady state does), rank 1 two ms after rank 0; time each posting call."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    out, into = torch.randn(2, 320), torch.empty(2, 320)  # a tutorial activation, 2560 B
    posts, waits = [], []
    for _ in range(rounds):
        dist.barrier()
        if rank == 1:
            time.sleep(0.002)
        start = time.perf_counter()
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, 1 - rank),
                                        dist.P2POp(dist.irecv, into, 1 - rank)])
        posted = time.perf_counter()
        for work in works:
            work.wait()
        posts.append(posted - start)
        waits.append(time.perf_counter() - posted)
    print(f"plain gloo batch_isend_irecv, rank {rank}: post call median "
          f"{statistics.median(posts) * 1e6:.0f} us, wait median "
          f"{statistics.median(waits) * 1e6:.0f} us over {rounds}", flush=True)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedule", default="1F1B")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--p2p", action="store_true",
                        help="instead: time plain gloo batch_isend_irecv posts (no popviz)")
    args = parser.parse_args()
    import torch.multiprocessing as mp

    if args.p2p:
        mp.spawn(_p2p, args=(free_port(), 15), nprocs=2)
        return 0
    config = MeasureConfig(schedule=args.schedule, microbatches=args.microbatches).validate()
    mp.spawn(_rank, args=(config, free_port(), args.steps, args.rounds), nprocs=config.ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
