"""Stages, IPUs and recomputation sections for every op; synthesized recompute ops.

Stages come from options.splits (a split name is the first layer of the next stage),
options.stages (lists of block names), one stage per block, or one stage. Backward,
recompute and optimiser ops go to the stage of their forward layer / module.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.options import Options
from popviz.recorder.program import Program


@dataclass
class StagePlan:
    ops: pd.DataFrame  # program ops + recompute ops, with stage, ipu, section, source_op
    stages: pd.DataFrame  # stage, ipu, first_layer, last_layer
    num_ipus: int
    module_stage: dict[str, int]
    layer_stage: dict[str, int]
    split_mode: str  # 'splits', 'stages', 'blocks', 'single', 'sections'


def _lookup(keys: pd.Series, table: dict[str, int], parents: bool) -> np.ndarray:
    """Stage of each key; with `parents`, a module falls back to its closest parent."""
    out = np.full(len(keys), -1, dtype=np.int64)
    for i, key in enumerate(keys.tolist()):
        k = str(key)
        while True:
            if k in table:
                out[i] = table[k]
                break
            if not parents or "." not in k:
                break
            k = k.rsplit(".", 1)[0]
    return out


def _ffill(values: np.ndarray, default: int) -> np.ndarray:
    s = pd.Series(np.where(values < 0, np.nan, values))
    return s.ffill().bfill().fillna(default).to_numpy(np.int64)


def _split_positions(program: Program, splits: list[str]) -> list[int]:
    layers = program.layers

    def under(name: str) -> list[int]:  # layers inside a parent name: "b2" -> "b2/0", "b.1"
        return [i for i, layer in enumerate(layers)
                if layer.startswith(name + "/") or layer.startswith(name + ".")]

    valid = list(program.model.get("split_names") or layers)
    unknown = [s for s in splits if s not in valid and s not in layers and not under(s)]
    if unknown:
        shown = ", ".join(valid[:200]) + (" ..." if len(valid) > 200 else "")
        raise ValueError(f"unknown pipeline split name(s) {', '.join(unknown)}; valid: {shown}")
    positions = []
    for name in splits:
        if name in layers:
            positions.append(layers.index(name))
            continue
        prefixed = under(name)
        if not prefixed:
            raise ValueError(f"pipeline split {name!r} names no recorded layer")
        positions.append(prefixed[0])
    if positions != sorted(positions):
        raise ValueError(f"pipeline splits {splits} are not in forward order")
    return positions


def _forward_stage(program: Program, options: Options, fwd: pd.DataFrame
                   ) -> tuple[np.ndarray, np.ndarray, str]:
    """(stage per forward op, section boundary per forward op, mode)."""
    n = len(fwd)
    boundary = np.zeros(n, dtype=bool)
    layers = program.layers
    layer_pos = {name: i for i, name in enumerate(layers)}
    pos = _ffill(np.array([layer_pos.get(str(x), -1) for x in fwd["layer"]]), 0)
    # a module that runs again later (a model's own reshapes after its last block) must not
    # send the forward back to an earlier stage
    pos = np.maximum.accumulate(pos) if len(pos) else pos
    if options.splits:
        cuts = _split_positions(program, options.splits)
        idx = np.searchsorted(np.asarray(cuts), pos, side="right")
        if options.num_ipus == 1:  # shards 1: splits are recomputation sections on one IPU
            return np.zeros(n, dtype=np.int64), idx, "sections"
        return idx.astype(np.int64), idx, "splits"
    blocks = fwd["block"].astype(str).to_numpy()
    if options.stages:
        table = {b: i for i, names in enumerate(options.stages) for b in names}
        found = set(blocks) - {""}
        missing = [b for names in options.stages for b in names if b not in found]
        if missing:
            raise ValueError(f"stage blocks {missing} not in the program; blocks: "
                             f"{', '.join(sorted(found))}")
        return _ffill(np.array([table.get(b, -1) for b in blocks]), 0), boundary, "stages"
    order = list(dict.fromkeys(b for b in blocks if b))
    if order:
        table = {b: i for i, b in enumerate(order)}
        return _ffill(np.array([table.get(b, -1) for b in blocks]), 0), boundary, "blocks"
    return np.zeros(n, dtype=np.int64), boundary, "single"


def _optimiser_by_parameters(program: Program, module_stage: dict[str, int], count: int,
                             num_stages: int) -> np.ndarray:
    """Unplaced optimiser ops: spread in order over stages by their parameters' bytes (an
    optimiser walks parameters in model order)."""
    t = program.tensors
    params = t[t["category"] == "parameter"]
    if params.empty or count == 0:
        return np.full(count, num_stages - 1, dtype=np.int64)
    stage = _ffill(_lookup(params["module"], module_stage, True), 0)
    share = np.bincount(stage, weights=params["bytes"].to_numpy(np.float64),
                        minlength=num_stages)
    cum = np.cumsum(share) / max(share.sum(), 1.0)
    frac = (np.arange(count) + 0.5) / count
    return np.minimum(np.searchsorted(cum, frac), num_stages - 1).astype(np.int64)


def repeated_block(modules: pd.Series) -> np.ndarray:
    """Per module path: the repeated block it may run in, the path up to its first
    numbered part (GPT-2's `transformer.h.3`, Llama's `model.layers.3`, ResNet's
    `layer1.0`); "" for a module outside any (embeddings, final norm, head, loss).
    plan_stages keeps only those that hold modules of their own (not `stem.1`, a norm)."""
    found = modules.astype(str).str.extract(r"^((?:[^.]*\.)*?[0-9]+)(?:\.|$)")[0]
    return found.fillna("").to_numpy(str)


def plan_stages(program: Program, options: Options, checkpoint_blocks: bool = False
                ) -> StagePlan:
    """Stages, IPUs (GPUs) and recomputation sections of each op. `checkpoint_blocks`
    (GPU targets): full recomputation checkpoints each repeated block on every stage, as
    Megatron-LM (--recompute-method uniform, one layer) and torchtitan (full activation
    checkpointing) do; otherwise each stage but the last is one section (PopART)."""
    ops = program.ops.reset_index(drop=True).copy()
    phase = ops["phase"].to_numpy(str)
    is_fwd = phase == "forward"
    fwd = ops[is_fwd]
    f_stage, f_section, mode = _forward_stage(program, options, fwd)
    num_stages = int(f_stage.max()) + 1 if len(f_stage) else 1

    stage = np.full(len(ops), -1, dtype=np.int64)
    section = np.full(len(ops), -1, dtype=np.int64)
    stage[is_fwd] = f_stage
    # a section ends after a checkpoint op and at every stage / split boundary
    ckpt = fwd["checkpoint"].to_numpy(bool)
    new_sec = np.r_[False, (np.diff(f_stage) != 0) | (np.diff(f_section) != 0) | ckpt[:-1]] \
        if len(fwd) else np.zeros(0, bool)
    blockwise = checkpoint_blocks and options.training and options.recomputation \
        and options.recompute_granularity == "full"
    block = repeated_block(fwd["module"]) if blockwise else np.zeros(0, str)
    if blockwise:  # a numbered leaf module (a Sequential's conv or norm, a classifier's
        # Linear) is a layer, not a block: a block holds modules of its own
        inner = fwd["module"].astype(str).to_numpy() != block
        holders = set(block[inner & (block != "")].tolist())
        block = np.where(np.isin(block, list(holders)), block, "")
    blockwise = blockwise and bool((block != "").any())
    if blockwise and len(fwd):  # and a section per repeated block
        new_sec |= np.r_[False, block[1:] != block[:-1]]
    section[is_fwd] = np.cumsum(new_sec)

    layer_stage = dict(zip(fwd["layer"].astype(str)[::-1], f_stage[::-1], strict=True))
    module_stage = dict(zip(fwd["module"].astype(str)[::-1], f_stage[::-1], strict=True))
    layer_section = dict(zip(fwd["layer"].astype(str)[::-1], section[is_fwd][::-1],
                             strict=True))
    module_section = dict(zip(fwd["module"].astype(str)[::-1], section[is_fwd][::-1],
                              strict=True))
    layer_stage.pop("", None)
    layer_section.pop("", None)

    for ph in ("backward", "recompute", "optimiser", "host_io"):
        m = phase == ph
        if not m.any():
            continue
        sub = ops[m]
        st = _lookup(sub["layer"], layer_stage, False)
        miss = st < 0
        st[miss] = _lookup(sub["module"][miss], module_stage, True)
        if blockwise:  # a layer may span blocks (a model's split-point names): by module
            sec = _lookup(sub["module"], module_section, True)
            sec[sec < 0] = _lookup(sub["layer"][sec < 0], layer_section, False)
        else:
            sec = _lookup(sub["layer"], layer_section, False)
            sec[sec < 0] = _lookup(sub["module"][sec < 0], module_section, True)
        if ph == "optimiser" and (st < 0).all():
            st[:] = _optimiser_by_parameters(program, module_stage, len(st), num_stages)
        elif ph == "optimiser":  # an unowned op (e.g. momentum scaling) joins its neighbour
            st = pd.Series(np.where(st < 0, np.nan, st)).bfill().ffill().to_numpy(np.int64)
        elif ph == "host_io":
            first_fwd = int(np.argmax(is_fwd)) if is_fwd.any() else 0
            before = np.flatnonzero(m) < first_fwd
            st[st < 0] = np.where(before[st < 0], 0, num_stages - 1)
        default = num_stages - 1 if ph in ("backward", "recompute") else 0
        stage[m] = _ffill(st, default)
        section[m] = _ffill(sec, int(section[is_fwd].max()) if is_fwd.any() else 0)

    ops["stage"] = stage
    ops["section"] = section
    ops["source_op"] = np.int64(-1)
    ipus = _stage_ipus(program, options, num_stages, mode, fwd, f_stage)
    ops["ipu"] = ipus[stage]
    if options.training and options.recomputation:
        if options.recompute_granularity == "selective":
            ops = _synthesize_selective(ops)
        elif blockwise:
            in_block = section[is_fwd][block != ""]
            ops = _synthesize_recompute(ops, set(in_block.tolist()))
        else:
            ops = _synthesize_recompute(ops)

    named = fwd["layer"].astype(str).to_numpy() != ""
    by_stage = fwd[named].groupby(f_stage[named])["layer"]
    first = by_stage.first() if named.any() else pd.Series(dtype=str)
    last = by_stage.last() if named.any() else pd.Series(dtype=str)
    stages = pd.DataFrame({
        "stage": np.arange(num_stages, dtype=np.int64),
        "ipu": ipus,
        "first_layer": [str(first.get(s, "")) for s in range(num_stages)],
        "last_layer": [str(last.get(s, "")) for s in range(num_stages)],
    })
    num_ipus = options.num_ipus or int(ipus.max()) + 1
    return StagePlan(ops, stages, max(num_ipus, int(ipus.max()) + 1),
                     {k: int(v) for k, v in module_stage.items()},
                     {k: int(v) for k, v in layer_stage.items()}, mode)


def _stage_ipus(program: Program, options: Options, num_stages: int, mode: str,
                fwd: pd.DataFrame, f_stage: np.ndarray) -> np.ndarray:
    if options.stage_ipus:
        if len(options.stage_ipus) != num_stages:
            raise ValueError(f"stage_ipus has {len(options.stage_ipus)} entries for "
                             f"{num_stages} stages")
        return np.asarray(options.stage_ipus, dtype=np.int64)
    if mode == "splits" and options.num_ipus and num_stages != options.num_ipus:
        raise ValueError(f"{options.num_ipus} IPUs need {options.num_ipus - 1} pipeline split "
                         f"names, got {num_stages - 1}: {options.splits}")
    if mode == "blocks":
        block_ipus = program.model.get("block_ipus") or {}
        order = list(dict.fromkeys(b for b in fwd["block"].astype(str) if b))
        if block_ipus and all(block_ipus.get(b) is not None for b in order):
            ipus = np.asarray([int(block_ipus[b]) for b in order], dtype=np.int64)
            if np.all(np.diff(ipus) >= 0):
                return ipus
    ipus = np.arange(num_stages, dtype=np.int64)
    if options.num_ipus and num_stages > options.num_ipus:
        ipus = ipus * options.num_ipus // num_stages
    return ipus


def _synthesize_recompute(ops: pd.DataFrame, sections: set[int] | None = None
                          ) -> pd.DataFrame:
    """Copy each section's forward ops as recompute ops (placed before that section's
    backward later). `sections`: the sections to recompute (checkpointed blocks, the last
    included); by default every section but the last, whose backward follows at once. A
    section whose recompute was recorded (torch.utils.checkpoint) keeps the recorded ops."""
    fwd = ops[ops["phase"] == "forward"]
    bwd_sections = set(ops.loc[ops["phase"] == "backward", "section"].tolist())
    recorded = set(ops.loc[ops["phase"] == "recompute", "section"].tolist())
    if fwd.empty:
        return ops
    chosen = fwd["section"].isin(sections) if sections is not None \
        else fwd["section"] != int(fwd["section"].max())
    keep = fwd[chosen & fwd["section"].isin(bwd_sections) & ~fwd["section"].isin(recorded)]
    if keep.empty:
        return ops
    return _with_copies(ops, keep)


def _with_copies(ops: pd.DataFrame, keep: pd.DataFrame, anchor: str | None = None
                 ) -> pd.DataFrame:
    """`ops` with a recompute copy of each row of `keep` (new op ids, `source_op` the
    original); `anchor` "module": each runs before its own module's backward (order.py),
    else before its section's."""
    rec = keep.copy()
    rec["source_op"] = rec["op_id"].to_numpy(np.int64)
    rec["op_id"] = np.arange(len(rec), dtype=np.int64) + int(ops["op_id"].max()) + 1
    rec["phase"] = "recompute"
    rec["checkpoint"] = False
    rec["host_ns"] = np.int64(0)
    if anchor is not None:
        rec["recompute_anchor"] = anchor
    return pd.concat([ops, rec], ignore_index=True)


# the last part of an attention module's path: GPT-2's `attn`, BERT's `attention.self`,
# ViT's `attention.attention`, Llama's `self_attn`, T5's `SelfAttention`, Megatron's
# `core_attention`
ATTENTION_SCOPES = ("attn", "attention", "self", "self_attn", "selfattention",
                    "core_attention", "inner_attention")
FUSED_ATTENTION = r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention"


def attention_core(fwd: pd.DataFrame) -> np.ndarray:
    """Per forward op: whether it is an attention core's (the ops an attention module runs
    itself between its projections: scores, mask, softmax, dropout, the weighted sum and
    the heads' layout copies; the projections are its Linear children's ops). A fused
    attention kernel is not: it keeps only its log-sum-exp, nothing to recompute."""
    module = fwd["module"].astype(str)
    last = module.str.rsplit(".", n=1).str[-1].str.lower()
    fused = fwd["op"].astype(str).str.contains(FUSED_ATTENTION, regex=True)
    with_fused = set(module[fused])  # such a module's core is the one fused kernel
    return (last.isin(ATTENTION_SCOPES) & ~module.isin(with_fused)).to_numpy()


def _synthesize_selective(ops: pd.DataFrame) -> pd.DataFrame:
    """Selective recomputation (Korthikanti et al. 2022, Megatron-LM's
    --recompute-granularity selective): only each attention core is recomputed before its
    backward, from its inputs (the query, key and value projections, kept); its scores,
    softmax and dropout, which grow with the sequence squared, are not kept, its output
    (the next projection's input) is. A ValueError when the program has no attention core
    to recompute (no attention module, or fused attention)."""
    fwd = ops[ops["phase"] == "forward"]
    core = attention_core(fwd)
    if not core.any():
        raise ValueError("selective recomputation recomputes attention cores, and this "
                         "program has none (no attention module, or fused attention such as "
                         "SDPA's flash kernel, which keeps no scores); use full "
                         "recomputation")
    keep = fwd[core]
    # the output of each attention module's core: its last op, read by the projection
    last_of = keep.groupby(keep["module"].astype(str), sort=False).tail(1).index
    ops = ops.copy()
    ops.loc[last_of, "checkpoint"] = True
    return _with_copies(ops, ops.loc[keep.index], anchor="module")
