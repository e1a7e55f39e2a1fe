"""argparse `type=` functions shared by the commands (cli/ and popviz.measure; a leaf
module): a bad value is refused while parsing, in one line naming the flag (`popviz
<command>: error: argument --top: ...`, exit 2)."""

from __future__ import annotations

import argparse


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def positive_int(text: str) -> int:
    """A count that must be at least 1 (`--top -5` would list nothing, or everything)."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value



def non_empty_path(text: str) -> str:
    """A path that is not empty: "" would otherwise act as the current folder (`export
    --to ""` writing its CSVs there)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; give a file or folder ('.' for "
                                         "the current folder)")
    return text


def non_negative_int(text: str) -> int:
    """A count where 0 has a meaning of its own (`compare --ops --top 0`: every row)."""
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value
