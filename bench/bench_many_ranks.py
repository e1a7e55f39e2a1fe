"""Every page of a job of many ranks (synthetic torch.profiler traces shaped like the real
fixtures, bench_import.write_traces, imported with `popviz.import_trace`), built as the
app builds it, cold and warm: the pages must stay usable as the job grows.

    PYTHONPATH=. python bench/bench_many_ranks.py                  # 32 and 128 ranks
    PYTHONPATH=. python bench/bench_many_ranks.py --ranks 256 --events 1000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_import import write_traces

import popviz


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[32, 128])
    p.add_argument("--events", type=int, default=2000, help="events per rank")
    args = p.parse_args()
    from popviz_app import create_app, render
    from popviz_app.pages import PAGES

    pages = [page.PATH for page in PAGES if page.NEEDS_PROFILE]
    rows: dict[str, list[str]] = {page: [] for page in pages}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            folder = Path(tmp) / f"ranks{n}"
            paths = write_traces(folder / "traces", n, args.events)
            t = time.perf_counter()
            popviz.import_trace(paths, folder / "job" / "profile.h5")
            print(f"{n} ranks: imported in {time.perf_counter() - t:.1f} s")
            ctx = create_app(folder, vetter=False).popviz_context
            for page in pages:
                times = []
                for _ in range(2):  # cold (the file read and indexed), then warm
                    t = time.perf_counter()
                    render(ctx, page, "?profile=job/profile.h5")
                    times.append(time.perf_counter() - t)
                rows[page].append(f"{times[0]:6.2f} {times[1]:6.2f}")
    head = "".join(f"{f'{n} ranks cold/warm s':>22}" for n in args.ranks)
    print(f"{'page':<13}{head}")
    for page, cells in rows.items():
        print(f"{page:<13}" + "".join(f"{c:>22}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
