"""`popviz serve DIR [--host 127.0.0.1] [--port 8050]`: the Dash app over every profile
under DIR. Loopback by default and never in debug mode (debug would run arbitrary code
for anyone who can reach the port)."""

from __future__ import annotations

import argparse
from pathlib import Path

from popviz.cli.command import EXIT_OK, Command, UsageError


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="directory of profiles (searched "
                        "recursively, including training/ and inference/)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=8050, help="port (default 8050)")


def _run(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if not root.is_dir():
        raise UsageError(f"{root}: no such directory")
    if not 0 < args.port < 65536:
        raise UsageError(f"port {args.port} is outside 1..65535")
    from popviz_app import create_app  # Dash is imported only when serving

    app = create_app(root)
    print(f"popviz: serving {root.resolve()} at http://{args.host}:{args.port}/ "
          "(Ctrl-C to stop)", flush=True)
    app.run(host=args.host, port=args.port, debug=False)
    return EXIT_OK


COMMAND = Command(
    name="serve",
    help="serve the profiles under DIR in a web app",
    description="Serve every profile under DIR (recursively) in a Dash app: summary, trace, "
    "liveness, memory, stages, exchange and operations pages.",
    add_arguments=_add_arguments,
    run=_run,
)
