"""Issue 34: nothing replaced without --force and never a command's own input; FIFOs,
sockets, devices and symlink loops refused by every reader and writer before opening;
empty paths and negative counts refused while parsing."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import popviz
from popviz.cli.main import main
from popviz.errors import ProfileError
from popviz.format.folder_lock import LOCK_NAME
from tests.test_format import write_tiny

ROOT = Path(__file__).resolve().parents[1]
MODELLED = ROOT / "profiles" / "tutorial_pipelined" / "training" / "profile.h5"
TRACE = ROOT / "tests" / "fixtures" / "kineto_pipelining_interleaved_1rank.json.gz"
TUNE = ["--no-progress", "--max-compiles", "2"]


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _refused_for_force(line: str, target: Path, flag: str) -> None:
    assert line == (f"popviz: error: {target}: a profile is already there; pass --force to "
                    f"replace it, or choose another {flag}")


@pytest.fixture()
def modelled(tmp_path: Path) -> Path:
    path = tmp_path / "in" / "profile.h5"
    path.parent.mkdir()
    shutil.copy(MODELLED, path)
    return path


# --- 1. nothing replaced without --force, never an input ------------------------------

def test_tune_write_keeps_an_earlier_profile_without_force(
        modelled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--write", "--write-now"):
        old = write_tiny(tmp_path / flag.strip("-"))
        before = old.read_bytes()
        assert main(["tune", str(modelled), *TUNE, flag, str(old.parent)]) == 1
        _refused_for_force(_one_line(capsys), old, flag)
        assert old.read_bytes() == before
        assert main(["tune", str(modelled), *TUNE, flag, str(old.parent), "--force"]) == 0
        capsys.readouterr()
        with popviz.open(old) as written:  # the tuned profile, not the tiny one
            assert written.command_line != "train.py --profile"  # write_tiny's


@pytest.mark.parametrize("form", ["file", "folder"])
def test_tune_never_writes_over_the_profile_it_reads(
        form: str, modelled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    given = str(modelled if form == "file" else modelled.parent)
    before = modelled.read_bytes()
    for flag in ("--write", "--write-now"):
        assert main(["tune", given, *TUNE, flag, given, "--force"]) == 2
        line = _one_line(capsys)
        assert line.startswith(f"popviz: error: {modelled}: is an input of this command")
        assert "never writes over its own input, --force or not" in line
    link = modelled.parent.parent / "link.h5"  # another name for the same file
    link.symlink_to(modelled)
    assert main(["tune", given, *TUNE, "--write-now", str(link), "--force"]) == 2
    assert "is an input of this command" in _one_line(capsys)
    assert modelled.read_bytes() == before


def test_write_plan_never_writes_over_its_profile(modelled: Path) -> None:
    """The library call behind /tune's plans: the same rule as `tune --write`."""
    from popviz.advise.plans import run_tune, write_plan
    from popviz.format.guards import OwnInput

    before = modelled.read_bytes()
    with popviz.open(modelled) as profile:
        result = run_tune(profile, max_compiles=2, top=1)
        with pytest.raises(OwnInput, match="is an input of this command"):
            write_plan(profile, result, 1, modelled.parent)
    assert modelled.read_bytes() == before


def test_tune_write_and_write_now_into_one_place(modelled: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["tune", str(modelled), *TUNE, "--write", str(out), "--write-now",
                 str(out / "profile.h5")]) == 2
    assert "--write and --write-now both name" in _one_line(capsys)
    assert not out.exists()


def test_merge_keeps_an_earlier_profile_and_its_inputs(
        modelled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write_tiny(tmp_path / "merged")
    before = old.read_bytes()
    assert main(["merge", str(modelled), "--out", str(old.parent)]) == 1
    _refused_for_force(_one_line(capsys), old, "--out")
    assert main(["merge", str(modelled), "--out", str(modelled), "--force"]) == 2
    assert "is an input of this command" in _one_line(capsys)
    assert old.read_bytes() == before


def test_import_never_writes_over_its_trace(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.h5"  # a trace under a name a profile could have
    shutil.copy(TRACE, trace)
    before = trace.read_bytes()
    assert main(["import", str(trace), "--to", str(trace), "--force"]) == 2
    assert _one_line(capsys).startswith(f"popviz: error: {trace}: is an input of this "
                                        "command")
    assert trace.read_bytes() == before


def test_export_never_writes_over_the_profile_it_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "run.json"  # a profile file whose name export would write
    shutil.copy(MODELLED, profile)
    before = profile.read_bytes()
    assert main(["export", str(profile), "--format", "chrome", "--to", str(profile),
                 "--force", "--no-vet"]) == 2
    assert "is an input of this command" in _one_line(capsys)
    assert profile.read_bytes() == before


def _train(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "train.py", "--plan-only", "--quiet", "--profile",
                           *map(str, argv)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), check=False)


def test_train_py_keeps_an_earlier_run_without_force(tmp_path: Path) -> None:
    first = _train("--profile-dir", tmp_path, "--no-validation")
    assert first.returncode == 0, first.stderr
    training = tmp_path / "training" / "profile.h5"
    before = training.read_bytes()
    again = _train("--profile-dir", tmp_path, "--no-validation")
    assert again.returncode == 1
    assert again.stderr.strip() == (f"train.py: error: {training}: a profile is already "
                                    "there; pass --force to replace it, or choose another "
                                    "--profile-dir")
    assert again.stdout == ""  # refused before anything was recorded
    assert training.read_bytes() == before
    assert not (tmp_path / LOCK_NAME).exists()
    forced = _train("--profile-dir", tmp_path, "--no-validation", "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"profile: {training}" in forced.stdout


def test_measure_keeps_an_earlier_profile_before_spawning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write_tiny(tmp_path / "measured")
    before = old.read_bytes()
    assert main(["measure", "--profile-dir", str(old.parent)]) == 1
    err = _one_line(capsys)
    assert err == (f"popviz.measure: error: {old}: a profile is already there; pass --force "
                   "to replace it, or choose another --profile-dir")
    assert main(["measure", "--out", str(old)]) == 1
    assert "choose another --out" in _one_line(capsys)
    assert old.read_bytes() == before
    assert not (old.parent / "traces").exists()


# --- 7. FIFOs, sockets, devices, symlink loops ----------------------------------------

@pytest.fixture()
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.h5"
    os.mkfifo(path)
    return path


@pytest.fixture()
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "sock.h5"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        yield path
    finally:
        server.close()


@pytest.fixture()
def loop(tmp_path: Path) -> Path:
    path = tmp_path / "loop.h5"
    path.symlink_to(path)
    return path


def _popviz(*argv: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A command in its own process: one that opens a FIFO would block for ever here."""
    return subprocess.run([sys.executable, "-m", "popviz.cli.main", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), check=False)


def _not_regular(done: subprocess.CompletedProcess[str], path: Path,
                 what: str = "a FIFO", prog: str = "popviz") -> None:
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == f"{prog}: error: {path}: is {what}, not a regular file"


def test_import_refuses_a_fifo_as_trace_or_snapshot(fifo: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _not_regular(_popviz("import", fifo, "--to", out), fifo)
    _not_regular(_popviz("import", TRACE, "--memory-snapshot", fifo, "--to", out), fifo)
    assert not out.exists()


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_import_refuses_a_fifo_as_target(fifo: Path, force: list[str]) -> None:
    _not_regular(_popviz("import", TRACE, "--to", fifo, *force), fifo)
    assert fifo.is_fifo() and [p.name for p in fifo.parent.iterdir()] == [fifo.name]


def test_tune_write_refuses_a_fifo(fifo: Path, modelled: Path) -> None:
    for force in ([], ["--force"]):
        _not_regular(_popviz("tune", modelled, *TUNE, "--write", fifo, *force), fifo)
    assert fifo.is_fifo()


def test_train_py_refuses_a_fifo_profile_and_leaves_no_lock(tmp_path: Path) -> None:
    target = tmp_path / "training" / "profile.h5"
    target.parent.mkdir()
    os.mkfifo(target)
    done = _train("--profile-dir", tmp_path, "--force")
    _not_regular(done, target, prog="train.py")
    assert not (tmp_path / LOCK_NAME).exists() and not (tmp_path / "inference").exists()


def test_export_refuses_a_fifo_target(fifo: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    target = fifo.with_suffix(".json")
    os.rename(fifo, target)
    assert main(["export", str(MODELLED), "--format", "chrome", "--to", str(target),
                 "--force", "--no-vet"]) == 1
    assert _one_line(capsys) == f"popviz: error: {target}: is a FIFO, not a regular file"
    assert target.is_fifo()


@pytest.mark.parametrize("kind", ["fifo", "socket", "device", "loop"])
def test_readers_say_what_the_file_is(kind: str, request: pytest.FixtureRequest,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """summary, compare, export and popviz.open name a FIFO, socket, device or loop for
    what it is (not 'no such file'), without opening it."""
    path, what = {"fifo": (lambda: request.getfixturevalue("fifo"), "a FIFO"),
                  "socket": (lambda: request.getfixturevalue("unix_socket"), "a socket"),
                  "device": (lambda: Path("/dev/null"), "a character device"),
                  "loop": (lambda: request.getfixturevalue("loop"), "a symlink loop")}[kind]
    special = path()
    line = f"{special}: is {what}, not a regular file"
    with pytest.raises(ProfileError, match="^" + line.replace(".", r"\.") + "$"):
        popviz.open(special)
    for argv in (["summary", str(special)], ["compare", str(MODELLED), str(special)],
                 ["export", str(special), "--to", str(special.parent / "csv")]):
        assert main(argv) == 1
        assert _one_line(capsys) == f"popviz: error: {line}"


@pytest.mark.parametrize("kind", ["fifo", "loop"])
def test_serve_says_what_its_folder_is(kind: str, request: pytest.FixtureRequest,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    special = request.getfixturevalue(kind)
    what = {"fifo": "a FIFO", "loop": "a symlink loop"}[kind]
    assert main(["serve", str(special), "--port", "1"]) == 2
    assert _one_line(capsys) == (f"popviz: error: {special}: is {what}, not a folder; serve "
                                 "the folder that holds profiles (e.g. profiles/)")


def test_a_fifo_as_the_folder_lock_is_left_alone(tmp_path: Path) -> None:
    from popviz.format.folder_lock import hold_folder

    os.mkfifo(tmp_path / LOCK_NAME)
    with pytest.raises(OSError, match="is a FIFO, not a regular file"), \
            hold_folder(tmp_path):
        pass
    assert (tmp_path / LOCK_NAME).is_fifo()


def test_the_writer_refuses_a_fifo(fifo: Path) -> None:
    with pytest.raises(OSError, match="is a FIFO, not a regular file"):
        write_tiny(fifo)
    assert fifo.is_fifo()


# --- 10. empty paths, negative counts -------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["export", str(MODELLED), "--to", ""],
    ["export", "", "--to", "out"],
    ["import", str(TRACE), "--to", ""],
    ["import", "", "--to", "out"],
    ["import", str(TRACE), "--memory-snapshot", "", "--to", "out"],
    ["summary", ""],
    ["serve", ""],
    ["compare", str(MODELLED), ""],
    ["tune", str(MODELLED), "--write", ""],
    ["merge", str(MODELLED), "--out", ""],
    ["measure", "--profile-dir", ""],
    ["train", "--profile-dir", ""],
])
def test_an_empty_path_is_refused(argv: list[str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # where an empty path would have written
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"popviz {argv[0]}: error: argument ") and "an empty path" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, flag, words", [
    (["compare", str(MODELLED), str(MODELLED), "--ops", "--top", "-5"], "--top",
     "must be 0 or more, got -5"),
    (["tune", str(MODELLED), "--top", "-5"], "--top", "must be at least 1, got -5"),
    (["tune", str(MODELLED), "--top", "0"], "--top", "must be at least 1, got 0"),
])
def test_a_negative_count_is_refused(argv: list[str], flag: str, words: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"popviz {argv[0]}: error: argument {flag}: {words}"


def test_compare_top_zero_still_means_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(MODELLED), str(MODELLED), "--ops", "--top", "0",
                 "--no-vet"]) == 0
    assert capsys.readouterr().out

