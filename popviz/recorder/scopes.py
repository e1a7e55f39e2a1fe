"""Module scopes of a recording: module paths, layer names, and tensors from before the step.

A mixin of `Recorder` (recorder.py): global module forward hooks keep a stack of module
paths, so each op knows the module (and so the layer and block) it runs in.
"""

from __future__ import annotations

from typing import Any

import torch

from popviz.annotate import STATE
from popviz.recorder.tensors import Storage, tensors_in


class ModuleScopes:
    """Module-path bookkeeping; the attributes it uses are set by Recorder.__enter__."""

    _root: torch.nn.Module | None
    _paths: dict[int, str]
    _param_names: dict[int, str]
    _params: list[torch.nn.Parameter]
    _layer_names: dict[str, str]
    _layer_cache: dict[str, str]
    _storages: dict[int, Storage]
    _rows: list[Storage]
    _grad_cds: set[int]
    _mod_stack: list[str]
    _input_shape: list[int] | None
    _batch_dims: list[int]  # dim 0 of each call of the model in the step
    _call_counted: bool  # the current call of the model has been counted
    _forward_started: bool

    def _adopt_root(self, model: torch.nn.Module) -> None:
        self._root = model
        for path, mod in model.named_modules():
            self._paths.setdefault(id(mod), path)
        for pname, p in model.named_parameters():
            self._param_names.setdefault(p.untyped_storage()._cdata, pname)
            self._params.append(p)
        for bname, b in model.named_buffers():
            self._param_names.setdefault(b.untyped_storage()._cdata, bname)
        self._layer_names = dict(getattr(model, "popviz_layer_names", None) or {})
        # parameters, buffers and existing gradients exist before the step: rows up front
        for t in [*model.parameters(), *model.buffers()]:
            self._register_existing(t)
        for p in self._params:
            if p.grad is not None:
                rec = self._register_existing(p.grad)
                self._grad_cds.add(p.grad.untyped_storage()._cdata)
                rec.module, rec.layer = None, None

    def _register_existing(self, t: torch.Tensor) -> Storage:
        storage = t.untyped_storage()
        cd = storage._cdata
        rec = self._storages.get(cd)
        if rec is None:
            rec = Storage(len(self._rows), t, storage, -1, None, None, None)
            name = self._param_names.get(cd)
            if name is not None:
                rec.name = name
                rec.module = name.rpartition(".")[0]
                rec.layer = self._layer_of(rec.module)
            self._storages[cd] = rec
            self._rows.append(rec)
        return rec

    def _path_of(self, mod: torch.nn.Module) -> str:
        path = self._paths.get(id(mod))
        if path is None:
            if self._root is None and not self._mod_stack:
                self._adopt_root(mod)  # no model given: the first module called is the model
                return ""
            parent = self._mod_stack[-1] if self._mod_stack else ""
            path = f"{parent}.{type(mod).__name__}" if parent else type(mod).__name__
            self._paths[id(mod)] = path
        return path

    def _module_pre(self, mod: torch.nn.Module, args: Any) -> None:
        path = self._path_of(mod)
        if path == "" and mod is self._root and torch._C._current_graph_task_id() == -1:
            STATE.begin_block = ""  # a new forward pass: BeginBlock marks start over
            # a call of the model outside backward (so not a checkpoint's re-run): its
            # batch is dim 0 of its first tensor argument, here or (keywords) at its end
            self._call_counted = self._count_call(tensors_in(args))
            self._forward_started = True
        self._mod_stack.append(path)

    def _count_call(self, tensors: Any) -> bool:
        """Add one model call's batch to the step's micro-batch (two calls of 4 in one
        step, gradient accumulation in the step, are 8 samples of forward and backward
        work); the first call's input shape is kept as `input_shape`."""
        first = next(iter(tensors), None)
        if first is None or not first.dim():
            return False
        if self._input_shape is None:
            self._input_shape = [int(s) for s in first.shape]
        self._batch_dims.append(int(first.shape[0]))
        return True

    def _module_post(self, mod: torch.nn.Module, args: Any, *rest: Any) -> None:
        # (kwargs, out) normally; (out,) when torch runs it after an exception
        path = self._paths.get(id(mod))
        if path == "" and not self._call_counted and len(rest) == 2 and rest[0] \
                and mod is self._root and torch._C._current_graph_task_id() == -1:
            # model(input_ids=..., labels=...): the batch from the keyword arguments
            self._call_counted = self._count_call(tensors_in(rest[0].values()))
        stack = self._mod_stack
        if stack and stack[-1] == path:
            stack.pop()
        elif path in stack:  # an exception unwound inner modules without their hooks
            del stack[len(stack) - 1 - stack[::-1].index(path):]

    def _layer_of(self, module: str) -> str:
        layer = self._layer_cache.get(module)
        if layer is None:
            layer = module
            names = self._layer_names
            if names:
                parts = module.split(".") if module else []
                for k in range(len(parts), -1, -1):  # longest matching prefix wins
                    prefix = ".".join(parts[:k])
                    if prefix in names:
                        layer = names[prefix]
                        break
            self._layer_cache[module] = layer
        return layer
