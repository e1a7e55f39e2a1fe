"""docs/cost-model.md's calibration results, regenerated from the model: the table of the
fitted points (published, modelled, in-sample and leave-one-out error) and the table of
the points never fitted (documented misses and held-out figures, modelled with the fitted
constants). After a refit:

    python -m tooling.costdoc --write --results    # about a minute on 2 cores

`tests/test_calibration.py` checks the fitted table's modelled and in-sample cells against
the model, so a table left stale after a refit fails there.
"""

from __future__ import annotations

from typing import Any

FIT_HEADER = "| point | role | published | modelled | in sample | leave-one-out |"
OUT_HEADER = "| point | role | published | modelled | error |"


def _published(p: dict[str, Any]) -> str:
    return f"{p['value'] / 1e12:,.1f}" if p["kind"] == "bandwidth" else f"{p['value']:,.0f}"


def _modelled(p: dict[str, Any], value: float) -> str:
    return f"{value / 1e12:,.1f}" if p["kind"] == "bandwidth" else f"{value:,.1f}"


def _name(p: dict[str, Any]) -> str:
    return p["id"] + (" (documented miss)" if p.get("known_miss") else "")


def fitted_rows(points: list[dict[str, Any]]) -> list[str]:
    """One row per fitted point: published, modelled with the committed constants, the
    in-sample error and the error with the point left out of its own fit."""
    from popviz.target.costmodel import DEFAULT_COST, CostModel
    from tooling.calibration import Evaluator, leave_one_out

    fitted = [p for p in points if p.get("use") == "fit"]
    ev = Evaluator(fitted)
    inside = ev.errors(DEFAULT_COST)
    loo = leave_one_out(ev, fitted, CostModel())  # from the fit's own start, as the fit
    rows = [f"| {_name(p)} | fit | {_published(p)} | "
            f"{_modelled(p, ev.predict(p, DEFAULT_COST))} | {e:+.1%} | {lo:+.1%} |"
            for p, e, lo in zip(fitted, inside, loo, strict=True)]
    mean_in = sum(abs(e) for e in inside) / len(fitted)
    mean_out = sum(abs(e) for e in loo) / len(fitted)
    return [*rows, f"| **mean, {len(fitted)} fitted throughput points** | | | | "
            f"**{mean_in:.1%}** | **{mean_out:.1%}** |"]


def outside_rows(points: list[dict[str, Any]]) -> list[str]:
    """One row per throughput or bandwidth point never fitted: checks, then held out."""
    from popviz.target.costmodel import DEFAULT_COST
    from tooling.calibration import bandwidth, prepare

    rows = []
    for use in ("check", "holdout"):
        for p in points:
            if p.get("use") != use or p["kind"] not in ("throughput", "bandwidth"):
                continue
            got = bandwidth(p, DEFAULT_COST) if p["kind"] == "bandwidth" \
                else prepare(p).predict(DEFAULT_COST)
            rows.append(f"| {_name(p)} | {use} | {_published(p)} | {_modelled(p, got)} | "
                        f"{got / p['value'] - 1:+.1%} |")
    return rows


def replace_table(text: str, header: str, rows: list[str]) -> str:
    """`text` with the body of the table under `header` (every row up to its first line
    that is not one) replaced by `rows`."""
    if text.count(header) != 1:
        raise ValueError(f"docs/cost-model.md has {text.count(header)} tables headed "
                         f"{header!r}, not one")
    head, rest = text.split(header, 1)
    lines = rest.split("\n")
    # lines[0] is the header's own line end, lines[1] its |---| rule
    end = 2
    while end < len(lines) and lines[end].startswith("| "):
        end += 1
    return head + header + "\n".join([lines[0], lines[1], *rows, *lines[end:]])


def render_results(text: str) -> str:
    from tooling.calibration import load_points

    points = load_points()
    text = replace_table(text, FIT_HEADER, fitted_rows(points))
    return replace_table(text, OUT_HEADER, outside_rows(points))
