"""Issue 22: temporary files are popviz's own, exactly; read-only commands delete nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from popviz_app import create_app

import popviz
from popviz.cli.main import main
from popviz.format import schema, tempfiles
from tests.test_format import write_tiny

ROOT = Path(__file__).resolve().parents[1]
CSV = b"step,loss\n1,0.5\n2,0.25\n"
OLD = 10 * 24 * 3600  # ten days: well past STALE_AFTER_S


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _aged(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    when = time.time() - OLD
    os.utime(path, (when, when))
    return path


def _user_files(folder: Path, dead: int) -> dict[Path, bytes]:
    """Files people keep that look like temporary files, with dead-pid numbers, old."""
    marker = schema.TEMP_MARKER
    files = {
        folder / "results.tmp-20240101-final.csv": CSV,  # the two files lost in issue 22
        folder / "model.tmp-4000000-v2.h5": tempfiles.HDF5_SIGNATURE + b"keras",
        folder / "x.tmp-1-2-abcd1234": CSV,
        folder / f"profile.h5.tmp-{dead}-1-abcd1234": CSV,  # the old popviz form, not ours
        folder / f"notes.txt{marker}{dead}-1-abcd1234": CSV,  # our marker, not HDF5
        folder / f"p.h5{marker}{dead}-1-abcd1234.bak": tempfiles.HDF5_SIGNATURE,  # not anchored
        folder / f"p.h5{marker}{dead}-1-ABCD1234": tempfiles.HDF5_SIGNATURE,  # not our token
        folder / f"{marker}{dead}-1-abcd1234": b"",  # no final name before the marker
    }
    for path, content in files.items():
        _aged(path, content)
    return files


def _assert_intact(files: dict[Path, bytes]) -> None:
    for path, content in files.items():
        assert path.read_bytes() == content, path.name


@pytest.mark.parametrize("name, temp", [
    ("profile.h5.popviz-tmp-123-140234-0a1b2c3d", True),
    ("trace.json.popviz-tmp-9-1-ffffffff", True),
    ("profile.h5.tmp-123-140234-0a1b2c3d", True),  # old writers': skipped, never removed
    ("profile.h5.tmp-123", True),
    ("results.tmp-20240101-final.csv", False),
    ("model.tmp-4000000-v2.h5", False),
    ("x.tmp-1-2-abcd1234", False),
    ("profile.h5.popviz-tmp-0-1-0a1b2c3d", False),  # pid 0 is no process
    ("profile.h5.popviz-tmp-1-1-0a1b2c3", False),
    ("profile.h5.popviz-tmp-1-1-0a1b2c3d.h5", False),
])
def test_temp_names_are_exact(name: str, temp: bool) -> None:
    assert tempfiles.is_temp_name(name) is temp


def test_read_only_commands_delete_nothing(tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "runs"
    write_tiny(folder / "run")
    dead = _dead_pid()
    files = {**_user_files(folder, dead), **_user_files(folder / "run", dead)}
    ours = _aged(folder / "run" / f"profile.h5{schema.TEMP_MARKER}{dead}-7-0a1b2c3d",
                 tempfiles.HDF5_SIGNATURE)
    files[ours] = tempfiles.HDF5_SIGNATURE  # even popviz's own: only a writer removes it

    listed = [p.relative_to(folder).as_posix() for p in popviz.discover(folder)]
    assert listed == ["model.tmp-4000000-v2.h5", "run/model.tmp-4000000-v2.h5",
                      "run/profile.h5"]
    rows = create_app(folder, vetter=False).popviz_context.cache.listing()  # serve's view
    assert sorted(r["profile"] for r in rows) == listed
    main(["summary", str(folder)])  # refuses the keras file; deletes nothing either way
    assert main(["summary", str(folder / "run" / "profile.h5")]) == 0
    capsys.readouterr()
    _assert_intact(files)


DEAD_WRITER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from pathlib import Path
    import h5py
    from popviz.format import tempfiles
    temp = tempfiles.temp_name(Path(sys.argv[1]))
    h5 = h5py.File(temp, "w")
    h5.attrs["half"] = "a profile"
    h5.flush()
    print(temp, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_dead_writers_temp_file_is_cleaned_by_the_next_writer(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    proc = subprocess.run([sys.executable, "-c", DEAD_WRITER.format(root=str(ROOT)),
                           str(folder / "profile.h5")], capture_output=True, text=True,
                          timeout=60)
    temp = Path(proc.stdout.strip())
    assert proc.returncode == -9 and temp.parent == folder and temp.exists()
    user = _user_files(folder, _dead_pid())
    write_tiny(folder)
    assert temp.exists()  # under a minute old: its writer may live in another namespace
    when = time.time() - OLD
    os.utime(temp, (when, when))
    popviz.discover(folder)
    assert temp.exists()  # discovery only skips it
    write_tiny(folder)
    assert not temp.exists()
    _assert_intact(user)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["profile.h5", *(p.name for p in user)])


def test_a_link_named_like_a_temp_file_is_left_alone(tmp_path: Path) -> None:
    target = _aged(tmp_path / "precious.h5", tempfiles.HDF5_SIGNATURE)
    link = tmp_path / "run" / f"profile.h5{schema.TEMP_MARKER}{_dead_pid()}-1-0a1b2c3d"
    link.parent.mkdir()
    link.symlink_to(target)
    os.utime(link, (time.time() - OLD,) * 2, follow_symlinks=False)
    write_tiny(link.parent)
    assert link.is_symlink() and target.read_bytes() == tempfiles.HDF5_SIGNATURE
