"""Module scopes of a recording: module paths, layer names, a model call's batch.

Plain functions over state the Recorder (recorder.py) holds and passes in: its global
module forward hooks keep a stack of module paths, so each op knows the module (and so the
layer and block) it runs in.
"""

from __future__ import annotations

from typing import Any

import torch


def name_modules(model: torch.nn.Module, paths: dict[int, str], param_names: dict[int, str],
                 params: list[torch.nn.Parameter]) -> dict[str, str]:
    """Record the model's module paths (by id), parameter and buffer names (by StorageImpl)
    and parameters; returns its split-point layer names (`popviz_layer_names`)."""
    for path, mod in model.named_modules():
        paths.setdefault(id(mod), path)
    for pname, p in model.named_parameters():
        param_names.setdefault(p.untyped_storage()._cdata, pname)
        params.append(p)
    for bname, b in model.named_buffers():
        param_names.setdefault(b.untyped_storage()._cdata, bname)
    return dict(getattr(model, "popviz_layer_names", None) or {})


def call_shape(tensors: Any) -> list[int] | None:
    """Shape of a model call's first tensor argument (dim 0 is the call's batch), or None
    when it has none with a dimension."""
    first = next(iter(tensors), None)
    if first is None or not first.dim():
        return None
    return [int(s) for s in first.shape]


def pop_scope(stack: list[str], path: str | None) -> None:
    """Leave module `path`: the top of the stack, or deeper when an exception unwound inner
    modules without their hooks."""
    if stack and stack[-1] == path:
        stack.pop()
    elif path in stack:
        del stack[len(stack) - 1 - stack[::-1].index(path):]


def layer_of(module: str, names: dict[str, str], cache: dict[str, str]) -> str:
    """The split-point layer of a module path: its longest prefix in `names`, else itself."""
    layer = cache.get(module)
    if layer is None:
        layer = module
        if names:
            parts = module.split(".") if module else []
            for k in range(len(parts), -1, -1):  # longest matching prefix wins
                prefix = ".".join(parts[:k])
                if prefix in names:
                    layer = names[prefix]
                    break
        cache[module] = layer
    return layer


__all__ = ["call_shape", "layer_of", "name_modules", "pop_scope"]
