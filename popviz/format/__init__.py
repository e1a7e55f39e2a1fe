"""The `.h5` profile format v1: writer, reader, schema (docs/profile-format.md)."""

from popviz.format.memory import ReportProfile
from popviz.format.profile import Profile
from popviz.format.reader import FileProfile, discover, open
from popviz.format.schema import FORMAT_NAME, FORMAT_VERSION
from popviz.format.writer import write_profile, write_report

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "FileProfile", "Profile", "ReportProfile", "discover",
           "open", "write_profile", "write_report"]
