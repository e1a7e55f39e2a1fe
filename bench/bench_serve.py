"""Load-test `popviz serve` from a cold start with the callbacks the pages really send.

    .venv/bin/python bench/bench_serve.py [--dir profiles] [--clients 50] [--seconds 60]

Starts `popviz serve DIR` in a subprocess on a free loopback port, then N client threads
(one keep-alive connection each) for T seconds replay what browsers send: the `route`
callback for every page of every profile, trace zoom, liveness zoom, the tile heat map,
the memory IPU pick (its output key carries an allow_duplicate hash, taken from
GET /_dash-dependencies) and tile click, operations paging / sorting / filtering,
compare, the home refresh, and CSV downloads. Prints requests, errors, p50 / p95 / p99
latency (all and per kind), the server's RSS cold, at half of the run (the cache
full) and after (growth is judged from the half-way mark), and whether it still
answers `/` afterwards. If no request completes for --stall seconds the server is sent
SIGUSR1 (its threads' stacks go to its log, printed here). Exit code 1 when a target
(0 errors, answering afterwards, RSS growth < 25 % from the half-way mark) is missed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import popviz  # noqa: E402
from tests.dash_http import find, payload  # noqa: E402 - after the path is set

PAGES = ["/summary", "/trace", "/tree", "/liveness", "/memory", "/stages", "/exchange",
         "/operations"]
FILTERS = ["", "{op} contains conv", "{op} contains relu", "{op_id} > 100", "{op} contains x"]
TIMEOUT_S = 120
# RSS growth is judged from this point of the run: by then the bounded cache has filled
# (6 open profiles, their derived data), so what grows after it would be a leak.
WARM_FRACTION = 0.5


@dataclass
class ProfileFacts:
    rel: str
    ipus: list[int]
    trace_end: float
    steps: int
    tile_ipus: list[int]
    tiles: int
    op_columns: list[str]


def profile_facts(root: Path) -> list[ProfileFacts]:
    """What the clients need to send sensible values (ranges, IPUs, columns)."""
    out = []
    for path in popviz.discover(root):
        with popviz.open(path) as p:
            trace, tm = p.trace, p.tile_memory
            out.append(ProfileFacts(
                rel=path.relative_to(root).as_posix(),
                ipus=sorted(int(i) for i in trace["ipu"].unique()) or [0],
                trace_end=float(trace["end"].max()) if len(trace) else 1.0,
                steps=int(p.liveness["step"].max()) + 1 if len(p.liveness) else 1,
                tile_ipus=sorted(int(i) for i in tm["ipu"].unique()),
                tiles=int(tm["tile"].max()) + 1 if len(tm) else 0,
                op_columns=[str(c) for c in p.ops.columns]))
    return out


CHECKING = "being checked in a separate process"


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    latency: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)
    last_done: float = field(default_factory=time.monotonic)
    # the server's bounded answer while a file is still being vetted ("retry"): not an
    # error (issue 22: no request waits on vetting without a deadline), counted apart
    checking: dict[str, int] = field(default_factory=dict)
    last_checking: float = 0.0

    def add(self, kind: str, seconds: float, error: str = "") -> None:
        with self.lock:
            self.latency.setdefault(kind, []).append(seconds)
            self.last_done = time.monotonic()
            if CHECKING in error:
                self.checking[kind] = self.checking.get(kind, 0) + 1
                self.last_checking = self.last_done
            elif error:
                self.errors[kind] = self.errors.get(kind, 0) + 1
                if len(self.samples) < 10:
                    self.samples.append(f"{kind}: {error[:300]}")


class Client:
    def __init__(self, port: int, deps: list[dict[str, Any]], profiles: list[ProfileFacts],
                 seed: int, tally: Tally) -> None:
        self.port, self.deps, self.profiles, self.tally = port, deps, profiles, tally
        self.rnd = random.Random(seed)
        self.conn: http.client.HTTPConnection | None = None

    def _request(self, kind: str, method: str, url: str, body: dict | None = None) -> None:
        started = time.monotonic()
        error = ""
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                       timeout=TIMEOUT_S)
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if data else {}
            self.conn.request(method, url, body=data, headers=headers)
            reply = self.conn.getresponse()
            text = reply.read()
            if reply.status not in (200, 204):
                error = f"HTTP {reply.status} {url[:80]}: {text[:200]!r}"
            elif body is not None and reply.status == 200 and b'"sideUpdate"' in text:
                side = json.loads(text).get("sideUpdate", {}).get("callback-error", {})
                if side.get("children"):
                    error = f"callback error: {json.dumps(side)[:200]}"
        except (OSError, http.client.HTTPException) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if self.conn is not None:
                self.conn.close()
            self.conn = None
        self.tally.add(kind, time.monotonic() - started, error)

    def call(self, kind: str, output: str, values: dict[str, Any]) -> None:
        # several callbacks may write one output: the one fired by the first value given
        self._request(kind, "POST", "/_dash-update-component",
                      payload(find(self.deps, output, next(iter(values))), values))

    def step(self) -> None:
        r = self.rnd
        p = r.choice(self.profiles)
        search = f"?profile={p.rel}"
        kind = r.choice(["route", "route", "route", "trace", "liveness", "heat", "memory",
                         "tile", "ops", "compare", "home", "csv"])
        if kind == "route":
            path = r.choice(["/", *PAGES])
            self.call("route " + path, "page.children",
                      {"url.pathname": path, "url.search": "" if path == "/" else search})
        elif kind == "trace":
            lo = r.uniform(0, p.trace_end)
            hi = lo + r.choice([0.001, 0.02, 0.3]) * p.trace_end
            relayout = r.choice([{"xaxis.range[0]": lo, "xaxis.range[1]": hi},
                                 {"xaxis.autorange": True}])
            self.call("trace zoom", "trace-graph.figure",
                      {"trace-graph.relayoutData": relayout, "url.search": search})
        elif kind == "liveness":
            lo = r.uniform(0, p.steps)
            self.call("liveness zoom", "live-graph.figure", {
                "live-graph.relayoutData": {"xaxis.range[0]": lo,
                                            "xaxis.range[1]": lo + r.uniform(2, p.steps)},
                "url.search": search})
        elif kind == "heat":
            if not p.tile_ipus:
                return
            lo = r.uniform(0, p.steps)
            self.call("tile heat map", "tile-live-graph.figure", {
                "live-ipu.value": r.choice(p.tile_ipus),
                "tile-live-graph.relayoutData": r.choice(
                    [None, {"xaxis.range[0]": lo, "xaxis.range[1]": lo + 10}]),
                "url.search": search})
        elif kind == "memory":
            if not p.tile_ipus:
                return
            self.call("memory ipu", "mem-tiles.figure",
                      {"mem-ipu.value": r.choice(p.tile_ipus), "url.search": search})
        elif kind == "tile":
            if p.tile_ipus:
                self._tile(p, search)
        elif kind == "ops":
            column = r.choice(p.op_columns)
            self.call("ops page", "ops-table.data", {
                "ops-table.page_current": r.randrange(3), "ops-table.page_size": 25,
                "ops-table.sort_by": r.choice([[], [{"column_id": column,
                                                     "direction": r.choice(["asc", "desc"])}]]),
                "ops-table.filter_query": r.choice(FILTERS), "url.search": search})
        elif kind == "compare":
            other = r.choice(self.profiles).rel
            self.call("route /compare", "page.children", {
                "url.pathname": "/compare", "url.search": f"?profile={p.rel}&other={other}"})
        elif kind == "home":
            self.call("home refresh", "home-list.children",
                      {"home-refresh.n_intervals": r.randrange(1, 100)})
        else:
            table = r.choice(["ops", "stages", "trace"])
            self._request("csv download", "GET", f"/download/csv/{table}{search}")

    def _tile(self, p: ProfileFacts, search: str) -> None:
        # the tile click's own output (the IPU pick's carries an allow_duplicate hash)
        dep = next(d for d in self.deps if d["output"] == "mem-breakdown.children")
        body = payload(dep, {"mem-tiles.clickData": {"points": [{"x": self.rnd.randrange(
            p.tiles)}]}, "mem-ipu.value": self.rnd.choice(p.tile_ipus), "url.search": search})
        self._request("memory tile", "POST", "/_dash-update-component", body)

    def run(self, until: float) -> None:
        while time.monotonic() < until:
            try:
                self.step()
            except Exception as exc:  # a bench bug is counted, not a dead client
                self.tally.add("bench client", 0.0, f"{type(exc).__name__}: {exc}")
        if self.conn is not None:
            self.conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def get(port: int, url: str, timeout: float = 30) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", url)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def answers(port: int, timeout: float = 30) -> bool:
    """`/` and the home listing's callback both answer."""
    try:
        status, deps = get(port, "/_dash-dependencies", timeout)
        if get(port, "/", timeout)[0] != 200 or status != 200:
            return False
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        body = payload(find(json.loads(deps), "page.children"),
                       {"url.pathname": "/", "url.search": ""})
        conn.request("POST", "/_dash-update-component", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except (OSError, http.client.HTTPException):
        return False


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=str(REPO / "profiles"))
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--threads", type=int, default=10, help="server threads")
    parser.add_argument("--stall", type=float, default=60,
                        help="seconds without a completed request before threads are dumped")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=float, default=0, metavar="S",
                        help="print requests so far and the server's RSS every S seconds")
    args = parser.parse_args()
    root = Path(args.dir).resolve()
    profiles = profile_facts(root)
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="bench_serve_", suffix=".log")[1])
    with open(log, "w") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "popviz.cli.main", "serve", str(root), "--port", str(port),
             "--threads", str(args.threads)], cwd=REPO, stdout=sink, stderr=sink)
    try:
        return _bench(args, server, port, profiles, log)
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()


def _bench(args: argparse.Namespace, server: subprocess.Popen[bytes], port: int,
           profiles: list[ProfileFacts], log: Path) -> int:
    started = time.monotonic()
    while True:
        try:
            if get(port, "/", 5)[0] == 200:
                break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() - started > 120:
            print(f"server did not start; log {log}:\n{log.read_text()[-3000:]}")
            return 1
        time.sleep(0.2)
    deps = json.loads(get(port, "/_dash-dependencies")[1])
    rss_before = rss_mb(server.pid)
    print(f"popviz serve {args.dir} (pid {server.pid}, port {port}, {args.threads} threads) "
          f"up in {time.monotonic() - started:.1f} s; {len(profiles)} profiles; "
          f"{args.clients} clients x {args.seconds:g} s from cold")
    tally = Tally()
    until = time.monotonic() + args.seconds
    clients = [Client(port, deps, profiles, args.seed * 1000 + i, tally)
               for i in range(args.clients)]
    threads = [threading.Thread(target=c.run, args=(until,), daemon=True) for c in clients]
    for t in threads:
        t.start()
    rss_peak, dumped = rss_before, False
    warm_at, rss_warm = time.monotonic() + args.seconds * WARM_FRACTION, None
    next_line = time.monotonic() + args.every
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        rss_now = rss_mb(server.pid)
        rss_peak = max(rss_peak, rss_now)
        if rss_warm is None and time.monotonic() >= warm_at:
            rss_warm = rss_now
        if args.every and time.monotonic() >= next_line:
            next_line += args.every
            with tally.lock:
                done = sum(len(v) for v in tally.latency.values())
            print(f"  {time.monotonic() - until + args.seconds:5.0f} s: {done:,} requests, "
                  f"server RSS {rss_now:.0f} MB", flush=True)
        stalled = time.monotonic() - tally.last_done
        if stalled > args.stall and not dumped:
            print(f"no request completed for {stalled:.0f} s: dumping the server's threads "
                  f"(SIGUSR1) to {log}")
            os.kill(server.pid, signal.SIGUSR1)
            dumped = True
        if time.monotonic() > until + TIMEOUT_S + 30:
            break
    elapsed = time.monotonic() - until + args.seconds
    alive = answers(port)
    rss_after = rss_mb(server.pid)
    all_lat = [x for v in tally.latency.values() for x in v]
    n, errors = len(all_lat), sum(tally.errors.values())
    print(f"requests {n:,} in {elapsed:.0f} s ({n / max(elapsed, 1e-9):.1f}/s), errors {errors}")
    print(f"latency s: p50 {pct(all_lat, .5):.3f}  p95 {pct(all_lat, .95):.3f}  "
          f"p99 {pct(all_lat, .99):.3f}  max {max(all_lat, default=float('nan')):.3f}")
    print(f"{'kind':<22}{'n':>7}{'err':>6}{'p50':>8}{'p95':>8}{'p99':>8}")
    for kind in sorted(tally.latency):
        lat = tally.latency[kind]
        print(f"{kind:<22}{len(lat):>7}{tally.errors.get(kind, 0):>6}{pct(lat, .5):>8.3f}"
              f"{pct(lat, .95):>8.3f}{pct(lat, .99):>8.3f}")
    for sample in tally.samples:
        print("  error:", sample)
    if tally.checking:
        print(f"'being checked, retry' answers (the files' first vetting, bounded waits): "
              f"{sum(tally.checking.values())}, the last "
              f"{tally.last_checking - (until - args.seconds):.0f} s into the run")
    rss_warm = rss_warm or rss_after
    growth = (rss_after - rss_warm) / rss_warm
    print(f"server RSS: {rss_before:.0f} MB cold (before any profile was read), "
          f"{rss_warm:.0f} MB at {WARM_FRACTION:.0%} of the run, {rss_after:.0f} MB after: "
          f"{growth:+.0%} over the rest of the run ({(rss_after - rss_before) / rss_before:+.0%} "
          f"from cold); peak {rss_peak:.0f} MB (sampled each second)")
    print(f"server answers / afterwards: {'yes' if alive else 'NO'}")
    if dumped or not alive:
        print(f"server log with thread dump: {log}")
        if not alive:
            os.kill(server.pid, signal.SIGUSR1)
            time.sleep(1)
            print(log.read_text()[-6000:])
    ok = errors == 0 and alive and growth < 0.25
    print(f"targets (0 errors, answering, RSS growth < 25 %): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
