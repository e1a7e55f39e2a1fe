"""One small profile of each kind (modelled IPU, modelled GPU, measured, imported) and
its semantic mutants: each column popviz.format.bounds bounds set to 10^9, -1 and NaN
(tests/test_value_bounds*.py, bench/bench_fuzz_serve.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from popviz.format.bounds import COLUMNS
from tooling.testing.semantic import VALUES, Mutation, numeric_columns

REPO = Path(__file__).resolve().parents[1]
MODELLED_IPU = REPO / "profiles" / "tutorial_pipelined" / "inference" / "profile.h5"
MEASURED = REPO / "profiles" / "tutorial_measured_2ranks" / "profile.h5"
KINDS = ("modelled IPU", "modelled GPU", "measured", "imported")


def make_sources(folder: Path) -> dict[str, Path]:
    """The four kinds' small profiles under `folder` (a GPU plan is compiled, a trace
    imported with its memory snapshot: ~10 s)."""
    from popviz import import_trace
    from popviz.compiler import compile
    from popviz.format.writer import write_report
    from popviz.options import Options
    from tests.import_fixtures import RESNET, snapshot_inside_trace
    from tooling.gpu_programs import gpu_program

    folder.mkdir(parents=True, exist_ok=True)
    ipu = shutil.copyfile(MODELLED_IPU, folder / "ipu.h5")
    measured = shutil.copyfile(MEASURED, folder / "measured.h5")
    plan = compile(gpu_program("mlp", 512, 64, "adamw"),
                   Options(target="h100", splits=["body.2"], gradient_accumulation=2))
    gpu = write_report(plan, folder / "gpu.h5")
    imported = import_trace([RESNET], folder / "imported.h5",
                            memory_snapshot=snapshot_inside_trace(folder))
    return {"modelled IPU": Path(ipu), "modelled GPU": Path(gpu), "measured": Path(measured),
            "imported": Path(imported)}


def bounded_columns(source: Path) -> list[tuple[str, str]]:
    """(table, column) of the source's numeric columns with rows that bounds.py bounds."""
    return [(t, c) for t, c in numeric_columns(source) if c in COLUMNS.get(t, {})]


def mutations(source: Path) -> list[Mutation]:
    """Every bounded column of `source` at 10^9, -1 and NaN, every row."""
    return [Mutation(t, c, v) for t, c in bounded_columns(source) for v in VALUES]


def write_mutant(source: Path, mutation: Mutation, to: Path) -> Path:
    to.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, to)
    mutation.apply(to)
    return to


def file_name(kind: str, mutation: Mutation) -> str:
    """A file name for a mutant (letters, digits, _ . -)."""
    text = f"{kind}-{mutation.label}".replace(" ", "_").replace("=", "_")
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in text) + ".h5"


def allowed_mutations(source: Path) -> list[Mutation]:
    """The values bounds.py lets through, all at once: every column whose 'none' is -1 at
    -1, every key-only column ('finite': a stream, a correlation id) at 10^9."""
    out = []
    for table, column in bounded_columns(source):
        kind, lowest = COLUMNS[table][column]
        if lowest < 0:
            out.append(Mutation(table, column, -1))
        elif kind == "finite":
            out.append(Mutation(table, column, 10**9))
    return out
