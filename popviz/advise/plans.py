"""The plans of `popviz tune` as a table and a Pareto front, and each plan written as a
profile so it can be compared with the current one (the app's /tune page).

Throughput against peak memory: a plan is on the Pareto front when it fits and no other
fitting plan has both more throughput and less peak memory (per IPU, the fullest IPU)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from popviz.advise.tune import TuneResult, candidate_options, load_program, tune
from popviz.advise.tune_search import Candidate
from popviz.format.profile import Profile

PLAN_COLUMNS = ["plan", "splits", "amp", "recomputation", "recompute", "schedule", "fits",
                "oom_tiles",
                "throughput", "throughput_per_ipu", "vs_now", "step_ms", "idle_fraction",
                "peak_bytes", "fullest_tile", "imbalance", "pareto", "train_args"]


def run_tune(profile: Profile, num_ipus: int | None = None, max_compiles: int = 16,
             top: int = 8, max_tile_fill: float = 1.0) -> TuneResult:
    """`popviz tune` on an open modelled profile (no progress bar); a plan fits when no
    tile is fuller than `max_tile_fill` of its memory (--max-tile-fill)."""
    program, options = load_program(profile)
    return tune(program, options, num_ipus, top=top, max_compiles=max_compiles,
                max_tile_fill=max_tile_fill)


def _row(name: str, c: Candidate, strategy: str = "pipelined") -> dict:
    amps = [f"{a:g}" for a in c.amp]
    return {"plan": name, "splits": " ".join(c.splits) or "-",
            "amp": amps[0] if len(set(amps)) == 1 else "/".join(amps),
            "recomputation": bool(c.recomputation), "recompute": c.recompute_words,
            "schedule": c.schedule,
            "fits": bool(c.fits), "oom_tiles": int(c.oom_tiles),
            "throughput": float(c.throughput), "throughput_per_ipu": float(c.throughput_per_ipu),
            "vs_now": float(c.throughput_ratio), "step_ms": float(c.step_ms),
            "idle_fraction": float(c.idle_fraction),
            "peak_bytes": float(max(c.peak_bytes, default=0)),
            "fullest_tile": float(max(c.max_tile_fill, default=0.0)),
            "imbalance": float(c.imbalance), "train_args": c.train_args(strategy)}


def pareto(plans: pd.DataFrame) -> pd.Series:
    """True for the fitting plans that no other fitting plan beats on both throughput
    (higher) and peak memory (lower or equal, one strictly better)."""
    fit = plans[plans["fits"]]
    out = pd.Series(False, index=plans.index)
    for i, row in fit.iterrows():
        better = fit[(fit["throughput"] >= row["throughput"]) &
                     (fit["peak_bytes"] <= row["peak_bytes"]) &
                     ((fit["throughput"] > row["throughput"]) |
                      (fit["peak_bytes"] < row["peak_bytes"]))]
        out[i] = better.empty  # type: ignore[call-overload]  # pandas-stubs: a group key is Hashable
    return out


def plans_table(result: TuneResult, strategy: str = "pipelined") -> pd.DataFrame:
    """'now' then the ranked plans '#1', '#2', ... with their figures and Pareto flag;
    `train_args` in the flags of the profile's `strategy`, as `popviz tune` prints them (a
    sharded profile's layouts have no --pipeline)."""
    rows = [_row("now", result.baseline, strategy)]
    rows += [_row(f"#{i}", c, strategy) for i, c in enumerate(result.candidates, 1)]
    frame = pd.DataFrame(rows)
    frame["pareto"] = pareto(frame)
    return frame[PLAN_COLUMNS]


def compile_plan(profile: Profile, result: TuneResult, rank: int) -> Any:
    """Compile plan `#rank` (1-based) into an in-memory Report (nothing written)."""
    from popviz.compiler import compile as compile_program

    if not 1 <= rank <= len(result.candidates):
        raise ValueError(f"no plan #{rank}: the search kept {len(result.candidates)}")
    program, options = load_program(profile)
    plan = candidate_options(options, result.candidates[rank - 1], result.target,
                             result.blocks)
    return compile_program(program, plan)


def write_plan(profile: Profile, result: TuneResult, rank: int,
               path: str | os.PathLike[str]) -> Path:
    """Compile plan `#rank` (1-based) and write it as a profile at `path` (never over
    `profile` itself: OwnInput)."""
    from popviz.format.guards import refuse_own_input
    from popviz.format.writer import profile_path, write_report

    refuse_own_input(profile_path(path), [profile.path] if profile.path else [], "path")
    return write_report(compile_plan(profile, result, rank), path,
                        command_line=f"popviz tune (plan #{rank})")
