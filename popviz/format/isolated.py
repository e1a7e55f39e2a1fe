"""Read an untrusted profile in a short-lived worker process with a time and memory limit.

A damaged HDF5 file can crash libhdf5 (a segfault on a flipped attribute) or make it loop
for ever while it holds h5py's global lock; no in-process guard survives either. Reading
the file once in a worker first turns those into a `Verdict` and costs a worker, not the
caller:

    verdict = read_isolated(path, timeout_s=10, memory_bytes=1 << 30)
    if not verdict.ok:
        print(verdict.outcome, verdict.message)

Outcomes: "ok", "profile_error" (the reader refused the file: `message` is its one line),
"error" (any other exception: a bug to fix), "memory" (the read ran past `memory_bytes`),
"crash" (the worker died of a signal), "hang" (still running after `timeout_s`; killed),
"interrupted" (a Ctrl-C reached the worker: says nothing of the file).

`start="spawn"` runs a fresh interpreter (safe from any process, ~0.5 s of imports);
`start="fork"` forks the caller (milliseconds; only from a single-threaded process, such as
a fuzzer: a fork of a threaded server may inherit a held lock). Run as a module
(`python -m popviz.format.isolated PATH`) it prints the verdict as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the worker imports the reader itself, after its limits are set
    from popviz.format.reader import FileProfile

OUTCOMES = ("ok", "profile_error", "error", "memory", "crash", "hang", "interrupted")
_MESSAGE_CHARS = 400
_BLOCK_STEPS = 65536  # tile_liveness steps read at a time


@dataclass(frozen=True)
class Verdict:
    """What reading one file in a worker came to."""

    outcome: str  # one of OUTCOMES
    message: str  # one line: the ProfileError, the exception, or what killed the worker
    seconds: float  # wall time of the worker
    # the worker's peak resident memory: its own (VmHWM) when it reported one; for a dead
    # worker the kernel's ru_maxrss, which may include the spawning process's peak
    max_rss_bytes: int
    signal: int | None = None  # the signal that ended a crashed worker

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


def read_everything(profile: FileProfile) -> None:
    """What a viewer reads: every table, the string table, each IPU's trace through the
    per-IPU index and every tile-liveness block (as the app's step pyramid reads them)."""
    for name in profile.table_names:
        profile.table(name)
    for name in ("stages", "trace", "liveness", "tile_memory", "exchange", "ops",
                 "tensors", "variables", "oom"):
        profile.table(name)
    profile._strings  # noqa: B018 - read even when no table refers to it
    for ipu in sorted(set(profile.trace["ipu"].tolist())):
        profile.trace_for(int(ipu))
    shape = profile.array_shape("tile_liveness")
    if shape and len(shape) != 3:
        profile.tile_liveness(0)  # raises the reader's one-line 'damaged array' error
    elif shape:
        for ipu in range(shape[0]):
            for first in range(0, max(shape[1], 1), _BLOCK_STEPS):
                profile.tile_liveness(ipu, first, first + _BLOCK_STEPS)


def _load_probe(probe: str | None) -> Callable[[Any], Any] | None:
    if not probe:
        return None
    module, _, name = probe.partition(":")
    return getattr(importlib.import_module(module), name)


def _classify(exc: BaseException) -> tuple[str, str]:
    from popviz.errors import ProfileError, interrupted_by

    text = " ".join(str(exc).split())[:_MESSAGE_CHARS]
    if interrupted_by(exc):  # Ctrl-C reached the worker too: no verdict on the file
        return "interrupted", "interrupted (Ctrl-C)"
    if isinstance(exc, MemoryError) or isinstance(exc.__context__, MemoryError):
        return "memory", text or "MemoryError"
    if isinstance(exc, ProfileError):
        return "profile_error", text
    return "error", f"{type(exc).__name__}: {text}"


def _limit_memory(memory_bytes: int) -> None:
    """Address space may grow by `memory_bytes` from here; no core files."""
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(ValueError, OSError):  # `popviz serve --memory-mb` caps the
        _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)  # server, not its workers
        resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))
    if memory_bytes <= 0:
        return
    try:
        with open("/proc/self/statm") as handle:
            now = int(handle.read().split()[0]) * resource.getpagesize()
    except OSError:  # not Linux: limit the total instead
        now = 0
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = now + memory_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _work(path: str, memory_bytes: int, probe: str | None, base_rss: int = 0
          ) -> dict[str, Any]:
    """The worker's side: open, read everything, run the probe; never raises. `base_rss`:
    what a forked worker held when forked (its peak is reported above it)."""
    try:
        from popviz.format import reader  # imported before the memory limit applies

        probe_fn = _load_probe(probe)
        _limit_memory(memory_bytes)
        with reader.open(path) as profile:
            read_everything(profile)
            if probe_fn is not None:
                probe_fn(profile)
        outcome, message = "ok", ""
    except BaseException as exc:  # the worker reports everything, KeyboardInterrupt too
        outcome, message = _classify(exc)
    return {"outcome": outcome, "message": message, "peak_rss": _peak_rss(base_rss)}


def _status_bytes(field: str) -> int:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def resident_now() -> int:
    """Resident memory of this process now (VmRSS; 0 where /proc is not there)."""
    return _status_bytes("VmRSS:")


def _peak_rss(base: int = 0) -> int:
    """Peak resident memory of this process image (VmHWM) above `base`. Unlike ru_maxrss
    it does not carry over, through exec, the peak of the process that spawned the
    worker; a forked worker passes what it held when forked (the parent's pages, resident
    in it from the start), so its figure is what the reading itself took."""
    return max(0, _status_bytes("VmHWM:") - base)


def _wait(pid: int, timeout_s: float) -> tuple[int, Any, bool]:
    """Wait for `pid` up to `timeout_s`, then SIGKILL it; (status, rusage, timed_out)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage, False
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            return status, usage, True
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _verdict(report: bytes, status: int, usage: Any, timed_out: bool, seconds: float,
             timeout_s: float) -> Verdict:
    rss = int(usage.ru_maxrss) * (1 if sys.platform == "darwin" else 1024)
    if timed_out:
        return Verdict("hang", f"still reading after {timeout_s:g} s; worker killed",
                       seconds, rss)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number == signal.SIGINT:  # a Ctrl-C, not the file, ended it
            return Verdict("interrupted", "worker interrupted (SIGINT)", seconds, rss, number)
        return Verdict("crash", f"worker died of {signal.Signals(number).name}", seconds, rss,
                       number)
    lines = report.decode("utf-8", "replace").strip().splitlines()
    try:
        data = json.loads(lines[-1])
        peak = data.get("peak_rss")
        return Verdict(str(data["outcome"]), str(data["message"]), seconds,
                       peak if isinstance(peak, int) and peak >= 0 else rss)
    except (IndexError, ValueError, KeyError, TypeError):
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
        return Verdict("crash", f"worker exited {code} without a verdict", seconds, rss)


def read_isolated(path: str | os.PathLike[str], timeout_s: float = 10.0,
                  memory_bytes: int = 1 << 30, probe: str | None = None,
                  start: str = "spawn") -> Verdict:
    """Open and fully read `path` in a worker; see the module docstring.

    `memory_bytes` is how far the worker's address space may grow while reading (0: no
    limit); `probe` names an extra `module:function` called with the open Profile (e.g.
    "popviz.analysis.facts:profile_facts")."""
    path = str(Path(path))
    began = time.monotonic()
    if start == "fork":
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            try:
                os.close(read_end)
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 2)
                faulthandler.disable()  # a crash is the verdict, not a traceback to print
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                result = _work(path, memory_bytes, probe, base_rss=resident_now())
                os.write(write_end, (json.dumps(result) + "\n").encode())
            finally:
                os._exit(0)
        os.close(write_end)
        status, usage, timed_out = _wait(pid, timeout_s)
        with os.fdopen(read_end, "rb") as handle:
            report = handle.read()
    elif start == "spawn":
        command = [sys.executable, "-m", "popviz.format.isolated", "--memory-bytes",
                   str(memory_bytes), *(["--probe", probe] if probe else []), path]
        # one BLAS thread: the worker reads, it does not compute, and idle thread stacks
        # would count against its address-space limit
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   MKL_NUM_THREADS="1")
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL, env=env) as proc:
            status, usage, timed_out = _wait(proc.pid, timeout_s)
            proc.returncode = 0  # reaped above; keep Popen from waiting again
            report = proc.stdout.read() if proc.stdout else b""
    else:
        raise ValueError(f"start must be 'spawn' or 'fork', not {start!r}")
    return _verdict(report, status, usage, timed_out, time.monotonic() - began, timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m popviz.format.isolated",
                                     description="Read one profile fully; print a verdict.")
    parser.add_argument("path")
    parser.add_argument("--memory-bytes", type=int, default=0)
    parser.add_argument("--probe", default=None)
    args = parser.parse_args(argv)
    result = _work(args.path, args.memory_bytes, args.probe)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["OUTCOMES", "Verdict", "read_everything", "read_isolated"]
