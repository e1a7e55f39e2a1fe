"""What the home list of a big folder costs `popviz serve`: N hard links of one tiny profile.

    .venv/bin/python bench/bench_home.py [--profiles 5000] [--tabs 3] [--seconds 30]

Makes a temporary folder of N `pNNNNN/profile.h5` (hard links of one small synthetic
profile), starts `popviz serve` on it and then:

1. polls the home list's refresh callback once a second, sending back what the last
   answer stored as Dash does, until no row of the shown page says "checking" (its
   files vetted and their facts read) or --settle seconds pass: time and bytes of each
   answer (a 204: the shown page is unchanged);
2. for --seconds, one client opens another profile's summary page (the `route` callback)
   every 0.5 s, first alone, then with --tabs open home tabs, each refreshing at the
   interval the page sets (5 s; less often for a big folder): latency of both.

Prints the figures; the bench sets no target (issue 34: 4-13 s and 1.6 MB per refresh
of 5,000 profiles, three tabs slowing other pages from 0.2 to 2 s).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.bench_serve import free_port, get, pct, rss_mb  # noqa: E402
from tests.dash_http import find, payload  # noqa: E402

REFRESH_S = 5.0  # the home page's dcc.Interval


def make_folder(root: Path, count: int) -> str:
    """`count` hard links of one small profile; the relative path of the first."""
    from popviz.format import write_report
    from tooling.testing.synthetic import synthetic_report

    first = write_report(synthetic_report(num_ipus=2, events=200, steps=20, num_ops=20,
                                          seed=1), root / "original.h5")
    for n in range(count):
        folder = root / f"p{n:05d}"
        folder.mkdir()
        os.link(first, folder / "profile.h5")
    first.unlink()
    return "p00000/profile.h5"


class Caller:
    """One browser tab's callback: values it sends, updated from what each answer set."""

    def __init__(self, port: int, dep: dict[str, Any], values: dict[str, Any]) -> None:
        self.port, self.dep, self.values = port, dep, dict(values)

    def call(self) -> tuple[float, int, int, str]:
        """(seconds, HTTP status, bytes, text) of one call."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        began = time.monotonic()
        try:
            conn.request("POST", "/_dash-update-component",
                         body=json.dumps(payload(self.dep, self.values)).encode(),
                         headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = reply.read()
        finally:
            conn.close()
        took = time.monotonic() - began
        if reply.status == 200:
            for id_, props in json.loads(data).get("response", {}).items():
                for prop, value in props.items():
                    self.values[f"{id_}.{prop}"] = value
        return took, reply.status, len(data), data.decode(errors="replace")


def _component(node: Any, id_: str) -> dict[str, Any] | None:
    """The props of the component `id_` in a Dash JSON answer."""
    if isinstance(node, dict):
        props = node.get("props")
        if isinstance(props, dict) and props.get("id") == id_:
            return props
        nodes: list[Any] = list(node.values())
    elif isinstance(node, list):
        nodes = node
    else:
        return None
    for value in nodes:
        if (found := _component(value, id_)) is not None:
            return found
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", type=int, default=5000)
    parser.add_argument("--tabs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--settle", type=float, default=300,
                        help="longest wait for every row to be vetted and read")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_home_"))
    log = root.with_suffix(".log")
    try:
        began = time.monotonic()
        other = make_folder(root, args.profiles)
        print(f"{args.profiles:,} profiles (hard links) made in "
              f"{time.monotonic() - began:.1f} s under {root}")
        port = free_port()
        with open(log, "w") as sink:
            server = subprocess.Popen([sys.executable, "-m", "popviz.cli.main", "serve",
                                       str(root), "--port", str(port)], cwd=REPO,
                                      stdout=sink, stderr=sink)
        try:
            return _bench(args, port, server, other)
        finally:
            server.terminate()
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        log.unlink(missing_ok=True)


def _bench(args: argparse.Namespace, port: int, server: subprocess.Popen[bytes],
           other: str) -> int:
    began = time.monotonic()
    while True:
        try:
            if get(port, "/", 5)[0] == 200:
                break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() - began > 120:
            print("server did not start")
            return 1
        time.sleep(0.2)
    deps = json.loads(get(port, "/_dash-dependencies")[1])
    home = find(deps, "home-list.children")
    route = find(deps, "page.children")
    print(f"server up in {time.monotonic() - began:.1f} s, RSS {rss_mb(server.pid):.0f} MB")
    opener = Caller(port, route, {"url.pathname": "/", "url.search": ""})
    first = opener.call()
    print(f"first home page (route callback): {first[0]:.2f} s, {first[2]:,} bytes")
    layout = json.loads(first[3]).get("response", {}).get("page", {})
    shown = _component(layout, "home-digest")
    interval = _component(layout, "home-refresh")
    refresh_s = float(interval.get("interval", REFRESH_S * 1000)) / 1000 if interval \
        else REFRESH_S
    tab = Caller(port, home, {"home-refresh.n_intervals": 1, "home-page.data": 0,
                              "home-digest.data": (shown or {}).get("data")})
    last_text = first[3]
    settle_until = time.monotonic() + args.settle
    rounds: list[tuple[float, int, int]] = []
    while True:
        took, status, size, text = tab.call()
        tab.values["home-refresh.n_intervals"] += 1
        rounds.append((took, status, size))
        if status == 200:
            last_text = text
        if len(rounds) % 10 == 1:
            print(f"  {time.monotonic() - began:6.0f} s: refresh {took:.2f} s, HTTP {status}, "
                  f"{size:,} bytes{', rows checking' if 'checking' in last_text else ''}",
                  flush=True)
        if "checking" not in last_text or time.monotonic() > settle_until:
            break
        time.sleep(1)
    settled = "checking" not in last_text
    print(f"{'the shown page read' if settled else 'rows still checking'} after "
          f"{time.monotonic() - began:.0f} s; refreshes while settling: "
          f"p50 {pct([r[0] for r in rounds], .5):.2f} s, "
          f"max {max(r[0] for r in rounds):.2f} s, "
          f"p50 {pct([float(r[2]) for r in rounds], .5):,.0f} bytes")
    steady = [tab.call() for _ in range(5)]
    print(f"steady refresh (nothing changed): p50 {pct([s[0] for s in steady], .5):.3f} s, "
          f"HTTP {sorted({s[1] for s in steady})}, "
          f"{pct([float(s[2]) for s in steady], .5):,.0f} bytes")

    page = Caller(port, route, {"url.pathname": "/summary", "url.search": f"?profile={other}"})
    page.call()  # opened once: then the page's own cost is what remains

    def pages(seconds: float) -> list[float]:
        out, until = [], time.monotonic() + seconds
        while time.monotonic() < until:
            out.append(page.call()[0])
            time.sleep(0.5)
        return out

    alone = pages(args.seconds / 2)
    stop = threading.Event()
    tab_times: list[tuple[float, int]] = []

    def tab_loop(n: int) -> None:
        caller = Caller(port, home, dict(tab.values))
        time.sleep(n * refresh_s / max(args.tabs, 1))  # tabs opened at different times
        while not stop.is_set():
            took, _status, size, _ = caller.call()
            caller.values["home-refresh.n_intervals"] += 1
            tab_times.append((took, size))
            stop.wait(refresh_s)

    tabs = [threading.Thread(target=tab_loop, args=(n,), daemon=True)
            for n in range(args.tabs)]
    for t in tabs:
        t.start()
    busy = pages(args.seconds / 2)
    stop.set()
    for t in tabs:
        t.join(timeout=300)
    print(f"summary page of another profile, alone: p50 {pct(alone, .5):.3f} s, "
          f"p95 {pct(alone, .95):.3f} s ({len(alone)} requests)")
    print(f"  with {args.tabs} home tabs refreshing every {refresh_s:g} s: "
          f"p50 {pct(busy, .5):.3f} s, p95 {pct(busy, .95):.3f} s ({len(busy)} requests)")
    if tab_times:
        print(f"  their refreshes: p50 {pct([t[0] for t in tab_times], .5):.3f} s, "
              f"max {max(t[0] for t in tab_times):.3f} s, "
              f"p50 {pct([float(t[1]) for t in tab_times], .5):,.0f} bytes "
              f"({len(tab_times)} refreshes)")
    print(f"server RSS after: {rss_mb(server.pid):.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
