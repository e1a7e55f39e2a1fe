"""The backward split in two, as zero-bubble schedules run it: the input gradient (I: what
the previous stage waits for; popviz's schedules run it as B) and the weight gradient (W:
what only the optimiser reads).

Qi et al., *Zero Bubble Pipeline Parallelism* (ICLR 2024, §2) and torch.distributed.
pipelining (`stage_backward_input` / `stage_backward_weight`) run a stage's backward as
two actions: I computes the gradient of the stage's input and W the gradients of its
weights, later, where the pipeline would otherwise idle. Which recorded backward op belongs
to which follows from the dataflow and the stages: an op of stage s is I when what it
makes is read by a backward op of an earlier stage (the gradient sent back) or by an I op
of its own stage; every other backward op of the stage is W (a matmul's `grad_out^T @ x`,
a bias gradient's sum, the add that accumulates a tied weight's two gradients). So the
first stage's backward is all W: nothing waits for the gradient of its input. An op that
makes both at once (a convolution's backward with its weight mask) is I: eager PyTorch
runs it as one kernel call.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz.compiler.memory import _parse_ids

INPUT, WEIGHT = "input", "weight"


def grad_parts(ops: pd.DataFrame) -> np.ndarray:
    """Per row of `ops` (with `stage`, `pass`, `inputs`, `outputs`, optionally `step` and
    `source_op`): "input" or "weight" for the backward ops, "" for the rest. Without
    recorded dataflow every backward op is "input" (nothing can be deferred safely)."""
    passes = ops["pass"].astype(str).to_numpy()
    out = np.where(passes == "B", INPUT, "").astype(object)
    if not {"inputs", "outputs", "stage"} <= set(ops.columns) or not (passes == "B").any():
        return out
    real = ops["source_op"].to_numpy() < 0 if "source_op" in ops else np.ones(len(ops), bool)
    stage = ops["stage"].to_numpy(np.int64)
    reads = _parse_ids(ops["inputs"].astype(str).tolist())
    writes = _parse_ids(ops["outputs"].astype(str).tolist())
    ins: dict[int, set[int]] = {}
    read_by: dict[int, list[int]] = {}
    for r, t in zip(reads["row"].tolist(), reads["tensor_id"].tolist(), strict=True):
        ins.setdefault(r, set()).add(t)
        if passes[r] == "B":
            read_by.setdefault(t, []).append(r)
    outs: dict[int, set[int]] = {}
    for r, t in zip(writes["row"].tolist(), writes["tensor_id"].tolist(), strict=True):
        outs.setdefault(r, set()).add(t)
    order = ops["step"].to_numpy(np.int64) if "step" in ops else np.arange(len(ops))
    is_input = np.zeros(len(ops), dtype=bool)
    made_by: dict[int, int] = {}
    backward = np.flatnonzero((passes == "B") & real)
    for r in backward[np.argsort(-order[backward], kind="stable")].tolist():
        # a view (t, view, detach) writes the id it reads: it makes nothing new
        made = outs.get(r, set()) - ins.get(r, set())
        for t in made:
            made_by[t] = r
        is_input[r] = any(stage[c] < stage[r] or (stage[c] == stage[r] and is_input[c])
                          for t in made for c in read_by.get(t, ()) if c != r)
    for r in backward.tolist():  # a view is W only over what a W op made
        if not outs.get(r, set()) - ins.get(r, set()):
            is_input[r] = not any(t in made_by and not is_input[made_by[t]]
                                  for t in outs.get(r, ()))
    out[(passes == "B") & ~is_input] = WEIGHT
    return out


def weight_share(ops: pd.DataFrame, tensors: pd.DataFrame, parts: np.ndarray,
                 num_stages: int) -> np.ndarray:
    """Per stage, what a micro-batch holds between its B and its W, as a share of what its
    forward keeps for the backward: the forward's tensors a weight gradient reads (a
    Linear's input) and the input gradient's tensors it reads (the output gradient dY).
    Zero Bubble's (M_F + M_B) / M_F, i.e. 32h of 34h + 5as bytes per token and layer for
    its GPT with eager attention, here from the recorded dataflow instead of a formula. 1
    where the stage keeps nothing or nothing is recorded."""
    out = np.ones(num_stages)
    if "inputs" not in ops.columns or not len(ops):
        return out
    real = ops["source_op"].to_numpy() < 0 if "source_op" in ops else np.ones(len(ops), bool)
    row_of = pd.Series(np.flatnonzero(real), index=ops["op_id"].to_numpy()[real])
    reads = _parse_ids(ops["inputs"].astype(str).tolist())
    passes = ops["pass"].astype(str).to_numpy()
    stage = ops["stage"].to_numpy(np.int64)
    prod = row_of.reindex(tensors["producer"].to_numpy()).to_numpy()
    made = pd.DataFrame({"tensor_id": tensors["tensor_id"].to_numpy(np.int64), "prod": prod,
                         "bytes": tensors["bytes"].to_numpy(np.float64)}).dropna()
    prow = made["prod"].to_numpy(np.int64)
    made = made.assign(stage=stage[prow], forward=passes[prow] == "F",
                       by_input=(passes[prow] == "B") & (parts[prow] == INPUT))
    back = reads[passes[reads["row"].to_numpy()] == "B"]
    back = back.assign(stage=stage[back["row"].to_numpy()],
                       weight=parts[back["row"].to_numpy()] == WEIGHT)
    read = made.merge(back, on=["tensor_id", "stage"])
    per = read.groupby(["stage", "tensor_id"]).agg(
        bytes=("bytes", "first"), forward=("forward", "first"),
        by_input=("by_input", "first"), weight=("weight", "any")).reset_index()
    kept = per[per["forward"]]
    total = np.bincount(kept["stage"], weights=kept["bytes"], minlength=num_stages)
    held = per[per["weight"] & (per["forward"] | per["by_input"])]
    for_w = np.bincount(held["stage"], weights=held["bytes"], minlength=num_stages)
    ok = total[:num_stages] > 0
    out[ok] = for_w[:num_stages][ok] / total[:num_stages][ok]
    return out
