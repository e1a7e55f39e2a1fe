"""How a popviz program (`popviz`, `train.py`, `python -m popviz.measure`) ends its process,
so that a Ctrl-C at any moment, its own exit included, is one line (a leaf: the commands
of cli/ and popviz.measure both use it)."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def run_program(body: Callable[[], int], prog: str) -> NoReturn:
    """Run a program's `body` and end the process with its exit code; a Ctrl-C at any
    moment, the program's own exit included, ends it with `prog: interrupted` and 130.

    CPython puts SIGINT back to its default while it tears the interpreter down, so a
    late Ctrl-C there killed the process by the signal without a word. Here the exit
    work Python does (joining threads, atexit) runs with a handler that says it, and the
    process then ends with os._exit: there is no teardown left for a signal to land in.
    """
    caught: list[int] = []

    def on_interrupt(signum: int, frame: object) -> None:
        caught.append(signum)  # remembered: a finalizer that swallows the exception
        raise KeyboardInterrupt  # (h5py's, a weakref callback) cannot hide the Ctrl-C

    def late(signum: int, frame: object) -> None:
        os._exit(_said_interrupted(prog))

    def unraisable(hook: Any) -> None:  # a swallowed Ctrl-C: said once, at the end
        if not isinstance(hook.exc_value, KeyboardInterrupt):
            sys.__unraisablehook__(hook)

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not ignored
        signal.signal(signal.SIGINT, on_interrupt)
        sys.unraisablehook = unraisable
    code = EXIT_INTERRUPTED
    try:
        try:
            code = body()
        finally:  # from here on a Ctrl-C is `late`, wherever it lands
            if signal.getsignal(signal.SIGINT) is on_interrupt:
                signal.signal(signal.SIGINT, late)
    except KeyboardInterrupt:
        code = _said_interrupted(prog)
    except SystemExit as exc:  # argparse's --help (0) and usage errors (2)
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    if caught and code != EXIT_INTERRUPTED:  # a Ctrl-C that something swallowed
        code = _said_interrupted(prog)
    _end(code)


def _said_interrupted(prog: str) -> int:
    with contextlib.suppress(OSError, ValueError):  # a closed or gone stream
        os.write(2, f"{prog}: interrupted\n".encode())
    return EXIT_INTERRUPTED


def _end(code: int) -> NoReturn:
    """What the interpreter's exit does before its teardown, then os._exit(code)."""
    shutdown = getattr(threading, "_shutdown", None)  # joins non-daemon threads
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()  # multiprocessing's, logging's, tempfile's
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or gone stream
            stream.flush()
    _pending_handlers_run()
    os._exit(code)


def _pending_handlers_run() -> None:
    """Nothing: entering a Python function is where CPython runs a signal handler whose
    signal came during the C calls just before (a Ctrl-C during the flush is said)."""

