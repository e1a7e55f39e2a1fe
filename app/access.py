"""Who may talk to the app: allowed `Host` headers and, when set, an access token.

Every request (page, callback, download, asset) passes `check` first. The `Host` header
must name this machine's loopback, the address the server is bound to or a name given
with `--allow-host` (so a DNS-rebinding page cannot drive the server from a browser).
With a token, a request must carry it: `?token=` once (the reply sets a cookie and
redirects to the same URL without it), the cookie, or the `X-Popviz-Token` header.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from urllib.parse import urlencode

import flask
import werkzeug

COOKIE = "popviz_token"
HEADER = "X-Popviz-Token"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """'example.org:8050' -> 'example.org'; '[::1]:8050' -> '::1' (lower case)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _text(body: str, status: int) -> flask.Response:
    return flask.Response(body + "\n", status, mimetype="text/plain")


def install(server: flask.Flask, bound_host: str, token: str | None = None,
            allow_hosts: Iterable[str] = ()) -> None:
    """Check Host (and the token, if any) before every request of `server`."""
    allowed = set(LOOPBACK_NAMES) | {host_name(h) for h in allow_hosts if h}
    if bound_host and bound_host not in ("0.0.0.0", "::"):
        allowed.add(host_name(bound_host))
    # bound to every address: the name clients use is unknown, so --allow-host adds it

    @server.before_request
    def check() -> werkzeug.Response | None:  # flask.redirect's is werkzeug's
        request = flask.request
        name = host_name(request.host or "")
        if name not in allowed and not is_loopback(name):
            return _text(f"popviz: host {name[:100]!r} is not served here (start the "
                         "server with --allow-host NAME to allow it)", 400)
        if not token:
            return None
        given = request.args.get("token")
        if given is not None and hmac.compare_digest(given, token):
            rest = [(k, v) for k, v in request.args.items(multi=True) if k != "token"]
            target = request.path + ("?" + urlencode(rest) if rest else "")
            reply = flask.redirect(target, code=303)
            reply.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
            return reply
        for candidate in (request.cookies.get(COOKIE), request.headers.get(HEADER)):
            if candidate and hmac.compare_digest(candidate, token):
                return None
        return _text("popviz: this server needs its access token: open the address it "
                     "printed when it started (it ends in ?token=...)", 401)
