"""Errors popviz raises at its boundaries."""


class ProfileError(Exception):
    """A profile cannot be read: missing, not HDF5, truncated, foreign, too new, damaged,
    lying about its sizes, or holding values outside the schema.

    The message is one line that names the file, the table where there is one, and the
    reason. Every failure of `popviz.open` and of a Profile's reads is this type.
    """
