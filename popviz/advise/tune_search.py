"""The advisor's building blocks: a compiled layout with its evidence (`Candidate`), and
the compile cache that fits AMP per IPU and moves splits (local search). `tune.py` drives
the search; see docs/tune.md."""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from popviz.errors import ProfileError
from popviz.options import Options
from popviz.recorder.program import Program
from popviz.vocab import naming_of

if TYPE_CHECKING:
    from popviz.compiler.report import Report

DEFAULT_TARGET = Options().target  # train.py's --target default too: left out of the flags


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
    similar: int = 0  # other layouts found within tune.NEAR_EQUAL (not listed)
    # planned with the profile's: stated in the flags, since train.py's default for a
    # pipeline (2 x shards) would change with the layout and with it the throughput
    gradient_accumulation: int = 1
    target: str = "mk2"  # the target planned for; stated in the flags unless train.py's
    gpu: bool = False  # a GPU target: no AMP, no tiles (GPipe / 1F1B)
    gpu_precision: str = "as-recorded"  # how a GPU plan holds its state (gpu_recipe.py)
    # with recomputation: "full" (every checkpointed section's forward) or, on a GPU,
    # "selective" (only the attention core, Megatron's selective activation recompute)
    recompute_granularity: str = "full"

    @property
    def headroom(self) -> float:
        """Free share of the fullest tile of all IPUs (negative when it overflows)."""
        return 1.0 - max(self.max_tile_fill, default=0.0)

    @property
    def fill_ceiling(self) -> float:
        """Its fullest tile rounded up to a whole percent: the --max-tile-fill that keeps
        every layout within this one's memory."""
        return math.ceil(max(self.max_tile_fill, default=0.0) * 100 - 1e-9) / 100

    @property
    def imbalance(self) -> float:
        """Busiest stage over the mean stage (1 = perfectly balanced)."""
        c = np.asarray(self.stage_cycles, dtype=np.float64)
        return float(c.max() / c.mean()) if len(c) and c.mean() > 0 else 1.0

    def key(self) -> tuple:
        """Ranking: fitting first, then throughput, then memory headroom."""
        return (not self.fits, self.oom_tiles if not self.fits else 0, -self.throughput,
                -self.headroom, len(self.splits), self.splits, self.amp,
                not self.recomputation, self.recompute_granularity, self.schedule)

    @property
    def recompute_words(self) -> str:
        """off, on (full) or selective: the recomputation column's words."""
        if not self.recomputation:
            return "off"
        return "on" if self.recompute_granularity == "full" else self.recompute_granularity

    def train_args(self, strategy: str = "pipelined") -> str:
        """The layout as train.py flags (AMP: one value, or conv and matmul per stage;
        none on a GPU, which has no AMP)."""
        args = [f"--target {self.target}"] if self.target != DEFAULT_TARGET else []
        args.append(f"--shards {self.num_ipus}")
        if self.num_ipus > 1 and strategy == "pipelined":
            args += ["--pipeline", f"--pipeline-schedule {self.schedule}"]
        if self.splits:
            args.append("--pipeline-splits " + " ".join(self.splits))
        if self.recomputation:
            args.append("--enable-recomputation")
            if self.recompute_granularity != "full":
                args.append(f"--recompute-granularity {self.recompute_granularity}")
        args.append(f"--gradient-accumulation {self.gradient_accumulation}")
        if self.gpu:
            if self.gpu_precision != "as-recorded":
                args.append(f"--gpu-precision {self.gpu_precision}")
            return " ".join(args)
        amp = [f"{a:g}" for a in self.amp]
        amp = amp[:1] if len(set(amp)) == 1 else [a for a in amp for _ in (0, 1)]
        return " ".join([*args, "--available-memory-proportion " + " ".join(amp)])

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "headroom": self.headroom, "imbalance": self.imbalance,
                "max_stage_cycles": max(self.stage_cycles, default=0),
                "train_args": self.train_args()}


def fit_words(fits: bool, oom_tiles: int, fill_limit: float = 1.0) -> str:
    """A plan's fit as tune prints it: yes, or NO (N tiles), naming a ceiling below 1."""
    if fits:
        return "yes"
    return f"NO ({oom_tiles} tiles" + (f" > {fill_limit:.0%})" if fill_limit < 1 else ")")


def candidate_options(base: Options, c: Candidate, target: str,
                      blocks: list[str] | None = None) -> Options:
    """Options that compile candidate `c` (`blocks`: the program's Block names)."""
    return layout_options(base, c.splits, c.amp, c.recomputation, c.schedule, target, blocks,
                          c.recompute_granularity)


def layout_options(base: Options, splits: list[str], amp: list[float], recomputation: bool,
                   schedule: str, target: str, blocks: list[str] | None = None,
                   granularity: str = "full") -> Options:
    """`base` with another layout: splits (they replace any blocks / stages; on one IPU
    they are recomputation checkpoints), AMP per IPU, recomputation and schedule. One IPU
    without splits puts every Block in one stage (else the Blocks' own IPUs would apply)."""
    one = len(amp) == 1
    stages = [list(blocks)] if one and not splits and blocks else []
    return base.copy(
        target=target, splits=list(splits), stages=stages, stage_ipus=[0] if stages else [],
        num_ipus=len(amp), available_memory_proportion=dict(enumerate(amp)),
        recomputation=recomputation, schedule=schedule,
        recompute_granularity=granularity if recomputation else "full",
        strategy="pipelined" if one else base.strategy)


class SearchBudget(Exception):
    """The compile budget ran out."""


# one layout to fit: splits, recomputation, schedule, source, recompute granularity
Layout = tuple[list[str], bool, str, str, str]


class Search:
    """Compiles layouts (cached, counted against the budget) and fits AMP per IPU.
    `executor` (anything with `submit(fn, *args)` returning a future with `result()`: a
    process pool, a Dask client) fits independent layouts side by side (`fit_many`)."""

    def __init__(self, program: Program, base: Options, target: str,
                 ladder: tuple[float, ...], max_compiles: int, progress: bool,
                 max_tile_fill: float = 1.0, executor: Any = None) -> None:
        from popviz.compiler import compile as compile_program

        self.compile = compile_program
        self.program, self.base, self.target = program, base, target
        self.blocks = [str(b) for b in program.model.get("blocks") or []]
        self.n, self.ladder, self.max = 1, ladder, max_compiles  # n: set once known
        self.count = 0
        self.fill_limit = max_tile_fill  # a layout fits when no tile is fuller than this
        self.cache: dict[tuple, Candidate] = {}
        self.fitted: dict[tuple, Candidate] = {}
        self.bar = _progress_bar(max_compiles, progress)
        self.executor = executor
        self._shipped: Any = None  # the program as the executor holds it (Dask: scattered)
        self._compiles: dict[tuple, int] = {}  # compiles of each layout fitted apart

    @property
    def width(self) -> int:
        """How many layouts the executor fits at once (1 without one)."""
        if self.executor is None:
            return 1
        workers = getattr(self.executor, "_max_workers", None)  # a process pool
        if workers is None and hasattr(self.executor, "scheduler_info"):  # a Dask client
            workers = sum(w.get("nthreads", 1) for w in
                          self.executor.scheduler_info()["workers"].values())
        return max(1, int(workers or 1))

    def fit_many(self, layouts: list[Layout], limit: int | None = None
                 ) -> list[Candidate | None]:
        """`fit` of each layout, in order. With an executor, the ones not fitted yet go
        side by side, each to a worker, when the budget (`limit`: the compiles the caller
        may spend in all, default `max`) holds every one of them at its most (a fit
        compiles at most once per AMP rung); else one after another here. Either way the
        same candidates, compiles and budget stops: past `max`, SearchBudget as `fit`
        raises it; past a `limit` given, None for that layout and the ones after it."""
        stop_at_limit = limit is not None
        limit = self.max if limit is None else limit
        todo: dict[tuple, Layout] = {}  # a layout twice (another source): fitted once
        for s, rc, sch, src, g in layouts:
            key = (tuple(s), rc, sch, g)
            if key not in self.fitted and key not in todo:
                todo[key] = (list(s), rc, sch, src, g)
        self._compiles = {}  # this batch's alone: `forget` drops only what it fitted
        room = limit - self.count
        if self.executor is None or len(todo) < 2 or len(todo) * len(self.ladder) > room:
            out: list[Candidate | None] = []
            for s, rc, sch, src, g in layouts:
                key, before = (tuple(s), rc, sch, g), self.count
                fresh = key not in self.fitted
                if fresh and self.count >= limit and stop_at_limit:
                    out += [None] * (len(layouts) - len(out))
                    return out
                out.append(self.fit(list(s), rc, sch, src, g))
                if fresh:
                    self._compiles[key] = self.count - before
            return out
        if self._shipped is None:
            scatter = getattr(self.executor, "scatter", None)  # Dask: send it once
            self._shipped = scatter(self.program, broadcast=True) if scatter else self.program
        futures = [self.executor.submit(_fit_apart, self._shipped, self.base, self.target,
                                        self.ladder, room, self.fill_limit, self.n, layout)
                   for layout in todo.values()]
        try:
            results = [f.result() for f in futures]
        except Exception as exc:  # a worker that died: one line, as imports say it
            for f in futures:
                f.cancel()
            raise ProfileError(f"a tune worker failed while it fitted a layout "
                               f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                               "nothing was written") from None
        for key, (candidate, compiles) in zip(todo, results, strict=True):
            self.count += compiles
            if self.bar is not None:
                self.bar.update(compiles)
            if candidate is not None:
                self.fitted[key] = candidate
                self._compiles[key] = compiles
        return [self.fitted.get((tuple(s), rc, sch, g)) for s, rc, sch, _, g in layouts]

    def run(self, options: Options, source: str) -> tuple[Candidate, Any]:
        if self.count >= self.max:
            raise SearchBudget
        self.count += 1
        if self.bar is not None:
            self.bar.update(1)
        report = self.compile(self.program, options)
        return _candidate(report, options, source, self.fill_limit), report

    def evaluate(self, splits: list[str], amp: list[float], rc: bool, schedule: str,
                 source: str, granularity: str = "full") -> Candidate:
        key = (tuple(splits), tuple(amp), rc, schedule, granularity)
        if key not in self.cache:
            options = layout_options(self.base, splits, amp, rc, schedule, self.target,
                                     self.blocks, granularity)
            self.cache[key] = self.run(options, source)[0]
        return self.cache[key]

    def forget(self, layouts: list[Layout]) -> None:
        """Drop layouts the last `fit_many` fitted apart that a search one at a time would
        not have fitted (moves after the one taken), with their compiles: the search's
        result and count stay those of one fit after another."""
        for s, rc, sch, _, g in layouts:
            key = (tuple(s), rc, sch, g)
            if key in self._compiles:
                dropped = self._compiles.pop(key)
                self.count -= dropped
                self.fitted.pop(key, None)
                for k in [k for k in self.cache  # its AMP rungs, if it was fitted here
                          if (k[0], k[2], k[3], k[4]) == key]:
                    del self.cache[k]
                if self.bar is not None:
                    self.bar.update(-dropped)

    def fit(self, splits: list[str], rc: bool, schedule: str, source: str,
            granularity: str = "full") -> Candidate:
        """The layout with each IPU at the highest AMP rung that fits (fit is taken to be
        monotone in AMP and independent between IPUs, so all IPUs search at once). Per
        IPU: the top rung, the next, then the lowest (does any fit?), then bisection.
        An IPU whose fullest tile is no smaller at the lowest rung than higher up stops
        there (temporaries are not what overflows, so lower rungs would not help)."""
        key = (tuple(splits), rc, schedule, granularity)
        if key in self.fitted:
            return self.fitted[key]
        last = len(self.ladder) - 1
        bad: list[int] = [-1] * self.n  # highest failing rung
        ok: list[int | None] = [None] * self.n  # lowest fitting rung
        fill: list[dict[int, float]] = [{} for _ in range(self.n)]
        stuck: set[int] = set()
        probe = [0] * self.n
        while True:
            c = self.evaluate(splits, [self.ladder[r] for r in probe], rc, schedule, source,
                              granularity)
            oom = set(c.oom_ipus)
            for i, r in enumerate(probe):
                if i in stuck or (ok[i] is not None and r == ok[i]):
                    continue
                fill[i][r] = c.max_tile_fill[i]
                if i in oom:
                    bad[i] = max(bad[i], r)
                    # judged at the lowest rung: a plan may not change between two
                    # neighbouring rungs and still shrink further down
                    higher_fill = [f for q, f in fill[i].items() if q < r]
                    if r == last and higher_fill and c.max_tile_fill[i] >= min(higher_fill):
                        stuck.add(i)
                else:
                    ok[i] = r if (fit := ok[i]) is None else min(fit, r)
            nxt = []
            for i, fit in enumerate(ok):
                if i in stuck:
                    nxt.append(probe[i])
                elif fit is not None and fit - bad[i] <= 1:
                    nxt.append(fit)
                elif fit is not None:
                    nxt.append((bad[i] + fit) // 2)
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


def _fit_apart(program: Program, base: Options, target: str, ladder: tuple[float, ...],
               budget: int, fill_limit: float, n: int, layout: Layout
               ) -> tuple[Candidate | None, int]:
    """One layout fitted in a worker (`Search.fit_many`): its candidate (None when the
    budget ran out first) and the compiles it took."""
    search = Search(program, base, target, ladder, budget, False, fill_limit)
    search.n = n
    splits, rc, schedule, source, granularity = layout
    try:
        return search.fit(splits, rc, schedule, source, granularity), search.count
    except SearchBudget:
        return None, search.count


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="tune", unit="compile", file=sys.stderr, leave=False)


def _candidate(report: Report, options: Options, source: str,
               fill_limit: float = 1.0) -> Candidate:
    """The compiled layout as a Candidate. Below a `fill_limit` of 1, a tile fuller than
    that share of its capacity counts as out of memory: the layout keeps headroom."""
    s = report.summary
    tm = report.tables["tile_memory"]
    n = int(s["num_ipus"])
    fill = (tm.groupby("ipu")["total_bytes"].max() / tm.groupby("ipu")["capacity_bytes"].max()
            ).reindex(range(n)).fillna(0.0)
    fits, oom_tiles = bool(s["fits"]), int(s["oom_tiles"])
    oom_ipus = [int(i) for i in s.get("oom_ipus", [])]
    if fill_limit < 1.0:
        over = (tm["total_bytes"] > fill_limit * tm["capacity_bytes"]).to_numpy()
        oom_tiles = int(over.sum())
        oom_ipus = sorted({int(i) for i in tm.loc[over, "ipu"]})
        fits = oom_tiles == 0
    st = report.tables["stages"]
    per_mb = (st["forward_cycles_per_microbatch"] + st["recompute_cycles_per_microbatch"]
              + st["backward_cycles_per_microbatch"])
    peak = s.get("peak_liveness_bytes") or {}
    # blocks / explicit stages: the split names are the first layers of stages 1..
    splits = list(options.splits) or [str(x) for x in st["first_layer"].iloc[1:]]
    return Candidate(
        source=source, splits=splits, amp=[options.amp_for(i) for i in range(n)],
        recomputation=bool(options.recomputation),
        recompute_granularity=str(options.recompute_granularity)
        if options.recomputation else "full",
        gradient_accumulation=int(options.gradient_accumulation),
        target=str(options.target), gpu=naming_of(report.meta).gpu_plan,
        gpu_precision=str(options.gpu_precision),
        schedule=str(s.get("schedule") or options.schedule), num_ipus=n,
        replicas=int(s.get("replicas") or 1),
        fits=fits, oom_tiles=oom_tiles, oom_ipus=oom_ipus,
        throughput=float(s["throughput"]), throughput_per_ipu=float(s["throughput_per_ipu"]),
        step_ms=float(s["step_ms"]), idle_fraction=float(s["idle_fraction"]),
        stage_cycles=[int(x) for x in per_mb],
        peak_bytes=[int(peak.get(str(i), 0)) for i in range(n)],
        max_tile_fill=[round(float(x), 6) for x in fill], amp_ignored=int(s["amp_ignored"]))
