"""popviz.vocab: one set of words and limits, used the same way by every view."""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz import vocab
from popviz.figures import lod
from popviz.metrics import rank_time


def test_unknown_kinds_are_compute_in_the_timeline_and_in_the_drawing() -> None:
    trace = pd.DataFrame({"ipu": [0, 0, 0], "start": [0, 4, 6], "end": [4, 6, 10],
                          "kind": ["memcpy", "compute", "idle"], "pass": ["", "B", ""]})
    codes = vocab.category_codes(trace["kind"], trace["pass"])
    assert [vocab.CATEGORIES[c] for c in codes] == ["compute", "backward", "idle"]
    # the drawing's legend keys name the same categories in the same order
    assert [lod.CATEGORIES[c] for c in lod.category_codes(trace)] == ["compute", "B", "idle"]
    t = rank_time(trace).iloc[0]
    assert (t["compute"], t["backward"], t["idle"]) == (4.0, 2.0, 4.0)


def test_device_names_and_kinds() -> None:
    assert vocab.ipu_label(np.int64(3)) == "IPU3" and vocab.rank_label(2.0) == "rank 2"
    assert vocab.naming_of("measured").label(1) == "rank 1"
    assert vocab.naming_of(meta={"kind": "modelled"}).label(1) == "IPU1"
    assert vocab.is_measured("measured") and not vocab.is_measured("modelled")
    assert not vocab.is_measured(None)


def test_thresholds_are_the_ones_the_views_use() -> None:
    from popviz.analysis import advice, advice_time
    from popviz.figures import stages

    assert advice.IMBALANCE_LIMIT is advice_time.IMBALANCE_LIMIT is vocab.IMBALANCE_LIMIT \
        == 1.15
    assert advice_time.BUBBLE_LIMIT is vocab.BUBBLE_LIMIT == 0.30
    assert stages.IMBALANCE_LIMIT is vocab.IMBALANCE_LIMIT
