"""GPU plans against Megatron-LM's CI golden values (NVIDIA/Megatron-LM @ d98e8a64,
tests/functional_tests/test_cases/gpt/<case>: model_config.yaml and golden_values_*.json):
a small GPT (12 layers, hidden 512, 8 heads, sequence 1024, micro-batch 4, global batch 32,
bf16, TP 1, 8 GPUs so DP = 8 / PP) whose last pipeline rank logs `mem-allocated-bytes`
(after the step) and `mem-max-allocated-bytes` (the peak), and the iteration time, on DGX
A100 and H100. Cases: gpt3_mcore_tp1_pp2 and _pp4 (1F1B), gpt3_mcore_te_tp1_pp1_uniform_
full_recompute (every layer checkpointed, --recompute-method uniform, one layer each) and
gpt3_mcore_tp1_pp1_dist_optimizer_overlap_grad_reduce_param_gather (the distributed
optimizer: 6 + 12 / DP bytes per parameter), gpt3_mcore_te_tp1_pp4_vp1_uneven_pipeline (2, 4,
4 and 2 layers on the four GPUs, untied embeddings, unfused attention: 1F1B, as its
model_config.yaml names no virtual stages). And gpt3_7b_tp1_pp4_memory_speed's DGX A100
values (its H100 and GB200 values are held out: the plan's H100 figures are printed, not
compared): a 7B GPT, 32 layers, hidden 4096, 32 heads in 8 query groups, untied
embeddings, vocabulary 131,073 (padded to 131,200 as Megatron pads it), sequence 8192,
micro-batch 1, global batch 8, PP 4 interleaved with one layer per model chunk (8 chunks a
GPU), DP 2, bf16, Transformer Engine, the distributed optimizer; recorded as
tooling/megatron_gpt.py's GPT (grouped-query attention as the fused kernel runs it).

    PYTHONPATH=. python bench/bench_gpu_mci.py

Recorded in plan mode as a HuggingFace GPT-2 of that shape (vocabulary 50,304: GPT-2's BPE
padded to a multiple of 128 as Megatron pads it; tied input and output embeddings, as
Megatron ties them by default; exact GELU, one op that keeps its input, as Megatron's fused
bias-GELU, not HF's five-op tanh GELU), held as `megatron-bf16` (or -distopt), 1F1B over PP
GPUs with DP replicas and 32 / (4 DP) micro-batches. What differs: the TE case runs
Transformer Engine's layers (its own cuBLASLt workspaces), the others Megatron's local ones;
every case runs with
--no-gradient-accumulation-fusion (the recipe fuses it; at 2-4 micro-batches of a 45M
parameter rank the add kernels are under 1 ms) and log every step's parameter norm and
zeros in the gradients, timers and deterministic kernels, none of which the plan models:
their iteration times are printed, not counted in any mean. Evidence:
/work/shared/evidence/gpu_published.md (MCI).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from popviz.compiler import compile  # noqa: E402
from popviz.options import Options  # noqa: E402
from tooling.gpu_programs import gpu_program  # noqa: E402

LAYERS, HIDDEN, HEADS, VOCAB, SEQUENCE, MICRO_BATCH, GLOBAL_BATCH, GPUS = \
    12, 512, 8, 50304, 1024, 4, 32, 8
# (target, PP, how it is run) -> (median iteration s, allocated GB after the step, peak
# allocated GB), the last rank's (evidence file, MCI small-GPT table; the full-recompute
# case's A100 iteration time is the middle of its 0.131-0.162 s)
PUBLISHED = {("a100", 2, "plain"): (0.130, 0.949, 3.633),
             ("h100", 2, "plain"): (0.0848, 0.949, 3.633),
             ("a100", 4, "plain"): (0.169, 0.782, 2.749),
             ("h100", 4, "plain"): (0.103, 0.779, 2.747),
             ("a100", 1, "full-recompute"): (0.146, 1.23, 2.53),
             ("h100", 1, "full-recompute"): (0.110, 1.26, 2.56),
             ("a100", 1, "distopt"): (0.0896, 0.615, 4.736),
             ("a100", 4, "uneven"): (0.196, 0.659, 2.386),
             ("h100", 4, "uneven"): (0.144, 0.688, 2.416)}
RUNS = ("plain", "full-recompute", "distopt", "uneven")
# gpt3_mcore_te_tp1_pp4_vp1_uneven_pipeline: --decoder-first-pipeline-num-layers 2 and
# --decoder-last-pipeline-num-layers 2 (the middle 8 layers 4 a GPU), untied embeddings,
# --attention-backend unfused (the scores kept, as HF's eager attention keeps them)
UNEVEN_FIRST_LAYERS = (0, 2, 6, 10)
# gpt3_7b_tp1_pp4_memory_speed: (layers, hidden, heads, query groups, padded vocabulary),
# sequence, micro-batch, global batch, PP; DGX A100's (median iteration s, allocated GB
# after the step, peak allocated GB), the last rank's (evidence file, MCI)
BIG_SHAPE = (32, 4096, 32, 8, 131200)
BIG_SEQUENCE, BIG_MICRO_BATCH, BIG_GLOBAL_BATCH, BIG_PP = 8192, 1, 8, 4
BIG_PUBLISHED = {"a100": (2.948, 24.51, 60.49)}
BIG_HELD_OUT = ("h100",)  # its published values are kept out: printed, never compared


def record(tied: bool = True) -> Any:
    """The small GPT; `tied=False`: its output layer its own matrix (the uneven case)."""
    return gpu_program("gpt2", (LAYERS, HIDDEN, HEADS, VOCAB), MICRO_BATCH,
                       sequence_length=SEQUENCE, activation="gelu", tied=tied)


def planned(program: Any, target: str, pp: int, run: str = "plain") -> Any:
    if run not in RUNS:
        raise ValueError(f"unknown run {run!r}; valid: {', '.join(RUNS)}")
    per = LAYERS // pp
    dp = GPUS // pp
    firsts = UNEVEN_FIRST_LAYERS[1:pp] if run == "uneven" else \
        [i * per for i in range(1, pp)]
    options = Options(target=target, splits=[f"lm.transformer.h.{i}.ln_1" for i in firsts],
                      num_ipus=pp, schedule="1F1B", replication_factor=dp,
                      gradient_accumulation=GLOBAL_BATCH // (MICRO_BATCH * dp),
                      gpu_precision="megatron-bf16-distopt" if run == "distopt"
                      else "megatron-bf16", recomputation=run == "full-recompute")
    return compile(program, options)


def record_big() -> Any:
    return gpu_program("megatron-gpt", BIG_SHAPE, BIG_MICRO_BATCH,
                       sequence_length=BIG_SEQUENCE)


def planned_big(program: Any, target: str) -> Any:
    """The 7B case: one layer per model chunk (a chunk starts at each layer's first norm;
    the embeddings ride with layer 0, the final norm, output layer and loss with layer 31),
    Megatron's interleaved 1F1B over PP 4 GPUs, DP 2, the distributed optimizer."""
    layers = BIG_SHAPE[0]
    dp = GPUS // BIG_PP
    options = Options(target=target, splits=[f"h.{i}.ln_1" for i in range(1, layers)],
                      num_ipus=BIG_PP, schedule="Interleaved1F1B", replication_factor=dp,
                      gradient_accumulation=BIG_GLOBAL_BATCH // (BIG_MICRO_BATCH * dp),
                      gpu_precision="megatron-bf16-distopt")
    return compile(program, options)


def last_rank(report: Any) -> tuple[float, float]:
    """The last GPU's state held through the step and its peak allocated, GB (10^9 B)."""
    gpu = report.summary["num_gpus"] - 1
    live = report.tables["liveness"]
    state = float(live.loc[live["ipu"] == gpu, "always_live_bytes"].max()) / 1e9
    return state, int(report.summary["max_memory_allocated"][str(gpu)]) / 1e9


def _row(report: Any, target: str, pp: int, run: str,
         published: tuple[float, float, float] | None) -> tuple[str, float | None]:
    """One table row for `report` (the last rank's peak, state and the iteration) against
    the published (iteration s, allocated GB, peak GB), or "held out" without them; and the
    peak's ratio."""
    state, top = last_rank(report)
    step = report.summary["step_ms"] / 1e3
    head = f"{target:>6} {pp:>3} {GPUS // pp:>3} {report.summary['microbatches']:>2} {run:>14}"
    if published is None:
        return (f"{head} | {'held out':>7} {top:>7.3f} {'':>6} | {'':>8} {state:>6.3f} | "
                f"{'':>7} {step:>7.4f}"), None
    seconds, allocated, peak = published
    return (f"{head} | {peak:>7.3f} {top:>7.3f} {top / peak:>6.2f} | {allocated:>8.3f} "
            f"{state:>6.3f} | {seconds:>7.4f} {step:>7.4f} {step / seconds:>6.2f}"), top / peak


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    t0 = time.perf_counter()
    programs = {True: record(), False: record(tied=False)}
    print(f"recorded in {time.perf_counter() - t0:.1f} s")
    print(f"{'target':>6} {'PP':>3} {'DP':>3} {'m':>2} {'run':>14} | {'peak GB':>7} "
          f"{'planned':>7} "
          f"{'ratio':>6} | {'alloc GB':>8} {'state':>6} | {'iter s':>7} {'planned':>7} "
          f"{'ratio':>6}")
    ratios = []
    for (target, pp, run), published in PUBLISHED.items():
        line, ratio = _row(planned(programs[run != "uneven"], target, pp, run), target, pp,
                           run, published)
        assert ratio is not None  # every row here has its published values
        ratios.append(ratio)
        print(line)
    print(f"last rank's peak: predicted / published {min(ratios):.2f}-{max(ratios):.2f}; "
          "iteration times not modelled (per-step logging, timers, deterministic mode)")
    t0 = time.perf_counter()
    big = record_big()
    print(f"\ngpt3_7b_tp1_pp4_memory_speed (recorded in {time.perf_counter() - t0:.1f} s): "
          f"PP {BIG_PP} interleaved, {BIG_SHAPE[0] // BIG_PP} chunks a GPU, "
          f"DP {GPUS // BIG_PP}, distributed optimizer")
    for target in (*BIG_PUBLISHED, *BIG_HELD_OUT):
        print(_row(planned_big(big, target), target, BIG_PP, "distopt",
                   BIG_PUBLISHED.get(target))[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
