"""popviz Dash app (installed as the package `popviz_app`): wiring only.

`create_app(profile_dir)` builds the app; `popviz serve DIR` runs it. Pages live in
`pages/` and are listed in `pages.PAGES`; every page takes `?profile=<path relative to
DIR>` so a URL can be shared."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import dash
from dash import Input, Output, dcc, html
from dash.exceptions import DependencyException

from popviz.errors import ProfileError, RequestStopped
from popviz.vet import Vetter

from . import bodies, downloads
from .cache import PathRefused, ProfileCache, StillChecking, resolve_profile
from .common import AppContext, error_text, message, profile_of, profile_query
from .pages import PAGES
from .style import INDEX_STRING

log = logging.getLogger("popviz.app")
ERROR_ID = "callback-error"  # a callback that fails shows its one-line error here
POLL_ID = "checking-poll"  # re-renders a page whose file is still being vetted
POLL_MS = 2000

# Test hook only, like popviz.vet's: "spin:NAME,grab:NAME" makes a page of a profile whose
# path contains NAME spin for ever or allocate until refused (SIMULATE_GRAB_BYTES at
# most), so tests drive the server's time and memory budgets (popviz.cli.serve_budget)
SIMULATE_ENV = "POPVIZ_SERVE_SIMULATE"
SIMULATE_GRAB_BYTES = 3 << 30


def simulate_load(rel: str) -> None:
    for item in os.environ.get(SIMULATE_ENV, "").split(","):
        what, _, name = item.partition(":")
        if not name or name not in rel:
            continue
        if what == "spin":
            turns = 0
            while True:
                turns += 1
        elif what == "grab":
            held = [b"\x01" * (64 << 20) for _ in range(SIMULATE_GRAB_BYTES >> 26)]
            del held


__all__ = ["PathRefused", "ProfileCache", "StillChecking", "create_app", "render",
           "render_page", "resolve_profile"]


def _nav(path: str, rel: str) -> html.Nav:
    links: list[Any] = []  # Spans and Links
    for page in PAGES:
        href = page.PATH + (profile_query(rel) if page.NEEDS_PROFILE else "")
        cls = "nav-link active" if path == page.PATH else "nav-link"
        if page.NEEDS_PROFILE and not rel:
            links.append(html.Span(page.TITLE, className="nav-link disabled"))
        else:
            links.append(dcc.Link(page.TITLE, href=href, className=cls))
    return html.Nav([html.Span("popviz", className="brand"), *links], className="nav")


def render(ctx: AppContext, path: str | None, search: str | None) -> list[Any]:
    """Navigation plus the page for a URL (a refused or broken profile, or anything that
    goes wrong building the page, becomes a one-line message, never an exception)."""
    return render_page(ctx, path, search)[0]


def render_page(ctx: AppContext, path: str | None,
                search: str | None) -> tuple[list[Any], bool]:
    """`render`, and whether the profile is still being vetted (the page then polls)."""
    path = path or "/"
    rel = profile_of(search)
    page = next((p for p in PAGES if path == p.PATH), None)
    if page is None:
        return [_nav(path, ""), message(f"No page {path[:80]}. Pages: "
                                        + ", ".join(p.PATH for p in PAGES))], False
    try:
        if not page.NEEDS_PROFILE:
            return [_nav(path, rel), page.layout(ctx, None)], False
        entry = ctx.cache.get(rel)
        if SIMULATE_ENV in os.environ:
            simulate_load(rel)
        return [_nav(path, rel), page.layout(ctx, entry)], False
    except StillChecking as exc:  # the page polls (POLL_ID) until the verdict is in
        return [_nav(path, rel), message(error_text(ctx, exc, rel), tone="info")], True
    except Exception as exc:  # the page of one bad file must not be a blank 500
        if not isinstance(exc, PathRefused | ProfileError | RequestStopped):
            log.exception("building %s for %r", path, rel)
        return [_nav(path, ""), message(error_text(ctx, exc, rel)),
                dcc.Link("Back to the list of profiles", href="/")], False


def callback_failed(ctx: AppContext, exc: Exception) -> None:
    """Dash's on_error: the callback's outputs stay as they were and the page shows one
    line saying why (instead of a 500 the browser shows as nothing at all)."""
    try:
        rel = profile_of(dash.callback_context.states.get("url.search"))
    except Exception:  # no callback context (a test calling the handler directly)
        rel = ""
    if not isinstance(exc, PathRefused | ProfileError | RequestStopped):
        log.error("callback failed for %r", rel, exc_info=exc)
    dash.set_props(ERROR_ID, {"children": message(error_text(ctx, exc, rel))})


def create_app(profile_dir: str | os.PathLike[str], cache_size: int = 6,
               vetter: Vetter | bool | None = True,
               vet_wait_s: float | None = None) -> dash.Dash:
    """The Dash app serving every profile under `profile_dir` (and nothing outside it).

    `vetter`: True (a default `popviz.vet.Vetter`), a Vetter, or False/None to open files
    in-process without a worker's verdict first (only for files you trust).
    `vet_wait_s`: how long a request waits for a file's verdict before its page says
    "being checked" and polls (None: as long as vetting takes; `popviz serve` sets it)."""
    root = Path(profile_dir)
    if not root.is_dir():
        raise ValueError(f"{root}: no such directory")
    if vetter is True:
        vetter = Vetter()
    cache = ProfileCache(root.resolve(), cache_size, vetter=vetter or None,
                         vet_wait_s=vet_wait_s)
    cache.prewarm()
    ctx = AppContext(root=root.resolve(), cache=cache)
    app = dash.Dash(__name__, title="popviz", suppress_callback_exceptions=True,
                    update_title=None,  # type: ignore[arg-type, unused-ignore]  # dash: None turns it off
                    assets_folder=str(Path(__file__).parent / "assets"),
                    on_error=lambda exc: callback_failed(ctx, exc))
    app.index_string = INDEX_STRING
    app.layout = html.Div([dcc.Location(id="url", refresh=False),
                           dcc.Interval(id=POLL_ID, interval=POLL_MS, disabled=True),
                           html.Div(id=ERROR_ID, className="callback-error"),
                           html.Div(id="page", className="page")])
    app.popviz_context = ctx  # type: ignore[attr-defined]  # tests call page builders with it

    @app.callback(Output("page", "children"), Output(ERROR_ID, "children"),
                  Output(POLL_ID, "disabled"), Input("url", "pathname"),
                  Input("url", "search"), Input(POLL_ID, "n_intervals"))
    def route(path: str | None, search: str | None,
              _polls: int | None) -> tuple[list[Any], None, bool]:
        children, checking = render_page(ctx, path, search)
        return children, None, not checking  # a new page clears an old callback error

    views: dict[str, Any] = {}
    callbacks: dict[str, Any] = {}
    for page in PAGES:
        for name, function in (page.register(app, ctx) or {}).items():
            callbacks[f"{page.__name__.rsplit('.', 1)[-1]}.{name}"] = function
        views.update(page.FIGURES)
    app.popviz_callbacks = callbacks  # type: ignore[attr-defined]  # tests call these plain functions
    downloads.register(app.server, ctx, views)
    bodies.install(app)
    app.server.register_error_handler(DependencyException, _no_such_asset)
    return app


def _no_such_asset(exc: Exception) -> Any:
    """Dash raises DependencyException for a /_dash-component-suites/ path that names no
    file it serves (an unknown package, `../`): that is a 404, not a server error."""
    import flask

    return flask.Response("popviz: no such file\n", 404, mimetype="text/plain")
