"""Issue 22: a vetted profile swapped for a hostile file of the same size, with the old
mtime set back (`os.utime(ns=...)`) and `os.replace`d in, is vetted again, and a swap
between vetting and opening is refused: verdicts are keyed by inode and ctime too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from popviz_app.cache import ProfileCache

from popviz.cli import vetcache
from popviz.cli.main import main
from popviz.errors import ProfileError
from popviz.format import write_report
from popviz.vet import Verdict, Vetter, stamp_of, vet
from tooling.testing.synthetic import synthetic_report

# popviz.open succeeds on it, then reading its tables kills the process with SIGSEGV
FLIPPED = Path(__file__).parent / "data" / "flipped_segv.h5"


def _good(path: Path, seed: int = 3) -> Path:
    # 20,000 events: a little larger than FLIPPED, which is padded to the same size
    return write_report(synthetic_report(num_ipus=2, events=20_000, steps=30, seed=seed),
                        path)


def _swap_in(victim: Path, content: bytes) -> None:
    """Replace `victim` with `content` (same size) under its old atime and mtime."""
    before = victim.stat()
    assert len(content) == before.st_size
    temp = victim.with_name("swap.part")
    temp.write_bytes(content)
    os.utime(temp, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(temp, victim)
    after = victim.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def _hostile(size: int) -> bytes:
    data = FLIPPED.read_bytes()
    assert len(data) <= size
    return data + bytes(size - len(data))  # trailing zeros: still a 1.0 file


def test_stamp_tells_a_swapped_file_from_the_vetted_one(tmp_path: Path) -> None:
    good = _good(tmp_path / "run" / "profile.h5")
    stamp = stamp_of(good)
    _swap_in(good, good.read_bytes())  # even the same bytes: another file now
    assert stamp_of(good) != stamp
    assert stamp_of(good)[:1] == stamp[:1]  # same path


def test_summary_vets_a_swapped_file_again(tmp_path: Path) -> None:
    good = _good(tmp_path / "run" / "profile.h5")
    hostile = _hostile(good.stat().st_size)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))

    def summary() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "popviz.cli.main", "summary",
                               str(good)], env=env, capture_output=True, text=True,
                              timeout=120)

    assert summary().returncode == 0  # vetted, verdict cached
    _swap_in(good, hostile)
    proc = summary()
    assert proc.returncode == 1, (proc.returncode, proc.stderr)  # not the cached 'ok'
    lines = proc.stderr.strip().splitlines()
    # the swapped-in bytes are a 1.0 file that crashed libhdf5: vetted again, it is refused
    # by its version before a table is read
    assert len(lines) == 1 and lines[0].startswith(f"popviz: error: {good}: profile format "
                                                   "1.0.0") and "regenerate" in lines[0]


def test_a_swap_between_vetting_and_opening_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    good = _good(tmp_path / "run" / "profile.h5")
    other = _good(tmp_path / "other.h5", seed=4)
    real = vetcache.cached_verdict

    def vet_then_swap(path: Path, stamp: Any = None) -> Verdict:
        verdict = real(path, stamp)
        os.replace(other, good)  # after the verdict, before the open
        return verdict

    monkeypatch.setattr(vetcache, "cached_verdict", vet_then_swap)
    assert main(["export", str(good), "--to", str(tmp_path / "csv")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"popviz: error: {good}: changed or replaced while it was being " \
                  "checked; try again"
    assert not (tmp_path / "csv").exists()


def test_the_app_vets_a_swapped_file_again_and_checks_what_it_opens(tmp_path: Path) -> None:
    root = tmp_path / "served"
    good = _good(root / "run" / "profile.h5")
    vetter = Vetter()
    try:
        assert ProfileCache(root, vetter=vetter).get("run/profile.h5").profile.meta
        assert vetter.vettings == 1
        _swap_in(good, b"x" * good.stat().st_size)  # not HDF5: refused, never crashes here
        with pytest.raises(ProfileError, match="not an HDF5 file"):
            ProfileCache(root, vetter=vetter).get("run/profile.h5")  # a restarted cache
        assert vetter.vettings == 2  # the old verdict did not vouch for the new bytes
    finally:
        vetter.close()

    # a folder named in the URL (as the CLI takes it) is its profile file, vetted as such:
    # a folder's stamp never matches the file HDF5 opens ("changed or replaced" forever)
    vetter = Vetter()
    try:
        good.unlink()  # the x-bytes above: a writer never replaces what is not a profile
        _good(good)
        assert ProfileCache(root, vetter=vetter).get("run").profile.meta
        _good(root / "two" / "a.h5")
        _good(root / "two" / "b.h5", seed=4)
        with pytest.raises(ProfileError, match="two: holds 2 profiles"):
            ProfileCache(root, vetter=vetter).get("two")
    finally:
        vetter.close()

    class SwapsAfterVetting:
        def vetted(self, path: Path, wait_s: float | None = None) -> tuple[Any, Verdict]:
            stamp = stamp_of(path)
            _good(tmp_path / "other.h5", seed=5).replace(path)
            return stamp, Verdict(True)

    _good(good)
    with pytest.raises(ProfileError, match="changed or replaced while it was being checked"):
        ProfileCache(root, vetter=SwapsAfterVetting()).get("run/profile.h5")  # type: ignore[arg-type]


def test_the_hostile_file_does_crash_a_worker(tmp_path: Path) -> None:
    """The padded file really is hostile (what the summary test relies on)."""
    path = tmp_path / "hostile.h5"
    path.write_bytes(_hostile(FLIPPED.stat().st_size + 4096))
    assert not vet(path).ok
