"""Aligned plain-text tables, as every text reporter prints them."""

from __future__ import annotations

from collections.abc import Container, Sequence


def aligned(head: Sequence[str], rows: Sequence[Sequence[str]], right: Container[int],
            indent: str = "  ") -> list[str]:
    """`head` then `rows`, each column as wide as its widest cell; the columns in `right`
    right-aligned (numbers), the others left-aligned; no trailing blanks."""
    widths = [max(len(cell) for cell in column) for column in zip(head, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return (indent + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                                   for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
                ).rstrip()
    return [line(head), *(line(r) for r in rows)]

