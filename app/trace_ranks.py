"""Which ranks /trace draws for an import of many: the lanes of at most MAX_RANKS (1,024
ranks' lanes are ~6,000 rows and seconds to build, each rank a fraction of a pixel high),
the first ones until others are picked; a link to one rank's range brings that rank in."""

from __future__ import annotations

from dash import dcc, html

from .cache import Entry
from .common import naming

MAX_RANKS = 16


def rank_count(entry: Entry) -> int:
    return entry.get("rank_count", lambda: int(entry.profile.trace["ipu"].nunique()))


def all_ranks(entry: Entry) -> list[int]:
    return entry.get("ranks", lambda: sorted(int(r) for r in entry.profile.trace["ipu"]
                                             .unique()))


def default_ranks(entry: Entry, lanes: bool) -> list[int] | None:
    """The ranks an import with thread lanes (`lanes`) of more than MAX_RANKS ranks opens
    on (the first ones), else None: every rank."""
    if not lanes or rank_count(entry) <= MAX_RANKS:
        return None
    return all_ranks(entry)[:MAX_RANKS]


def drawn_ranks(entry: Entry, lanes: bool, picked: list | None,
                linked: int | None = None) -> list[int] | None:
    """The ranks to draw: those picked (ranks of the profile; past MAX_RANKS the last
    picked), else the default; a linked rank joins them. None: every rank."""
    default = default_ranks(entry, lanes)
    if default is None:
        return None
    ranks = set(all_ranks(entry))
    valid = [r for r in picked or [] if isinstance(r, int) and r in ranks]
    chosen = sorted(list(dict.fromkeys(valid))[-MAX_RANKS:]) or default
    if linked is not None and linked in ranks and linked not in chosen:
        chosen = sorted([*chosen[:MAX_RANKS - 1], linked])
    return chosen


def rank_picker(entry: Entry, shown: list[int] | None) -> html.Div:
    """The ranks drawn, for an import of more than MAX_RANKS (hidden otherwise: the
    callbacks read its value either way)."""
    if shown is None:
        return html.Div(dcc.Dropdown(id="trace-ranks", multi=True, value=None),
                        style={"display": "none"})
    words = naming(entry)
    return html.Div([
        html.P(f"{rank_count(entry):,} {words.devices}: the lanes of {len(shown)} are drawn "
               f"(at most {MAX_RANKS}: past that, the last picked); pick others below. The "
               "statistics under the trace and Find cover every rank; /stages has each "
               "rank's share of the step and the stragglers.", id="trace-ranks-note",
               className="hint"),
        dcc.Dropdown(id="trace-ranks", multi=True, value=shown, className="picker",
                     options=[{"label": words.label(r), "value": r}
                              for r in all_ranks(entry)])],
        className="controls")
