"""A page that spins or allocates against `popviz serve`'s budgets (issue 34).

    .venv/bin/python bench/bench_budget.py [--spinning 16] [--threads 10] [--timeout 5]

Serves two small profiles with the test hook POPVIZ_SERVE_SIMULATE: every page of
`spin/` spins for ever, every page of `grab/` allocates 3 GiB. Fires --spinning spin
requests at once (more than the server's threads), and while they run fetches `/` and
another profile's summary page every 0.5 s; then two grab requests under
`--memory-mb 1024` (a second server). Prints how each spinning request ended and when,
the others' latency, and the server's RSS and peak RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from popviz_app import SIMULATE_ENV  # noqa: E402

from bench.bench_serve import pct  # noqa: E402
from tests.serve_util import start_serve, stop  # noqa: E402
from tests.test_serve_budget import Server, _folder, _post, _status_mb  # noqa: E402


def _others(server: Server, seconds: float) -> tuple[list[float], list[float], int]:
    """Latency of `/` and of calm/'s summary page, every 0.5 s; failures."""
    home, calm, failed = [], [], 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        took, status, _ = _post(f"{server.base}/")
        home.append(took)
        failed += status != 200
        took, status, text = server.page("calm/profile.h5")
        calm.append(took)
        failed += status != 200 or "calm/profile.h5 · " not in text
        time.sleep(0.5)
    return home, calm, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spinning", type=int, default=16)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args()
    os.environ[SIMULATE_ENV] = "spin:spin/,grab:grab/"
    with tempfile.TemporaryDirectory(prefix="bench_budget_") as folder:
        root = Path(folder)
        _folder(root, ["spin", "grab", "calm"])
        proc, port = start_serve(root, "--threads", str(args.threads),
                                 "--request-timeout", f"{args.timeout:g}")
        try:
            server = Server(root, port)
            alone = _others(server, 3)
            began = time.monotonic()
            with ThreadPoolExecutor(args.spinning + 1) as pool:
                spins = [pool.submit(server.page, "spin/profile.h5", "/liveness", 300)
                         for _ in range(args.spinning)]
                during = pool.submit(_others, server, 2 * args.timeout).result()
                ended = [(f.result(), time.monotonic() - began) for f in spins]
            stopped = sum("was stopped" in text for (_, _, text), _ in ended)
            print(f"{args.spinning} spinning pages against {args.threads} threads, "
                  f"--request-timeout {args.timeout:g}: {stopped} answered 'stopped', "
                  f"the last after {max(t for _, t in ended):.1f} s")
            for name, before, now in (("/", alone[0], during[0]),
                                      ("another profile's summary", alone[1], during[1])):
                print(f"  {name}: alone p50 {pct(before, .5):.3f} s; while they spin "
                      f"p50 {pct(now, .5):.3f} s, max {max(now):.3f} s ({len(now)} requests)")
            print(f"  failed requests meanwhile: {during[2]}; server RSS "
                  f"{_status_mb(proc.pid, 'VmRSS'):.0f} MB; answers / afterwards: "
                  f"{_post(f'{server.base}/')[1] == 200}")
        finally:
            stop(proc)
        proc, port = start_serve(root, "--memory-mb", "1024")
        try:
            server = Server(root, port)
            rss = _status_mb(proc.pid, "VmRSS")
            with ThreadPoolExecutor(2) as pool:
                grabs = list(pool.map(lambda _: server.page("grab/profile.h5"), range(2)))
            refused = sum("needed more memory" in text for _, _, text in grabs)
            print(f"2 pages allocating 3 GiB each under --memory-mb 1024: {refused} answered "
                  f"'needed more memory' in {max(t for t, _, _ in grabs):.1f} s; server RSS "
                  f"{rss:.0f} MB before, peak {_status_mb(proc.pid, 'VmHWM'):.0f} MB, "
                  f"{_status_mb(proc.pid, 'VmRSS'):.0f} MB after; another page: HTTP "
                  f"{server.page('calm/profile.h5')[1]}")
        finally:
            stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
