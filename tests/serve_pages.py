"""Every page, the callbacks a browser fires when each page opens, and every download of one
profile, as HTTP requests to a running `popviz serve` (tests/test_value_bounds_serve.py and
bench/bench_fuzz_serve.py). `visit` reports, per request, how it ended."""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from tests.dash_http import find, payload

PAGES = ["/summary", "/trace", "/liveness", "/memory", "/stages", "/exchange", "/operations",
         "/tree", "/tune"]
VIEWS = ["histogram", "ipu_totals", "trace", "liveness", "tile_liveness", "tile_memory",
         "tile_map", "ipu_time", "stage_load", "stash", "amp", "exchange_matrix",
         "exchange_time", "tree"]
TABLES = ["stages", "trace", "liveness", "tile_memory", "exchange", "ops", "tensors",
          "variables", "oom", "host_slices", "alloc_blocks", "alloc_segments", "alloc_frames",
          "p2p"]
CHECKING = "being checked in a separate process"


@dataclass
class Outcome:
    """How one request ended: `status` (0: no answer), its first line, its time."""

    what: str
    status: int
    line: str
    seconds: float
    callback_error: str = ""

    @property
    def failed(self) -> bool:
        """An answer that is not a page, a figure, a file or a one-line refusal."""
        return self.status == 0 or self.status >= 500 or bool(self.callback_error)


def requests_for(rel: str, deps: list[dict[str, Any]],
                 devices: tuple[int, ...] = (0,)) -> list[tuple[str, str, Any]]:
    """(what, url, body or None) for each page of `rel`, the callbacks that fire when
    the pages open (trace in both modes, liveness, tile heat map, memory, allocations,
    operations), each figure as HTML and each table as CSV."""
    search = f"?profile={quote(rel)}"
    out: list[tuple[str, str, Any]] = []

    def call(what: str, output: str, values: dict[str, Any]) -> None:
        body = payload(find(deps, output, next(iter(values))), values)
        out.append((what, "/_dash-update-component", body))

    for page in PAGES:
        call(f"page {page}", "page.children", {"url.pathname": page, "url.search": search})
    call("page /compare", "page.children",
         {"url.pathname": "/compare", "url.search": f"{search}&other={quote(rel)}"})
    linked = f"{search}&t0=0&t1=10000000"  # a range, as the views link to each other
    call("trace linked", "trace-graph.figure",
         {"trace-init.children": None, "url.search": linked})
    for mode in ("flame", "flat"):
        call(f"trace {mode}", "trace-graph.figure",
             {"trace-mode.value": mode, "trace-window.data": None, "url.search": search})
    call("trace zoom", "trace-graph.figure",
         {"trace-graph.relayoutData": {"xaxis.range[0]": 0, "xaxis.range[1]": 1e6},
          "url.search": search, "trace-mode.value": "flame"})
    call("liveness linked", "live-graph.figure",
         {"live-init.children": None, "url.search": linked})
    for ipu in devices:
        call(f"tile heat map {ipu}", "tile-live-graph.figure",
             {"live-ipu.value": ipu, "tile-live-graph.relayoutData": None,
              "live-ranges.data": None, "url.search": search})
        call(f"memory {ipu}", "mem-tiles.figure", {"mem-ipu.value": ipu, "url.search": search})
        call(f"allocations {ipu}", "alloc-blocks.figure",
             {"alloc-blocks.relayoutData": None, "alloc-ipu.value": ipu, "url.search": search})
    call("operations linked", "ops-table.data",
         {"ops-init.children": None, "url.search": linked})
    call("operation groups", "ops-groups.children",
         {"ops-group-by.value": "op_class", "ops-table.filter_query": "", "url.search": search})
    out += [(f"html {v}", f"/download/html/{v}{search}", None) for v in VIEWS]
    out += [(f"csv {t}", f"/download/csv/{t}{search}", None) for t in TABLES]
    return out


def ask(conn: http.client.HTTPConnection, url: str, body: Any) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    conn.request("POST" if data else "GET", url, body=data,
                 headers={"Content-Type": "application/json"} if data else {})
    reply = conn.getresponse()
    return reply.status, reply.read()


def first_line(status: int, text: bytes) -> tuple[str, str]:
    """(the answer's first line, a callback's error line when the page shows one)."""
    if status == 200 and text[:1] == b"{":
        reply = json.loads(text)
        side = reply.get("sideUpdate", {}).get("callback-error", {})
        error = json.dumps(side.get("children", ""))[:300] if side.get("children") else ""
        return json.dumps(reply)[:200], error
    return text[:300].decode("utf-8", "replace").splitlines()[0] if text else "", ""


def visit(port: int, rel: str, deps: list[dict[str, Any]], timeout_s: float = 60,
          devices: tuple[int, ...] = (0,), checking_wait_s: float = 120,
          only: list[str] | None = None) -> list[Outcome]:
    """Every request of `requests_for` (or those named in `only`), in order, on one
    connection. A file still being vetted ("being checked") is asked again until its
    verdict is in."""
    outcomes = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        wanted = requests_for(rel, deps, devices)
        if only is not None:
            wanted = sorted((r for r in wanted if r[0] in only), key=lambda r: only.index(r[0]))
        for what, url, body in wanted:
            began = time.monotonic()
            while True:
                try:
                    status, text = ask(conn, url, body)
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
                    status, text = 0, f"{type(exc).__name__}: {exc}".encode()
                if CHECKING.encode() not in text or time.monotonic() - began > checking_wait_s:
                    break
                time.sleep(0.5)
            line, error = first_line(status, text)
            outcomes.append(Outcome(what, status, line, time.monotonic() - began, error))
    finally:
        conn.close()
    return outcomes
