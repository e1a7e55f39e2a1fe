"""Refuse a profile that would make HDF5 read anything but the file itself.

HDF5 can follow external links to other files, store a dataset's bytes in external raw
files (`create_dataset(..., external=[...])`), assemble virtual datasets from other
files, and resolve soft links (which may loop). A served profile could use any of these
to show the server's files (`/etc/passwd`) on a page or in a CSV download, so a profile
may hold only hard links to groups and datasets whose layout is contiguous, chunked or
compact, with no external storage and only the filters the writer uses. This walks the
link structure and the dataset creation properties: no data is read.
"""

from __future__ import annotations

import h5py

from popviz.errors import ProfileError

_LAYOUTS = {h5py.h5d.CONTIGUOUS: "contiguous", h5py.h5d.CHUNKED: "chunked",
            h5py.h5d.COMPACT: "compact"}
# deflate (gzip), shuffle, fletcher32, and h5py's built-in lzf: nothing loads a plugin.
_FILTERS = {h5py.h5z.FILTER_DEFLATE, h5py.h5z.FILTER_SHUFFLE, h5py.h5z.FILTER_FLETCHER32,
            h5py.h5z.FILTER_LZF}
MAX_OBJECTS = 100_000  # far more than any profile holds; a bigger tree is not ours


def check_self_contained(h5: h5py.File, label: str) -> None:
    """Raise ProfileError unless every object reachable in `h5` lives in the file itself.

    `label` names the file in the message (the caller decides how much path to show)."""
    problems: list[str] = []
    count = 0

    def visit(name: str, link: object) -> bool | None:
        """A problem stops the walk (visititems_links ends on a non-None return)."""
        nonlocal count
        count += 1
        if count > MAX_OBJECTS:
            raise ProfileError(f"{label}: refused (more than {MAX_OBJECTS:,} objects)")
        if isinstance(link, h5py.ExternalLink):
            problems.append(f"'{name}' is an external link to another file")
        elif isinstance(link, h5py.SoftLink):
            problems.append(f"'{name}' is a soft link")
        elif not isinstance(link, h5py.HardLink):
            problems.append(f"'{name}' is a link of an unknown class")
        else:
            obj = h5.get(name)
            if isinstance(obj, h5py.Dataset):
                reason = _dataset_problem(obj)
                if reason:
                    problems.append(f"'{name}' {reason}")
        return True if problems else None

    try:
        h5.visititems_links(visit)
    except ProfileError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ProfileError(f"{label}: damaged profile (cannot walk its objects: {text})") \
            from None
    if problems:
        raise ProfileError(f"{label}: refused: {problems[0]}; a profile must hold only its "
                           "own data")


def _dataset_problem(dataset: h5py.Dataset) -> str:
    plist = dataset.id.get_create_plist()
    layout = plist.get_layout()
    if layout not in _LAYOUTS:
        kind = "a virtual dataset" if layout == getattr(h5py.h5d, "VIRTUAL", -1) \
            else f"of an unknown layout ({layout})"
        return f"is {kind}"
    if plist.get_external_count() > 0:
        return "keeps its data in an external file"
    for k in range(plist.get_nfilters()):
        code = plist.get_filter(k)[0]
        if code not in _FILTERS:
            return f"uses an unknown filter ({code})"
    return ""
