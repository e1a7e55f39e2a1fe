"""The advisor: re-plan a recorded program with other split points, AMP per IPU,
recomputation and schedule, and rank the layouts by modelled throughput.

Layering: the advise package sits beside cli, above analysis: it opens profiles and calls
`popviz.compile` because re-planning a recorded program is its whole point; it never runs
the model.
Every candidate is one pure, deterministic `compile()` call, so the same profile and
arguments give the same ranking. The search (see docs/tune.md):

1. seeds: the current splits, and splits that balance per-stage cycles (DP over the
   segments between split names), with and without recomputation;
2. AMP per IPU: the highest ladder rung that fits (top, next, lowest, then bisection);
3. local search: move one split one name earlier / later, the bottleneck (or
   out-of-memory) stage first, keep the first move that raises throughput;
4. the other pipeline schedule (Grouped / Interleaved) for the best layouts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from popviz.advise.tune_layers import Segments, balanced_bounds, segments, split_positions
from popviz.advise.tune_local import local_search
from popviz.advise.tune_search import (
    Candidate,
    Layout,
    Search,
    SearchBudget,
    candidate_options,
    layout_options,
)
from popviz.compiler.plan_common import ACCUMULATE_GRADIENT
from popviz.errors import ProfileError
from popviz.format.profile import Profile
from popviz.format.reader import open as open_profile
from popviz.options import Options
from popviz.recorder.program import OP_COLUMNS, OP_EXTRA_COLUMNS, TENSOR_COLUMNS, Program
from popviz.target.gpu import GpuTarget
from popviz.target.machines import get_target
from popviz.vocab import MODELLED_KIND

__all__ = ["AMP_LADDER", "DEFAULT_MAX_COMPILES", "Candidate", "TuneResult", "candidate_options",
           "layout_options", "load_program", "tune"]

AMP_LADDER = (0.6, 0.45, 0.3, 0.2, 0.15, 0.1, 0.05)
DEFAULT_MAX_COMPILES = 60
SECTION_COUNTS = (2, 3, 4, 6, 8)  # checkpoint sections tried on one IPU
SCHEDULE_RESERVE = 4  # compiles kept back from local search for the schedule variants
NEAR_EQUAL = 1e-3  # layouts this close in throughput (same fit, recomputation, schedule)
# are listed once: the first ranked stands for the others


def load_program(profile: Profile | str | os.PathLike[str]) -> tuple[Program, Options]:
    """The recorded Program and the Options a modelled profile was compiled with.

    The profile's `ops` are the program's ops plus compiler columns and synthesized rows
    (recompute copies, source_op >= 0; gradient accumulations); `tensors` are the
    program's tensors plus stage and ipu. Dropping those gives back the program exactly,
    so compiling it with the stored options reproduces the stored tables (if the compiler
    has not changed since)."""
    if isinstance(profile, str | os.PathLike):
        with open_profile(profile) as opened:  # opened here, so closed here
            return load_program(opened)
    p = profile
    where = str(p.path)
    if p.kind != MODELLED_KIND:
        raise ProfileError(f"{where}: a {p.kind} profile holds no recorded program to "
                           "re-plan; tune needs a modelled one (train.py --profile)")
    ops, tensors = p.ops, p.tensors
    missing = [c for c in (*OP_COLUMNS, "source_op") if c not in ops.columns]
    missing += [c for c in TENSOR_COLUMNS if c not in tensors.columns]
    if missing or ops.empty:
        what = f"lacks {', '.join(missing[:5])}" if missing else "has no ops"
        raise ProfileError(f"{where}: the recorded program cannot be rebuilt (ops/tensors "
                           f"{what}); record it again with train.py --profile")
    synthesized = (ops["source_op"] >= 0) | (ops["op"].astype(str) == ACCUMULATE_GRADIENT)
    ops = ops[~synthesized].sort_values("op_id", kind="stable")
    ops = ops[[*OP_COLUMNS, *(c for c in OP_EXTRA_COLUMNS if c in ops.columns)]]
    ops = ops.reset_index(drop=True)
    tensors = tensors[list(TENSOR_COLUMNS)].reset_index(drop=True)
    mode = "plan" if not (ops["host_ns"] > 0).any() else "measured"
    try:
        options = Options.from_meta(dict(p.meta.get("options") or {}))
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"{where}: stored options cannot be rebuilt: {exc}") from None
    return Program(ops, tensors, dict(p.meta.get("model") or {}), mode), options


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
    blocks: list[str] = field(default_factory=list)  # the program's Blocks (for best_options)
    max_tile_fill: float = 1.0  # 'fits': no tile fuller than this share of its memory
    # a GPU target: the largest micro-batch (powers of two from the current) that fits the
    # best layout, with its samples/s; None where not searched
    largest_micro_batch: dict[str, Any] | None = None

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    def best_options(self, base: Options) -> Options:
        best = self.best or self.baseline
        return candidate_options(base, best, self.target, self.blocks)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "target": self.target, "num_ipus": self.num_ipus,
                "compiles": self.compiles, "layouts": self.layouts,
                "max_tile_fill": self.max_tile_fill,
                "seconds": self.seconds, "budget_exhausted": self.budget_exhausted,
                "notes": list(self.notes), "largest_micro_batch": self.largest_micro_batch,
                "baseline": self.baseline.to_dict(),
                "candidates": [c.to_dict() for c in self.candidates]}

def tune(program: Program, options: Options, num_ipus: int | None = None, *,
         amp_ladder: tuple[float, ...] = AMP_LADDER, top: int = 5,
         max_compiles: int = DEFAULT_MAX_COMPILES, target: str | None = None,
         progress: bool = False, max_tile_fill: float = 1.0,
         executor: Any = None) -> TuneResult:
    """Search layouts of `program` over `num_ipus` IPUs (default: as `options` place it)
    and rank them; the layout of `options` is the baseline. A layout fits when no tile is
    fuller than `max_tile_fill` of its memory (below 1: headroom kept on every IPU, as
    experts balance memory; the baseline is judged the same way). Raises ValueError for an
    impossible request (more IPUs than split names + 1, empty ladder, ...). `executor` (a
    process pool or a Dask client: `submit` and futures) fits the search's independent
    layouts, and the local search's next moves, side by side (`Search.fit_many`), with
    the result of one fit after another."""
    t0 = time.perf_counter()
    ladder = _check_ladder(amp_ladder)
    if top < 1:
        raise ValueError(f"--top must be >= 1, got {top}")
    if not 0.0 < max_tile_fill <= 1.0:
        raise ValueError(f"--max-tile-fill must be in (0, 1], got {max_tile_fill:g}")
    if max_compiles < 2:
        raise ValueError(f"--max-compiles must be >= 2 (baseline and one candidate), "
                         f"got {max_compiles}")
    target = str(target or options.target)
    if isinstance(get_target(target), GpuTarget):  # AMP is an IPU option: one rung is enough
        ladder = ladder[:1]
        if max_tile_fill < 1.0:
            raise ValueError(f"--max-tile-fill is an IPU option: a GPU ({target}) has no "
                             "tiles; leave it at 1")
    usable = len(split_positions(program)[0])
    if num_ipus is not None:
        _check_ipus(program, int(num_ipus), usable)
    search = Search(program, options, target, ladder, max_compiles, progress, max_tile_fill,
                    executor)
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
    except SearchBudget:
        found, notes = list(search.fitted.values()), []
    found = _collapse(_rank(found, baseline))
    notes = list(notes)
    largest = None
    try:
        if isinstance(get_target(target), GpuTarget) and options.training:
            largest = _largest_micro_batch(search, found[0] if found else baseline,
                                           int(program.model.get("batch_size") or 1),
                                           options.micro_batch_size)
    finally:
        search.close()
    if largest is not None:
        notes.append(_micro_batch_note(largest))
    if max_tile_fill < 1.0:
        notes.append(f"'fits' here means no tile fuller than {max_tile_fill:.0%} of its "
                     "memory (--max-tile-fill)")
    if search.count >= max_compiles:
        notes.append(f"stopped at the compile budget ({max_compiles}); raise --max-compiles "
                     "to search further")
    if found and not found[0].fits:
        notes.append("no layout found fits: try more IPUs, recomputation, a lower AMP ladder "
                     "or a smaller micro-batch")
    if found and (note := _headroom_note(found[0], baseline)):
        notes.append(note)
    return TuneResult(baseline, found[:top], n, target, str(program.model.get("name", "")),
                      search.count, len(search.fitted), time.perf_counter() - t0,
                      search.count >= max_compiles, notes, search.blocks, max_tile_fill,
                      largest)


MICRO_BATCH_DOUBLINGS = 10  # 2^10 x the current at most (and the compile budget)


def _largest_micro_batch(search: Search, layout: Candidate, recorded: int,
                         current: int) -> dict[str, Any] | None:
    """A GPU layout's largest micro-batch that fits: the current one doubled while the
    plan still fits (each try is a compile, counted against the budget); None when the
    layout does not fit at all or the budget is spent first."""
    if not layout.fits:
        return None
    now = current if current > 1 else recorded
    options = candidate_options(search.base, layout, search.target, search.blocks)
    best, best_rate, tried = now, layout.throughput, [now]
    for _ in range(MICRO_BATCH_DOUBLINGS):
        size = best * 2
        try:
            candidate = search.run(options.copy(micro_batch_size=size),
                                   f"micro-batch {size}")[0]
        except SearchBudget:
            break
        tried.append(size)
        if not candidate.fits:
            break
        best, best_rate = size, candidate.throughput
    else:
        return {"now": now, "largest": best, "throughput": best_rate, "tried": tried,
                "limit": "doublings"}
    return {"now": now, "largest": best, "throughput": best_rate, "tried": tried,
            "limit": "memory" if tried[-1] > best else "budget"}


def _micro_batch_note(largest: dict[str, Any]) -> str:
    more = {"memory": f"{largest['largest'] * 2} does not fit",
            "budget": "the compile budget stopped the doubling",
            "doublings": "doubling stopped here"}[largest["limit"]]
    return (f"largest micro-batch that fits the best layout: {largest['largest']} (now "
            f"{largest['now']}; {more}), {largest['throughput']:,.0f} samples/s; try it "
            f"with train.py --batch-size {largest['largest']} (a larger micro-batch also "
            "changes the global batch)")


HEADROOM_GAP = 0.05  # the best fills its fullest tile this much more than the current


def _headroom_note(best: Candidate, baseline: Candidate) -> str:
    """A note when the best layout is faster partly by filling memory the current one
    keeps free: experts balance memory across IPUs (docs/tune.md), and the model's memory
    is an estimate, so say how to search within the current layout's fullest tile."""
    now, new = max(baseline.max_tile_fill, default=0.0), max(best.max_tile_fill, default=0.0)
    if not (best.fits and baseline.fits and best.throughput > baseline.throughput
            and new > now + HEADROOM_GAP and now > 0):
        return ""
    return (f"the best layout fills its fullest tile to {new:.0%} where the current one "
            f"stops at {now:.0%}: some of its gain is headroom the current layout keeps "
            f"(experts balance memory across IPUs); --max-tile-fill {baseline.fill_ceiling:g} "
            "searches "
            "within the current layout's fullest tile")


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


def _search(search: Search, options: Options, segs: Segments, n: int,
            baseline: Candidate) -> tuple[list[Candidate], list[str]]:
    notes: list[str] = []
    rcs = (True, False) if options.training else (False,)
    gpu = isinstance(get_target(search.target), GpuTarget)
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
        checkpointed = [c for c in seeds if c.splits]
        if checkpointed:  # move the checkpoints of the best sectioning
            local_search(search, min(checkpointed, key=Candidate.key), segs, "local",
                         SELECTIVE_TRIES if gpu and options.training else 0)
        if gpu and options.training:
            _selective(search)
        return list(search.fitted.values()), notes

    pipelined = options.strategy == "pipelined" and options.training
    # torch.distributed.pipelining's names and Zero Bubble's on a GPU target, PopART's on
    # an IPU; the first is searched with, the others tried on the two best layouts
    pair: tuple[str, ...] = ("1F1B", "GPipe", "ZB1P", "ZB2P") if gpu \
        else ("Grouped", "Interleaved")
    first = options.schedule if options.schedule in pair else pair[0]
    schedule = first if pipelined else options.schedule
    current = list(options.splits) if len(options.splits) == n - 1 and \
        segs.bounds(list(options.splits)) is not None else None
    starts: list[Layout] = []
    for rc in rcs:
        starts.append((segs.splits(balanced_bounds(segs, n, rc)), rc, schedule, "balanced",
                       "full"))
        if current is not None:
            starts.append((current, rc, schedule, "current splits", "full"))
    search.fit_many(starts)  # side by side with an executor; cached for the fits below
    by_rc = {rc: [search.fit(list(s), r, sch, src) for s, r, sch, src, _ in starts
                  if r == rc] for rc in rcs}
    order = sorted(rcs, key=lambda rc: min(by_rc[rc], key=Candidate.key).key())
    reserve = (SCHEDULE_RESERVE if pipelined else 0) + \
        (SELECTIVE_TRIES if gpu and options.training else 0) + \
        (len(TWO_PER_GPU) if gpu and pipelined else 0)
    for rc in order:
        local_search(search, min(by_rc[rc], key=Candidate.key), segs, "local", reserve)
    if pipelined:
        layouts = []
        for c in _rank(list(search.fitted.values()), baseline):
            if (c.splits, c.recomputation) not in layouts:
                layouts.append((c.splits, c.recomputation))
        search.fit_many([(splits, rc, other, f"{other} schedule", "full")
                         for other in pair if other != schedule
                         for splits, rc in layouts[:2]])
    if gpu and options.training:
        _selective(search)
    if gpu and pipelined and 2 * n <= segs.count:  # after selective: the budget's last
        best = _rank(list(search.fitted.values()), baseline)
        _two_stages_per_gpu(search, segs, n, best[0].recomputation if best else False)
    return list(search.fitted.values()), notes


# GPU schedules that run two stages on each GPU, tried on the balanced 2n-stage layout
TWO_PER_GPU = ("ZBV", "InterleavedZB", "Interleaved1F1B")


def _two_stages_per_gpu(search: Search, segs: Segments, n: int, rc: bool) -> None:
    """On n GPUs, the model cut into 2n balanced stages, run two per GPU: ZB-V folded in a
    V (GPU r: stages r and 2n - 1 - r), torch's interleaved zero-bubble and Interleaved1F1B
    looped (GPU r: stages r and n + r); with the recomputation of the best layout."""
    splits = segs.splits(balanced_bounds(segs, 2 * n, rc))
    search.fit_many([(splits, rc, kind, f"{kind}: 2 stages per GPU", "full")
                     for kind in TWO_PER_GPU])


SELECTIVE_TRIES = 2  # the best layouts with full recomputation tried with selective


def _selective(search: Search) -> None:
    """On a GPU, recomputation is three-way (none, selective, full): the best layouts that
    recompute fully are tried recomputing only their attention core (Megatron's
    selective activation recompute: most of full's memory saving for a fraction of its
    time on a transformer). Within the budget; not for a program without an attention
    core to recompute (none, or a fused kernel that keeps no scores)."""
    from popviz.compiler.stages import attention_core

    ops = search.program.ops
    if not attention_core(ops[ops["phase"] == "forward"]).any():
        return
    full = [c for c in sorted(search.fitted.values(), key=Candidate.key)
            if c.recomputation and c.recompute_granularity == "full"]
    try:
        search.fit_many([(c.splits, True, c.schedule, "selective recomputation", "selective")
                         for c in full[:SELECTIVE_TRIES]])
    except SearchBudget:
        return


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
                     and k.recompute_granularity == c.recompute_granularity
                     and k.schedule == c.schedule and abs(k.throughput - c.throughput)
                     <= NEAR_EQUAL * max(k.throughput, 1e-12)), None)
        if twin is None:
            out.append(c)
        else:
            twin.similar += 1
    return out
