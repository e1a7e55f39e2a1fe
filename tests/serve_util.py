"""`popviz serve DIR` as users run it (waitress, its body and header limits, vetting) in a
child process on a free loopback port, for the serve and browser tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(root: Path, *extra: str, log: IO[str] | None = None,
                tries: int = 3) -> tuple[subprocess.Popen[str], int]:
    """Start `popviz serve root` and wait until it accepts connections. Output goes to
    `log` (a file: a pipe nobody reads would stall a chatty server) or to pipes. A port
    taken between picking and binding it is retried on another."""
    why = ""
    for _ in range(tries):
        port = free_port()
        out = log if log is not None else subprocess.PIPE
        proc = subprocess.Popen([sys.executable, "-m", "popviz.cli.main", "serve", str(root),
                                 "--port", str(port), *extra], cwd=REPO, text=True,
                                stdout=out, stderr=subprocess.STDOUT if log else out)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return proc, port
            except OSError:
                if proc.poll() is not None:
                    break
                time.sleep(0.3)
        proc.kill()
        tail = proc.communicate()[1] if log is None else ""
        why = (tail or "")[-2000:] or f"exit status {proc.returncode}"
    raise AssertionError(f"popviz serve did not start: {why}")


def stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Stop the server; its (stdout, stderr) when they were piped."""
    proc.terminate()
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return out or "", err or ""
