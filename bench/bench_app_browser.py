"""Time each page of the app drawn in Chromium through `popviz serve` on a 1M-event profile.

    .venv/bin/python bench/bench_app_browser.py [--events 1000000] [--steps 20000]
    .venv/bin/python bench/bench_app_browser.py --bundled [DIR]   # issue 31's targets

`bench/bench_app.py` times the server's side (layouts and callbacks called directly); this
one times what a user waits for: from navigation until every figure on the page has been
drawn by Plotly and no callback is still running, in Debian's Chromium (headless, software
rendering) driven by Playwright against the real server (waitress, vetting). A large
synthetic profile (1,000,000 trace events, 1472 tiles x 20,000 liveness steps on IPU0) and
a small one (2,000 events) are written side by side; each page is opened once to warm the
server's caches (reported as the first visit) and then 3 times (median). Also timed: the
trace zoomed out to the whole run by a double-click, the interaction that sends the most.
The target (issue 21) is every page's figures drawn in under 2 s on the large profile.

The browser has a user profile of its own (a temporary directory), as a user's browser has:
V8's code cache lives there, so a returning user's new tab does not compile Plotly's bundle
again. `--incognito` measures a context without one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from popviz.format import write_report
from tests.serve_util import start_serve, stop
from tooling.testing.synthetic import synthetic_report

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--enable-unsafe-swiftshader",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
PAGES = ["/summary", "/trace", "/liveness", "/memory", "/stages", "/exchange", "/operations",
         "/tree"]
TARGET_S = 2.0
BUNDLED_PAGES = [*PAGES, "/tune"]
NEW_TAB = ["/summary (new tab)", "/compare (new tab)"]

# drawn: a heading or message, every dcc.Graph has a computed Plotly plot, no callback
# running, and no "being checked" page waiting for the vetting worker
_SETTLED = """() => {
    const graphs = document.querySelectorAll('.dash-graph');
    const plots = [...document.querySelectorAll('.js-plotly-plot')];
    return !!document.querySelector('#page h2, #page .message')
        && !document.querySelector('#page').innerText.includes('being checked')
        && graphs.length === plots.length && plots.every(p => p.calcdata)
        && !document.querySelector('[data-dash-is-loading="true"]');
}"""


def open_drawn(context: Any, url: str, timeout_s: float = 120) -> tuple[Any, float]:
    """A new tab at `url`, and the seconds until the page is drawn."""
    page = context.new_page()
    t = time.perf_counter()
    page.goto(url)
    page.wait_for_function(_SETTLED, timeout=timeout_s * 1e3, polling=20)
    return page, time.perf_counter() - t


def navigate_drawn(page: Any, url: str, timeout_s: float = 120) -> float:
    """Go to `url` inside the running app as a link does (history.pushState and Dash's own
    event: no reload, the script bundles stay loaded) and the seconds until drawn: the
    moment the page's nav marks `url` and the page has stayed settled for 150 ms (React
    patches the old page's nodes in place, so a marker on them would not tell)."""
    page.evaluate("""u => { window.__navStart = performance.now(); window.__settledAt = null;
                            window.history.pushState({}, '', u);
                            window.dispatchEvent(new CustomEvent('_dashprivate_pushstate')); }""",
                  url)
    page.wait_for_function(
        """([u, settled]) => {
            const active = document.querySelector('nav a.nav-link.active');
            const now = performance.now();
            if (!active || active.getAttribute('href') !== u || !eval(settled)()) {
                window.__settledAt = null; return false; }
            if (window.__settledAt === null) window.__settledAt = now;
            return now - window.__settledAt >= 150;
        }""", arg=[url, _SETTLED], timeout=timeout_s * 1e3, polling=10)
    return page.evaluate("() => (window.__settledAt - window.__navStart) / 1e3")


def zoom_out_drawn(page: Any, timeout_s: float = 120) -> float:
    """Double-click the trace (autorange: the whole run) and the seconds until it is redrawn
    with the whole run's statistics."""
    box = page.locator("#trace-graph .nsewdrag").first.bounding_box()
    t = time.perf_counter()
    page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function(
        "() => (document.querySelector('#trace-status') || {}).innerText"
        ".includes('zoom in for single events')", timeout=timeout_s * 1e3, polling=20)
    page.wait_for_function(_SETTLED, timeout=timeout_s * 1e3, polling=20)
    return time.perf_counter() - t


def time_pages(context: Any, base: str, rel: str, repeat: int) -> dict[str, list[float]]:
    """Per page [first visit in a new tab, median warm visit in a new tab (bundles loaded
    again), median warm visit through the app's own navigation] in seconds."""
    out: dict[str, list[float]] = {}
    for path in PAGES:
        url = f"{base}{path}?profile={rel}"
        page, first = open_drawn(context, url)
        page.close()
        tabs = []
        for _ in range(repeat):
            page, seconds = open_drawn(context, url)
            tabs.append(seconds)
            if path == "/trace" and len(tabs) == 1:
                zoom = zoom_out_drawn(page)
                out["/trace zoom out (dblclick)"] = [zoom, zoom, zoom]
            page.close()
        out[path] = [first, statistics.median(tabs), 0.0]
    page, _ = open_drawn(context, f"{base}/stages?profile={rel}")
    for path in PAGES:
        runs = []
        away = "/stages" if path == "/summary" else "/summary"  # come from another page
        for _ in range(repeat):
            navigate_drawn(page, f"{away}?profile={rel}")
            runs.append(navigate_drawn(page, f"{path}?profile={rel}"))
        out[path][2] = statistics.median(runs)
    page.close()
    return out


INTERACTION_TARGET_S = 0.5  # issue 31: each interaction, 95th percentile
LOAD_TARGET_S = 1.5  # issue 31: each page drawn, 95th percentile


def _after(page: Any, action: Any, changed_js: str, timeout_s: float = 60,
           every: bool = False) -> float:
    """Seconds from `action()` until the value `changed_js` reads differs (`every`: each
    item of the list it reads) and the page has settled (no callback running, every figure
    drawn)."""
    before = json.dumps(page.evaluate(changed_js))
    t = time.perf_counter()
    action()
    differs = ("(now, b) => now.every((x, i) => JSON.stringify(x) != JSON.stringify(b[i]))"
               if every else "(now, b) => JSON.stringify(now) != JSON.stringify(b)")
    page.wait_for_function(f"b => ({differs})(({changed_js})(), JSON.parse(b))", arg=before,
                           timeout=timeout_s * 1e3, polling=10)
    page.wait_for_function(_SETTLED, timeout=timeout_s * 1e3, polling=10)
    return time.perf_counter() - t


_OPS_CELLS = ("() => [...document.querySelectorAll('#ops-table td.dash-cell')]"
              ".slice(0, 40).map(e => e.innerText)")
# a sort as the page shows it: the CSV link carries the sort (the first rows may not move:
# an import's ops sorted by ns ascending start with the same zero-ns ops as by op id)
_OPS_SORTED = ("() => [(document.querySelector('#ops-csv') || {href: ''}).href, "
               "...(" + _OPS_CELLS + ")()]")


def time_interactions(page: Any, base: str, rel: str, repeat: int) -> dict[str, list[float]]:
    """/operations as a user works it: sort by a column (both ways), filter, page on,
    group; each `repeat` times. Seconds per run."""
    out: dict[str, list[float]] = {k: [] for k in ("sort", "filter", "next page", "group")}
    navigate_drawn(page, f"/operations?{urlencode({'profile': rel})}")
    if not page.query_selector("#ops-table"):
        return {}
    sort = '#ops-table th[data-dash-column="cycles"] .column-header--sort'
    cell = page.locator('th.dash-filter[data-dash-column="op"] input').first
    for k in range(repeat):
        out["sort"].append(_after(page, lambda: page.click(sort), _OPS_SORTED))
        word = ("conv", "add", "mm")[k % 3]
        out["filter"].append(_after(page, lambda w=word: (cell.fill(w), cell.press("Enter")),
                                    "() => document.querySelector('#ops-note').innerText"))
        if page.query_selector("#ops-table .next-page:not([disabled])"):
            out["next page"].append(_after(page, lambda: page.click("#ops-table .next-page"),
                                           _OPS_CELLS))
        out["filter"].append(_after(page, lambda: (cell.fill(""), cell.press("Enter")),
                                    "() => document.querySelector('#ops-note').innerText"))
        group = ("class", "pass", "(no grouping)")[k % 3]

        def pick(label: str = group) -> None:
            page.click("#ops-group-by")
            page.locator("[role=option]", has_text=label).first.click()  # a portal

        out["group"].append(_after(page, pick, "() => (document.querySelector("
                                               "'#ops-groups-table') || {innerText: ''})"
                                               ".innerText.slice(0, 200)"))
    return {k: v for k, v in out.items() if v}


_TREE = ("() => { const d = document.querySelector('#tree-graph .js-plotly-plot').data[0]; "
         "return [d.level || 'model', d.ids.length]; }")
_TRACE_STATUS = "() => (document.querySelector('#trace-status') || {}).innerText"


def _click_tree_box(page: Any, node: str) -> None:
    box = page.evaluate("""id => { const el = [...document.querySelectorAll(
        '#tree-graph g.slice')].find(e => e.__data__ && e.__data__.data &&
        e.__data__.data.data && e.__data__.data.data.id === id);
        const r = el.getBoundingClientRect();
        return {x: r.x + 5, y: r.y + r.height / 2}; }""", node)
    page.mouse.click(box["x"], box["y"])


def time_views(page: Any, rel: str, repeat: int) -> dict[str, list[float]]:
    """The program tree zoomed into its widest top-level box and back up by that box, and
    the trace zoomed into a tenth of the run and back to the whole run (double-click);
    each `repeat` times. Seconds per run."""
    out: dict[str, list[float]] = {k: [] for k in ("tree zoom in", "tree zoom out",
                                                    "trace zoom in", "trace whole run")}
    q = urlencode({"profile": rel})
    navigate_drawn(page, f"/tree?{q}")
    # the widest box under the model (Plotly's own hierarchy: the data's numbers arrive
    # base64-encoded)
    top = page.evaluate("""() => { let best = null, size = -1;
        document.querySelectorAll('#tree-graph g.slice').forEach(e => {
            const d = e.__data__; if (!d || !d.parent || !d.data) return;
            const id = d.data.data.id;
            if (d.parent.data.data.id === 'model' && !id.includes('/') && d.value > size) {
                best = id; size = d.value; } });
        return best; }""")
    for _ in range(repeat if top else 0):
        # until the level below the clicked box is drawn: the node shown and the number
        # of boxes (the window the server sends) both change
        out["tree zoom in"].append(_after(page, lambda: _click_tree_box(page, top), _TREE,
                                          every=True))
        page.wait_for_timeout(800)
        out["tree zoom out"].append(_after(page, lambda: _click_tree_box(page, top), _TREE,
                                           every=True))
        page.wait_for_timeout(800)
    navigate_drawn(page, f"/trace?{q}")
    span = page.evaluate("() => document.querySelector('#trace-graph .js-plotly-plot')"
                         "._fullLayout.xaxis.range")
    lo, hi = float(span[0]), float(span[1])
    for k in range(repeat):
        a = lo + (hi - lo) * (0.3 + 0.05 * k)

        def zoom(a: float = a) -> None:
            page.evaluate("""([a, b]) => Plotly.relayout(document.querySelector(
                '#trace-graph .js-plotly-plot'), {'xaxis.range[0]': a, 'xaxis.range[1]': b})""",
                          [a, a + (hi - lo) / 10])

        out["trace zoom in"].append(_after(page, zoom, _TRACE_STATUS))
        box = page.locator("#trace-graph .nsewdrag").first.bounding_box()
        out["trace whole run"].append(_after(page, lambda b=box: page.mouse.dblclick(
            b["x"] + b["width"] / 2, b["y"] + b["height"] / 2), _TRACE_STATUS))
    return {k: v for k, v in out.items() if v}


@contextlib.contextmanager
def served_browser(folder: Path, log: Any, incognito: bool = False
                   ) -> Iterator[tuple[str, Any]]:
    """`popviz serve folder` and a Chromium context: (the server's URL, the context).

    The context has a user profile of its own (a new temporary directory), as a user's
    browser has: Chromium keeps V8's compiled code of a script it has loaded before only
    in a profile's disk cache, so from the third tab on Plotly's 4.8 MB bundle is not
    compiled again (0.3 s to window.Plotly, against 1.2-2 s each time in a context
    without one). `incognito`: a context without a profile, compiling every tab afresh."""
    from playwright.sync_api import sync_playwright

    proc, port = start_serve(folder, log=log)
    viewport = {"width": 1400, "height": 900}
    try:
        with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
            if incognito:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                yield f"http://127.0.0.1:{port}", browser.new_context(viewport=viewport)
                browser.close()
            else:
                context = pw.chromium.launch_persistent_context(
                    profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS, viewport=viewport)
                yield f"http://127.0.0.1:{port}", context
                context.close()
    finally:
        stop(proc)


def _bundled_runs(folder: Path, rels: list[str], log: Any, repeat: int,
                  loads: dict[tuple[str, str], float],
                  acts: dict[tuple[str, str], list[float]], incognito: bool = False
                  ) -> float:
    """Fills `loads` and `acts`; the seconds of the very first page (a browser that has
    never loaded the app)."""
    first_ever = 0.0
    with served_browser(folder, log, incognito) as (base, context):
        for i, rel in enumerate(rels):
            q = urlencode({"profile": rel})  # as the app's own links write it
            page, seconds = open_drawn(context, f"{base}/summary?{q}")
            first_ever = first_ever or seconds
            for path in BUNDLED_PAGES:
                away = "/stages" if path == "/summary" else "/summary"
                runs = []
                for _ in range(repeat):
                    navigate_drawn(page, f"{away}?{q}")
                    runs.append(navigate_drawn(page, f"{path}?{q}"))
                loads[rel, path] = statistics.median(runs)
            for name, runs in (time_interactions(page, base, rel, repeat)
                               | time_views(page, rel, repeat)).items():
                acts[rel, name] = runs
            page.close()
            # a new tab (the browser has the app's scripts cached, as after a first visit)
            other = urlencode({"profile": rel, "other": rels[(i + 1) % len(rels)]})
            for column, url in zip(NEW_TAB, (f"{base}/summary?{q}",
                                             f"{base}/compare?{other}"), strict=True):
                runs = []
                for _ in range(repeat):
                    page, seconds = open_drawn(context, url)
                    runs.append(seconds)
                    page.close()
                loads[rel, column] = statistics.median(runs)
    return first_ever


def bundled(folder: Path, repeat: int, incognito: bool = False) -> int:
    """Every page of every profile in `folder` (the bundled profiles/) drawn through the
    app's navigation, and /operations' interactions, against issue 31's targets."""
    rels = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.h5"))
    if not rels:
        print(f"no profiles (*.h5) in {folder}", file=sys.stderr)
        return 1
    loads: dict[tuple[str, str], float] = {}
    acts: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, (Path(tmp) / "serve.log").open("w") as log:
        first_ever = _bundled_runs(folder, rels, log, repeat, loads, acts, incognito)
    load_avg = os.getloadavg()[0]
    print(f"\nbundled profiles ({folder}): seconds until drawn through the app's navigation "
          f"(median of {repeat}); load average {load_avg:.2f}")
    columns = [*BUNDLED_PAGES, *NEW_TAB]
    heads = [p.strip("/")[:9] for p in BUNDLED_PAGES] + ["summary*", "compare*"]
    print(f"{'profile':38} " + " ".join(f"{h:>9}" for h in heads))
    for rel in rels:
        print(f"{rel[:38]:38} " + " ".join(f"{loads[rel, p]:9.2f}" for p in columns))
    print("* in a new tab (compare: against the next profile in the list) of "
          + ("an incognito context (no profile: Plotly compiled in every tab)" if incognito
             else "a browser with a user profile (V8 keeps Plotly's compiled code)"))
    print(f"the first page of all, in a browser that had never loaded the app: "
          f"{first_ever:.2f} s (not in the percentiles below)")
    print("\ninteractions (/operations, /tree, /trace), seconds (each run)")
    for (rel, name), runs in acts.items():
        print(f"{rel[:38]:38} {name:10} " + " ".join(f"{r:5.2f}" for r in runs))
    every_load = np.array(list(loads.values()))
    every_act = np.array([r for runs in acts.values() for r in runs])
    p_load = float(np.percentile(every_load, 95))
    p_act = float(np.percentile(every_act, 95)) if len(every_act) else 0.0
    print(f"\n95th percentile: page drawn {p_load:.2f} s (target {LOAD_TARGET_S:g} s), "
          f"interaction {p_act:.2f} s (target {INTERACTION_TARGET_S:g} s); load average "
          f"{load_avg:.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bundled", nargs="?", const=str(ROOT / "profiles"), default=None,
                        metavar="DIR", help="time every page of every profile in DIR (the "
                        "bundled profiles/ by default) and /operations' interactions "
                        "instead of the synthetic large / small pair")
    parser.add_argument("--incognito", action="store_true",
                        help="new tabs in a context without a user profile, where Chromium "
                        "compiles Plotly's bundle afresh in every tab (by default the "
                        "browser has a profile of its own, as a user's has)")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is not installed (apt-get install -y chromium)", file=sys.stderr)
        return 1
    if args.bundled:
        return bundled(Path(args.bundled), args.repeat, args.incognito)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        write_report(synthetic_report(events=args.events, steps=args.steps, microbatches=16,
                                      tile_liveness_ipus=1, num_ops=20_000, model="large"),
                     root / "large.h5")
        write_report(synthetic_report(events=2_000, steps=200, tile_liveness_ipus=1,
                                      model="small"), root / "small.h5")
        print(f"wrote profiles in {time.perf_counter() - t:.1f} s "
              f"(large.h5 {(root / 'large.h5').stat().st_size / 2**20:.0f} MiB, "
              f"{args.events:,} trace events)", flush=True)
        with (root / "serve.log").open("w") as log, \
                served_browser(root, log, args.incognito) as (base, context):
            results = {rel: time_pages(context, base, rel, args.repeat)
                       for rel in ("small.h5", "large.h5")}
    print("\nseconds until every figure is drawn (Chromium, headless, software rendering)")
    print(f"{'page':30} {'small':>7} {'large':>7} {'large':>7} {'large':>9}")
    print(f"{'':30} {'in-app':>7} {'in-app':>7} {'new tab':>7} {'1st visit':>9}")
    worst = 0.0
    for name, (_, _, small) in results["small.h5"].items():
        first, tab, large = results["large.h5"][name]
        worst = max(worst, large)
        print(f"{name:30} {small:7.2f} {large:7.2f} {tab:7.2f} {first:9.2f}"
              + (f"  > {TARGET_S:g} s" if large > TARGET_S else ""))
    print(f"\nslowest page drawn on the large profile through the app's navigation: "
          f"{worst:.2f} s (target < {TARGET_S:g} s); 'new tab' adds loading the app's "
          f"scripts (Plotly, Dash) again")
    return 0


if __name__ == "__main__":
    sys.exit(main())
