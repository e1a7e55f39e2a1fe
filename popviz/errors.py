"""Errors popviz raises at its boundaries."""


class ProfileError(Exception):
    """A profile cannot be read: missing, not HDF5, truncated, foreign, too new, damaged,
    lying about its sizes, or holding values outside the schema.

    The message is one line that names the file, the table where there is one, and the
    reason. Every failure of `popviz.open` and of a Profile's reads is this type.
    """


def os_error_line(exc: OSError) -> str:
    """`PATH: reason` on one line (h5py's OSError messages run over several lines)."""
    reason = " ".join((exc.strerror or str(exc) or type(exc).__name__).split())[:300]
    return f"{exc.filename}: {reason}" if exc.filename else reason


def write_error(exc: OSError, target: object) -> OSError:
    """`exc` (a full disk, no permission, ...) as an OSError naming what was being written
    rather than its temporary file; same errno, so the same OSError subclass."""
    reason = " ".join((exc.strerror or str(exc) or type(exc).__name__).split())[:300]
    error = OSError(exc.errno, f"cannot write ({reason}); nothing was written there",
                    str(target))
    error.__cause__ = exc
    return error
