"""Selective recomputation (Korthikanti et al. 2022; Megatron-LM's --recompute-granularity
selective) on GPU plans: only the attention cores are recomputed, each right before its
own layer's backward. Checked against the paper's per-layer activation formula: a
transformer layer keeps 34h + 5as bytes per token in half precision with dropout, and
selective recomputation removes the 5as (the scores, their softmax and dropout mask)."""

from __future__ import annotations

from typing import Any

import pytest

from popviz.compiler import compile
from popviz.options import Options
from tooling.gpu_programs import gpu_program

H, A, S, B = 512, 8, 512, 4  # hidden, heads, sequence, micro-batch
SPLIT = ["lm.transformer.h.2.ln_1"]  # 4 layers: 2 and 2


@pytest.fixture(scope="module")
def plans() -> dict[str, Any]:
    program = gpu_program("gpt2", (4, H, A, 4096), B, sequence_length=S)
    base = Options(target="a100", splits=SPLIT, num_ipus=2, schedule="1F1B",
                   gradient_accumulation=4, gpu_precision="megatron-fp16")
    return {"none": compile(program, base),
            "selective": compile(program, base.copy(recomputation=True,
                                                    recompute_granularity="selective")),
            "full": compile(program, base.copy(recomputation=True))}


def test_selective_drops_the_5as_term_per_layer(plans: dict[str, Any]) -> None:
    none, sel = (plans[k].tables["stages"]["stash_bytes_per_microbatch"] for k in
                 ("none", "selective"))
    per_layer = 5 * A * S * S * B  # 5as bytes per token x s b tokens
    for stage in (0, 1):  # two layers each
        assert (none[stage] - sel[stage]) == pytest.approx(2 * per_layer, rel=0.05)


def test_selective_costs_less_time_than_full_and_saves_memory(plans: dict[str, Any]) -> None:
    step = {k: r.summary["step_ms"] for k, r in plans.items()}
    assert step["none"] < step["selective"] < step["full"]
    rec = {k: r.tables["stages"]["recompute_cycles_per_microbatch"].sum()
           for k, r in plans.items()}
    assert rec["none"] == 0 < rec["selective"] < rec["full"]
    peak = {k: max(r.summary["max_memory_allocated"].values()) for k, r in plans.items()}
    assert peak["selective"] < peak["none"]


def test_only_attention_cores_each_before_its_own_backward(plans: dict[str, Any]) -> None:
    ops = plans["selective"].tables["ops"]
    rec = ops[ops["pass"] == "R"]
    assert set(rec["module"].astype(str).str.rsplit(".", n=1).str[-1]) == {"attn"}
    back = ops[ops["pass"] == "B"]
    for stage, here in rec.groupby("stage"):
        start = back.loc[back["stage"] == stage, "step"].min()
        firsts = []
        for module, mine in here.groupby("module"):
            own = back.loc[back["module"] == module, "step"].min()
            assert mine["step"].max() < own  # before its own core's backward
            firsts.append((own, mine["step"].min()))
        # not all hoisted to the stage's first backward op: the later layers' cores are
        # recomputed after the earlier layers' backward began
        firsts.sort()
        assert all(first > start for _, first in firsts[1:]), (stage, firsts, start)


def test_selective_needs_an_attention_core_and_a_gpu() -> None:
    sdpa = gpu_program("gpt2", (2, 64, 2, 512), 2, sequence_length=32, attn="sdpa")
    options = Options(target="h100", recomputation=True, recompute_granularity="selective")
    with pytest.raises(ValueError, match="no attention module, or fused attention"):
        compile(sdpa, options)
    eager = gpu_program("gpt2", (2, 64, 2, 512), 2, sequence_length=32)
    with pytest.raises(ValueError, match="modelled on GPU targets"):
        compile(eager, options.copy(target="mk2"))
    with pytest.raises(ValueError, match="recompute granularity"):
        Options(recompute_granularity="some").validate()


def test_full_recomputation_keeps_its_section_order(plans: dict[str, Any]) -> None:
    """Full recomputation still runs each section's recompute right before the section's
    first backward op (RecomputeAndBackpropagateInterleaved), not per module."""
    ops = plans["full"].tables["ops"]
    rec = ops[ops["pass"] == "R"]
    assert len(rec) and ("recompute_anchor" not in ops
                         or ops["recompute_anchor"].isna().all()
                         or (ops["recompute_anchor"].astype(str) != "module").all())
    back = ops[ops["pass"] == "B"]
    for (stage, section), mine in rec.groupby(["stage", "section"]):
        first_b = back[(back["stage"] == stage) & (back["section"] == section)]["step"].min()
        steps = mine["step"].sort_values().to_numpy()
        # one contiguous block ending right before the section's first backward op
        assert steps[-1] == first_b - 1 and (steps[1:] - steps[:-1] == 1).all()


def test_tune_on_a_gpu_tries_selective_recomputation() -> None:
    """Recomputation on a GPU is three-way: tune tries its best fully recomputing layouts
    with selective recomputation too, and says so in its flags and Python."""
    from popviz.advise.tune import tune
    from popviz.reporters.tune import python_lines

    program = gpu_program("gpt2", (4, H, A, 4096), B, sequence_length=S)
    base = Options(target="a100", splits=SPLIT, num_ipus=2, schedule="1F1B",
                   gradient_accumulation=4, gpu_precision="megatron-fp16",
                   recomputation=True)
    result = tune(program, base, 2, max_compiles=16, progress=False, top=50)
    found = [result.baseline, *result.candidates]
    selective = [c for c in found if c.recompute_granularity == "selective"]
    assert selective, [(c.source, c.recompute_words) for c in found]
    c = selective[0]
    assert c.recomputation and c.recompute_words == "selective"
    assert "--enable-recomputation --recompute-granularity selective" in c.train_args()
    assert 'options.set_recomputation(True, "selective")' in python_lines(c)
    # the same layout fully recomputed: the first stage recomputes its whole forward there,
    # only its attention cores here (the last stage recomputes nothing under full: its
    # backward follows its forward; selective recomputes its cores too)
    full = next((f for f in found if f.splits == c.splits and f.schedule == c.schedule
                 and f.recomputation and f.recompute_granularity == "full"), None)
    if full is not None:
        assert c.stage_cycles[0] < full.stage_cycles[0]
    # and what tune reports is what a compile of its options gives
    again = compile(program, base.copy(splits=c.splits, schedule=c.schedule,
                                       recompute_granularity="selective"))
    assert again.summary["throughput"] == pytest.approx(c.throughput, rel=1e-9)
