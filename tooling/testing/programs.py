"""Hand-checkable synthetic Programs: a chain of conv -> norm -> relu layers with its
backward and an SGD-with-momentum step. For tests and benchmarks of the compiler that
must not depend on the recorder; sizes follow the usual conv formulas."""

from __future__ import annotations

from typing import Any

from popviz.recorder.program import OP_COLUMNS, TENSOR_COLUMNS, Program, frame

F32 = 4


def synthetic_program(layers: int = 8, batch: int = 4, channels: int = 16, hw: int = 16,
                      kernel: int = 3, groups: int = 1, blocks: int = 0,
                      checkpoints: tuple[int, ...] = (), matmul_head: bool = True) -> Program:
    """`layers` conv layers; every quarter of the chain halves the image and doubles the
    channels (like a ResNet). `blocks` > 0 names popviz Blocks B0.. over the layers;
    `checkpoints` lists layers whose output is a recomputation checkpoint."""
    ops: list[dict[str, Any]] = []
    tensors: list[dict[str, Any]] = []
    reads: dict[int, list[int]] = {}  # op_id -> tensor_ids it reads (the `inputs` column)

    def op(name: str, cls: str, phase: str, layer: str, module: str, block: str,
           flops: float, read: float, written: float, out_shape: str, ckpt: bool = False
           ) -> int:
        ops.append({"op_id": len(ops), "op": name, "op_class": cls, "phase": phase,
                    "module": module, "layer": layer, "block": block, "checkpoint": ckpt,
                    "flops": int(flops), "bytes_read": int(read), "bytes_written": int(written),
                    "shapes": "", "out_shape": out_shape, "dtype": "float32", "host_ns": 0})
        return len(ops) - 1

    def tensor(name: str, nbytes: float, category: str, module: str, layer: str, block: str,
               producer: int, shape: str = "") -> int:
        tensors.append({"tensor_id": len(tensors), "name": name, "bytes": int(nbytes),
                        "dtype": "float32", "shape": shape, "category": category,
                        "module": module, "layer": layer, "block": block,
                        "producer": producer, "last_use": producer})
        return len(tensors) - 1

    def use(tid: int, op_id: int) -> None:
        tensors[tid]["last_use"] = max(tensors[tid]["last_use"], op_id)
        reads.setdefault(op_id, []).append(tid)

    names = [f"l{i}" for i in range(layers)]
    block_of = [f"B{i * blocks // layers}" if blocks else "" for i in range(layers)]
    c_in, size = 3, hw
    x = tensor("input", batch * c_in * size * size * F32, "input", "", "", "", -1,
               f"[{batch},{c_in},{size},{size}]")
    saved = []  # per layer: (module, input tensor, conv out, relu out, params, shapes)
    params = []
    cur = x
    for i, layer in enumerate(names):
        quarter = max(layers // 4, 1)
        if i and i % quarter == 0:
            size = max(size // 2, 1)
        c_out = channels * 2 ** min(i // quarter, 3)
        mod, blk = f"layers.{i}", block_of[i]
        in_b = batch * c_in * size * size * F32
        out_b = batch * c_out * size * size * F32
        w_b = c_out * (c_in // groups) * kernel * kernel * F32
        shape = f"[{batch},{c_out},{size},{size}]"
        w = tensor(f"{mod}.conv.weight", w_b, "parameter", f"{mod}.conv", layer, blk, -1)
        g = tensor(f"{mod}.norm.weight", c_out * 2 * F32, "parameter", f"{mod}.norm", layer,
                   blk, -1)
        params += [w, g]
        flops = 2 * batch * c_out * size * size * (c_in // groups) * kernel * kernel
        cls = "conv" if groups == 1 else "grouped_conv"
        o1 = op("aten.convolution.default", cls, "forward", layer, f"{mod}.conv", blk, flops,
                in_b + w_b, out_b, shape)
        use(cur, o1)
        use(w, o1)
        conv_out = tensor(f"conv#{o1}", out_b, "activation", f"{mod}.conv", layer, blk, o1,
                          shape)
        o2 = op("aten.native_batch_norm.default", "norm", "forward", layer, f"{mod}.norm",
                blk, 8 * out_b / F32, out_b, out_b, shape)
        use(conv_out, o2)
        norm_out = tensor(f"norm#{o2}", out_b, "activation", f"{mod}.norm", layer, blk, o2,
                          shape)
        o3 = op("aten.relu.default", "elementwise", "forward", layer, f"{mod}.relu", blk,
                out_b / F32, out_b, out_b, shape, ckpt=i in checkpoints)
        use(norm_out, o3)
        relu_out = tensor(f"relu#{o3}", out_b, "activation", f"{mod}.relu", layer, blk, o3,
                          shape)
        saved.append((mod, layer, blk, cur, conv_out, relu_out, w, g, flops, cls, in_b, out_b,
                      w_b, shape, f"[{batch},{c_in},{size},{size}]"))
        cur, c_in = relu_out, c_out
    head = ""
    if matmul_head:
        feat = c_in * size * size
        classes = 10
        hw_b = feat * classes * F32
        wh = tensor("head.weight", hw_b, "parameter", "head", "head", block_of[-1], -1)
        params.append(wh)
        oh = op("aten.addmm.default", "matmul", "forward", "head", "head", block_of[-1],
                2 * batch * feat * classes, batch * feat * F32 + hw_b, batch * classes * F32,
                f"[{batch},{classes}]")
        use(cur, oh)
        use(wh, oh)
        logits = tensor(f"addmm#{oh}", batch * classes * F32, "activation", "head", "head",
                        block_of[-1], oh, f"[{batch},{classes}]")
        head = "head"
        names.append("head")
    last = logits if matmul_head else cur
    ol = op("aten._log_softmax.default", "reduction", "forward", head or names[-1], head,
            block_of[-1], 4 * tensors[last]["bytes"] / F32, tensors[last]["bytes"], 4, "[]")
    use(last, ol)
    loss = tensor(f"loss#{ol}", 4, "activation", head, head or names[-1], block_of[-1], ol)

    # backward: head, then layers in reverse (relu, norm, conv)
    grads: list[tuple[int, int]] = []
    ob = op("aten._log_softmax_backward_data.default", "reduction", "backward",
            head or names[-1], head, block_of[-1], 4 * tensors[last]["bytes"] / F32,
            tensors[last]["bytes"], tensors[last]["bytes"], "")
    use(loss, ob)
    use(last, ob)
    g_cur = tensor(f"grad#{ob}", tensors[last]["bytes"], "temporary", head, head or names[-1],
                   block_of[-1], ob)
    if matmul_head:
        om = op("aten.mm.default", "matmul", "backward", "head", "head", block_of[-1],
                4 * batch * feat * classes, batch * classes * F32 + hw_b + batch * feat * F32,
                batch * feat * F32 + hw_b, f"[{batch},{feat}]")
        use(g_cur, om)
        use(cur, om)
        use(wh, om)
        grads.append((wh, tensor("head.weight.grad", hw_b, "gradient", "head", "head",
                                 block_of[-1], om)))
        g_cur = tensor(f"grad#{om}", batch * feat * F32, "temporary", "head", "head",
                       block_of[-1], om)
    for (mod, layer, blk, x_in, conv_out, relu_out, w, g, flops, cls, in_b, out_b, w_b, shape,
         in_shape) in reversed(saved):
        r = op("aten.threshold_backward.default", "elementwise", "backward", layer,
               f"{mod}.relu", blk, out_b / F32, 2 * out_b, out_b, shape)
        use(g_cur, r)
        use(relu_out, r)
        g_cur = tensor(f"grad#{r}", out_b, "temporary", f"{mod}.relu", layer, blk, r)
        nb = op("aten.native_batch_norm_backward.default", "norm", "backward", layer,
                f"{mod}.norm", blk, 10 * out_b / F32, 2 * out_b, out_b, shape)
        use(g_cur, nb)
        use(conv_out, nb)
        grads.append((g, tensor(f"{mod}.norm.weight.grad", tensors[g]["bytes"], "gradient",
                                f"{mod}.norm", layer, blk, nb)))
        g_cur = tensor(f"grad#{nb}", out_b, "temporary", f"{mod}.norm", layer, blk, nb)
        cb = op("aten.convolution_backward.default", cls, "backward", layer, f"{mod}.conv",
                blk, 2 * flops, out_b + in_b + w_b, in_b + w_b, in_shape)
        use(g_cur, cb)
        use(x_in, cb)
        use(w, cb)
        grads.append((w, tensor(f"{mod}.conv.weight.grad", w_b, "gradient", f"{mod}.conv",
                                layer, blk, cb)))
        g_cur = tensor(f"grad#{cb}", in_b, "temporary", f"{mod}.conv", layer, blk, cb)

    # optimiser: SGD with momentum, one op per parameter, in model order
    by_param = dict(grads)
    for p in params:
        t = tensors[p]
        state = tensor(f"{t['name']}.momentum", t["bytes"], "optimiser_state", t["module"],
                       t["layer"], t["block"], -1)
        o = op("aten._foreach_add_.List", "elementwise", "optimiser", t["layer"], t["module"],
               t["block"], 3 * t["bytes"] / F32, 3 * t["bytes"], 2 * t["bytes"], "")
        use(by_param[p], o)
        use(state, o)
    end = len(ops) - 1
    for t in tensors:
        if t["category"] in ("parameter", "optimiser_state"):
            t["last_use"] = end
    for row in ops:
        row["inputs"] = ";".join(str(i) for i in reads.get(row["op_id"], []))
    n_params = sum(tensors[p]["bytes"] // F32 for p in params)
    model = {"name": f"synthetic{layers}", "parameters": int(n_params),
             "parameter_bytes": int(n_params * F32), "batch_size": batch,
             "input_shape": [batch, 3, hw, hw], "layers": names, "split_names": names}
    return Program(frame(ops, OP_COLUMNS), frame(tensors, TENSOR_COLUMNS), model, "plan")
