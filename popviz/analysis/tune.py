"""The advisor: re-plan a recorded program with other split points, AMP per IPU,
recomputation and schedule, and rank the layouts by modelled throughput.

Layering note: this analysis module calls `popviz.compile` (to its left in the flow)
because re-planning a recorded program is its whole point; it never runs the model.
Every candidate is one pure, deterministic `compile()` call, so the same profile and
arguments give the same ranking. The search (see docs/tune.md):

1. seeds: the current splits, and splits that balance per-stage cycles (DP over the
   segments between split names), with and without recomputation;
2. AMP per IPU: walk each IPU down the ladder until it fits (highest rung that fits);
3. local search: move one split one name earlier / later, the bottleneck (or
   out-of-memory) stage first, keep the first move that raises throughput;
4. the other pipeline schedule (Grouped / Interleaved) for the best layouts.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from popviz.analysis.tune_layers import Segments, balanced_bounds, segments, split_positions
from popviz.errors import ProfileError
from popviz.format.reader import Profile
from popviz.format.reader import open as open_profile
from popviz.options import Options
from popviz.record.program import OP_COLUMNS, TENSOR_COLUMNS, Program

AMP_LADDER = (0.6, 0.45, 0.3, 0.2, 0.15, 0.1, 0.05)
DEFAULT_MAX_COMPILES = 60
SECTION_COUNTS = (2, 3, 4, 6, 8)  # checkpoint sections tried on one IPU
SCHEDULE_RESERVE = 4  # compiles kept back from local search for the schedule variants
NEAR_EQUAL = 1e-3  # layouts this close in throughput (same fit, recomputation, schedule)
# are listed once: the first ranked stands for the others


def load_program(profile: Profile | str | os.PathLike[str]) -> tuple[Program, Options]:
    """The recorded Program and the Options a modelled profile was compiled with.

    The profile's `ops` are the program's ops plus compiler columns and synthesized
    recompute rows (source_op >= 0); `tensors` are the program's tensors plus stage and
    ipu. Dropping those gives back the program exactly, so compiling it with the stored
    options reproduces the stored tables (if the compiler has not changed since)."""
    p = profile if isinstance(profile, Profile) else open_profile(profile)
    where = str(p.path)
    if p.kind != "modelled":
        raise ProfileError(f"{where}: a {p.kind} profile holds no recorded program to "
                           "re-plan; tune needs a modelled one (train.py --profile)")
    ops, tensors = p.ops, p.tensors
    missing = [c for c in (*OP_COLUMNS, "source_op") if c not in ops.columns]
    missing += [c for c in TENSOR_COLUMNS if c not in tensors.columns]
    if missing or ops.empty:
        what = f"lacks {', '.join(missing[:5])}" if missing else "has no ops"
        raise ProfileError(f"{where}: the recorded program cannot be rebuilt (ops/tensors "
                           f"{what}); record it again with train.py --profile")
    ops = ops[ops["source_op"] < 0].sort_values("op_id", kind="stable")
    ops = ops[list(OP_COLUMNS)].reset_index(drop=True)
    tensors = tensors[list(TENSOR_COLUMNS)].reset_index(drop=True)
    mode = "plan" if not (ops["host_ns"] > 0).any() else "measured"
    try:
        options = Options.from_meta(dict(p.meta.get("options") or {}))
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"{where}: stored options cannot be rebuilt: {exc}") from None
    return Program(ops, tensors, dict(p.meta.get("model") or {}), mode), options


@dataclass
class Candidate:
    """One compiled layout and its evidence. Lists are per IPU unless named per stage."""

    source: str  # how the search found it: baseline, current, balanced, sections, local, ...
    splits: list[str]
    amp: list[float]
    recomputation: bool
    schedule: str
    num_ipus: int  # per replica
    replicas: int
    fits: bool
    oom_tiles: int
    oom_ipus: list[int]
    throughput: float
    throughput_per_ipu: float
    step_ms: float
    idle_fraction: float
    stage_cycles: list[int]  # per stage, forward + recompute + backward per micro-batch
    peak_bytes: list[int]  # always-live + max not-always-live, per IPU
    max_tile_fill: list[float]  # fullest tile / tile capacity, per IPU
    amp_ignored: int
    throughput_ratio: float = 1.0  # vs the baseline
    throughput_per_ipu_ratio: float = 1.0
    similar: int = 0  # other layouts found within NEAR_EQUAL of this one (not listed)

    @property
    def headroom(self) -> float:
        """Free share of the fullest tile of all IPUs (negative when it overflows)."""
        return 1.0 - max(self.max_tile_fill, default=0.0)

    @property
    def imbalance(self) -> float:
        """Busiest stage over the mean stage (1 = perfectly balanced)."""
        c = np.asarray(self.stage_cycles, dtype=np.float64)
        return float(c.max() / c.mean()) if len(c) and c.mean() > 0 else 1.0

    def key(self) -> tuple:
        """Ranking: fitting first, then throughput, then memory headroom."""
        return (not self.fits, self.oom_tiles if not self.fits else 0, -self.throughput,
                -self.headroom, len(self.splits), self.splits, self.amp,
                not self.recomputation, self.schedule)

    def train_args(self, strategy: str = "pipelined") -> str:
        """The layout as train.py flags (AMP: one value, or conv and matmul per stage)."""
        args = [f"--shards {self.num_ipus}"]
        if self.num_ipus > 1 and strategy == "pipelined":
            args += ["--pipeline", f"--pipeline-schedule {self.schedule}"]
        if self.splits:
            args.append("--pipeline-splits " + " ".join(self.splits))
        if self.recomputation:
            args.append("--enable-recomputation")
        amp = [f"{a:g}" for a in self.amp]
        amp = amp[:1] if len(set(amp)) == 1 else [a for a in amp for _ in (0, 1)]
        return " ".join([*args, "--available-memory-proportion " + " ".join(amp)])

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "headroom": self.headroom, "imbalance": self.imbalance,
                "max_stage_cycles": max(self.stage_cycles, default=0),
                "train_args": self.train_args()}


@dataclass
class TuneResult:
    baseline: Candidate
    candidates: list[Candidate]  # ranked, best first (top K)
    num_ipus: int
    target: str
    model: str
    compiles: int
    layouts: int  # distinct layouts evaluated (fitted)
    seconds: float
    budget_exhausted: bool
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def best_options(self, base: Options) -> Options:
        best = self.best or self.baseline
        return candidate_options(base, best, self.target)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "target": self.target, "num_ipus": self.num_ipus,
                "compiles": self.compiles, "layouts": self.layouts,
                "seconds": self.seconds, "budget_exhausted": self.budget_exhausted,
                "notes": list(self.notes), "baseline": self.baseline.to_dict(),
                "candidates": [c.to_dict() for c in self.candidates]}


def candidate_options(base: Options, c: Candidate, target: str) -> Options:
    """Options that compile candidate `c`."""
    return layout_options(base, c.splits, c.amp, c.recomputation, c.schedule, target)


def layout_options(base: Options, splits: list[str], amp: list[float], recomputation: bool,
                   schedule: str, target: str) -> Options:
    """`base` with another layout: splits (they replace any blocks / stages; on one IPU
    they are recomputation checkpoints), AMP per IPU, recomputation and schedule."""
    return base.copy(
        target=target, splits=list(splits), stages=[], stage_ipus=[], num_ipus=len(amp),
        available_memory_proportion=dict(enumerate(amp)), recomputation=recomputation,
        schedule=schedule, strategy="pipelined" if len(amp) == 1 else base.strategy)


class _Budget(Exception):
    """The compile budget ran out."""


class _Search:
    """Compiles layouts (cached, counted against the budget) and fits AMP per IPU."""

    def __init__(self, program: Program, base: Options, target: str, num_ipus: int,
                 ladder: tuple[float, ...], max_compiles: int, progress: bool) -> None:
        from popviz.compile import compile as compile_program

        self.compile = compile_program
        self.program, self.base, self.target = program, base, target
        self.n, self.ladder, self.max = num_ipus, ladder, max_compiles
        self.count = 0
        self.cache: dict[tuple, Candidate] = {}
        self.fitted: dict[tuple, Candidate] = {}
        self.bar = _progress_bar(max_compiles, progress)

    def run(self, options: Options, source: str) -> tuple[Candidate, Any]:
        if self.count >= self.max:
            raise _Budget
        self.count += 1
        if self.bar is not None:
            self.bar.update(1)
        report = self.compile(self.program, options)
        return _candidate(report, options, source), report

    def evaluate(self, splits: list[str], amp: list[float], rc: bool, schedule: str,
                 source: str) -> Candidate:
        key = (tuple(splits), tuple(amp), rc, schedule)
        if key not in self.cache:
            options = layout_options(self.base, splits, amp, rc, schedule, self.target)
            self.cache[key] = self.run(options, source)[0]
        return self.cache[key]

    def fit(self, splits: list[str], rc: bool, schedule: str, source: str) -> Candidate:
        """The layout with each IPU at the highest AMP rung that fits (fit is taken to be
        monotone in AMP and independent between IPUs, so all IPUs search at once). Per
        IPU: the top rung, the next, then the lowest (does any fit?), then bisection.
        An IPU whose fullest tile does not shrink when its AMP is lowered stops there
        (temporaries are not what overflows, so lower rungs would not help)."""
        key = (tuple(splits), rc, schedule)
        if key in self.fitted:
            return self.fitted[key]
        last = len(self.ladder) - 1
        bad, ok = [-1] * self.n, [None] * self.n  # highest failing / lowest fitting rung
        fill: list[dict[int, float]] = [{} for _ in range(self.n)]
        stuck: set[int] = set()
        probe = [0] * self.n
        while True:
            c = self.evaluate(splits, [self.ladder[r] for r in probe], rc, schedule, source)
            oom = set(c.oom_ipus)
            for i, r in enumerate(probe):
                if i in stuck or (ok[i] is not None and r == ok[i]):
                    continue
                fill[i][r] = c.max_tile_fill[i]
                if i in oom:
                    bad[i] = max(bad[i], r)
                    lower_fill = [f for q, f in fill[i].items() if q < r]
                    if lower_fill and c.max_tile_fill[i] >= min(lower_fill):
                        stuck.add(i)
                else:
                    ok[i] = r if ok[i] is None else min(ok[i], r)
            nxt = []
            for i in range(self.n):
                if i in stuck:
                    nxt.append(probe[i])
                elif ok[i] is not None and ok[i] - bad[i] <= 1:
                    nxt.append(ok[i])
                elif ok[i] is not None:
                    nxt.append((bad[i] + ok[i]) // 2)
                elif bad[i] >= last:
                    stuck.add(i)
                    nxt.append(last)
                else:
                    nxt.append(bad[i] + 1 if bad[i] == 0 else last)
            if nxt == probe:
                break
            probe = nxt
        self.fitted[key] = c
        return c

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="tune", unit="compile", file=sys.stderr, leave=False)


def _candidate(report: Any, options: Options, source: str) -> Candidate:
    s = report.summary
    tm = report.tables["tile_memory"]
    n = int(s["num_ipus"])
    fill = (tm.groupby("ipu")["total_bytes"].max() / tm.groupby("ipu")["capacity_bytes"].max()
            ).reindex(range(n)).fillna(0.0)
    st = report.tables["stages"]
    per_mb = (st["forward_cycles_per_microbatch"] + st["recompute_cycles_per_microbatch"]
              + st["backward_cycles_per_microbatch"])
    peak = s.get("peak_liveness_bytes") or {}
    # blocks / explicit stages: the split names are the first layers of stages 1..
    splits = list(options.splits) or [str(x) for x in st["first_layer"].iloc[1:]]
    return Candidate(
        source=source, splits=splits, amp=[options.amp_for(i) for i in range(n)],
        recomputation=bool(options.recomputation),
        schedule=str(s.get("schedule") or options.schedule), num_ipus=n,
        replicas=int(s.get("replicas") or 1),
        fits=bool(s["fits"]), oom_tiles=int(s["oom_tiles"]),
        oom_ipus=[int(i) for i in s.get("oom_ipus", [])],
        throughput=float(s["throughput"]), throughput_per_ipu=float(s["throughput_per_ipu"]),
        step_ms=float(s["step_ms"]), idle_fraction=float(s["idle_fraction"]),
        stage_cycles=[int(x) for x in per_mb],
        peak_bytes=[int(peak.get(str(i), 0)) for i in range(n)],
        max_tile_fill=[round(float(x), 6) for x in fill], amp_ignored=int(s["amp_ignored"]))


def _better(new: Candidate, old: Candidate) -> bool:
    return new.key() < old.key() and (not new.fits or not old.fits
                                      or new.throughput > old.throughput * (1 + 1e-9))


def _moves(c: Candidate, last: tuple[int, int] | None) -> list[tuple[int, int]]:
    """(split index, +-1) moves: the last successful move again, then those shrinking
    the out-of-memory or bottleneck stage (stage b starts at split b-1 and ends before
    split b), then every other."""
    k = len(c.splits)
    first = [last] if last else []
    if c.num_ipus > 1:
        focus = c.oom_ipus[0] if c.oom_ipus else int(np.argmax(c.stage_cycles))
        first += [(focus - 1, +1), (focus, -1)]
    every = [(i, d) for i in range(k) for d in (-1, +1)]
    return [m for m in first + every if 0 <= m[0] < k]


def _local_search(search: _Search, start: Candidate, segs: Segments, source: str,
                  reserve: int) -> Candidate:
    cur = start
    bounds = segs.bounds(cur.splits)
    if bounds is None:
        return cur
    improved, last = True, None
    while improved and search.count < search.max - reserve:
        improved = False
        tried = set()
        for i, d in _moves(cur, last):
            if (i, d) in tried or search.count >= search.max - reserve:
                continue
            tried.add((i, d))
            b = list(bounds)
            b[i] += d
            lo = b[i - 1] if i else 0
            hi = b[i + 1] if i + 1 < len(b) else segs.count
            if not lo < b[i] < hi:
                continue
            c = search.fit(segs.splits(b), cur.recomputation, cur.schedule, source)
            if _better(c, cur):
                cur, bounds, improved, last = c, b, True, (i, d)
                break
    return cur


def tune(program: Program, options: Options, num_ipus: int | None = None, *,
         amp_ladder: tuple[float, ...] = AMP_LADDER, top: int = 5,
         max_compiles: int = DEFAULT_MAX_COMPILES, target: str | None = None,
         progress: bool = False) -> TuneResult:
    """Search layouts of `program` over `num_ipus` IPUs (default: as `options` place it)
    and rank them; the layout of `options` is the baseline. Raises ValueError for an
    impossible request (more IPUs than split names + 1, empty ladder, ...)."""
    t0 = time.perf_counter()
    ladder = _check_ladder(amp_ladder)
    if top < 1:
        raise ValueError(f"--top must be >= 1, got {top}")
    if max_compiles < 2:
        raise ValueError(f"--max-compiles must be >= 2 (baseline and one candidate), "
                         f"got {max_compiles}")
    target = str(target or options.target)
    usable = len(split_positions(program)[0])
    if num_ipus is not None:
        _check_ipus(program, int(num_ipus), usable)
    search = _Search(program, options, target, 1, ladder, max_compiles, progress)
    try:
        base_opts = options.copy(target=target)
        baseline, report = search.run(base_opts, "baseline")
        n = int(num_ipus or baseline.num_ipus)
        _check_ipus(program, n, usable)
        microbatches = options.gradient_accumulation * (1 if options.training
                                                        else options.device_iterations)
        segs = segments(program, report.tables["ops"], microbatches)
        del report
        search.n = n
        found, notes = _search(search, options, segs, n, baseline)
    except _Budget:
        found, notes = list(search.fitted.values()), []
    finally:
        search.close()
    found = _collapse(_rank(found, baseline))
    notes = list(notes)
    if search.count >= max_compiles:
        notes.append(f"stopped at the compile budget ({max_compiles}); raise --max-compiles "
                     "to search further")
    if found and not found[0].fits:
        notes.append("no layout found fits: try more IPUs, recomputation, a lower AMP ladder "
                     "or a smaller micro-batch")
    return TuneResult(baseline, found[:top], n, target, str(program.model.get("name", "")),
                      search.count, len(search.fitted), time.perf_counter() - t0,
                      search.count >= max_compiles, notes)


def _check_ipus(program: Program, n: int, usable: int) -> None:
    if n < 1:
        raise ValueError(f"--ipus must be >= 1, got {n}")
    if n > usable + 1:
        name = program.model.get("name") or "the model"
        raise ValueError(f"--ipus {n} needs {n - 1} split points but {name} has only "
                         f"{usable} usable split names (at most {usable + 1} IPUs)")


def _check_ladder(ladder: tuple[float, ...]) -> tuple[float, ...]:
    values = sorted({float(a) for a in ladder}, reverse=True)
    if not values:
        raise ValueError("the AMP ladder is empty")
    bad = [a for a in values if not 0.0 < a <= 1.0]
    if bad:
        raise ValueError(f"AMP ladder values must be in (0, 1], got {bad[0]:g}")
    return tuple(values)


def _search(search: _Search, options: Options, segs: Segments, n: int,
            baseline: Candidate) -> tuple[list[Candidate], list[str]]:
    notes: list[str] = []
    rcs = (True, False) if options.training else (False,)
    if n == 1:
        schedule = options.schedule if baseline.num_ipus == 1 else "Sequential"
        seeds = [search.fit([], False, schedule, "one IPU")] if options.training else []
        if baseline.num_ipus == 1 and options.splits and options.recomputation:
            seeds.append(search.fit(list(options.splits), True, schedule, "current"))
        for k in SECTION_COUNTS:
            if k <= segs.count and options.training:
                bounds = balanced_bounds(segs, k, False)
                seeds.append(search.fit(segs.splits(bounds), True, schedule,
                                        f"{k} sections"))
        if not options.training:
            seeds.append(search.fit([], False, schedule, "one IPU"))
        best = min(seeds, key=Candidate.key)
        if best.splits:
            _local_search(search, best, segs, "local", 0)
        return list(search.fitted.values()), notes

    pipelined = options.strategy == "pipelined" and options.training
    first = options.schedule if options.schedule in ("Grouped", "Interleaved") else "Grouped"
    schedule = first if pipelined else options.schedule
    current = list(options.splits) if len(options.splits) == n - 1 and \
        segs.bounds(list(options.splits)) is not None else None
    seeds: dict[bool, list[Candidate]] = {}
    for rc in rcs:
        seeds[rc] = [search.fit(segs.splits(balanced_bounds(segs, n, rc)), rc, schedule,
                                "balanced")]
        if current is not None:
            seeds[rc].append(search.fit(current, rc, schedule, "current splits"))
    order = sorted(rcs, key=lambda rc: min(seeds[rc], key=Candidate.key).key())
    reserve = SCHEDULE_RESERVE if pipelined else 0
    for rc in order:
        _local_search(search, min(seeds[rc], key=Candidate.key), segs, "local", reserve)
    if pipelined:
        other = "Interleaved" if schedule == "Grouped" else "Grouped"
        layouts = []
        for c in _rank(list(search.fitted.values()), baseline):
            if (c.splits, c.recomputation) not in layouts:
                layouts.append((c.splits, c.recomputation))
        for splits, rc in layouts[:2]:
            search.fit(splits, rc, other, f"{other} schedule")
    return list(search.fitted.values()), notes


def _rank(found: list[Candidate], baseline: Candidate) -> list[Candidate]:
    out = sorted(found, key=Candidate.key)
    for c in out:
        c.throughput_ratio = c.throughput / baseline.throughput if baseline.throughput else 0.0
        c.throughput_per_ipu_ratio = (c.throughput_per_ipu / baseline.throughput_per_ipu
                                      if baseline.throughput_per_ipu else 0.0)
    return out


def _collapse(ranked: list[Candidate]) -> list[Candidate]:
    """Keep one of each group of near-equal layouts (the best ranked)."""
    out: list[Candidate] = []
    for c in ranked:
        twin = next((k for k in out if k.fits == c.fits and k.recomputation == c.recomputation
                     and k.schedule == c.schedule and abs(k.throughput - c.throughput)
                     <= NEAR_EQUAL * max(k.throughput, 1e-12)), None)
        if twin is None:
            out.append(c)
        else:
            twin.similar += 1
    return out
