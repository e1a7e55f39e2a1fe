"""Advice only a GPU plan gets: a micro-batch that leaves the GPU's memory mostly unused.

A GPU holds its training state (weights, gradients, optimiser state) whatever the
micro-batch, and the activations of each micro-batch in flight on top; the activations grow
with the micro-batch, so a plan that fills a small share of the GPU can run a larger one,
which means fewer, larger kernels (the host issues fewer per sample) and higher throughput
per GPU. The estimate below scales the activations linearly: tune or a re-plan at that
size is what confirms it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from popviz.vocab import naming_of

UNUSED = 0.25  # a fullest GPU below this share of its memory is mostly unused


def micro_batch_advice(meta: dict[str, Any], stages: pd.DataFrame
                       ) -> list[tuple[str, str, int | None, str]]:
    """(severity, topic, device, text) when a modelled GPU training plan's fullest GPU
    uses under a quarter of its memory; nothing otherwise."""
    target = meta.get("target") or {}
    options = meta.get("options") or {}
    usable = float(target.get("usable_bytes") or 0)
    # micro_batch_size 1 is "as recorded" (popviz.compiler's rescale): the model's batch
    micro_batch = int(options.get("micro_batch_size") or 1)
    if micro_batch == 1:
        micro_batch = int((meta.get("model") or {}).get("batch_size") or 1)
    needed = {"ipu", "peak_bytes", "stash_bytes_per_microbatch"}
    if not naming_of(meta).gpu_plan or \
            not options.get("training", True) or usable <= 0 or micro_batch < 1 or \
            stages.empty or not needed <= set(stages.columns):
        return []
    per_gpu = stages.groupby("ipu").agg(peak=("peak_bytes", "max"),
                                        per_mb=("stash_bytes_per_microbatch", "sum"))
    peaks = per_gpu["peak"].to_numpy(np.float64)
    row = int(np.argmax(peaks))
    gpu = int(per_gpu.index.to_numpy()[row])
    peak, per_mb = float(peaks[row]), float(per_gpu["per_mb"].to_numpy(np.float64)[row])
    share = peak / usable
    if share >= UNUSED or per_mb <= 0:
        return []
    # the largest micro-batch whose activations still fit the fullest GPU, as a power of 2
    scale = 1 + (usable * 0.9 - peak) / per_mb  # 10% left for the allocator's cache
    fits = micro_batch
    while fits * 2 <= micro_batch * scale:
        fits *= 2
    if fits <= micro_batch:
        return []
    return [("info", "micro_batch", gpu, (
        f"GPU {gpu} uses {share:.1%} of its memory ({peak / 2**30:.2f} of "
        f"{usable / 2**30:.1f} GiB) at micro-batch {micro_batch}: the rest is unused. Its "
        f"activations ({per_mb / 2**30:.2f} GiB per micro-batch) grow with the "
        f"micro-batch, so about {fits} would still fit (estimated; plan it with "
        f"train.py --batch-size {fits} to check). A larger micro-batch launches fewer, "
        "larger kernels per sample: more throughput per GPU."))]
