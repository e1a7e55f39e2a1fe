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

from popviz.compiler.gpu_recipe import tensor_ids
from popviz.compiler.memory import _parse_ids
from popviz.recorder.program import Program

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


def split_conv_backward(program: Program) -> Program:
    """Each convolution's backward as a zero-bubble schedule runs it: two calls. torch's
    split backward (`stage_backward_input`, then `stage_backward_weight`) runs autograd's
    ConvolutionBackward once for the input gradient and again, later, for the weight and
    bias gradients, so cuDNN's dgrad and wgrad kernels land in I and W; eager PyTorch's
    one `convolution_backward` call computes both. A recorded call that makes both becomes
    the dgrad call (reads dY and the weight, writes dX) and a new wgrad row after the
    program's ops (reads dY and the forward's input, writes dW and db), each with half the
    FLOPs (one pass's, as the recorder counts them), the bytes it moves and half the
    recorded call's kernels (`conv_part`); the gradients' producer and the input's last
    use move to the new row. `grad_parts` then places the halves."""
    ops, t = program.ops, program.tensors
    name = ops["op"].astype(str)
    calls = np.flatnonzero(name.str.contains("convolution_backward").to_numpy()
                           & (ops["phase"].astype(str) == "backward").to_numpy())
    if not len(calls):
        return program
    cat = dict(zip(t["tensor_id"].to_numpy(np.int64).tolist(),
                   t["category"].astype(str).tolist(), strict=True))
    size = dict(zip(t["tensor_id"].to_numpy(np.int64).tolist(),
                    t["bytes"].to_numpy(np.int64).tolist(), strict=True))
    ins = ops["inputs"].astype(str).tolist()
    outs = ops["outputs"].astype(str).tolist()
    op_ids = ops["op_id"].to_numpy(np.int64)
    flops = ops["flops"].to_numpy(np.int64).copy()
    host = ops["host_ns"].to_numpy(np.int64).copy()
    read = ops["bytes_read"].to_numpy(np.int64).copy()
    written = ops["bytes_written"].to_numpy(np.int64).copy()
    part = np.full(len(ops), "", dtype=object)
    new_inputs, new_outputs = list(ins), list(outs)
    new_rows, producer, last_use = [], {}, {}
    next_id = int(op_ids.max()) + 1
    for i in calls.tolist():
        grad_out, x, w = [*tensor_ids(ins[i]), -1, -1, -1][:3]
        made = tensor_ids(outs[i])
        weight_grads = [g for g in made if cat.get(g) == "gradient"]
        input_grads = [g for g in made if cat.get(g) != "gradient"]
        if not weight_grads or not input_grads or x < 0:
            continue  # one gradient only (the stem's): one call either way
        row = ops.iloc[i].copy()
        half_flops, half_host = int(flops[i]) // 2, int(host[i]) // 2
        row["op_id"], row["conv_part"] = next_id, WEIGHT
        row["inputs"], row["outputs"] = f"{grad_out};{x}", ";".join(map(str, weight_grads))
        row["flops"], row["host_ns"] = half_flops, half_host
        row["bytes_read"] = size.get(grad_out, 0) + size.get(x, 0)
        row["bytes_written"] = sum(size.get(g, 0) for g in weight_grads)
        new_rows.append(row)
        for g in weight_grads:
            producer[g] = next_id
        last_use[x] = (int(op_ids[i]), next_id)
        new_inputs[i], new_outputs[i] = f"{grad_out};{w}", ";".join(map(str, input_grads))
        flops[i] -= half_flops
        host[i] -= half_host
        read[i] = size.get(grad_out, 0) + size.get(w, 0)
        written[i] = sum(size.get(g, 0) for g in input_grads)
        part[i] = INPUT
        next_id += 1
    first = ops.assign(inputs=new_inputs, outputs=new_outputs, flops=flops, host_ns=host,
                       bytes_read=read, bytes_written=written, conv_part=part)
    if not new_rows:
        return program
    out = pd.concat([first, pd.DataFrame(new_rows)], ignore_index=True)
    out = out.astype({c: first[c].dtype for c in first.columns})
    t = t.copy()
    ids = t["tensor_id"].to_numpy(np.int64)
    t["producer"] = [producer.get(int(k), int(p)) for k, p in zip(ids, t["producer"],
                                                                   strict=True)]
    t["last_use"] = [last_use[int(k)][1] if int(k) in last_use and int(u) ==
                     last_use[int(k)][0] else int(u)
                     for k, u in zip(ids, t["last_use"], strict=True)]
    return Program(out, t, program.model, program.mode)
