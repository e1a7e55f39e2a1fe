"""A profile may only make HDF5 read the file itself (issue: files outside DIR were served).

Each hostile file points at a secret outside the served folder through one HDF5 feature:
external raw storage, an external link, a virtual dataset, a soft link. `popviz.open`,
the home listing, every page and the CSV download must refuse it with a one-line
ProfileError and never show the secret."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
from popviz_app import create_app, render

import popviz
from popviz.format import write_report
from tests.dash_util import component_text
from tooling.testing.synthetic import synthetic_report

SECRET = b"root:x:0:0:SECRET-MARKER:/root:/bin/bash\n" * 8


def _add_column(h5: h5py.File, table: str, name: str, make: Callable[..., None]) -> None:
    group = h5["tables"][table]
    make(group, name, int(group.attrs["n_rows"]))
    order = [c.decode() for c in group.attrs["column-order"]]
    group.attrs["column-order"] = np.array([*order, name], dtype=object)


def _external_storage(secret: Path) -> Callable[[h5py.File], None]:
    def mutate(h5: h5py.File) -> None:
        def make(group: h5py.Group, name: str, rows: int) -> None:
            ds = group.create_dataset(name, shape=(rows,), dtype="u1",
                                      external=[(str(secret), 0, h5py.h5f.UNLIMITED)])
            ds.attrs["encoding"] = "numeric"
        _add_column(h5, "ops", "evil", make)
    return mutate


def _external_link(secret_h5: Path) -> Callable[[h5py.File], None]:
    def mutate(h5: h5py.File) -> None:
        del h5["tables"]["ops"]["op"]
        h5["tables"]["ops"]["op"] = h5py.ExternalLink(str(secret_h5), "/data")
    return mutate


def _virtual(secret_h5: Path) -> Callable[[h5py.File], None]:
    def mutate(h5: h5py.File) -> None:
        def make(group: h5py.Group, name: str, rows: int) -> None:
            layout = h5py.VirtualLayout(shape=(rows,), dtype="u1")
            layout[:min(rows, len(SECRET))] = h5py.VirtualSource(
                str(secret_h5), "/data", shape=(len(SECRET),))[:min(rows, len(SECRET))]
            group.create_virtual_dataset(name, layout, fillvalue=0)
            group[name].attrs["encoding"] = "numeric"
        _add_column(h5, "ops", "evil", make)
    return mutate


def _soft_loop(_: Path) -> Callable[[h5py.File], None]:
    def mutate(h5: h5py.File) -> None:
        h5["loop_a"] = h5py.SoftLink("/loop_b")
        h5["loop_b"] = h5py.SoftLink("/loop_a")
    return mutate


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    base = tmp_path_factory.mktemp("hostile")
    outside = base / "outside"
    outside.mkdir()
    secret = outside / "passwd"
    secret.write_bytes(SECRET)
    secret_h5 = outside / "secret.h5"
    with h5py.File(secret_h5, "w") as f:
        f["data"] = np.frombuffer(SECRET, dtype="u1")
    served = base / "served"
    clean = served / "clean" / "profile.h5"
    write_report(synthetic_report(num_ipus=1, events=200, steps=40, seed=1), clean)
    makers = {"external_storage": _external_storage(secret),
              "external_link": _external_link(secret_h5),
              "virtual": _virtual(secret_h5), "soft_loop": _soft_loop(secret)}
    rels = {}
    for name, mutate in makers.items():
        target = served / name / "profile.h5"
        target.parent.mkdir(parents=True)
        shutil.copy(clean, target)
        with h5py.File(target, "r+") as h5:
            mutate(h5)
        rels[name] = f"{name}/profile.h5"
    return served, rels


REASONS = {"external_storage": "external file", "external_link": "external link",
           "virtual": "virtual dataset", "soft_loop": "soft link"}


@pytest.mark.parametrize("name", sorted(REASONS))
def test_open_refuses_a_profile_that_reads_outside_itself(hostile, name) -> None:
    served, rels = hostile
    with pytest.raises(popviz.ProfileError) as caught:
        popviz.open(served / rels[name])
    text = str(caught.value)
    assert "\n" not in text and REASONS[name] in text and "refused" in text


def test_the_same_feature_is_readable_by_plain_h5py(hostile) -> None:
    """The hostile files really do reach the secret: the refusal is what protects."""
    served, rels = hostile
    with h5py.File(served / rels["external_storage"], "r") as h5:
        assert bytes(h5["tables/ops/evil"][()][:20]) == SECRET[:20]


def test_served_pages_and_downloads_never_show_the_secret(hostile) -> None:
    served, rels = hostile
    app = create_app(served)
    client = app.server.test_client()
    listing = {r["profile"]: r for r in app.popviz_context.cache.listing()}
    for name, rel in rels.items():
        assert "refused" in listing[rel]["error"], name
        for table in ("ops", "trace", "stages"):
            response = client.get(f"/download/csv/{table}?profile={rel}")
            assert response.status_code == 404
            assert b"SECRET-MARKER" not in response.data
        for page in ("/operations", "/summary", "/trace"):
            parts = render(app.popviz_context, page, f"?profile={rel}")
            text = " ".join(component_text(part) for part in parts)
            assert "refused" in text and "SECRET-MARKER" not in text
    ok = client.get("/download/csv/ops?profile=clean/profile.h5")
    assert ok.status_code == 200 and b"op_id" in ok.data
