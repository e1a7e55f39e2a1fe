"""Human-readable units shared by every layer (analysis text, figures, the CLI)."""

from __future__ import annotations

from collections.abc import Callable

KiB = 2**10
MiB = 2**20
GiB = 2**30


def fmt_bytes(value: float) -> str:
    """1536 -> '1.5 KiB'; binary units, one decimal, thousands separators."""
    value = float(value)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(value) >= size:
            return f"{value / size:,.1f} {unit}"
    return f"{value:,.0f} B"


def known_or(value: float, fmt: Callable[[float], str]) -> str:
    """`fmt(value)`, or 'unknown' where a profile does not record the figure (NaN)."""
    return "unknown" if value != value else fmt(value)  # NaN is the one value != itself


def count_of(n: object, word: str) -> str:
    """'1 rank', '4 IPUs': a count and its noun, plural unless one."""
    return f"{n} {word}" + ("" if n == 1 else "s")
