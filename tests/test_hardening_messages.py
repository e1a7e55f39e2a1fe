"""Issue 34, items 8 and 9: every message names the real cause. `measure` checks its
values before any rank starts and says a rank's failure in one line, leaving no
pytorch-errorfile behind; a Ctrl-C (inside h5py, in a vetting worker, or while the program
exits) is "interrupted", never a damaged file or a silent death by signal; a file where a
folder goes, an unreadable folder, a port or host `serve` cannot listen on, an 80 MB string
outside traceEvents and an annotation number past int64 are each said as such; unknown
/_dash-component-suites/ paths are 404s."""

from __future__ import annotations

import errno
import gzip
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from popviz.cli.main import main
from tests.serve_util import start_serve, stop
from tests.test_format import write_tiny

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "kineto_pipelining_interleaved_1rank.json.gz"
MODELLED = ROOT / "profiles" / "tutorial_pipelined" / "training" / "profile.h5"


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture
def note(tmp_path: Path) -> Path:
    """A user's own file, where a folder would be needed."""
    path = tmp_path / "user.txt"
    path.write_text("mine")
    return path


# ---- item 8: measure ----
@pytest.mark.parametrize(("flags", "said"), [
    (["--learning-rate", "nan"], "learning rate must be a finite number > 0, got nan"),
    (["--learning-rate", "-1"], "learning rate must be a finite number > 0, got -1.0"),
    (["--learning-rate", "inf"], "learning rate must be a finite number > 0, got inf"),
    (["--num-classes", "0"], "num classes must be a whole number in 1..1,000,000, got 0"),
    (["--seed", "-1"], "seed must be a whole number in 0..2**63-1, got -1"),
    (["--profile-dir", "{note}"], "{note}: a file, not a folder"),
    (["--profile-dir", "{note}/m"], "{note}: a file, not a folder"),
    (["--profile-dir", "{tmp}/ok", "--out", "{note}/p.h5"], "{note}: a file, not a folder"),
    # an empty --profile-dir is refused while parsing (test_hardening_writes)
])
def test_measure_refuses_bad_values_before_any_rank_starts(
        flags: list[str], said: str, note: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import popviz.measure.spawning as spawning

    def no_ranks(config: Any) -> None:
        raise AssertionError("ranks were spawned for a value that should be refused")

    monkeypatch.setattr(spawning, "spawn_ranks", no_ranks)
    fill = {"note": str(note), "tmp": str(tmp_path)}
    argv = ["measure", *(f.format(**fill) for f in flags)]
    if "--profile-dir" not in flags:
        argv += ["--profile-dir", str(tmp_path / "m")]
    assert main(argv) == 2
    assert _one_line(capsys).startswith(f"popviz.measure: error: {said.format(**fill)}")
    assert note.read_text() == "mine" and not (tmp_path / "m").exists()


def test_a_failing_rank_is_one_line_and_leaves_no_error_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one real spawn here: a rank whose optimiser refuses its learning rate (set past
    validation, as a value only a rank can find wrong would be)."""
    from popviz.measure.runner import MeasureConfig
    from popviz.measure.spawning import RankFailed, spawn_ranks

    temp = tmp_path / "tmp"  # torch puts its pytorch-errorfile-*.pickle files here
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    config = MeasureConfig(ranks=1, steps=1, profile_dir=str(tmp_path / "m")).validate()
    config.learning_rate = float("nan")
    with pytest.raises(RankFailed) as failed:
        spawn_ranks(config)
    assert str(failed.value) == "rank 0 failed: Invalid learning rate: nan"
    assert sorted(os.listdir(temp)) == []


# ---- item 9: a file where a folder goes ----
def test_a_file_in_the_way_is_named_as_a_file_not_a_folder(note: Path) -> None:
    from popviz.errors import not_a_folder, os_error_line

    line = os_error_line(NotADirectoryError(errno.ENOTDIR, "Not a directory",
                                            str(note / "sub" / "x.csv")))
    assert line == f"{note}: a file, not a folder"
    assert not_a_folder(note.parent / "new" / "sub") is None


@pytest.mark.parametrize("to", ["{note}/sub", "{note}"])
@pytest.mark.parametrize("fmt", ["csv", "chrome"])
def test_export_to_a_path_under_a_file(to: str, fmt: str, note: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    target = to.format(note=note)
    assert main(["export", str(MODELLED), "--to", target, "--format", fmt]) == 2
    assert _one_line(capsys).startswith(f"popviz: error: {note}: a file, not a folder; ")
    assert note.read_text() == "mine"


@pytest.mark.parametrize("sub", ["", "sub"])
def test_train_profile_dir_under_a_file(sub: str, note: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from popviz.cli.train import main as train_main

    folder = note / sub if sub else note
    assert train_main(["--profile", "--profile-dir", str(folder), "--iterations", "1"]) == 2
    assert _one_line(capsys) == (f"train.py: error: {note}: a file, not a folder; "
                                 "--profile-dir is the folder profiles go into")
    assert note.read_text() == "mine"


@pytest.mark.parametrize("args", [["summary", "{note}/sub"], ["export", "{note}/p.h5", "--to",
                                   "{note}.csv"], ["compare", "{note}/a", "{note}/b"]])
def test_a_profile_asked_for_under_a_file_names_the_file(
        args: list[str], note: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(note=note) for a in args]
    assert main(argv) == 1
    assert _one_line(capsys) == (f"popviz: error: {argv[1]}: no such file or directory "
                                 f"({note} is a file, not a folder)")


# ---- item 9: Ctrl-C is "interrupted" ----
def test_ctrl_c_inside_h5py_is_interrupted_not_a_damaged_profile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A KeyboardInterrupt that lands inside h5py's lock surfaces as CPython's SystemError
    ("<cyfunction FastRLock.__exit__> returned a result with an exception set") caused by
    it; the reader must pass it on as the interrupt."""
    from popviz.format import validate

    checked = validate.check_values

    def interrupted_in_h5py(table: str, *args: Any) -> None:
        if table == "trace":
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as ctrl_c:
                raise SystemError("<cyfunction FastRLock.__exit__> returned a result "
                                  "with an exception set") from ctrl_c
        checked(table, *args)

    monkeypatch.setattr(validate, "check_values", interrupted_in_h5py)
    out = tmp_path / "csv"
    assert main(["export", str(MODELLED), "--to", str(out), "--no-vet"]) == 130
    assert _one_line(capsys) == "popviz: interrupted"
    assert not out.exists() or not list(out.iterdir())


def _terminal_sigint() -> None:
    """In the child before exec: SIGINT as a user at a terminal has it. The suite may run
    with SIGINT ignored (`trap '' INT`, nohup), which a child would inherit, and Python
    leaves an inherited SIG_IGN alone: the Ctrl-C these tests send would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with open(task / "children") as handle:
            found += [int(c) for c in handle.read().split()]
    return found


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_ctrl_c_in_a_vetting_worker_is_interrupted_and_not_cached(tmp_path: Path) -> None:
    """SIGINT to the worker alone (a Ctrl-C reaches the whole process group; the worker
    may see it first): the command says interrupted, no verdict on the file is kept."""
    profile = tmp_path / "slowfile" / "profile.h5"
    profile.parent.mkdir()
    shutil.copy(MODELLED, profile)
    cache = tmp_path / "cache"
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), POPVIZ_VET_SIMULATE="slow:slowfile")
    proc = subprocess.Popen([sys.executable, "-m", "popviz.cli.main", "summary",
                             str(profile)], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_terminal_sigint)
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while not workers and time.monotonic() < deadline and proc.poll() is None:
            workers = _children(proc.pid)
            time.sleep(0.05)
        assert workers, "no vetting worker started"
        time.sleep(1.0)  # in its imports, its read or its (simulated) slow probe
        # the worker alive now: a short-lived child seen first may be gone (a loaded CI)
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                os.kill(_children(proc.pid)[-1], signal.SIGINT)
                break
            except (IndexError, ProcessLookupError):
                time.sleep(0.05)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (proc.returncode, err.strip()) == (130, "popviz: interrupted")
    assert not list(cache.rglob("vet-*.json"))  # nothing said of the file is kept


def test_a_late_ctrl_c_is_said_not_a_silent_signal(tmp_path: Path) -> None:
    """SIGINT right after the command printed its result: while Python exits (where
    CPython has put SIGINT back to its default) the process died of the signal without
    a word. Now: `popviz: interrupted` and 130, or, once the process is past its exit
    call, a plain 0."""
    profile = write_tiny(tmp_path / "run")
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # the line comes when printed
    seen = []
    for delay in (0.0, 0.0005, 0.001, 0.002):
        out = tmp_path / f"out{delay}"
        proc = subprocess.Popen([sys.executable, "-m", "popviz.cli.main", "export",
                                 str(profile), "--to", str(out)], env=env, cwd=ROOT,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=_terminal_sigint)
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("wrote ")
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        seen.append((proc.returncode, err.strip()))
        assert (proc.returncode, err.strip()) in ((130, "popviz: interrupted"), (0, "")), \
            seen


# ---- item 9: an unreadable folder ----
def _without_root_powers() -> list[str] | None:
    """A command prefix under which file permissions hold: nothing for a normal user;
    for root, setpriv dropping the capabilities that bypass them (None: not possible)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    return prefix if probe.returncode == 0 else None


@pytest.fixture
def locked(tmp_path: Path) -> Any:
    prefix = _without_root_powers()
    if prefix is None:
        pytest.skip("running as root without setpriv able to drop CAP_DAC_OVERRIDE: an "
                    "unreadable folder cannot be made")
    folder = tmp_path / "locked"
    (folder / "run").mkdir(parents=True)
    shutil.copy(MODELLED, folder / "run" / "profile.h5")
    folder.chmod(0)
    try:
        yield prefix, folder
    finally:
        folder.chmod(0o755)


def _run(prefix: list[str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "popviz.cli.main", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def test_an_unreadable_folder_is_said_as_such(locked: tuple[list[str], Path]) -> None:
    prefix, folder = locked
    for args in (["summary", str(folder)], ["export", str(folder), "--to",
                                            str(folder.parent / "csv")]):
        done = _run(prefix, *args)
        assert (done.returncode, done.stderr.strip()) == (
            1, f"popviz: error: {folder}: cannot be read (permission denied)"), args


def test_serve_refuses_an_unreadable_folder(locked: tuple[list[str], Path]) -> None:
    prefix, folder = locked
    done = _run(prefix, "serve", str(folder), "--port", "1")  # refused before binding
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (f"popviz: error: {folder}: cannot be read (permission "
                                   "denied); serve a folder this user may read")


# ---- item 9: serve's listening errors, unknown /_dash-component-suites/ paths ----
def test_serve_names_host_and_port_it_cannot_listen_on(tmp_path: Path) -> None:
    write_tiny(tmp_path / "run")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _run([], "serve", str(tmp_path), "--port", str(port))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.strip() == (f"popviz: error: 127.0.0.1:{port}: cannot listen there "
                                   "(Address already in use)")
    done = _run([], "serve", str(tmp_path), "--port", "8050", "--host", "no-such-host.invalid")
    assert done.returncode == 2 and done.stdout == ""
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith(
        "popviz: error: cannot listen on no-such-host.invalid:8050: unknown or invalid "
        "--host (")


def _get_raw(port: int, path: str) -> tuple[int, bytes]:
    """GET `path` exactly as given (http.client leaves `../` alone)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def test_unknown_component_suite_paths_are_404(tmp_path: Path) -> None:
    write_tiny(tmp_path / "run")
    proc, port = start_serve(tmp_path)
    try:
        for path in ("/_dash-component-suites/dash/../../etc/passwd",
                     "/_dash-component-suites/../x.js",
                     "/_dash-component-suites/nosuch/x.js",
                     "/_dash-component-suites/dash/nosuch.js",
                     "/_dash-component-suites/dash/deps/../../../x.js",
                     "/_dash-component-suites/plotly/x.js"):
            status, body = _get_raw(port, path)
            assert (status, body) == (404, b"popviz: no such file\n"), path
    finally:
        _, err = stop(proc)
    assert "Traceback" not in err


# ---- item 9: hostile traces ----
@pytest.mark.parametrize("where", ["before", "after"])
def test_a_huge_string_outside_trace_events_is_named(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An 80 MB string outside traceEvents, at a 1 MB scale (the limit lowered to match)."""
    from popviz.ingest import kineto

    monkeypatch.setattr(kineto, "MAX_TOP_BYTES", 1 << 20)
    with gzip.open(TRACE) as handle:
        trace = json.load(handle)
    big = {"bigNote": "x" * (2 << 20)}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({**big, **trace} if where == "before" else {**trace, **big}))
    assert main(["import", str(path), "--to", str(tmp_path / "out")]) == 1
    assert _one_line(capsys) == (
        f'popviz: error: {path}: field "bigNote" outside traceEvents is a string of '
        f"{2 << 20:,} bytes, past the {1 << 20:,} bytes a trace may hold outside "
        "traceEvents; refused")


@pytest.mark.parametrize(("old", "new", "said"), [
    ("PP:0F1", "Backward 99999999999999999999", "micro-batch 99999999999999999999"),
    ("PP:0F1", "PP:99999999999999999999F1", "stage 99999999999999999999"),
    ("PP:0F1", "PP:0F" + "9" * 5000, "micro-batch " + "9" * 30),
])
def test_an_annotation_number_past_int64_is_named(
        old: str, new: str, said: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    with gzip.open(TRACE) as handle:
        trace = json.load(handle)
    renamed = [e for e in trace["traceEvents"] if e.get("name") == old]
    renamed[0]["name"] = new
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    assert main(["import", str(path), "--to", str(tmp_path / "out")]) == 1
    shown = repr(new[:80])
    digits = len(new) - len(new.rstrip("0123456789")) if new.startswith("Backward") or \
        new.startswith("PP:0F") else len(said.split()[1])
    assert _one_line(capsys) == (f"popviz: error: {path}: annotation {shown} gives {said}, "
                                 f"a number of {digits} digits (at most 9); refused")
    assert not (tmp_path / "out").exists()
