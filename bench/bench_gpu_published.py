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
}
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


def plan(program: Any, model: str, m: int, recipe: str, schedule: str = "1F1B"
         ) -> tuple[float, int, list[float]]:
    """Peak allocated GB (10^9 B) over the GPUs, the GPU that holds it, and each GPU's
    state held before the step (weights, grads, optimiser state) in GB."""
    layers = MODELS[model][0]
    cut = chunk_splits(layers) if schedule == "Interleaved1F1B" else splits(layers)
    options = Options(target="a100", splits=cut, num_ipus=PP, schedule=schedule,
                      gradient_accumulation=m, gpu_precision=recipe)
    report = compile(program, options)
    peaks = report.summary["max_memory_allocated"]
    gpu = max(peaks, key=lambda g: int(peaks[g]))
    state = report.tables["liveness"].groupby("ipu")["always_live_bytes"].max() / 1e9
    return int(peaks[gpu]) / 1e9, int(gpu), state.round(2).tolist()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=tuple(MODELS), default=["1.5B"])
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
