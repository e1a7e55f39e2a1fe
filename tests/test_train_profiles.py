"""The committed example profiles in profiles/ are the ones scripts/make_profiles.py makes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import popviz

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_profiles",
                                               ROOT / "scripts" / "make_profiles.py")
assert _spec is not None and _spec.loader is not None
make_profiles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_profiles)


def _files(name: str) -> list[Path]:
    return sorted((ROOT / "profiles" / name).rglob("profile.h5"))


@pytest.mark.parametrize("name", sorted(make_profiles.PROFILES))
def test_committed_profile_matches_its_command(name: str) -> None:
    files = _files(name)
    expected = 2 if name.startswith("tutorial") else 1  # training/ and inference/
    assert len(files) == expected, files
    for path in files:
        prof = popviz.open(path)
        # written by this script's train.py command (plan mode, into this folder)
        args = " ".join(make_profiles.PROFILES[name])
        assert prof.command_line.startswith(f"train.py {args} --plan-only"), name
        assert f"--profile-dir profiles/{name}" in prof.command_line
        assert (prof.ops["host_ns"] == 0).all()
        assert prof.summary["fits"] in (True, False)


def test_published_layouts() -> None:
    pipe = popviz.open(ROOT / "profiles" / "rn50_pipeline")
    assert pipe.meta["options"]["splits"] == ["b1/2/relu", "b2/3/relu", "b3/3/relu"]
    assert pipe.stages["ipu"].tolist() == [0, 1, 2, 3]
    rec = popviz.open(ROOT / "profiles" / "rn50_recompute")
    assert rec.meta["options"]["splits"] == make_profiles.RN50_CHECKPOINTS
    assert rec.meta["options"]["recomputation"] is True
    assert set(rec.stages["ipu"]) == {0}
    rx = popviz.open(ROOT / "profiles" / "resnext101_inference_mk1")
    assert rx.meta["target"]["name"] == "mk1"
    assert rx.meta["options"]["training"] is False
    # published: ResNeXt-101 (32x4d) FP16 inference fits one Mk1 IPU (docs/hardware.md)
    assert rx.summary["fits"] is True
    sharded = popviz.open(ROOT / "profiles" / "tutorial_sharded" / "training")
    assert sharded.meta["options"]["strategy"] == "sharded"
    # the folder stays small enough to commit
    total = sum(p.stat().st_size for p in (ROOT / "profiles").rglob("*.h5"))
    assert total < 10e6


def _modelled_files() -> list[Path]:
    return [p for p in sorted((ROOT / "profiles").rglob("profile.h5"))
            if popviz.open(p).kind == "modelled"]


def test_every_modelled_example_is_there() -> None:
    # 4 single profiles + 2 x (training, inference): a missing file fails, not skips
    assert len(_modelled_files()) == 8


@pytest.mark.parametrize("path", _modelled_files(), ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_committed_profile_adds_up(path: Path) -> None:
    """The independent check beside the golden comparison below: facts any correct
    compile must satisfy, worked from the raw tables without popviz's analysis."""
    p = popviz.open(path)
    s, target = p.summary, p.meta["target"]
    step = int(s["step_cycles"])
    # each IPU's trace tiles [0, step] exactly: no gap, no overlap (BSP)
    for _ipu, t in p.trace.sort_values(["ipu", "start"]).groupby("ipu"):
        assert t["start"].iloc[0] == 0 and t["end"].iloc[-1] == step
        assert (t["start"].to_numpy()[1:] == t["end"].to_numpy()[:-1]).all()
    # the stage columns of each IPU partition its step
    cols = ["forward_cycles", "backward_cycles", "recompute_cycles", "optimiser_cycles",
            "exchange_cycles", "idle_cycles"]
    assert (p.stages.groupby("ipu")[cols].sum().sum(axis=1) == step).all()
    # throughput is samples over the step's seconds at the target's clock
    seconds = step / float(target["clock_hz"])
    assert s["throughput"] == pytest.approx(s["samples_per_step"] / seconds, rel=1e-12)
    # a tile's total is the sum of its categories, and fit is "no tile over capacity"
    tm = p.tile_memory
    cats = ["code", "always_live", "not_always_live_peak", "exchange", "vertex_state"]
    assert (tm[cats].sum(axis=1) == tm["total_bytes"]).all()
    assert s["fits"] == bool((tm["total_bytes"] <= tm["capacity_bytes"]).all())
    assert len(tm) == target["num_ipus"] * target["tiles_per_ipu"]


@pytest.mark.parametrize("path", _modelled_files(), ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_committed_profile_is_current(path: Path) -> None:
    """Recompiling each example's stored program with its stored options reproduces every
    table and the summary: a change to the cost model or the compiler that forgets
    `make profiles` fails here."""
    import pandas as pd

    from popviz.advise.tune import load_program

    stored = popviz.open(path)
    program, options = load_program(stored)
    again = popviz.compile(program, options)
    for name in ("stages", "trace", "liveness", "tile_memory", "exchange", "ops", "variables"):
        pd.testing.assert_frame_equal(again.tables[name].reset_index(drop=True),
                                      stored.table(name), check_dtype=False,
                                      obj=f"{path.parent.name}: {name}")
    assert again.summary == stored.summary
