"""Issue 33: the pages of a job of many ranks draw a few. /liveness draws the panels of the
ranks with the highest peaks and says which; /trace draws the lanes of the first ranks,
others when picked, and brings in the rank a link points at; the whole run's span, the
statistics and Find still cover every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import popviz_app.trace_ranks as trace_ranks
import pytest
from popviz_app import create_app, render
from popviz_app.pages import liveness as liveness_page
from popviz_app.pages import trace as trace_page

import popviz
from popviz.metrics import peak_liveness
from tests.bench_util import load_bench
from tests.dash_util import component_text

RANKS = 12
SHOWN = 4  # the pages' caps, lowered so a small job is "many ranks"
SEARCH = "?profile=job/profile.h5"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("many")
    paths = load_bench("bench_import").write_traces(root / "traces", RANKS, 600)
    popviz.import_trace(paths, root / "job")
    return root


@pytest.fixture()
def app(root: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(liveness_page, "MAX_PANELS", SHOWN)
    monkeypatch.setattr(trace_ranks, "MAX_RANKS", SHOWN)
    return create_app(root, vetter=False)


def test_liveness_draws_the_fullest_ranks_and_names_them(app: Any, root: Path) -> None:
    ctx = app.popviz_context
    text = component_text(render(ctx, "/liveness", SEARCH)[1])
    with popviz.open(root / "job" / "profile.h5") as profile:
        peaks = peak_liveness(profile.liveness)
    fullest = sorted(int(i) for i in peaks.sort_values(ascending=False, kind="stable")
                     .index[:SHOWN])
    entry = ctx.cache.get("job/profile.h5")
    fig = liveness_page.liveness(ctx, entry)
    titles = [a.text for a in fig.layout.annotations if a.text.startswith("rank ")]
    assert titles == [f"rank {r}" for r in fullest]
    assert f"{RANKS} ranks: the {SHOWN} with the highest peak are drawn" in text
    assert all(f"rank {r}" in text for r in fullest)


def test_liveness_of_few_ranks_draws_them_all(root: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = create_app(root, vetter=False).popviz_context  # MAX_PANELS 16 > 12 ranks
    fig = liveness_page.liveness(ctx, ctx.cache.get("job/profile.h5"))
    assert sum(a.text.startswith("rank ") for a in fig.layout.annotations) == RANKS
    assert "highest peak are drawn" not in component_text(render(ctx, "/liveness", SEARCH)[1])


def test_trace_draws_the_first_ranks_then_the_picked_ones(app: Any) -> None:
    ctx, cb = app.popviz_context, app.popviz_callbacks
    page = render(ctx, "/trace", SEARCH)[1]
    text = component_text(page)
    assert f"{RANKS} ranks: the lanes of {SHOWN} are drawn" in text
    entry = ctx.cache.get("job/profile.h5")
    opening = trace_page.trace(ctx, entry, ranks=trace_ranks.default_ranks(entry, True))
    assert opening.layout.meta["ranks"] == list(range(SHOWN))
    assert {row.split(" · ")[0] for row in opening.layout.meta["rows"] if " · " in row} \
        == {f"rank {r}" for r in range(SHOWN)}
    run = trace_page.trace(ctx, entry).layout.meta["range"]  # every rank's lanes
    whole, *_ = cb["trace.zoom"]({"xaxis.autorange": True}, SEARCH, "flame", None)
    assert whole.layout.meta["range"] == run and whole.layout.meta["ranks"] == \
        list(range(SHOWN))  # the run's span, not the drawn ranks' own
    picked, status = cb["trace.ranks"]([11, 7, 99, "x", 7], "flat", {"range": list(run)},
                                       SEARCH)
    assert picked.layout.meta["ranks"] == [7, 11]  # not a rank of the job: dropped
    assert status.endswith("(flat layout).")
    over, _ = cb["trace.ranks"]([*range(SHOWN), 10], "flame", {"range": list(run)}, SEARCH)
    assert over.layout.meta["ranks"] == [1, 2, 3, 10]  # at most the cap: the last picked


def test_a_link_to_a_rank_not_drawn_brings_it_in(app: Any) -> None:
    cb = app.popviz_callbacks
    fig, _, window, *_ = cb["trace.focus"](None, SEARCH + "&t0=1000&t1=5000&ipu=9", None)
    assert 9 in fig.layout.meta["ranks"] and len(fig.layout.meta["ranks"]) == SHOWN
    assert window["range"] == fig.layout.meta["range"]


def test_a_big_exchange_matrix_is_drawn_in_blocks_of_ranks() -> None:
    """1,024 ranks' matrix: a million cells, most under a pixel (Chromium drew it in 18 s
    and it looked empty); now 64 blocks of 16 consecutive ranks a side, each the sum of
    its cells, the host kept apart. A small one is drawn rank by rank."""
    import numpy as np
    import pandas as pd

    from popviz.figures.exchange import LABELLED_CELLS, exchange_matrix_figure
    from popviz.vocab import MEASURED, MODELLED

    def matrix(n: int) -> pd.DataFrame:
        labels = [f"IPU{i}" for i in range(n)] + ["host"]
        values = np.arange((n + 1) ** 2, dtype=np.int64).reshape(n + 1, n + 1) * 1024
        return pd.DataFrame(values, index=labels, columns=labels)

    full = matrix(1024)
    big = exchange_matrix_figure(full, naming=MODELLED)
    heat = big.data[0]
    assert list(heat.y[:2]) == ["IPU0–15", "IPU16–31"] and heat.y[-1] == "host"
    assert len(heat.y) == LABELLED_CELLS + 1 and "in blocks of 16" in big.layout.title.text
    scale = float(full.to_numpy()[:1024, :1024].reshape(64, 16, 64, 16).sum(axis=(1, 3))
                  .max()) / float(np.nanmax(np.asarray(heat.z, dtype=float)[:64, :64]))
    z = np.asarray(heat.z, dtype=float) * scale  # back to bytes
    want = full.to_numpy(dtype=float)
    assert z[1, 2] == want[16:32, 32:48].sum()
    assert z[64, 3] == want[1024, 48:64].sum() and z[64, 64] == want[1024, 1024]
    assert z.sum() == want.sum()
    ranks = exchange_matrix_figure(matrix(65).drop(index="host", columns="host"),
                                   naming=MEASURED)
    assert ranks.data[0].y[0] == "rank 0–1" and len(ranks.data[0].y) == 33
    small = exchange_matrix_figure(matrix(4), naming=MEASURED)
    assert list(small.data[0].y) == ["rank 0", "rank 1", "rank 2", "rank 3", "host"]
    assert small.data[0].text is not None and small.data[0].customdata is not None


def test_between_stages_of_a_big_job_in_blocks_and_timed_without_bytes() -> None:
    """200 stages: blocks of 4; a job whose links carry no bytes (collectives only) is
    coloured by time on the wire instead of drawn blank."""
    import numpy as np
    import pandas as pd

    from popviz.figures.exchange import stage_links_figure

    stages = np.arange(200)
    links = pd.DataFrame({"src_stage": stages, "dst_stage": stages, "kind": "collective",
                          "transfers": 2, "bytes": 0, "transfer_ns": 1000 * (stages + 1),
                          "receiver_wait_ns": 0, "sender_wait_ns": 0})
    fig = stage_links_figure(links)
    heat = fig.data[0]
    assert heat.x[0] == "stages 0–3" and heat.x[-1] == "stages 196–199" and len(heat.x) == 50
    assert "ms on the wire, no bytes" in fig.layout.title.text
    assert "blocks of 4" in fig.layout.title.text
    z = np.asarray(heat.z, dtype=float)
    assert z[0, 0] * 1e6 == 1000 + 2000 + 3000 + 4000 and np.isnan(z[0, 1])
    assert "stages 0–3 → stages 0–3" in heat.customdata[0][0]
    assert "collective: 8 ×" in heat.customdata[0][0]
