"""The pair of profiles /compare shows: read from the URL, written back to it, and their
comparison built once per pair (shared by the page and its op-by-op part)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode

from popviz.analysis.compare import Comparison, compare
from popviz.analysis.compare.verdict import JUDGES

from ..cache import Entry


def pair_of(search: str | None) -> tuple[str, str]:
    """(profile, other) from a URL search string ('' when absent)."""
    q = parse_qs((search or "").lstrip("?"))
    return (q.get("profile", [""])[0], q.get("other", [""])[0])


def asked_judge(search: str | None) -> str:
    """The `&judge=` of a URL search string as typed ('' when absent)."""
    return parse_qs((search or "").lstrip("?")).get("judge", [""])[0]


def judge_of(search: str | None) -> str | None:
    """The question the verdict answers (`&judge=total|per-device`), None for both; an
    unknown value is ignored (a shared link from elsewhere must not break the page)."""
    value = asked_judge(search)
    return value if value in JUDGES else None


def pair_query(a: str, b: str, judge: str | None = None) -> str:
    return "?" + urlencode({k: v for k, v in (("profile", a), ("other", b),
                                              ("judge", judge or "")) if v})


def comparison(a: Entry, b: Entry, judge: str | None = None) -> Comparison:
    """Built once per pair of files and question (kept with A's cached entry). Keyed by
    B's file stamp, not by B's entry: B is evicted and reopened as other profiles are
    looked at, and a key per reopening grew A's entry without bound."""
    return a.get(("compare", b.rel, b.stamp or id(b), judge),
                 lambda: compare(a.profile, b.profile, judge))
