"""What every reader and writer checks on a path before it opens it (issue 34).

- Not a FIFO, socket, device or symlink loop: opening a FIFO blocks until someone writes to
  it, `/dev/zero` never ends, so these are refused by what they are, before any open:
  `PATH: is a FIFO, not a regular file`. A folder is not refused here (a profile folder is
  a valid input; writers say what they do with one).
- A writer never writes over one of its own inputs, `--force` or not (same file: same
  device and inode, whatever path or link names it).
- A writer replaces an earlier profile only when asked (`--force`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from popviz.errors import ProfileError
from popviz.format import schema, tempfiles

PathLike = str | os.PathLike[str]

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class NotRegularFile(OSError):
    """A writer's target that is a FIFO, socket, device or symlink loop (one line)."""


class OwnInput(ValueError):
    """A writer's target that is one of the command's own inputs (one line)."""


def special_kind(path: PathLike) -> str | None:
    """What `path` is when it is there but is neither a regular file nor a folder ("a
    FIFO", "a socket", "a character device", "a block device", "a symlink loop"); None
    for a regular file, a folder, or nothing there (the caller's own open says why)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return "a symlink loop" if exc.errno == errno.ELOOP else None
    return next((what for test, what in _KINDS if test(mode)), None)


def not_regular_line(path: PathLike, kind: str) -> str:
    return f"{path}: is {kind}, not a regular file"


def refuse_special_input(path: PathLike) -> None:
    """ProfileError (one line) when the file a reader is about to open is a FIFO, socket,
    device or symlink loop."""
    kind = special_kind(path)
    if kind is not None:
        raise ProfileError(not_regular_line(path, kind))


def refuse_special_output(path: PathLike) -> None:
    """NotRegularFile (an OSError, one line) when the path a writer is about to write is a
    FIFO, socket, device or symlink loop."""
    kind = special_kind(path)
    if kind is not None:
        raise NotRegularFile(errno.EINVAL, f"is {kind}, not a regular file", str(path))


def same_file(a: PathLike, b: PathLike) -> bool:
    """Whether `a` and `b` are one file (device and inode), however each is named."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # one is not there (yet): not the same file
        return False


def refuse_own_input(target: PathLike, inputs: Iterable[PathLike], flag: str) -> None:
    """OwnInput when `target` is one of `inputs` (a profile folder given as an input
    counts by its profile.h5): never written over, even with --force."""
    for given in inputs:
        if not str(given):  # "" names no file (Path("") would be the current folder)
            continue
        candidates = [Path(given)]
        if Path(given).is_dir():
            from popviz.format.schema import PROFILE_FILENAME

            candidates.append(Path(given) / PROFILE_FILENAME)
        if any(same_file(target, c) for c in candidates):
            named = "" if str(given) == str(target) else f" ({given})"
            raise OwnInput(f"{target}: is an input of this command{named}; a command "
                           f"never writes over its own input, --force or not: choose "
                           f"another {flag}")


def refuse_existing(target: Path, force: bool, flag: str) -> None:
    """FileExistsError (one line) when a profile is already at `target` and not `force`."""
    if not force and (target.exists() or target.is_symlink()):
        raise FileExistsError(errno.EEXIST, "a profile is already there; pass --force to "
                              f"replace it, or choose another {flag}", str(target))


def check_target(to: PathLike, *, force: bool, inputs: Iterable[PathLike] = (),
                 flag: str = "--to") -> Path:
    """Everything a command checks before it starts work that ends in writing a profile at
    `to` (a .h5 path or a folder for profile.h5); the profile's path. In order: not a
    FIFO / device / loop, not one of `inputs`, not a user's own file or folder
    (refuse_foreign), not an earlier profile unless `force`."""
    refuse_special_output(to)
    target = profile_path(to)
    refuse_special_output(target)
    refuse_own_input(target, inputs, flag)
    refuse_foreign(target)
    refuse_existing(target, force, flag)
    return target


def same_target(a: PathLike, b: PathLike) -> bool:
    """Whether two writers' targets (.h5 paths or folders) name one profile file."""
    first, second = profile_path(a), profile_path(b)
    return same_file(first, second) or \
        os.path.realpath(first) == os.path.realpath(second)


def profile_path(path: str | os.PathLike[str]) -> Path:
    """A `.h5` path is used as is; anything else is a directory that gets profile.h5."""
    target = Path(path)
    if target.suffix == schema.PROFILE_SUFFIX:
        return target
    return target / schema.PROFILE_FILENAME


def is_popviz_profile(path: Path) -> bool:
    """Whether the file at `path` is a popviz profile (an HDF5 file whose root says so),
    the only kind of file a write may replace."""
    import h5py  # only when there is a file to look at: guards load without it

    try:
        with open(path, "rb") as handle:
            if handle.read(len(tempfiles.HDF5_SIGNATURE)) != tempfiles.HDF5_SIGNATURE:
                return False
        with h5py.File(path, "r") as h5:
            fmt = h5.attrs.get("format")
            return (fmt.decode() if isinstance(fmt, bytes) else fmt) == schema.FORMAT_NAME
    except (OSError, ValueError, UnicodeDecodeError):
        return False


def refuse_foreign(final: Path) -> None:
    """A profile is written over an older profile, never over anything else a user keeps
    at that path (their own file that happens to be called profile.h5, a folder), and
    never into a FIFO or device (opening one would block or never end)."""
    refuse_special_output(final)
    for folder in (final.parent, *final.parent.parents):  # the first that exists
        if folder.exists():
            if not folder.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "a file, not a folder: a profile "
                                         "goes into a folder (or give a .h5 path)",
                                         str(folder))
            break
    if not (final.exists() or final.is_symlink()):
        return
    if final.is_dir() or not is_popviz_profile(final):
        what = "a folder" if final.is_dir() else "not a popviz profile"
        raise FileExistsError(errno.EEXIST, f"already there and {what}, so not replaced; "
                              "move it or write the profile elsewhere", str(final))
