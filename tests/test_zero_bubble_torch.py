"""torch.distributed.pipelining's zero-bubble schedules as popviz plans them: each GPU's
order is torch's own, checked by running torch's order code (its schedule classes'
`_calculate_single_rank_operations`, which reads only the sizes) on the same sizes; the
plan then runs every action once, after what it needs, with stages placed as torch places
them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from torch.distributed.pipelining import schedules as torch_schedules

from popviz import open as popviz_open
from popviz.compiler.schedule import build_schedule
from popviz.compiler.schedule_zb import interleaved_zb_orders, stage_gpus, zbv_orders
from tests.test_zero_bubble import check_dependencies

SIZES = [(2, 1), (2, 3), (2, 4), (4, 4), (4, 8), (4, 6), (8, 8), (8, 24), (3, 9)]


def _torch_order(actions: list) -> list[str]:
    """torch's actions as popviz writes them: its I (input gradient) is B."""
    return [str(a).replace("I", "B") for a in actions if a is not None]


@pytest.mark.parametrize(("p", "m"), SIZES)
def test_zbv_is_torchs_order(p: int, m: int) -> None:
    fake = SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p)
    ours = zbv_orders(p, m)
    for r in range(p):
        theirs = torch_schedules.ScheduleZBVZeroBubble._calculate_single_rank_operations(
            fake, r)
        assert [str(a) for a in ours[r]] == _torch_order(theirs), (p, m, r)


@pytest.mark.parametrize("v", [1, 2, 3])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 4), (4, 8), (4, 12), (8, 16), (2, 3)])
def test_interleaved_zero_bubble_is_torchs_order(p: int, v: int, m: int) -> None:
    rounds = max(1, m // p)
    fake = SimpleNamespace(pp_group_size=p, _n_microbatches=m, n_local_stages=v,
                           microbatches_per_round=m // rounds)
    ours = interleaved_zb_orders(p, v, m)
    for r in range(p):
        method = torch_schedules.ScheduleInterleavedZeroBubble._calculate_single_rank_operations
        assert [str(a) for a in ours[r]] == _torch_order(method(fake, r)), (p, v, m, r)


def test_stages_sit_where_torch_puts_them() -> None:
    assert stage_gpus("ZBV", 8, 4).tolist() == [0, 1, 2, 3, 3, 2, 1, 0]
    assert stage_gpus("InterleavedZB", 8, 4).tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    v_style = torch_schedules.generate_stage_to_rank_mapping(4, 8, style="v")
    assert [v_style[s] for s in range(8)] == stage_gpus("ZBV", 8, 4).tolist()


@pytest.mark.parametrize(("kind", "n", "ranks"), [("ZBV", 8, 4), ("ZBV", 4, 2),
                                                   ("InterleavedZB", 8, 4),
                                                   ("InterleavedZB", 4, 4)])
@pytest.mark.parametrize("m", [1, 4, 8, 12])
def test_every_action_once_after_what_it_needs_one_per_gpu_at_a_time(
        kind: str, n: int, ranks: int, m: int) -> None:
    if kind == "InterleavedZB" and m % max(1, m // ranks):
        pytest.skip("torch refuses this count too")
    s = build_schedule(n, m, 1, True, kind, 1, False, ranks=ranks)
    a = s.actions
    assert s.split_backward
    for ps in "FBW":
        mine = a[a["pass"] == ps]
        assert len(mine) == n * m and not mine.duplicated(["stage", "microbatch"]).any()
    check_dependencies(a, n, m)
    gpu = stage_gpus(kind, n, ranks)[a["stage"].to_numpy()]
    assert not a.assign(gpu=gpu).duplicated(["superstep", "gpu"]).any()


def test_zbv_holds_2p_half_stages_at_most() -> None:
    """By hand from torch's order: GPU r runs 2(p - r) - 1 + r forwards of its first stage
    (r of its second between them), then one more before that stage's first input
    gradient, while its second stage holds r: 2p micro-batches of half a 1F1B stage's
    layers at once, p of a whole one (the paper's §6: "peak activations memory of
    p M_B"). A forward holds a micro-batch until its W."""
    p, m = 4, 12
    s = build_schedule(2 * p, m, 1, True, "ZBV", 1, False, ranks=p)
    a = s.actions[s.actions["pass"].isin(["F", "W"])]
    gpu = stage_gpus("ZBV", 2 * p, p)[a["stage"].to_numpy()]
    for r in range(p):
        held = np.cumsum(np.where(a["pass"].to_numpy()[gpu == r] == "F", 1, -1))
        assert held.max() == 2 * p and held[-1] == 0


@pytest.mark.parametrize(("kind", "n", "ranks", "message"), [
    ("ZBV", 6, 4, "exactly two stages per GPU"),
    ("InterleavedZB", 6, 4, "the same number on each"),
])
def test_a_layout_the_schedule_cannot_run_is_refused(kind: str, n: int, ranks: int,
                                                     message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_schedule(n, 8, 1, True, kind, 1, False, ranks=ranks)


def test_a_gpu_plan_places_the_stages_and_runs_w_apart() -> None:
    """The MLP's four Linear blocks as four stages on two GPUs: ZBV folds them into a V,
    InterleavedZB loops them; each GPU runs its two stages' actions in torch's order, with
    every micro-batch's weight gradient after its input gradient; ZB-V, whose last stage
    sits with its first, finishes sooner than Interleaved1F1B on the same stages."""
    from popviz.compiler import compile
    from popviz.options import Options
    from tooling.gpu_programs import gpu_program

    program = gpu_program("mlp", 64, 8)
    base = Options(target="h100", splits=["body.1", "body.2", "body.3"], num_ipus=2,
                   gradient_accumulation=4)
    plans = {k: compile(program, base.copy(schedule=k))
             for k in ("Interleaved1F1B", "InterleavedZB", "ZBV")}
    for kind in ("InterleavedZB", "ZBV"):
        report = plans[kind]
        stages = report.tables["stages"].sort_values("stage")
        assert stages["ipu"].tolist() == stage_gpus(kind, 4, 2).tolist()
        comp = report.tables["trace"]
        comp = comp[(comp["kind"] == "compute") & (comp["pass"] == "B")]
        parts = comp.groupby(["stage", "microbatch", "grad_part"])["start"].min()
        for st in range(1, 4):  # the first stage's backward is all weight gradient
            for mb in range(4):
                assert parts[(st, mb, "input")] < parts[(st, mb, "weight")], (kind, st, mb)
        assert report.summary["num_ipus"] == 2
    assert plans["ZBV"].summary["step_ms"] < plans["Interleaved1F1B"].summary["step_ms"]


def test_train_py_takes_the_gpus_and_their_stages(tmp_path: Path) -> None:
    """--shards is the GPUs of a schedule that runs several stages on each: ZBV takes
    2 x shards - 1 splits, and says so in one line when it gets another count."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    base = [sys.executable, str(root / "train.py"), "--model", "resnet", "--model-size",
            "18", "--target", "h100", "--plan-only", "--pipeline", "--shards", "2",
            "--pipeline-schedule", "ZBV", "--batch-size", "2", "--gradient-accumulation",
            "4", "--image-size", "32", "--profile", "--profile-dir", str(tmp_path / "p")]
    bad = subprocess.run([*base, "--pipeline-splits", "b3/0/relu"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == (
        "train.py: error: --pipeline-schedule ZBV on 2 GPUs runs 2 x 2 stages: give 3 "
        "--pipeline-splits names, got 1")
    ok = subprocess.run([*base, "--pipeline-splits", "b2/0/relu", "b3/0/relu", "b4/0/relu"],
                        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    with popviz_open(tmp_path / "p") as profile:
        assert profile.meta["options"]["schedule"] == "ZBV"
        assert profile.stages.sort_values("stage")["ipu"].tolist() == [0, 1, 1, 0]


def test_tune_on_gpus_tries_two_stages_per_gpu() -> None:
    """tune cuts the model into 2n balanced stages for n GPUs and tries them folded in a
    V (ZBV) and looped (InterleavedZB, Interleaved1F1B); each such layout's flags are the
    GPUs as --shards and 2n - 1 splits, and a compile of its options gives what tune says."""
    from popviz.advise.tune import TWO_PER_GPU, tune
    from popviz.compiler import compile
    from popviz.options import Options
    from tooling.gpu_programs import gpu_program

    program = gpu_program("mlp", 64, 8)
    base = Options(target="h100", splits=["body.2"], num_ipus=2, schedule="1F1B",
                   gradient_accumulation=4)
    result = tune(program, base, 2, max_compiles=40, progress=False, top=50)
    folded = {c.schedule: c for c in [result.baseline, *result.candidates]
              if c.schedule in TWO_PER_GPU}
    assert set(folded) == set(TWO_PER_GPU), [c.schedule for c in result.candidates]
    for kind, c in folded.items():
        assert c.num_ipus == 2 and len(c.splits) == 3 and len(c.peak_bytes) == 2
        assert f"--shards 2 --pipeline --pipeline-schedule {kind} --pipeline-splits " \
            f"{' '.join(c.splits)}" in c.train_args()
        again = compile(program, base.copy(splits=c.splits, schedule=kind))
        assert again.summary["throughput"] == pytest.approx(c.throughput, rel=1e-9)
