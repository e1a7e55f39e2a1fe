"""The app's pages, in menu order. Each module defines PATH, TITLE, NEEDS_PROFILE,
FIGURES (view name -> builder, for HTML downloads), layout(ctx, entry) and
register(app, ctx) -> {name: callback function}. Adding a page is one line here."""

from . import (
    compare,
    exchange,
    home,
    liveness,
    memory,
    operations,
    stages,
    summary,
    trace,
    tree,
    tune,
)

PAGES = [home, summary, trace, liveness, memory, stages, exchange, operations, tree, tune,
         compare]
