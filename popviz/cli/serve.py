"""`popviz serve DIR [--host 127.0.0.1] [--port 8050]`: the Dash app over every profile
under DIR, on waitress (a production WSGI server) with a bounded thread pool. Loopback by
default and never in debug mode (debug would run arbitrary code for anyone who can reach
the port); any other address warns and requires an access token (docs/app.md). waitress
runs with the deadlines and caps of `serve_guard` against slow clients, and with the
thread, time and memory budgets of `serve_budget` against slow or hungry pages."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import math
import os
import secrets
import signal
import socket
import sys
from pathlib import Path

from popviz.argtypes import non_empty_path
from popviz.cli.command import EXIT_OK, Command, UsageError

THREADS = 10  # 8 build views (callbacks, downloads), 2 only answer pages (serve_budget)
CONNECTION_LIMIT = 200
MAX_BODY_BYTES = 1 << 20  # callback payloads are a few KB; nothing uploads
MAX_HEADER_BYTES = 64 * 1024
CHANNEL_TIMEOUT_S = 120  # a connection without a byte either way is closed after this
CLEANUP_INTERVAL_S = 1  # how often deadlines are checked (popviz.cli.serve_guard)
VET_WAIT_S = 2.0  # a request waits this long for a file's vetting, then says "retry"


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from popviz.cli.serve_budget import DEFAULT_MEMORY_MB as SERVE_MEMORY_MB
    from popviz.cli.serve_budget import DEFAULT_REQUEST_TIMEOUT_S
    from popviz.vet import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S

    parser.add_argument("dir", metavar="DIR", type=non_empty_path,
                        help="directory of profiles (searched "
                        "recursively, including training/ and inference/)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1, this machine only; "
                        "any other address requires a token)")
    parser.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    parser.add_argument("--token", default=None,
                        help="access token every request must carry (default: none on "
                        "loopback, a generated one, printed once, on any other address)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="also accept requests whose Host header names NAME (the name "
                        "clients use to reach this machine); repeatable")
    parser.add_argument("--threads", type=int, default=THREADS,
                        help=f"worker threads answering requests (default {THREADS})")
    parser.add_argument("--vet-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds a worker process may take to read a profile before "
                        f"it is refused (default {DEFAULT_TIMEOUT_S:g}, plus 60 per GB "
                        "of file)")
    parser.add_argument("--vet-memory-mb", type=int, default=DEFAULT_MEMORY_MB, metavar="MB",
                        help="how far a worker process's address space may grow while it "
                        f"reads a profile (default {DEFAULT_MEMORY_MB})")
    parser.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT_S,
                        metavar="S", help="seconds a page, figure or download may take to "
                        "build before it is stopped and answered with one line (default "
                        f"{DEFAULT_REQUEST_TIMEOUT_S:g})")
    parser.add_argument("--memory-mb", type=int, default=SERVE_MEMORY_MB, metavar="MB",
                        help="how far the server's own memory may grow; a view that needs "
                        f"more is answered with one line (default {SERVE_MEMORY_MB})")


def _own_names(host: str) -> list[str]:
    """Names clients may use for this machine when bound to every address: its host name,
    fully qualified name and their addresses (others need --allow-host)."""
    if host not in ("0.0.0.0", "::", ""):
        return []
    names = {socket.gethostname(), socket.getfqdn()}
    for name in list(names):
        with contextlib.suppress(OSError):  # a name without an address is still a name
            names.update(socket.gethostbyname_ex(name)[2])
    return sorted(n for n in names if n)



def _check_root(root: Path) -> None:
    """A folder this process may list, or one line saying what it is instead."""
    from popviz.errors import in_the_way_note

    try:
        if not root.is_dir():
            raise UsageError(f"{root}: a file, not a folder; serve the folder that holds "
                             "profiles (e.g. profiles/)" if root.exists()
                             else f"{root}: no such directory{in_the_way_note(root)}")
        with os.scandir(root) as entries:
            next(entries, None)
    except PermissionError:  # served, it would list nothing and say nothing
        raise UsageError(f"{root}: cannot be read (permission denied); serve a folder "
                         "this user may read") from None


def _run(args: argparse.Namespace) -> int:
    from popviz.format.guards import special_kind

    root = Path(args.dir)
    if (kind := special_kind(root)) is not None:  # a FIFO, device, symlink loop
        raise UsageError(f"{root}: is {kind}, not a folder; serve the folder that holds "
                         "profiles (e.g. profiles/)")
    _check_root(root)
    if not 0 < args.port < 65536:
        raise UsageError(f"port {args.port} is outside 1..65535")
    if not 1 <= args.threads <= 64:
        raise UsageError(f"--threads {args.threads} is outside 1..64")
    for flag, seconds in (("--vet-timeout", args.vet_timeout),
                          ("--request-timeout", args.request_timeout)):
        if not (math.isfinite(seconds) and seconds > 0):
            raise UsageError(f"{flag} {seconds:g}: must be a positive number of seconds")
    for flag, mb, least in (("--vet-memory-mb", args.vet_memory_mb, 256),
                            ("--memory-mb", args.memory_mb, 512)):
        if mb < least:
            raise UsageError(f"{flag} {mb}: must be at least {least}")
    _check_listen(args.host, args.port)  # before the app starts vetting anything
    from popviz_app import access, create_app  # Dash and waitress only when serving

    from popviz.cli import serve_budget, serve_guard
    from popviz.vet import Vetter

    token = args.token
    if not access.is_loopback(args.host):
        token = token or secrets.token_urlsafe(24)
    app = create_app(root, vetter=Vetter(timeout_s=args.vet_timeout,
                                         memory_mb=args.vet_memory_mb),
                     vet_wait_s=VET_WAIT_S)
    access.install(app.server, args.host, token, [*args.allow_host, *_own_names(args.host)])
    # waitress warns on every queued request past its threads: under load that is one
    # line per request; overload shows in latency, not in a flooded log
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID` prints every thread's stack
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    problem = serve_budget.limit_memory(args.memory_mb)  # after the imports: they are not
    if problem:                                          # what a page may use
        raise UsageError(problem)
    # waitress, with header / body deadlines and per-address caps in front (serve_guard),
    # threads shared fairly and a deadline on each view (serve_budget)
    try:
        server = serve_guard.create_server(
            serve_budget.Deadline(app.server, args.request_timeout), host=args.host,
            port=args.port, threads=args.threads,
            dispatcher=serve_budget.FairDispatcher(serve_budget.Share.of(args.threads)),
            connection_limit=CONNECTION_LIMIT, channel_timeout=CHANNEL_TIMEOUT_S,
            cleanup_interval=CLEANUP_INTERVAL_S, max_request_body_size=MAX_BODY_BYTES,
            max_request_header_size=MAX_HEADER_BYTES, ident="popviz",
            expose_tracebacks=False)
    except (OSError, ValueError) as exc:  # taken since the check, or refused by waitress
        raise _listen_error(args.host, args.port, exc) from None
    # said once listening: a URL (and token) for a server that never started misleads
    if not access.is_loopback(args.host):
        print(f"popviz: warning: listening on {args.host}, not loopback: anyone who can "
              "reach this port and has the token can read every profile under "
              f"{root.resolve()}", file=sys.stderr, flush=True)
    url = f"http://{_shown(args.host)}:{args.port}/" + (f"?token={token}" if token else "")
    print(f"popviz: serving {root.resolve()} at {url} (Ctrl-C to stop)", flush=True)
    server.run()
    return EXIT_OK


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _check_listen(host: str, port: int) -> None:
    """One line naming the address and port when this process cannot listen there (an
    unknown host, an address not this machine's, a port in use or not permitted)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        raise _listen_error(host, port, exc) from None
    for family, kind, proto, _name, address in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as waitress
                probe.bind(address)
        except OSError as exc:
            raise _listen_error(host, port, exc) from None


def _listen_error(host: str, port: int, exc: BaseException) -> Exception:
    where = f"{_shown(host[:100])}:{port}"
    if isinstance(exc, socket.gaierror | UnicodeError | ValueError):
        reason = exc.strerror if isinstance(exc, socket.gaierror) else None
        if reason is None:  # waitress' "Invalid host/port specified.": resolve for why
            try:
                socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                reason = str(exc)
            except (OSError, UnicodeError) as resolving:
                reason = getattr(resolving, "strerror", None) or str(resolving)
        return UsageError(f"cannot listen on {where}: unknown or invalid --host "
                          f"({reason})")
    assert isinstance(exc, OSError)
    reason = " ".join((exc.strerror or str(exc)).split())
    return OSError(exc.errno, f"cannot listen there ({reason})", where)


COMMAND = Command(
    name="serve",
    help="serve the profiles under DIR in a web app",
    description="Serve every profile under DIR (recursively) in a Dash app: summary, trace, "
    "liveness, memory, stages, exchange and operations pages. Each file is first read by a "
    "short-lived worker process under time and memory limits, so a damaged file is refused, "
    "never crashes or freezes the server; a page whose file is still being checked says so "
    "after 2 s and reloads itself. Slow clients cannot lock others out: a request's headers "
    "must arrive within 10 s and its body within 30 s, and past 64 connections from one "
    "address the longest-waiting one is closed. A page cannot take the server down: views "
    "of one profile use at most half of the threads that build views, two threads always "
    "answer pages, a view still building after --request-timeout is stopped and one "
    "needing more than --memory-mb is refused, each with one line (limits: "
    "docs/limits.md).",
    add_arguments=_add_arguments,
    run=_run,
)
