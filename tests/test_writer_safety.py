"""Writes (issue 10): unique temporary names, stale ones removed, Ctrl-C, one run a folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import popviz
from popviz.format import schema, tempfiles
from popviz.format.folder_lock import LOCK_NAME, FolderInUse, hold_folder
from tests.test_format import write_tiny

ROOT = Path(__file__).resolve().parents[1]


def test_threads_writing_one_profile_never_collide(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def write() -> None:
        try:
            write_tiny(tmp_path / "run")
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["profile.h5"]
    assert popviz.open(tmp_path / "run").table("stages").shape[0] == 2


def test_temp_names_are_unique() -> None:
    final = Path("/x/profile.h5")
    names = {tempfiles.temp_name(final) for _ in range(100)}
    assert len(names) == 100
    pid = str(os.getpid())
    assert all(n.name.startswith(f"profile.h5{schema.TEMP_MARKER}{pid}-") for n in names)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _temp(folder: Path, pid: int, age_s: float, suffix: str = "-1-abcd0123") -> Path:
    """A writer's temporary file as a killed writer leaves it: an HDF5 signature first."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"profile.h5{schema.TEMP_MARKER}{pid}{suffix}"
    path.write_bytes(tempfiles.HDF5_SIGNATURE + b"half a profile")
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


def test_stale_temp_files_removed_by_the_next_writer(tmp_path: Path) -> None:
    dead = _dead_pid()
    folder = tmp_path / "run"
    stale = _temp(folder, dead, 3600)
    empty = _temp(folder, dead, 3600, suffix="-3-00ff00ff")
    empty.write_bytes(b"")  # killed before its first byte
    os.utime(empty, (time.time() - 3600,) * 2)
    live = _temp(folder, os.getpid(), 3600)
    fresh = _temp(folder, dead, 1, suffix="-2-ef01ef01")  # young: kept
    write_tiny(folder)
    left = {p.name for p in folder.iterdir()}
    assert stale.name not in left and empty.name not in left
    assert {live.name, fresh.name, "profile.h5"} <= left


def test_discover_skips_temp_files_and_removes_nothing(tmp_path: Path) -> None:
    dead = _dead_pid()
    write_tiny(tmp_path / "a" / "run")
    stale = _temp(tmp_path / "a" / "run", dead, 3600)
    legacy = tmp_path / "a" / "run" / f"profile.h5.tmp-{dead}-1-abcd"  # before issue 22
    legacy.write_bytes(tempfiles.HDF5_SIGNATURE)
    assert [p.parent.name for p in popviz.discover(tmp_path)] == ["run"]
    assert stale.exists() and legacy.exists()


CHILD = textwrap.dedent("""
    import signal
    import sys
    # Ctrl-C as a user at a terminal has it, even when this suite runs with SIGINT
    # ignored (in the background, under nohup), which a child would inherit
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {root!r})
    import numpy as np
    from popviz.format.writer import write_profile
    from tests.profiles_util import tiny_meta, tiny_tables
    big = np.random.default_rng(0).integers(0, 2**31, size=(4, 1500, 1472), dtype=np.uint32)
    print("writing", flush=True)
    try:
        write_profile(sys.argv[1], meta=tiny_meta(), tables=tiny_tables(),
                      arrays={{"tile_liveness": big}})
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    print("written", flush=True)
""")


@pytest.mark.parametrize("delay_ms", [5, 20, 60])
def test_ctrl_c_during_a_write_stops_it_and_removes_the_temp_file(
        tmp_path: Path, delay_ms: int) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(root=str(ROOT)), str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    time.sleep(delay_ms / 1000)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout, stderr)
    assert stderr.strip() == "interrupted"
    assert not out.exists() or list(out.iterdir()) == []


def test_interrupt_is_deferred_to_a_safe_point() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers need the main thread")
    reached = []
    # a terminal user's Ctrl-C, even when the suite itself runs with SIGINT ignored
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), tempfiles.deferred_interrupt() as check:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler ran: without deferral KeyboardInterrupt is here
            reached.append("after the signal")
            check()
            reached.append("never")
        assert reached == ["after the signal"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


HOLDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from popviz.format.folder_lock import hold_folder
    with hold_folder(sys.argv[1], "train.py --profile (the first run)"):
        print("held", flush=True)
        sys.stdin.read()
""")


def _hold(folder: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT)),
                             str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_second_writer_into_a_held_folder_is_told(tmp_path: Path) -> None:
    holder = _hold(tmp_path)
    try:
        with pytest.raises(FolderInUse) as info, hold_folder(tmp_path):
            pass
        message = str(info.value)
        assert f"pid {holder.pid}" in message and "the first run" in message
        assert "\n" not in message
    finally:
        holder.communicate("")
    with hold_folder(tmp_path) as lock:  # free again once the holder is gone
        assert lock.read_text().startswith(f"pid {os.getpid()}")
    assert not (tmp_path / LOCK_NAME).exists()


def test_killed_holder_does_not_block_the_next_run(tmp_path: Path) -> None:
    holder = _hold(tmp_path)
    holder.kill()
    holder.wait()
    with hold_folder(tmp_path):
        pass


def test_train_py_into_a_folder_another_run_holds(tmp_path: Path) -> None:
    holder = _hold(tmp_path)
    try:
        out = subprocess.run([sys.executable, str(ROOT / "train.py"), "--plan-only",
                              "--profile", "--profile-dir", str(tmp_path), "--quiet"],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    finally:
        holder.communicate("")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "another run is writing profiles here" in lines[0]
    assert not list(tmp_path.rglob("*.h5"))


def test_a_profile_replaces_an_older_profile_and_nothing_else(tmp_path: Path) -> None:
    """A user's own file at the profile's path, an HDF5 file of theirs or a folder is
    left as it was, with one line naming it; an older profile is replaced."""
    import h5py

    first = write_tiny(tmp_path / "run")
    assert write_tiny(tmp_path / "run", command_line="again") == first  # replaced
    assert popviz.open(first).meta is not None
    notes = tmp_path / "notes.h5"
    notes.write_text("my notes")
    theirs = tmp_path / "data.h5"
    with h5py.File(theirs, "w") as h5:
        h5["x"] = [1, 2, 3]
    folder = tmp_path / "dir" / "profile.h5"
    folder.mkdir(parents=True)
    for path, what in ((notes, "not a popviz profile"), (theirs, "not a popviz profile"),
                       (folder, "a folder")):
        before = sorted(p.name for p in path.parent.iterdir())
        with pytest.raises(FileExistsError, match=what) as info:
            write_tiny(path)
        assert info.value.filename == str(path)
        assert sorted(p.name for p in path.parent.iterdir()) == before  # no temp left
    assert notes.read_text() == "my notes"
    with pytest.raises(NotADirectoryError, match="a file, not a folder") as info:
        write_tiny(notes / "run")  # a folder path through a file of theirs
    assert info.value.filename == str(notes) and notes.read_text() == "my notes"
    with h5py.File(theirs, "r") as h5:
        assert list(h5["x"][:]) == [1, 2, 3]
