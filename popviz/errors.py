"""Errors popviz raises at its boundaries."""


class ProfileError(Exception):
    """A profile cannot be read: missing, not HDF5, truncated, foreign or too new.

    The message is one line that names the file and the reason.
    """
