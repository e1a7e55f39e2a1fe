"""Program: what the recorder captured from one step (see docs/internals.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

OP_COLUMNS: dict[str, str] = {
    "op_id": "int64",
    "op": "str",
    "op_class": "str",
    "phase": "str",
    "module": "str",
    "layer": "str",
    "block": "str",
    "checkpoint": "bool",
    "flops": "int64",
    "bytes_read": "int64",
    "bytes_written": "int64",
    "shapes": "str",
    "out_shape": "str",
    "dtype": "str",
    "host_ns": "int64",
    # dataflow (added for liveness): tensor_ids read / written, ";"-separated
    "inputs": "str",
    "outputs": "str",
}

# columns a recording adds beside the contract's: a Program made without them (by hand, or
# from a profile written before they existed) gets their empty value
OP_EXTRA_COLUMNS: dict[str, str] = {
    # the CUDA kernel family an element-wise op or copy runs (popviz/recorder/kernel_path.py)
    "kernel_path": "str",
}

TENSOR_COLUMNS: dict[str, str] = {
    "tensor_id": "int64",
    "name": "str",
    "bytes": "int64",
    "dtype": "str",
    "shape": "str",
    "category": "str",
    "module": "str",
    "layer": "str",
    "block": "str",
    "producer": "int64",
    "last_use": "int64",
}

OP_CLASSES = (
    "conv", "grouped_conv", "depthwise_conv", "matmul", "elementwise", "reduction", "norm",
    "data_movement", "other",
)
PHASES = ("forward", "backward", "recompute", "optimiser", "host_io")
CATEGORIES = ("parameter", "gradient", "optimiser_state", "activation", "temporary", "input")


def frame(rows: list[dict[str, Any]], columns: dict[str, str]) -> pd.DataFrame:
    """A DataFrame with exactly `columns`, in order and with their dtypes, from row dicts."""
    df = pd.DataFrame(rows, columns=list(columns))
    for name, dtype in columns.items():
        if dtype == "str":
            # astype(object) first: an all-missing column is float, and filling a float
            # column with "" is deprecated in pandas 3.
            df[name] = df[name].astype(object).fillna("").astype(str)
        elif dtype == "bool":
            df[name] = df[name].astype(object).fillna(False).astype(bool)
        else:
            df[name] = df[name].fillna(0).astype(dtype)  # type: ignore[call-overload]  # pandas-stubs: only literal dtype names
    return df


@dataclass
class Program:
    """Ops and tensors of one recorded step, plus facts about the model."""

    ops: pd.DataFrame
    tensors: pd.DataFrame
    model: dict[str, Any] = field(default_factory=dict)
    mode: str = "measured"  # 'measured' (real step) or 'plan' (fake tensors)

    def __post_init__(self) -> None:
        missing = [c for c in OP_COLUMNS if c not in self.ops.columns]
        if missing:
            raise ValueError(f"Program.ops lacks columns {missing}")
        absent = [c for c in OP_EXTRA_COLUMNS if c not in self.ops.columns]
        if absent:
            self.ops = self.ops.assign(**{c: "" for c in absent})
        missing = [c for c in TENSOR_COLUMNS if c not in self.tensors.columns]
        if missing:
            raise ValueError(f"Program.tensors lacks columns {missing}")
        if self.mode not in ("measured", "plan"):
            raise ValueError(f"Program.mode {self.mode!r} is not 'measured' or 'plan'")

    @property
    def layers(self) -> list[str]:
        """Layer names in forward order (from model['layers'] or the forward ops)."""
        if self.model.get("layers"):
            return list(self.model["layers"])
        fwd = self.ops[self.ops["phase"] == "forward"]
        return list(dict.fromkeys(fwd["layer"].tolist()))
