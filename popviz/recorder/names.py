"""Split names as module paths (`model.named_modules()`, e.g. "transformer.h.6"): checked
against the model before a step runs, and turned into the layer names the compiler splits
at once the step is recorded. No model edits (BeginBlock) are needed."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

import torch

from popviz.options import SEVERAL_STAGES_PER_GPU
from popviz.recorder.program import Program


def valid_split_names(model: torch.nn.Module) -> list[str]:
    """Module paths, plus a popviz model's own split and layer names, in model order."""
    names = [path for path, _ in model.named_modules() if path]
    names += list(getattr(model, "popviz_split_names", None) or [])
    names += list((getattr(model, "popviz_layer_names", None) or {}).values())
    return list(dict.fromkeys(names))


def closest_names(unknown: Sequence[str], valid: Sequence[str]) -> str:
    """The valid names closest to any of `unknown` (difflib), comma-separated."""
    close = [c for name in unknown
             for c in difflib.get_close_matches(name, valid, n=5, cutoff=0.5)]
    return ", ".join(dict.fromkeys(close)) or "none"


def unknown_name_error(what: str, unknown: Sequence[str], valid: Sequence[str]) -> ValueError:
    """One line: the unknown names, each with the closest valid ones (difflib)."""
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=5, cutoff=0.5)
        parts.append(f"{name!r} (closest: {', '.join(close)})" if close
                     else f"{name!r} (no close name; e.g. {', '.join(valid[:5])})")
    return ValueError(f"unknown {what} {'; '.join(parts)}")


def check_split_names(model: torch.nn.Module, options: Any) -> None:
    """Before the step: every split names a module (or a popviz layer), none repeats, and
    with several IPUs there is one split fewer than IPUs."""
    splits = list(options.splits)
    if not splits:
        return
    valid = valid_split_names(model)
    unknown = [s for s in splits if s not in valid]
    if unknown:
        raise unknown_name_error("pipeline split name(s)", unknown, valid)
    if len(set(splits)) != len(splits):
        raise ValueError(f"pipeline splits repeat a name: {splits}")
    ipus = options.num_ipus
    several = getattr(options, "schedule", None) in SEVERAL_STAGES_PER_GPU  # the compiler checks
    if ipus is not None and ipus > 1 and len(splits) != ipus - 1 and not several:
        raise ValueError(f"{ipus} IPUs need {ipus - 1} pipeline split names, got "
                         f"{len(splits)}: {splits}")


def splits_to_layers(program: Program, splits: Sequence[str]) -> list[str]:
    """A split naming a module becomes the layer of the first forward op inside it (the
    compiler splits where a layer first runs: a block's own residual add runs after its
    attention); a popviz model's layer and split names stay as they are."""
    known = set(program.layers) | set(program.model.get("split_names") or [])
    fwd = program.ops[program.ops["phase"] == "forward"]
    pairs = list(zip(fwd["module"].astype(str), fwd["layer"].astype(str), strict=True))
    out = []
    for name in splits:
        prefix = name + "."
        layer = next((lay for mod, lay in pairs if mod == name or mod.startswith(prefix)),
                     None)
        if layer is None and name not in known:
            valid = list(dict.fromkeys(m for m, _ in pairs if m))
            raise unknown_name_error("pipeline split name(s)", [name], valid)
        out.append(layer if layer is not None else name)
    return out
