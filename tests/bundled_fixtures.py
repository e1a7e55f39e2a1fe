"""The bundled example profiles most page and figure tests read: a measured run (ranks,
ns, no tiles) and a modelled pipeline (IPUs, cycles), each opened once per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import popviz

ROOT = Path(__file__).resolve().parents[1] / "profiles"
MEASURED_REL = "tutorial_measured_2ranks/profile.h5"
MODELLED_REL = "tutorial_pipelined/training/profile.h5"


@pytest.fixture(scope="module")
def measured() -> Iterator[Any]:
    with popviz.open(ROOT / MEASURED_REL) as profile:
        yield profile


@pytest.fixture(scope="module")
def modelled() -> Iterator[Any]:
    with popviz.open(ROOT / MODELLED_REL) as profile:
        yield profile
