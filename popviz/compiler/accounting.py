"""How the frameworks store what a recorded step holds: tensor bytes by precision and
replicated tensor sharding, and the dropout masks an IPU regenerates instead of keeping.

Split from memory.py (its caller).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from popviz.options import Options
from popviz.target.cost import Precision, dtype_scale

WEIGHT_CATEGORIES = ("parameter", "optimiser_state", "gradient")
RANDOM_FILL = "bernoulli"  # the in-place op that fills a dropout mask (aten.bernoulli_)


def stored_bytes(t: pd.DataFrame, precision: Precision, options: Options) -> np.ndarray:
    """Bytes of each tensor as PopART / PopTorch / TensorFlow store it: weights (the master
    copy), gradient accumulators and optimiser state in the weight-update precision (16.16:
    fp16; 16.32 and 32.32: fp32), every other float in the compute precision (the recorded
    dtype's bytes scaled; integers and bools as recorded). With replicated tensor sharding
    each replica holds 1 / replication_factor of the optimiser state (rounded up)."""
    cat = t["category"].to_numpy(str)
    weight = np.isin(cat, WEIGHT_CATEGORIES)
    scale = np.where(weight, dtype_scale(t["dtype"], precision.weight_bytes),
                     dtype_scale(t["dtype"], precision.compute_bytes))
    nbytes = t["bytes"].to_numpy(np.float64) * scale
    if options.replicated_tensor_sharding and options.replication_factor > 1:
        state = cat == "optimiser_state"
        nbytes[state] = nbytes[state] / options.replication_factor
    return np.ceil(nbytes).astype(np.int64)


def random_masks(ops: pd.DataFrame, tensor_ids: np.ndarray) -> np.ndarray:
    """Per tensor (of `tensor_ids`), whether it is a random mask filled in place by a
    Bernoulli op (torch's dropout). PopART, PopTorch and TensorFlow on the IPU draw dropout
    masks with poprand from a seed and draw them again in the backward, so no mask is kept
    from the forward to the backward."""
    if "inputs" not in ops.columns:
        return np.zeros(len(tensor_ids), dtype=bool)
    fill = ops[ops["op"].astype(str).str.contains(RANDOM_FILL, regex=False)]
    ids = {int(x) for text in fill["inputs"].astype(str) for x in text.split(";")
           if x.strip().isdigit()}
    return np.isin(np.asarray(tensor_ids, dtype=np.int64), np.fromiter(ids, dtype=np.int64))
