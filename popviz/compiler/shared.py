"""Parameters shared across IPUs (tied weights such as GPT-2's wte / lm_head).

A parameter read by forward ops on several IPUs is modelled as a copy on every IPU that
reads it (always-live memory there), and its gradient is sent from each reader IPU to the
IPU that owns the parameter and its optimiser state at every weight update (one row per
update in the exchange table, kind "shared_gradient", timed from the start of the owner's
update). The transfer is not added to the step time: the model treats it as overlapped
with the update, which understates the step by at most stage_copy_cycles(bytes) per update
(one way over the links joining the two IPUs, as a stage's copy).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz.compiler.memory import consumers
from popviz.compiler.stages import StagePlan
from popviz.target.cost import dtype_scale
from popviz.target.machines import Target

SHARED_KIND = "shared_gradient"
COPY_NAME = r"^(.*) \(copy on IPU\d+\)$"


def _home_stage(module: str, table: dict[str, int]) -> int:
    while module and module not in table and "." in module:
        module = module.rsplit(".", 1)[0]
    return table.get(module, 0)


def find_shared(ops: pd.DataFrame, tensors: pd.DataFrame, plan: StagePlan) -> pd.DataFrame:
    """One row per (shared parameter, reader IPU other than its home): tensor_id, name,
    bytes, dtype, home_ipu, home_stage, ipu, module (a forward reader's, on that IPU)."""
    cols = ["tensor_id", "name", "bytes", "dtype", "home_ipu", "home_stage", "ipu", "module"]
    params = tensors[tensors["category"] == "parameter"]
    if plan.num_ipus < 2 or params.empty:
        return pd.DataFrame(columns=cols)
    ops = ops.reset_index(drop=True)
    real = ops["source_op"].to_numpy() < 0
    prod_row = pd.Series(np.flatnonzero(real), index=ops.loc[real, "op_id"].to_numpy())
    pairs = consumers(ops, params, prod_row)
    rows = pairs["row"].to_numpy(np.int64)
    pairs = pairs[ops["pass"].to_numpy(str)[rows] == "F"].copy()
    pairs["ipu"] = ops["ipu"].to_numpy(np.int64)[pairs["row"].to_numpy(np.int64)]
    pairs["module"] = ops["module"].astype(str).to_numpy()[pairs["row"].to_numpy(np.int64)]
    stage_ipu = plan.stages["ipu"].to_numpy(np.int64)
    # the first forward reader (lowest row) of each parameter on each IPU, in
    # (tensor, ipu) order; then each parameter's home once (a handful of dict look-ups)
    first = pairs.sort_values(["tensor_id", "ipu", "row"], kind="stable").drop_duplicates(
        ["tensor_id", "ipu"])
    by_id = params.drop_duplicates("tensor_id").set_index("tensor_id")
    out = []
    homes: dict[int, tuple[int, int]] = {}
    for tid, ipu, module in zip(first["tensor_id"].to_numpy(np.int64).tolist(),
                                first["ipu"].to_numpy(np.int64).tolist(),
                                first["module"].tolist(), strict=True):
        if tid not in homes:
            stage = _home_stage(str(by_id.at[tid, "module"]), plan.module_stage)
            homes[tid] = (int(stage_ipu[min(stage, len(stage_ipu) - 1)]), stage)
        home, home_stage = homes[tid]
        if ipu != home:
            out.append([tid, str(by_id.at[tid, "name"]), int(by_id.at[tid, "bytes"]),  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
                        str(by_id.at[tid, "dtype"]), home, home_stage, ipu, str(module)])
    return pd.DataFrame(out, columns=cols)


def drop_copies(tensors: pd.DataFrame) -> pd.DataFrame:
    """The tensors without the copies `add_copies` made: a compiled profile's tensors table
    holds them, and a program rebuilt from it (`popviz tune`) must not count them twice
    (compile adds them again). A copy is a parameter no op makes, named after another
    parameter as '<name> (copy on IPU<n>)'."""
    names = tensors["name"].astype(str)
    found = names.str.extract(COPY_NAME, expand=True)[0]
    if found.isna().all():
        return tensors
    params = set(names[tensors["category"] == "parameter"])
    copy = found.notna() & found.isin(params) & (tensors["category"] == "parameter") \
        & (tensors["producer"] < 0)
    return tensors[~copy.to_numpy()].reset_index(drop=True)


def add_copies(tensors: pd.DataFrame, shared: pd.DataFrame) -> pd.DataFrame:
    """The tensors table plus one parameter row per copy, owned by a reader module on the
    copy's IPU (so memory places it there, always live)."""
    if shared.empty:
        return tensors
    src = tensors.set_index("tensor_id").loc[shared["tensor_id"].to_numpy()].reset_index()
    copies = src.assign(
        tensor_id=np.arange(len(src), dtype=np.int64) + int(tensors["tensor_id"].max()) + 1,
        name=[f"{n} (copy on IPU{i})" for n, i in zip(shared["name"], shared["ipu"],
                                                      strict=True)],
        module=shared["module"].to_numpy(), layer=shared["module"].to_numpy(), producer=-1)
    return pd.concat([tensors, copies[tensors.columns]], ignore_index=True)


def gradient_exchange(exchange: pd.DataFrame, trace: pd.DataFrame, shared: pd.DataFrame,
                      target: Target, weight_bytes: int) -> pd.DataFrame:
    """The exchange table plus, for every weight update of each shared parameter's home
    stage, its gradient from each reader IPU to the home IPU."""
    if shared.empty:
        return exchange
    wu = trace[(trace["kind"] == "compute") & (trace["pass"] == "WU")]
    rows = []
    scale = dtype_scale(shared["dtype"], weight_bytes)
    for (_, s), factor in zip(shared.iterrows(), scale, strict=True):
        nbytes = int(np.ceil(s["bytes"] * factor))
        cycles = int(np.ceil(target.stage_copy_cycles(nbytes)))
        starts = wu.loc[(wu["stage"] == s["home_stage"]) & (wu["ipu"] == s["home_ipu"]),
                        "start"]
        for start in starts.drop_duplicates().tolist():
            rows.append({"src": int(s["ipu"]), "dst": int(s["home_ipu"]), "bytes": nbytes,
                         "start": int(start), "end": int(start) + cycles, "kind": SHARED_KIND,
                         "stage": int(s["home_stage"]), "microbatch": -1})
    if not rows:
        return exchange
    extra = pd.DataFrame(rows).astype({"src": object, "dst": object})
    return pd.concat([exchange, extra[exchange.columns]], ignore_index=True)


def summary_rows(shared: pd.DataFrame) -> list[dict[str, object]]:
    """Per shared parameter: name, bytes, home IPU and the IPUs holding a copy."""
    return [{"name": name, "bytes": int(g["bytes"].iloc[0]),
             "home_ipu": int(g["home_ipu"].iloc[0]),
             "copy_ipus": sorted(int(i) for i in g["ipu"])}
            for name, g in shared.groupby("name", sort=True)]
