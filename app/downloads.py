"""CSV of each table and standalone HTML of each figure, as plain Flask routes
(`/download/csv/<table>?profile=...`, `/download/html/<view>?profile=...`)."""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable
from typing import Any

import flask
from werkzeug.exceptions import HTTPException

from popviz.analysis.table import filter_table, sort_table
from popviz.errors import ProfileError, RequestStopped

from .cache import Entry, PathRefused, StillChecking
from .common import AppContext, error_text, naming, view_name

log = logging.getLogger("popviz.app")

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _name(rel: str, what: str, suffix: str) -> str:
    return _SAFE.sub("_", f"{rel.rsplit('.', 1)[0]}_{what}").strip("_") + suffix


def _text(body: str, status: int) -> flask.Response:
    return flask.Response(body + "\n", status, mimetype="text/plain")


def _as_shown(frame: Any, args: Any) -> Any:
    """The table as the page shows it: `filter` (DataTable's filter query; cells it cannot
    read are skipped, as on the page) and `sort` (its sort_by, JSON) from the link."""
    rows = filter_table(frame, args.get("filter", ""), errors=[])
    try:
        sort_by = json.loads(args.get("sort", "") or "[]")
    except ValueError:
        sort_by = []
    if not isinstance(sort_by, list):
        sort_by = []
    return sort_table(rows, [s for s in sort_by if isinstance(s, dict)])


def register(server: flask.Flask, ctx: AppContext, views: dict[str, Any]) -> None:
    """`views` maps a view name to its builder (ctx, entry) -> Figure. A refused or broken
    profile is a 404, one still being vetted a 503 (Retry-After: 2) and a download that
    fails to build a 422, each with one line."""

    def guarded(handler: Callable[..., flask.Response]) -> Callable[..., flask.Response]:
        @functools.wraps(handler)
        def run(**kwargs: Any) -> flask.Response:
            rel = flask.request.args.get("profile", "")
            try:
                return handler(ctx.cache.get(rel), rel, **kwargs)
            except StillChecking as exc:  # its vetting is under way: come back soon
                reply = _text(error_text(ctx, exc, rel), 503)
                reply.headers["Retry-After"] = "2"
                return reply
            except (PathRefused, ProfileError) as exc:
                return _text(error_text(ctx, exc, rel), 404)
            except Exception as exc:  # one bad file: a line, not a blank 500
                log.exception("download %s for %r", flask.request.path, rel)
                return _text(error_text(ctx, exc, rel), 422)
        return run

    @server.route("/download/csv/<table>")
    @guarded
    def download_csv(entry: Entry, rel: str, table: str) -> flask.Response:
        try:
            frame = entry.profile.table(table)
        except KeyError:
            return _text(f"no table {table[:80]!r}", 404)
        frame = _as_shown(frame, flask.request.args)
        return flask.Response(
            frame.to_csv(index=False), mimetype="text/csv",
            headers={"Content-Disposition":
                     f'attachment; filename="{_name(rel, table, ".csv")}"'})

    @server.route("/download/html/<view>")
    def download_html(view: str) -> flask.Response:
        if view not in views:
            return _text(f"no figure {view[:80]!r}", 404)
        return _html(view=view)

    @guarded
    def _html(entry: Entry, rel: str, view: str) -> flask.Response:
        html = views[view](ctx, entry).to_html(include_plotlyjs=True, full_html=True)
        return flask.Response(html, mimetype="text/html", headers={
            "Content-Disposition":
                f'attachment; filename="{_name(rel, view_name(view, naming(entry)), ".html")}"'})

    @server.errorhandler(Exception)
    def any_error(exc: Exception) -> Any:
        """Anything else that escapes a route: one line, never a traceback."""
        if isinstance(exc, HTTPException):
            return exc
        if isinstance(exc, RequestStopped | MemoryError):  # a budget of `popviz serve`
            return _text("popviz: " + error_text(ctx, exc), 503)
        log.error("unhandled error on %s", flask.request.path, exc_info=exc)
        return _text("popviz: internal error (the server log has the details)", 500)
