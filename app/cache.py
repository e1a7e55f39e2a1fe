"""Which files the app may serve, and a bounded LRU of open profiles with derived data.

Only files under the served directory are ever opened: a `profile=` that is absolute or
resolves (through `..` or a symlink) outside it is refused with `PathRefused`."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import popviz
from popviz.errors import ProfileError
from popviz.format.profile import Profile
from popviz.format.reader import profile_file
from popviz.vet import Stamp, Verdict, Vetter, file_check, stamp_from

LISTING_WAIT_S = 8.0  # the home page waits this long, at most, for vetting to finish
LISTING_WAIT_FILES = 16  # ... when at most this many files are being vetted
FACTS_BUDGET_S = 1.0  # a listing reads new files' facts for this long, the rest later
LISTING_MAX_AGE_S = 4.0  # pages take a listing this old (one scan for every open tab)
SHOWN_FOR_S = 30.0  # rows a tab showed this recently have their facts read first
VET_WAITERS = 4  # threads waiting on vetting at once; more answer "being checked" at once


class PathRefused(Exception):
    """A profile path the app will not serve (one-line reason)."""


class StillChecking(ProfileError):
    """The file's vetting did not finish within the request's wait: retry soon."""


MAX_PATH_CHARS = 1024
MAX_NAME_CHARS = 255


def resolve_profile(root: Path, rel: str | None) -> Path:
    """The real path of `rel` inside `root`, or PathRefused saying why not."""
    if not rel:
        raise PathRefused("no profile chosen: pick one on the home page")
    if len(rel) > MAX_PATH_CHARS or any(len(p) > MAX_NAME_CHARS for p in rel.split("/")):
        raise PathRefused(f"refused a profile path of {len(rel):,} characters: too long")
    if any(ord(c) < 32 or ord(c) == 127 for c in rel):
        raise PathRefused(f"refused {rel!r}: control characters in a profile path")
    if os.path.isabs(rel) or rel.startswith(("/", "\\")) or ":" in rel[:3]:
        raise PathRefused(f"refused '{rel}': profile paths are relative to the served "
                          "directory")
    base = root.resolve()
    try:
        target = (base / rel).resolve()  # follows symlinks and '..'
        exists = target.exists()
    except (OSError, ValueError, RuntimeError) as exc:  # loops, odd bytes
        raise PathRefused(f"refused '{rel}': {type(exc).__name__}") from None
    if target != base and base not in target.parents:
        raise PathRefused(f"refused '{rel}': it is outside the served directory")
    if not exists:
        raise PathRefused(f"no profile '{rel}' in the served directory")
    return target


LINK_OUTSIDE = "refused: a link to a file outside the served folder (not read)"


def outside_root(root: Path, path: Path) -> bool:
    """Whether `path`, links followed, lies outside `root` (checked before anything opens
    or vets it: a link in the served folder must not make the server read elsewhere)."""
    base = os.path.realpath(root)
    real = os.path.realpath(path)
    return real != base and not real.startswith(base.rstrip(os.sep) + os.sep)


def relative_message(text: str, root: Path, rel: str = "") -> str:
    """An error message with the served folder's absolute paths cut to relative ones."""
    base = str(root.resolve())
    if rel:
        text = text.replace(str(root.resolve() / rel), rel)
    text = text.replace(base + os.sep, "").replace(base, ".")
    return " ".join(text.split())


@dataclass
class Entry:
    """One open profile and whatever has been derived from it (built once, on demand).

    Each key has its own lock, taken only while that key is built: builds of different
    keys never wait on each other, so a build may ask for another key of the same entry,
    and no lock is held across two entries (the old entry-wide lock, held while building
    a comparison that read another profile, could deadlock a cold server)."""

    profile: Profile
    rel: str
    # the file as it was opened: a file replaced (new inode) or changed in any way (ctime,
    # which no one can set back) is another stamp, so it is vetted and opened anew
    stamp: Stamp | None = None
    derived: dict[Any, Any] = field(default_factory=dict)
    _key_locks: dict[Any, threading.Lock] = field(default_factory=dict, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self, key: Any, build: Callable[[], Any]) -> Any:
        try:
            return self.derived[key]  # built already: no lock at all
        except KeyError:
            pass
        with self._guard:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:  # one build per key even when callbacks race
            if key not in self.derived:
                self.derived[key] = build()
            return self.derived[key]


VIRTUAL_PREFIX = "@"  # resolve_profile refuses no such name; no file is opened for it
VIRTUAL_CAPACITY = 8


class ProfileCache:
    """LRU of open profiles keyed by real path and file stamp (a rewritten file reopens)."""

    def __init__(self, root: Path, capacity: int = 6,
                 opener: Callable[..., Profile] | None = None,
                 vetter: Vetter | None = None, vet_wait_s: float | None = None) -> None:
        self.root = Path(root)
        self.capacity = capacity
        self._open = opener or popviz.open
        self.vetter = vetter  # None: files are opened without a worker's verdict first
        # None: wait for a file's vetting however long it takes (scripts, tests); a
        # number: then raise StillChecking (a server must not park its threads on it)
        self.vet_wait_s = vet_wait_s
        self._waiters = threading.BoundedSemaphore(VET_WAITERS)
        self._entries: OrderedDict[Stamp, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._opening: dict[Stamp, threading.Lock] = {}
        self._listing: dict[str, tuple[Stamp, dict[str, Any]]] = {}
        self._scan_lock = threading.Lock()
        self._scanned: tuple[float, list[dict[str, Any]]] | None = None  # when, rows
        self._shown: dict[tuple[int, int], float] = {}  # rows shown -> when last asked
        # in-memory profiles (tune plans) under names no file can have: served, never
        # written into the folder being served; bounded, oldest dropped first
        self._virtual: OrderedDict[str, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def register_virtual(self, rel: str, profile: Profile) -> Entry:
        """Serve an in-memory profile (a `ReportProfile`) under `rel`, which must start
        with VIRTUAL_PREFIX; at most VIRTUAL_CAPACITY are kept."""
        if not rel.startswith(VIRTUAL_PREFIX):
            raise ValueError(f"a virtual profile name starts with {VIRTUAL_PREFIX!r}: {rel}")
        with self._lock:
            entry = self._virtual.get(rel)
            if entry is None:
                entry = self._virtual[rel] = Entry(profile, rel)
            self._virtual.move_to_end(rel)
            while len(self._virtual) > VIRTUAL_CAPACITY:
                self._virtual.popitem(last=False)
        return entry

    def get(self, rel: str | None) -> Entry:
        """The entry for `rel`; raises PathRefused or ProfileError (one line)."""
        if rel and rel.startswith(VIRTUAL_PREFIX):
            with self._lock:
                entry = self._virtual.get(rel)
            if entry is None:
                raise ProfileError(f"{rel}: this in-memory plan is gone (the server "
                                   "restarted or dropped it); run tune again")
            return entry
        try:  # the file itself: a folder's stamp would never match the file HDF5 opens
            path = profile_file(resolve_profile(self.root, rel))
        except ProfileError as exc:
            raise ProfileError(relative_message(str(exc), self.root, str(rel))) from None
        if outside_root(self.root, path):  # a folder inside whose profile.h5 links out
            raise PathRefused(f"{rel}: {LINK_OUTSIDE}")
        stat = path.stat()
        key = stamp_from(path, stat)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry
            opening = self._opening.setdefault(key, threading.Lock())
        if self.vetter is not None and self.vet_wait_s is not None:
            # waited for here, not under `opening`: requests for one cold file would
            # otherwise queue on that lock, each then waiting its own deadline in turn
            self._checked(path, str(rel))
        # One thread opens a cold file while the others for the same file wait on its
        # lock (not on the cache's): opening may take a moment and must not block the
        # cache for every other profile.
        with opening:
            with self._lock:
                entry = self._entries.get(key)
            if entry is None:
                entry = Entry(self._open_vetted(path, str(rel)), str(rel), key)
            evicted: list[Entry] = []
            with self._lock:
                entry = self._entries.setdefault(key, entry)
                self._entries.move_to_end(key)
                while len(self._entries) > self.capacity:
                    evicted.append(self._entries.popitem(last=False)[1])
                self._opening.pop(key, None)
        del evicted  # dropped outside the lock: closing an HDF5 file takes h5py's lock
        return entry

    def _open_vetted(self, path: Path, rel: str) -> Profile:
        """Open `path` in-process only once a worker read it cleanly (popviz.vet)."""
        try:
            if self.vetter is None:
                profile = self._open(path)
            else:
                stamp, verdict = self._checked(path, rel)
                if not verdict.ok:
                    raise ProfileError(verdict.message(rel))
                # what HDF5 opens must be the file vetted, not one swapped in since
                profile = self._open(path, check_file=file_check(stamp, rel))
        except StillChecking:
            raise  # names `rel` already
        except ProfileError as exc:
            raise ProfileError(relative_message(str(exc), self.root, rel)) from None
        for name, value in (("meta", profile.meta), ("summary", profile.summary)):
            if value is not None and not isinstance(value, dict):  # every page reads objects
                profile.close()
                raise ProfileError(f"{rel}: damaged profile ({name} is "
                                   f"{type(value).__name__} JSON, not an object)")
        return profile

    def _checked(self, path: Path, rel: str) -> tuple[Stamp, Verdict]:
        """The vetter's verdict on `path`, waiting at most `vet_wait_s` (StillChecking)."""
        assert self.vetter is not None
        with self._wait_budget(self.vet_wait_s) as wait_s:
            stamp, verdict = self.vetter.vetted(path, wait_s)
        if verdict is None:
            raise StillChecking(f"{rel}: being checked in a separate process before it "
                                "is opened; retry in a few seconds")
        return stamp, verdict

    @contextmanager
    def _wait_budget(self, wait_s: float | None) -> Iterator[float | None]:
        """`wait_s`, or 0 when VET_WAITERS threads wait already: however many requests
        ask for files being vetted, threads stay free for the others."""
        if wait_s is None:
            yield None
        elif self._waiters.acquire(blocking=False):
            try:
                yield wait_s
            finally:
                self._waiters.release()
        else:
            yield 0.0

    def prewarm(self) -> None:
        """Start vetting every file now, off the request path (the first listing and
        the first page of each profile then find the verdict in)."""
        if self.vetter is None:
            return
        try:
            for path in popviz.discover(self.root):
                if not outside_root(self.root, path):
                    self.vetter.submit(path)
        except (OSError, ProfileError):
            pass

    def listing(self, wait_s: float | None = None, max_age_s: float = 0.0,
                shown: tuple[int, int] | None = None) -> list[dict[str, Any]]:
        """Every profile file under the root with its headline facts, or its error.

        Rescanned on each call, unless a scan at most `max_age_s` old is at hand (one
        scan serves every open home tab); with `max_age_s` > 0 a caller never waits for
        another's scan under way: it takes the last one, or scans itself when there is
        none yet (a page must not queue its thread behind a scan that waits on vetting
        or reads files).
        Facts are reused while a file's stamp is unchanged, and read for at most
        FACTS_BUDGET_S a call: the rest say "checking" until a later call. Files still
        being vetted after `wait_s` (all together; default LISTING_WAIT_S, or
        `vet_wait_s` if shorter) are listed as being checked; past LISTING_WAIT_FILES
        of them nobody waits (a big folder is vetted over minutes). A link out of the
        served folder is listed as refused and never opened or vetted.

        `shown`: the rows (start, stop) a caller shows; the rows any caller showed in the
        last SHOWN_FOR_S have their facts read first."""
        now = time.monotonic()
        with self._lock:
            if shown is not None:
                self._shown[shown] = now
            for old in [k for k, when in self._shown.items() if now - when > SHOWN_FOR_S]:
                del self._shown[old]
            scanned = self._scanned
        if scanned is not None and max_age_s > 0 and (
                now - scanned[0] <= max_age_s or self._scan_lock.locked()):
            return scanned[1]
        # a page scans itself rather than wait for a first scan under way (measured:
        # threads parked on this lock cut bench_serve's throughput fivefold)
        held = self._scan_lock.acquire(blocking=max_age_s <= 0)
        try:
            scanned = self._scanned
            if scanned is not None and time.monotonic() - scanned[0] <= max_age_s:
                return scanned[1]  # scanned while this caller waited
            rows = self._scan(wait_s)
            self._scanned = (time.monotonic(), rows)
            return rows
        finally:
            if held:
                self._scan_lock.release()

    def _scan(self, wait_s: float | None) -> list[dict[str, Any]]:
        if wait_s is None:
            wait_s = LISTING_WAIT_S if self.vet_wait_s is None else min(LISTING_WAIT_S,
                                                                        self.vet_wait_s)
        found: list[tuple[Path, str, Stamp | OSError | None]] = []
        for path in popviz.discover(self.root):
            rel = path.relative_to(self.root).as_posix()
            if outside_root(self.root, path):
                found.append((path, rel, None))
                continue
            try:
                found.append((path, rel, stamp_from(path, path.stat())))
            except OSError as exc:
                found.append((path, rel, exc))
        pending = {}
        if self.vetter is not None:
            for path, rel, stamp in found:
                cached = self._listing.get(rel)
                if isinstance(stamp, tuple) and (cached is None or cached[0] != stamp):
                    with suppress(OSError):  # gone since discover: listed below
                        pending[rel] = self.vetter.submit(path)
            waiting = [f for f in pending.values() if not f.done()]
            if 0 < len(waiting) <= LISTING_WAIT_FILES:
                with self._wait_budget(wait_s) as budget:
                    wait(waiting, timeout=budget)
        rows: list[dict[str, Any]] = []
        unread: list[int] = []  # rows whose facts are to be read
        for _path, rel, stamp in found:
            if stamp is None:
                rows.append({"profile": rel, "error": f"{rel}: {LINK_OUTSIDE}"})
                continue
            if isinstance(stamp, OSError):
                rows.append({"profile": rel, "error": f"{rel}: {stamp.strerror}"})
                continue
            cached = self._listing.get(rel)
            if cached is not None and cached[0] == stamp:
                rows.append(cached[1])
                continue
            if rel not in pending or pending[rel].done():
                unread.append(len(rows))
            rows.append({"profile": rel, "error": "", "checking": True})
        # the rows someone looks at first, then in order, for FACTS_BUDGET_S
        unread.sort(key=lambda n: not any(a <= n < b for a, b in self._shown))
        reading_until = time.monotonic() + FACTS_BUDGET_S
        for n in unread:
            if time.monotonic() > reading_until:
                break
            _path, rel, stamp = found[n]
            rows[n] = facts = self._facts(rel)
            if not facts.get("checking"):  # else changed since it was stamped: not kept
                self._listing[rel] = (cast(Stamp, stamp), facts)
        return rows

    def _facts(self, rel: str) -> dict[str, Any]:
        """Headline facts from the file's attributes; opened outside the LRU so listing
        many files does not push out the profiles being looked at."""
        try:
            profile = self._open_vetted(resolve_profile(self.root, rel), rel)
        except StillChecking:
            return {"profile": rel, "error": "", "checking": True}
        except (ProfileError, PathRefused) as exc:  # shown relative: no server paths leak
            return {"profile": rel, "error": relative_message(str(exc), self.root, rel)}
        except Exception as exc:  # a file we cannot read must not break the listing
            return {"profile": rel, "error": relative_message(
                f"{rel}: {type(exc).__name__}: {exc}", self.root, rel)}
        try:
            return self._describe(rel, profile)
        except Exception as exc:  # e.g. meta that is JSON but not an object
            return {"profile": rel, "error": relative_message(
                f"{rel}: damaged profile ({type(exc).__name__}: {exc})", self.root, rel)}
        finally:
            profile.close()

    @staticmethod
    def _describe(rel: str, profile: Profile) -> dict[str, Any]:
        meta, summary = profile.meta or {}, profile.summary or {}
        target = meta.get("target") or {}
        fits = summary.get("fits")
        oom = summary.get("oom_tiles")
        options = meta.get("options") or {}
        training = summary.get("training", options.get("training"))
        folder = Path(rel).parent.name
        if folder in ("training", "inference"):
            run = folder
        else:
            run = "" if training is None else "training" if training else "inference"
        return {
            "profile": rel, "error": "",
            "kind": str(profile.kind),
            "run": run,
            "model": str((meta.get("model") or {}).get("name", "")),
            "target": str(target.get("name", "")),
            "ipus": target.get("num_ipus", ""),
            "fits": "unknown" if fits is None else "fits" if fits else f"OOM ({oom} tiles)",
            "throughput": summary.get("throughput"),
            "latency_ms": summary.get("latency_ms"),
        }
