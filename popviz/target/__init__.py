"""Targets: machine descriptions (Mk1, Mk2, Bow, custom), per-op cost model, tile mapping."""

from popviz.target.machines import (
    BOW,
    MK1,
    MK2,
    Target,
    get_target,
    load_target,
    make_target,
    register_target,
    target_names,
)

__all__ = ["BOW", "MK1", "MK2", "Target", "get_target", "load_target", "make_target",
           "register_target", "target_names"]
