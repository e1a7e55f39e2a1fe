"""Reporters: a command's result as the text it prints.

Every reporter has one method, `render(result) -> str` (pyinstrument's renderers, memray's
reporters): commands parse their flags, call analysis / advise / compile, and hand what
they got to the reporter the flags chose. Presentation options (how many rows, which terms
to name) are given to a reporter when it is made, never to the analysis.

    summary   SummaryText / SummaryJson   over a SummaryReport (facts of one or more profiles)
    compare   CompareText / CompareJson   over an analysis.compare.Comparison
              OpsText / OpsJson           over an analysis.compare.ops.OpDiff (--ops)
    tune      TuneText / TuneJson         over a TuneReport (advise.tune's TuneResult + what
                                          the command wrote)
"""

from __future__ import annotations

from typing import Protocol, TypeVar

Result = TypeVar("Result", contravariant=True)


class Reporter(Protocol[Result]):
    """What every reporter is: one result in, the text a command prints out."""

    def render(self, result: Result) -> str: ...
