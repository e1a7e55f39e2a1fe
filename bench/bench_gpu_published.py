"""GPU plans against published pipeline memory: the Zero Bubble paper's 1F1B runs (Qi et al.,
ICLR 2024; sail-sg/zero-bubble-pipeline-parallelism @ 3a91d0c8, Tables 4, 11 and 12: A100
SXM 80 GB, fp16 Megatron, TP 1, DP 1, PP 8, sequence 1024, vocabulary 32,000, first and last
stage one layer fewer). Each point is recorded in plan mode (fake tensors: nothing
computed) at the published size as a HuggingFace GPT-2 of the same shape, planned on the
a100 target with 1F1B over the published micro-batches, and its peak allocated memory on
the most loaded GPU (max over GPUs, 10^9 B: docs/notes/gpu-plans-v2-research.md §2, §8)
printed against the paper's (and each GPU's state before the step: the notes' §8 derive
3.29 / 3.06 GB on GPUs 0 / 1 for 1.5B, 12.89 GB on a middle GPU for 6.2B), for
`as-recorded` (fp32, today's default) and `megatron-fp16` (how the ZB runs held their
state).

    PYTHONPATH=. python bench/bench_gpu_published.py                 # 1.5B points
    PYTHONPATH=. python bench/bench_gpu_published.py --models 1.5B 6.2B
    PYTHONPATH=. python bench/bench_gpu_published.py --models 1.5B 6.2B --time  # + step times

Only figures that are not held out (docs: /work/shared/evidence/gpu_published.md): the ZB
14.6B / 28.3B rows are never used. Published GB per GPU are the paper's.
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

# name -> (layers, hidden, heads)  (ZB Table 3; FFN 4h, learned positions, tied embedding)
MODELS = {"1.5B": (22, 2304, 24), "6.2B": (30, 4096, 32)}
# (model, micro-batch b, micro-batches m, schedule) -> published peak GB (ZB Tables 4, 11,
# 12; interleaved: Table 4, one layer per model chunk)
PUBLISHED = {
    ("1.5B", 6, 2, "1F1B"): 11, ("1.5B", 6, 4, "1F1B"): 18, ("1.5B", 6, 8, "1F1B"): 29,
    ("1.5B", 6, 24, "1F1B"): 30, ("1.5B", 12, 24, "1F1B"): 57,
    ("1.5B", 6, 24, "Interleaved1F1B"): 40,
    ("6.2B", 3, 2, "1F1B"): 21, ("6.2B", 3, 4, "1F1B"): 28, ("6.2B", 3, 8, "1F1B"): 39,
    ("6.2B", 3, 24, "1F1B"): 39, ("6.2B", 6, 24, "1F1B"): 66,
    ("6.2B", 3, 24, "Interleaved1F1B"): 48,
    # Zero Bubble's own schedules (Table 4: one peak per schedule, over m 24 / 32 / 64)
    ("1.5B", 6, 24, "ZB1P"): 32, ("1.5B", 6, 24, "ZB2P"): 59,
    ("6.2B", 3, 24, "ZB1P"): 42, ("6.2B", 3, 24, "ZB2P"): 70,
}
# (model, b, m, schedule) -> step seconds derived from the published samples per GPU per
# second: m b / (throughput x 8 GPUs) (ZB Tables 4, 11, 12; the evidence file's derivation)
STEP_S = {
    ("1.5B", 6, 24, "1F1B"): 1.525, ("1.5B", 6, 32, "1F1B"): 1.920,
    ("1.5B", 6, 64, "1F1B"): 3.529, ("1.5B", 6, 24, "Interleaved1F1B"): 1.374,
    ("1.5B", 6, 32, "Interleaved1F1B"): 1.791, ("1.5B", 6, 64, "Interleaved1F1B"): 3.453,
    ("1.5B", 12, 24, "1F1B"): 3.000, ("1.5B", 12, 32, "1F1B"): 3.810,
    ("1.5B", 12, 64, "1F1B"): 6.957,
    ("1.5B", 6, 2, "1F1B"): 0.421, ("1.5B", 6, 4, "1F1B"): 0.523, ("1.5B", 6, 8, "1F1B"): 0.726,
    ("6.2B", 3, 24, "1F1B"): 2.571, ("6.2B", 3, 32, "1F1B"): 3.243,
    ("6.2B", 3, 64, "1F1B"): 5.955, ("6.2B", 3, 24, "Interleaved1F1B"): 2.244,
    ("6.2B", 3, 32, "Interleaved1F1B"): 2.941, ("6.2B", 3, 64, "Interleaved1F1B"): 5.728,
    ("6.2B", 6, 24, "1F1B"): 5.056, ("6.2B", 6, 32, "1F1B"): 6.383,
    ("6.2B", 6, 64, "1F1B"): 11.736,
    ("6.2B", 3, 2, "1F1B"): 0.721, ("6.2B", 3, 4, "1F1B"): 0.888, ("6.2B", 3, 8, "1F1B"): 1.224,
    ("1.5B", 6, 24, "ZB1P"): 1.395, ("1.5B", 6, 32, "ZB1P"): 1.791,
    ("1.5B", 6, 64, "ZB1P"): 3.380, ("1.5B", 6, 24, "ZB2P"): 1.241,
    ("1.5B", 6, 32, "ZB2P"): 1.622, ("1.5B", 6, 64, "ZB2P"): 3.221,
    ("6.2B", 3, 24, "ZB1P"): 2.320, ("6.2B", 3, 32, "ZB1P"): 3.000,
    ("6.2B", 3, 64, "ZB1P"): 5.714, ("6.2B", 3, 24, "ZB2P"): 2.083,
    ("6.2B", 3, 32, "ZB2P"): 2.759, ("6.2B", 3, 64, "ZB2P"): 5.467,
}
# ZB Table 9 (ZB-2p, m 24): a middle stage's forward, input gradient, weight gradient and
# p2p per micro-batch, ms; 1.5B at b 6, 6.2B at b 3
TABLE9 = {"1.5B": (18.522, 18.086, 9.337, 0.601), "6.2B": (29.718, 29.444, 19.927, 0.527)}
PP = 8
SEQUENCE = 1024
VOCAB = 32000
RECIPES = ("as-recorded", "megatron-fp16")


def splits(layers: int, stages: int = PP) -> list[str]:
    """ZB's --allow-padding-num-layers: the first and last stage one layer fewer."""
    per = (layers + 2) // stages
    counts = [per - 1] + [per] * (stages - 2) + [per - 1]
    assert sum(counts) == layers, counts
    starts = [sum(counts[:i]) for i in range(1, stages)]
    # at the block's first sublayer: the block's own module path would start the stage at
    # its first op attributed to the block itself (the residual add after attention)
    return [f"lm.transformer.h.{s}.ln_1" for s in starts]


def chunk_splits(layers: int) -> list[str]:
    """Interleaved, one layer per model chunk: the padding leaves the first chunk the
    embedding alone and the last the final norm, head and loss (1.5B: 22 + 2 = 8 x 3
    chunks; 6.2B: 30 + 2 = 8 x 4)."""
    return [f"lm.transformer.h.{i}.ln_1" for i in range(layers)] + ["lm.transformer.ln_f"]


def record(model: str, batch: int) -> Any:
    """One fp32 AdamW training step of the ZB model at `batch`, in plan mode."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from popviz.models.gpt2 import Gpt2LM
    from popviz.models.hf import _no_init_weights, _transformers, loss_step
    from popviz.recorder import record_program

    layers, hidden, heads = MODELS[model]
    # eager attention: Megatron's legacy attention keeps [b, a, s, s] tensors too; exact
    # GELU (one op, saves its input) as Megatron's fused bias-GELU does, not HF's
    # five-op tanh GELU
    config = _transformers().GPT2Config(
        n_embd=hidden, n_layer=layers, n_head=heads, vocab_size=VOCAB, n_positions=2048,
        attn_implementation="eager", activation_function="gelu")
    with FakeTensorMode():
        torch.manual_seed(0)
        with _no_init_weights():
            net = Gpt2LM(config)
        net.lm.lm_head.weight = net.lm.transformer.wte.weight  # ZB ties the embedding
        ids = torch.randint(0, VOCAB, (batch, SEQUENCE))
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=True)
        return record_program(loss_step, net, opt, {"input_ids": ids, "labels": ids},
                              model=net, mode="plan", progress=False)


def compiled(program: Any, model: str, m: int, recipe: str, schedule: str = "1F1B") -> Any:
    layers = MODELS[model][0]
    cut = chunk_splits(layers) if schedule == "Interleaved1F1B" else splits(layers)
    options = Options(target="a100", splits=cut, num_ipus=PP, schedule=schedule,
                      gradient_accumulation=m, gpu_precision=recipe)
    return compile(program, options)


def plan(program: Any, model: str, m: int, recipe: str, schedule: str = "1F1B"
         ) -> tuple[float, int, list[float]]:
    """Peak allocated GB (10^9 B) over the GPUs, the GPU that holds it, and each GPU's
    state held before the step (weights, grads, optimiser state) in GB."""
    report = compiled(program, model, m, recipe, schedule)
    peaks = report.summary["max_memory_allocated"]
    gpu = max(peaks, key=lambda g: int(peaks[g]))
    state = report.tables["liveness"].groupby("ipu")["always_live_bytes"].max() / 1e9
    return int(peaks[gpu]) / 1e9, int(gpu), state.round(2).tolist()


def passes(report: Any, stage: int = 3) -> tuple[float, float, float, float]:
    """A middle stage's forward, input-gradient and weight-gradient ms per micro-batch
    (the backward's ops split as a zero-bubble schedule runs them), and one activation's
    p2p ms (the mean of the stage's sends)."""
    ops = report.tables["ops"]
    mine = ops[ops["stage"] == stage]
    ms = mine.groupby("pass")["cycles"].sum() / 1e6
    weight = float(mine.loc[mine["grad_part"] == "weight", "cycles"].sum()) / 1e6
    ex = report.tables["exchange"]
    sends = ex[(ex["kind"] == "activation") & (ex["stage"] == stage)]
    p2p = float((sends["end"] - sends["start"]).mean()) / 1e6 if len(sends) else 0.0
    return float(ms.get("F", 0.0)), float(ms.get("B", 0.0)) - weight, weight, p2p


def time_tables(models: list[str], recipe: str = "megatron-fp16") -> list[str]:
    """Step time against ZB's published throughput, and a middle stage's passes against
    its Table 9, for `recipe`."""
    lines = [f"step time, {recipe} (s; published = m b / (samples per GPU per s x 8)):",
             f"{'model':>5} {'schedule':>15} {'b':>3} {'m':>3} {'published':>9} "
             f"{'planned':>8} {'error':>7}"]
    errors: list[float] = []
    for model in models:
        for batch in sorted({b for (mm, b, _, _) in STEP_S if mm == model}):
            program = record(model, batch)
            for (mm, b, m, schedule), published in STEP_S.items():
                if (mm, b) != (model, batch):
                    continue
                report = compiled(program, model, m, recipe, schedule)
                step = report.summary["step_ms"] / 1e3
                errors.append(step / published - 1)
                lines.append(f"{model:>5} {schedule:>15} {b:>3} {m:>3} {published:>9.3f} "
                             f"{step:>8.3f} {step / published - 1:>+7.1%}")
                if (m, schedule) == (24, "ZB2P"):
                    f, i, w, p2p = passes(report)
                    pf, pi, pw, pp = TABLE9[model]
                    lines.append(f"      Table 9, a middle stage per micro-batch (ms): F "
                                 f"{f:.2f} vs {pf:.2f} ({f / pf - 1:+.0%}), I {i:.2f} vs "
                                 f"{pi:.2f} ({i / pi - 1:+.0%}), W {w:.2f} vs {pw:.2f} "
                                 f"({w / pw - 1:+.0%}), I + W {i + w:.2f} vs {pi + pw:.2f} "
                                 f"({(i + w) / (pi + pw) - 1:+.0%}), p2p {p2p:.3f} vs "
                                 f"{pp:.3f}")
    if errors:
        lines.append(f"step time mean |error| {sum(map(abs, errors)) / len(errors):.1%} "
                     f"over {len(errors)} points (range {min(errors):+.1%} to "
                     f"{max(errors):+.1%})")
    return lines


def leave_one_out() -> list[str]:
    """What the published points fit, and each fit without the point it is checked on.
    Only `p2p_efficiency` is fitted to a published figure (Table 9's 1.5B p2p); every other
    constant comes from the H100 / H200 traces, so no step or memory point above enters a
    fit and its leave-one-out error is the error printed. The p2p fit is redone from the
    other model's Table 9 p2p alone (an activation: b x s x h fp16 bytes, NVLink's 300
    GB/s, less the 5 us latency)."""
    from popviz.target.gpu import A100_80GB

    def fitted(model: str) -> float:
        hidden = MODELS[model][1]
        batch = 6 if model == "1.5B" else 3
        nbytes = batch * SEQUENCE * hidden * 2
        seconds = TABLE9[model][3] / 1e3 - A100_80GB.p2p_latency_s
        return nbytes / seconds / A100_80GB.nvlink_bytes_per_s

    used = A100_80GB.cost.p2p_efficiency
    lines = ["leave-one-out: no step or memory point enters a fit (the GPU constants come "
             "from the H100 / H200 traces), so each error above is its leave-one-out error; "
             f"p2p_efficiency {used:.3f} is fitted on Table 9's 1.5B p2p:"]
    for model, other in (("1.5B", "6.2B"), ("6.2B", "1.5B")):
        alone = fitted(other)
        lines.append(f"  {model} p2p from {other}'s Table 9 alone: efficiency {alone:.3f} "
                     f"({alone / used - 1:+.1%} on the one in use), {model}'s p2p "
                     f"{TABLE9[model][3] * fitted(model) / alone:.3f} ms vs "
                     f"{TABLE9[model][3]:.3f} published")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=tuple(MODELS), default=["1.5B"])
    p.add_argument("--time", action="store_true",
                   help="also plan step times (Tables 4, 11, 12) and a middle stage's "
                   "passes (Table 9), with megatron-fp16")
    args = p.parse_args(argv)
    print(f"{'model':>5} {'schedule':>15} {'b':>3} {'m':>3} {'published':>9} " + " ".join(
        f"{r + ' GB (GPU)':>24} {'ratio':>6}" for r in RECIPES) + "  plan s")
    misses: dict[str, list[float]] = {r: [] for r in RECIPES}
    for model in args.models:
        for batch in sorted({b for (mm, b, _, _) in PUBLISHED if mm == model}):
            t0 = time.perf_counter()
            program = record(model, batch)
            recorded = time.perf_counter() - t0
            for (mm, b, m, schedule), published in PUBLISHED.items():
                if (mm, b) != (model, batch):
                    continue
                t1 = time.perf_counter()
                cells = []
                for recipe in RECIPES:
                    gb, gpu, state = plan(program, model, m, recipe, schedule)
                    misses[recipe].append(gb / published)
                    cells.append(f"{gb:>17.1f} ({gpu}) {gb / published:>6.2f}")
                took = time.perf_counter() - t1
                print(f"{model:>5} {schedule:>15} {b:>3} {m:>3} {published:>9} "
                      + " ".join(cells)
                      + f"  {took:6.1f}", flush=True)
            print(f"  (recorded {model} b {batch} in {recorded:.1f} s; {RECIPES[-1]} state "
                  f"before the step per GPU, GB: {' '.join(map(str, state))})", flush=True)
    for recipe, ratios in misses.items():
        if ratios:
            print(f"{recipe}: predicted / published {min(ratios):.2f}-{max(ratios):.2f}, "
                  f"mean {sum(ratios) / len(ratios):.2f}")
    if args.time:
        print("\n".join(time_tables(args.models)))
    print("\n".join(leave_one_out()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
