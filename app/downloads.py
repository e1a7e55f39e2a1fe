"""CSV of each table and standalone HTML of each figure, as plain Flask routes
(`/download/csv/<table>?profile=...`, `/download/html/<view>?profile=...`)."""

from __future__ import annotations

import re
from typing import Any

import flask

from popviz.errors import ProfileError

from .cache import PathRefused
from .common import AppContext

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _name(rel: str, what: str, suffix: str) -> str:
    return _SAFE.sub("_", f"{rel.rsplit('.', 1)[0]}_{what}").strip("_") + suffix


def register(server: flask.Flask, ctx: AppContext, views: dict[str, Any]) -> None:
    """`views` maps a view name to its builder (ctx, entry) -> Figure."""

    def entry_or_error() -> Any:
        rel = flask.request.args.get("profile", "")
        try:
            return ctx.cache.get(rel), rel
        except (PathRefused, ProfileError) as exc:
            flask.abort(flask.make_response(str(exc) + "\n", 404, {"Content-Type":
                                                                   "text/plain"}))
            raise  # unreachable: abort raises

    @server.route("/download/csv/<table>")
    def download_csv(table: str) -> flask.Response:
        entry, rel = entry_or_error()
        try:
            frame = entry.profile.table(table)
        except KeyError:
            return flask.Response(f"no table {table!r}\n", 404, mimetype="text/plain")
        return flask.Response(
            frame.to_csv(index=False), mimetype="text/csv",
            headers={"Content-Disposition":
                     f'attachment; filename="{_name(rel, table, ".csv")}"'})

    @server.route("/download/html/<view>")
    def download_html(view: str) -> flask.Response:
        build = views.get(view)
        if build is None:
            return flask.Response(f"no figure {view!r}\n", 404, mimetype="text/plain")
        entry, rel = entry_or_error()
        html = build(ctx, entry).to_html(include_plotlyjs=True, full_html=True)
        return flask.Response(html, mimetype="text/html", headers={
            "Content-Disposition": f'attachment; filename="{_name(rel, view, ".html")}"'})
