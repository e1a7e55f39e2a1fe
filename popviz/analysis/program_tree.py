"""The recorded program as a tree: model -> modules (blocks, layers, ...) -> ops.

Modules come from each op's dotted module path (`layer1.0.conv1`), so the tree is the
model's own `nn.Module` hierarchy. A module's figures are the sum over every op recorded
inside it or its children, in every pass (forward, backward, recompute, optimiser); leaves
group a module's ops by name and pass ("convolution (F)"). A measured profile has no
modelled cycles: its `cycles` column holds each action's time in ns. Pure pandas.

Siblings are in program order (the first op each holds), not alphabetical: `blocks.2`
before `blocks.10`, `head` after the layers. Each node carries the split names (the
ops' `layer`, what `splits` and the stage table's first_layer name) it runs, so
`blocks.3` reads as `block2b`. With `weights` (per pass, from `step_weights`) the sums
are per step: an op's recorded cost is one micro-batch's (the optimiser's, one weight
update's)."""

from __future__ import annotations

import numpy as np
import pandas as pd

ROOT = "model"
PASS_NAMES = {"F": "forward", "B": "backward", "R": "recompute", "WU": "optimiser"}
COLUMNS = ["id", "parent", "name", "depth", "kind", "module", "cycles", "flops",
           "bytes_written", "temp_bytes", "ops", "stages", "ipus", "forward_cycles",
           "backward_cycles", "recompute_cycles", "optimiser_cycles", "first", "layers"]


def step_weights(meta: dict, summary: dict, measured: bool) -> dict[str, float] | None:
    """How many times each pass's recorded op runs in one compiled step: forward,
    backward and recompute once per micro-batch (the summary's `microbatches`), the
    optimiser once per weight update (device_iterations). None for a measured run (its
    ops are one recorded step already) or when the profile does not say."""
    if measured:
        return None
    micro = (summary or {}).get("microbatches")
    updates = ((meta or {}).get("options") or {}).get("device_iterations", 1)
    if micro is None:
        return None
    try:
        micro, updates = float(micro), float(updates or 1)
    except (TypeError, ValueError):
        return None
    if not (micro > 0 and updates > 0):
        return None
    return {"F": micro, "B": micro, "R": micro, "WU": updates}


def _short(op: str) -> str:
    parts = str(op).split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else str(op)


def _stage_texts(frame: pd.DataFrame, key: str, col: str, index: pd.Index) -> pd.Series:
    """Per group of `key`: the stages (IPUs) its ops ran on, '0', '0-2' (a run) or '0, 3',
    all groups at once: a run from the group's minimum, maximum and count; only groups
    with gaps list their values."""
    valid = frame.loc[pd.to_numeric(frame[col], errors="coerce") >= 0, [key, col]]
    valid = valid.assign(**{col: valid[col].astype(np.int64)}).drop_duplicates()
    g = valid.groupby(key, sort=False)[col]
    lo, hi, n = g.min(), g.max(), g.size()
    text = pd.Series("", index=index, dtype=object)
    one, run = (n == 1), (n > 1) & (hi - lo + 1 == n)
    text[one[one].index] = lo[one].astype(str)
    text[run[run].index] = lo[run].astype(str) + "-" + hi[run].astype(str)
    gaps = n[~(one | run)].index
    if len(gaps):
        sub = valid[valid[key].isin(gaps)].sort_values(col, kind="stable")
        text[gaps] = sub.groupby(key, sort=False)[col].agg(
            lambda v: ", ".join(map(str, v))).reindex(gaps)
    return text.astype(str)  # the text dtype a per-group agg gives


def _layer_texts(frame: pd.DataFrame, key: str, index: pd.Index) -> pd.Series:
    """Per group of `key`: 'block2b', or 'block2a…block2d' for the first and the last new
    split name in op order (by where each name first appears in the group)."""
    named = frame.loc[frame["layer"].astype(str) != "", [key, "layer", "pos"]]
    firsts = named.groupby([key, "layer"], sort=False)["pos"].min().reset_index()
    firsts = firsts.sort_values("pos", kind="stable")
    g = firsts.groupby(key, sort=False)["layer"]
    first, last, n = g.first(), g.last(), g.size()
    text = pd.Series("", index=index, dtype=object)
    text[n.index] = np.where(n.to_numpy() == 1, first.astype(str).to_numpy(),
                             (first.astype(str) + "…" + last.astype(str)).to_numpy())
    return text.astype(str)


def _aggregate(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    """Totals per value of `key` in one group-by (no loop over nodes)."""
    g = frame.groupby(key, sort=False)
    out = pd.DataFrame({
        "cycles": g["cycles"].sum(), "flops": g["flops"].sum(min_count=1),
        "bytes_written": g["bytes_written"].sum(min_count=1),
        "temp_bytes": g["temp_bytes"].max(),
        "ops": g.size(), "first": g["pos"].min()})
    out["stages"] = _stage_texts(frame, key, "stage", out.index)
    out["ipus"] = _stage_texts(frame, key, "ipu", out.index)
    out["layers"] = _layer_texts(frame, key, out.index)
    out = out[["cycles", "flops", "bytes_written", "temp_bytes", "ops", "stages", "ipus",
               "first", "layers"]]
    for code, name in PASS_NAMES.items():
        out[f"{name}_cycles"] = frame["cycles"].where(frame["pass"] == code, 0.0).groupby(
            frame[key], sort=False).sum()
    return out


def flops_recorded(ops: pd.DataFrame) -> bool:
    """Whether the ops' FLOPs mean anything: a trace recorded without them (no op with
    any) stores 0 for every op, which is unknown, not none."""
    if "flops" not in ops:
        return False
    return bool((pd.to_numeric(ops["flops"], errors="coerce") > 0).any())


def _normalised(ops: pd.DataFrame) -> pd.DataFrame:
    """The columns the tree sums, present (zero or -1) even where a profile lacks them."""
    out = pd.DataFrame(index=ops.index)
    out["module"] = ops["module"].fillna("").astype(str) if "module" in ops else ""
    out["op"] = ops["op"].astype(str) if "op" in ops else ""
    out["pass"] = ops["pass"].astype(str) if "pass" in ops else ""
    out["cycles"] = pd.to_numeric(ops["cycles"], errors="coerce").fillna(0.0).astype(float) \
        if "cycles" in ops else 0.0
    # a column the profile does not record stays NaN: its totals read "unknown", not 0
    for col in ("flops", "bytes_written", "temp_bytes"):
        out[col] = pd.to_numeric(ops[col], errors="coerce").fillna(0.0).astype(float) \
            if col in ops else np.nan
    if not flops_recorded(ops):
        out["flops"] = np.nan
    if "cycles" not in ops:  # measured: each action's time in ns
        if "host_ns" in ops and float(ops["host_ns"].sum()) > 0:
            out["cycles"] = ops["host_ns"].astype(float)
        elif {"start", "end"} <= set(ops.columns):
            out["cycles"] = (ops["end"] - ops["start"]).astype(float).clip(lower=0)
    for col in ("stage", "ipu"):
        out[col] = ops.get(col, -1)
    out["layer"] = ops["layer"].fillna("").astype(str) if "layer" in ops else ""
    out["pos"] = np.arange(len(ops))  # program order: ops are stored as they ran
    return out


def program_tree(ops: pd.DataFrame, weights: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per node: id (the module path, or 'model'), parent, name, depth, kind
    ('model' | 'module' | 'op'), module, cycles, flops, bytes_written, temp_bytes (largest
    temporary of one op), ops, stages, ipus, cycles per pass, first (the position of its
    first op) and layers (its split names). A parent's figures include its children's;
    ops without a module hang under the model. `weights` (pass -> runs per step) makes
    cycles, FLOPs and bytes written per step."""
    if ops.empty:
        return pd.DataFrame(columns=COLUMNS)
    ops = _normalised(ops)
    if weights:
        runs = ops["pass"].map(weights).fillna(1.0).to_numpy(float)
        for col in ("cycles", "flops", "bytes_written"):
            ops[col] = ops[col] * runs
    # each op counted once in every module that contains it: explode into its ancestors
    ancestors = ops["module"].map(
        lambda m: [".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 2)] if m
        else [])
    inside = ops.assign(path=ancestors).explode("path").dropna(subset=["path"])
    modules = _aggregate(inside, "path") if len(inside) else pd.DataFrame()
    model = _aggregate(ops.assign(path=ROOT), "path")
    model = model.assign(id=ROOT, parent="", name=ROOT, depth=0, kind="model", module="")
    frames = [model.reset_index(drop=True)]
    if len(modules):
        paths = modules.index.to_series()
        modules = modules.assign(
            id=paths, parent=paths.map(lambda p: p.rsplit(".", 1)[0] if "." in p else ROOT),
            name=paths.map(lambda p: p.rsplit(".", 1)[-1]),
            depth=paths.str.count(r"\.") + 1, kind="module", module=paths)
        frames.append(modules.sort_values(["depth", "first", "id"]).reset_index(drop=True))
    # leaves: each module's own ops by name and pass
    leaf = [f"{_short(o)} ({p})" for o, p in zip(ops["op"], ops["pass"], strict=True)]
    owner = ops["module"].where(ops["module"] != "", ROOT)
    keyed = ops.assign(path=owner + "/" + pd.Series(leaf, index=ops.index))
    leaves = _aggregate(keyed, "path")
    ids = leaves.index.to_series()
    parents = ids.str.rsplit("/", n=1).str[0]
    leaves = leaves.assign(
        id=ids, parent=parents, name=ids.str.rsplit("/", n=1).str[1],
        depth=parents.map(lambda p: 1 if p == ROOT else p.count(".") + 2), kind="op",
        module=parents.where(parents != ROOT, ""))
    frames.append(leaves.sort_values(["first", "id"]).reset_index(drop=True))
    return pd.concat(frames, ignore_index=True)[COLUMNS]


def node_ops(ops: pd.DataFrame, node: str) -> pd.DataFrame:
    """The ops under a node of `program_tree` (a module path, 'model', or a leaf id
    'module/name (pass)'), heaviest first."""
    if node in ("", ROOT):
        sel = ops
    else:  # a measured run may record no module (every op under the model)
        norm = _normalised(ops)
        mods = norm["module"]
        if "/" in node:
            module, leaf = node.rsplit("/", 1)
            module = "" if module == ROOT else module
            names = [f"{_short(o)} ({p})" for o, p in zip(norm["op"], norm["pass"],
                                                             strict=True)]
            sel = ops[(mods == module) & (pd.Series(names, index=ops.index) == leaf)]
        else:
            sel = ops[(mods == node) | mods.str.startswith(node + ".")]
    if "cycles" in sel:
        sel = sel.sort_values("cycles", ascending=False, kind="stable")
    return sel


def viewed_node(tree: pd.DataFrame, node: str) -> str:
    """The node a view of `node` is drawn from: an op (a leaf) is viewed from its module,
    an unknown id from the model."""
    row = tree[tree["id"] == node]
    if row.empty:
        return ROOT
    return str(row["parent"].iloc[0]) if row["kind"].iloc[0] == "op" else node


def tree_window(tree: pd.DataFrame, root: str = ROOT, levels: int = 4) -> pd.DataFrame:
    """The rows of `program_tree` a view of `root` needs: its ancestors (the path back up),
    itself, and its descendants down to `levels` below it (`viewed_node` picks the root).
    An icicle costs the browser time per node it is given, drawn or not (effnet-b4: 3,400
    nodes, about 0.9 s; the first 5 levels, 0.16 s)."""
    if tree.empty:
        return tree
    root = viewed_node(tree, root)
    ids = tree["id"].astype(str)
    parent = dict(zip(ids, tree["parent"].astype(str), strict=True))
    chain, node = [], root
    while node:  # the model's parent is ""
        chain.append(node)
        node = parent.get(node, "")
    depth = int(tree.loc[ids == root, "depth"].iloc[0])
    if root == ROOT:
        inside = pd.Series(True, index=tree.index)
    else:  # modules below root.x; ops below root/ or root.x/
        inside = ids.str.startswith(root + ".") | ids.str.startswith(root + "/")
    keep = ids.isin(chain) | (inside & (tree["depth"] <= depth + levels))
    return tree[keep]
