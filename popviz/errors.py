"""Errors popviz raises at its boundaries."""


class ProfileError(Exception):
    """A profile cannot be read: missing, not HDF5, truncated, foreign, too new, damaged,
    lying about its sizes, or holding values outside the schema.

    The message is one line that names the file, the table where there is one, and the
    reason. Every failure of `popviz.open` and of a Profile's reads is this type.
    """


def _reason(exc: OSError) -> str:
    """The reason of an OSError on one line (h5py's messages run over several lines)."""
    return " ".join((exc.strerror or str(exc) or type(exc).__name__).split())[:300]


def os_error_line(exc: OSError) -> str:
    """`PATH: reason` on one line."""
    reason = _reason(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


def write_error(exc: OSError, target: object) -> OSError:
    """`exc` (a full disk, no permission, ...) as an OSError naming what was being written
    rather than its temporary file; same errno, so the same OSError subclass."""
    error = OSError(exc.errno, f"cannot write ({_reason(exc)}); nothing was written there",
                    str(target))
    error.__cause__ = exc
    return error


class RequestStopped(Exception):
    """A request of `popviz serve` ran past its time budget (`--request-timeout`) and was
    stopped in its thread (popviz.cli.serve_budget). `limit_s` is the budget."""

    limit_s: float = 0.0

    def __init__(self, limit_s: float | None = None) -> None:
        if limit_s is not None:
            self.limit_s = limit_s
        super().__init__(self.limit_s)

    def __str__(self) -> str:
        return (f"building this view took longer than {self.limit_s:g} s and was stopped "
                "(popviz serve --request-timeout)")
