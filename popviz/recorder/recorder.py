"""Recorder: runs one training step under a TorchDispatchMode and builds its Program.

How each column is found (docs/recording.md has the user's view):
- module: a stack kept by global module forward hooks. Forward ops stamp their module,
  layer and block into the autograd node of their output (`grad_fn.metadata`); a backward
  op reads the node the autograd engine is running (`torch._C._current_autograd_node`),
  so it gets the module of the forward op it differentiates without keeping anything alive.
- phase: optimiser between torch.optim's global step pre/post hooks; backward while the
  autograd engine runs a graph task; recompute = ops run by the engine with grad mode on
  (torch.utils.checkpoint re-running a forward, reentrant or not); host_io for copies into
  the step before the model runs, `popviz.host_io()` scopes and reads back to the host.
- tensors: one row per storage, identified by its StorageImpl and watched through a
  StorageWeakRef (which neither keeps the data alive nor lets the address be reused).

One class holds the recording's state; the helpers it calls are plain functions that get
the state they need passed in (scopes.py, owners.py, overloads.py, build.py).
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from popviz.annotate import STATE
from popviz.recorder import flops as _flops
from popviz.recorder.attention import FusedAttentionMode
from popviz.recorder.build import CHECKPOINT, all_params, build_tables, model_facts
from popviz.recorder.dispatch import OpMode, progress_bar
from popviz.recorder.kernel_path import kernel_path
from popviz.recorder.overloads import FuncInfo, func_info
from popviz.recorder.owners import (
    latest_owner,
    node_info,
    node_is_accumulate,
    owner_of,
    stamp_pending,
    state_owners,
)
from popviz.recorder.program import Program
from popviz.recorder.scopes import call_shape, layer_of, name_modules, pop_scope
from popviz.recorder.tensors import (
    Storage,
    dummy_scalar,
    read_inputs,
    shape_str,
    tensors_in,
    write_outputs,
)

_SCALAR_READ = torch.ops.aten._local_scalar_dense.default
_PATH_CLASSES = ("elementwise", "data_movement")  # ops TensorIterator (or cat) runs
_HOST_COPIES = {"_to_copy", "copy_", "lift_fresh", "lift_fresh_copy", "clone", "contiguous"}


class Recorder:
    """Context manager around one step; `.program` holds the Program after a clean exit.

    `mode="plan"` is for steps on fake tensors (FakeTensorMode): nothing is computed,
    `host_ns` is 0 and `.item()` returns a placeholder (1, 1.0 or False).
    `fused_attention` (default: in plan mode) records each scaled-dot-product attention as
    the one fused kernel a GPU runs, not the CPU's math path (popviz/recorder/attention.py).
    """

    def __init__(self, model: torch.nn.Module | None = None, *, name: str | None = None,
                 model_info: dict[str, Any] | None = None, mode: str = "measured",
                 progress: bool | None = None, count_bookkeeping: bool = False,
                 fused_attention: bool | None = None) -> None:
        if mode not in ("measured", "plan"):
            raise ValueError(f"record mode {mode!r} is not 'measured' or 'plan'")
        self.fused_attention = mode == "plan" if fused_attention is None else fused_attention
        self.model = model
        self.name = name
        self.model_info = dict(model_info or {})
        self.mode = mode
        self.progress = progress
        self.count_bookkeeping = count_bookkeeping
        self.program: Program | None = None
        # called once, at the first optimiser step (record() checks Stage names there)
        self.before_update: Callable[[], None] | None = None
        self._active = False

    def __enter__(self) -> Recorder:
        if self._active:
            raise RuntimeError("this Recorder is already recording")
        self._ops: list[list[Any]] = []
        self._storages: dict[int, Storage] = {}
        self._rows: list[Storage] = []
        # id(overload) -> func_info (keyed by id: an OpOverload hashes in Python, ~0.3 us;
        # the tuple holds the overload, so the id stays its own)
        self._funcs: dict[int, FuncInfo] = {}
        self._shape_cache: dict[torch.Size, str] = {}
        self._dtype_cache: dict[torch.dtype, str] = {}
        self._layer_cache: dict[str, str] = {}
        self._paths: dict[int, str] = {}
        self._mod_stack: list[str] = []
        self._module_block: dict[str, str] = {}
        self._pending: list[tuple[weakref.ref[torch.Tensor], tuple[str, str, str]]] = []
        self._optimisers: list[weakref.ref[torch.optim.Optimizer]] = []
        self._opt_depth = 0
        self._forward_started = False
        self._backward_seen = False
        self._grad_cds: set[int] = set()  # gradients, and what optimiser work made of them
        self._from_grads = False
        self._last_module = ""
        self._input_shape: list[int] | None = None
        self._batch_dims: list[int] = []  # dim 0 of each call of the model in the step
        self._call_counted = True  # the current call of the model has been counted
        self._root: torch.nn.Module | None = None
        self._layer_names: dict[str, str] = {}
        self._param_names: dict[int, str] = {}
        self._params: list[torch.nn.Parameter] = []
        self._timed = self.mode == "measured"
        # CPU time spent recording, outside the ops (the bench asks; costs ~2 us per op)
        self.bookkeeping_ns = 0
        self._count_bookkeeping = self.count_bookkeeping
        if self.model is not None:
            self._adopt_root(self.model)
        STATE.reset()
        self._bar = progress_bar(self.mode, self.progress)
        self._hooks = [
            register_module_forward_pre_hook(self._module_pre),
            register_module_forward_hook(self._module_post, always_call=True,
                                         with_kwargs=True),
            register_optimizer_step_pre_hook(self._optimiser_pre),
            register_optimizer_step_post_hook(self._optimiser_post),
        ]
        STATE.on_checkpoint = self._mark_checkpoint
        # the recorder allocates a few small objects per op; without this the cyclic GC
        # runs full collections over torch's large heap during the step
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        self._attention = FusedAttentionMode() if self.fused_attention else None
        if self._attention is not None:
            self._attention.__enter__()
        self._mode = OpMode(self._on_op)
        self._mode.__enter__()
        self._active = True
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self._mode.__exit__(exc_type, exc, tb)
        finally:
            if self._attention is not None:
                self._attention.__exit__(exc_type, exc, tb)
            self._active = False
            STATE.on_checkpoint = None
            STATE.begin_block = ""
            for handle in self._hooks:
                handle.remove()
            if self._bar is not None:
                self._bar.update(len(self._ops) - self._bar.n)
                self._bar.close()
        try:
            if exc_type is None:  # an interrupted step leaves no program (nor profile)
                stamp_pending(self._pending)
                self.program = self._build()
            self._pending.clear()
        finally:
            if self._gc_was_enabled:
                gc.enable()

    def _build(self) -> Program:
        optimisers = [opt for opt in (ref() for ref in self._optimisers) if opt is not None]
        params = all_params(self._params, self._param_names, optimisers)
        root = self._root
        buffers = [b for _, b in root.named_buffers()] if root is not None else []
        ops, tensors = build_tables(self._ops, self._storages, self._rows, params, buffers,
                                    optimisers, self._register_existing)
        model = model_facts(ops, params, root, self.name, self._batch_dims, self._input_shape,
                            self.model_info)
        return Program(ops=ops, tensors=tensors, model=model, mode=self.mode)

    def _optimiser_pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._opt_depth += 1
        if self.before_update is not None:
            check, self.before_update = self.before_update, None
            check()
        if not any(ref() is opt for ref in self._optimisers):
            self._optimisers.append(weakref.ref(opt))
        # state from an earlier step (momentum, Adam moments, step counts) belongs to its
        # parameter's module, so the updates that read only the state go with it too
        for value, owner in state_owners(opt, self._storages):
            rec = self._register_existing(value)
            rec.module, rec.layer, rec.block = owner.module, owner.layer, owner.block

    def _optimiser_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._opt_depth = max(0, self._opt_depth - 1)

    def _mark_checkpoint(self, t: Any) -> None:
        if not isinstance(t, torch.Tensor):
            return
        rec = self._storages.get(t.untyped_storage()._cdata)
        if rec is not None and rec.writer >= 0:  # an in-place result: its last writer
            self._ops[rec.writer][CHECKPOINT] = True

    def _on_op(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        info = self._funcs.get(id(func))
        if info is None:
            info = self._funcs[id(func)] = func_info(func)
        if info[5]:  # not work
            return func(*args, **kwargs)
        if self._timed:
            start = time.perf_counter_ns()
            out = func(*args, **kwargs)
            host_ns = time.perf_counter_ns() - start
        else:
            host_ns = 0
            if func is _SCALAR_READ:
                out = dummy_scalar(args[0])
            else:
                out = func(*args, **kwargs)
        if self._count_bookkeeping:
            start = time.thread_time_ns()  # CPU time: steady when other jobs share cores
            if self._pending:
                stamp_pending(self._pending)
            self._record(func, info, args, kwargs, out, host_ns)
            self.bookkeeping_ns += time.thread_time_ns() - start
        else:
            if self._pending:
                stamp_pending(self._pending)
            self._record(func, info, args, kwargs, out, host_ns)
        return out

    def _phase_and_owner(self, func: Any, name: str, inputs: list[torch.Tensor]
                         ) -> tuple[str, str, str]:
        """(phase, module, block) of the op being recorded."""
        stack = self._mod_stack
        if self._opt_depth:
            module = owner_of(self._storages, inputs)
            return "optimiser", module, self._module_block.get(module, "")
        if torch._C._current_graph_task_id() != -1:
            self._backward_seen = True
            info = node_info(self._storages)
            # the engine re-running a forward (checkpointing): grad mode is on, or a module
            # is running (a custom Function's forward turns grad mode off)
            if stack or torch.is_grad_enabled():
                module = stack[-1] if stack else info[0]
                block = STATE.block_stack[-1] if STATE.block_stack else \
                    self._module_block.get(module, info[2])
                return "recompute", module, block
            return "backward", info[0], info[2]
        module = stack[-1] if stack else ""
        if STATE.host_io_depth:
            return "host_io", module, STATE.current_block()
        if not stack:
            if func is _SCALAR_READ or (not self._forward_started and name in _HOST_COPIES):
                return "host_io", "", STATE.current_block()
            if self._backward_seen and any(
                    t.untyped_storage()._cdata in self._grad_cds for t in inputs):
                module = owner_of(self._storages, inputs)  # e.g. clipping before step()
                self._from_grads = True
                return "optimiser", module, self._module_block.get(module, "")
        if not module and not STATE.block_stack:
            # outside every module, or in the root's own code (a loss), and not placed by a
            # Block scope: with the module that wrote its input
            # (else with the op before it: labels reshaped for the loss, decoder inputs)
            module = latest_owner(self._storages, inputs) or self._last_module
        else:
            self._last_module = module
        block = STATE.current_block()
        if module not in self._module_block:
            self._module_block[module] = block
        return "forward", module, block

    def _shape(self, shape: torch.Size) -> str:
        text = self._shape_cache.get(shape)
        if text is None:
            text = self._shape_cache[shape] = shape_str(shape)
        return text

    def _dtype(self, dtype: torch.dtype) -> str:
        text = self._dtype_cache.get(dtype)
        if text is None:
            text = self._dtype_cache[dtype] = str(dtype).removeprefix("torch.")
        return text

    def _record(self, func: Any, info: tuple[Any, ...], args: Any, kwargs: dict[str, Any],
                out: Any, host_ns: int) -> None:
        # hot path: runs for every op of the step, so caches and no repeated lookups
        op_id = len(self._ops)
        kind, name, op_name, is_view, mutated = info[:5]
        inputs = tensors_in(args)
        if kwargs:
            inputs.extend(tensors_in(kwargs.values()))
        outputs = tensors_in(out if isinstance(out, (tuple, list)) else (out,))
        self._from_grads = False
        phase, module, block = self._phase_and_owner(func, name, inputs)
        layer = layer_of(module, self._layer_names, self._layer_cache)
        storages = self._storages
        in_shapes = [t.shape for t in inputs]
        out_shapes = [t.shape for t in outputs]
        owner = (module, layer, block)
        # lift_fresh turns a constant made by torch.tensor(...) into a tensor: the output
        # is new in this step (fake mode copies it, real mode aliases it)
        read, bytes_read, dtype = read_inputs(
            inputs if name != "lift_fresh" else [], storages, self._register_existing, op_id,
            owner, phase == "forward", is_view)
        grad_owner = phase == "backward" and node_is_accumulate()
        if name == "native_batch_norm" and len(args) > 5 and args[5]:
            mutated = (3, 4)  # running stats, updated in training but not annotated so
        if mutated:  # written in place without being returned
            outputs = [*outputs, *tensors_in(args[i] for i in mutated if i < len(args))]
        written, bytes_written = write_outputs(
            outputs, storages, self._rows, op_id, owner, is_view, self._shape,
            self._grad_cds if grad_owner or self._from_grads else None)
        if dtype is None:
            source = inputs or outputs
            dtype = source[0].dtype if source else None
        if kind == "data_movement":  # most ops of a step: views, copies, detach
            op_class, n_flops = "data_movement", 0
        else:
            op_class, n_flops = _flops.classify(func, kind, args, kwargs, out,
                                                in_shapes,  # type: ignore[arg-type]  # a Size is a tuple
                                                out_shapes)  # type: ignore[arg-type]  # a Size is a tuple
        shape = self._shape
        self._ops.append([
            op_id, op_name, op_class, phase, module, layer, block, False, int(n_flops),
            bytes_read, bytes_written, ";".join([shape(s) for s in in_shapes]),
            shape(out_shapes[0]) if out_shapes else "",
            self._dtype(dtype) if dtype is not None else "", host_ns,
            ";".join(dict.fromkeys(read)) if len(read) > 1 else "".join(read),
            ";".join(dict.fromkeys(written)) if len(written) > 1 else "".join(written),
            kernel_path(name, inputs, outputs)
            if op_class in _PATH_CLASSES and bytes_written and not is_view else "",
        ])
        # also with grad mode off: a custom Function's forward, whose output gets its node
        # (the Function's backward) once apply returns
        if outputs and phase in ("forward", "recompute"):
            self._pending.append((weakref.ref(outputs[0]), owner))
        if self._bar is not None and op_id % 256 == 255:
            self._bar.update(256)

    def _adopt_root(self, model: torch.nn.Module) -> None:
        self._root = model
        self._layer_names = name_modules(model, self._paths, self._param_names, self._params)
        # parameters, buffers and existing gradients exist before the step: rows up front
        for t in [*model.parameters(), *model.buffers()]:
            self._register_existing(t)
        for p in self._params:
            if p.grad is not None:
                rec = self._register_existing(p.grad)
                self._grad_cds.add(p.grad.untyped_storage()._cdata)
                rec.module, rec.layer = None, None

    def _register_existing(self, t: torch.Tensor) -> Storage:
        """The row of a tensor that exists from before the step (made on first sight)."""
        storage = t.untyped_storage()
        cd = storage._cdata
        rec = self._storages.get(cd)
        if rec is None:
            rec = Storage(len(self._rows), t, storage, -1, None, None, None)
            name = self._param_names.get(cd)
            if name is not None:
                rec.name = name
                rec.module = name.rpartition(".")[0]
                rec.layer = layer_of(rec.module, self._layer_names, self._layer_cache)
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
        shape = call_shape(tensors)
        if shape is None:
            return False
        if self._input_shape is None:
            self._input_shape = shape
        self._batch_dims.append(shape[0])
        return True

    def _module_post(self, mod: torch.nn.Module, args: Any, *rest: Any) -> None:
        # (kwargs, out) normally; (out,) when torch runs it after an exception
        path = self._paths.get(id(mod))
        if path == "" and not self._call_counted and len(rest) == 2 and rest[0] \
                and mod is self._root and torch._C._current_graph_task_id() == -1:
            # model(input_ids=..., labels=...): the batch from the keyword arguments
            self._call_counted = self._count_call(tensors_in(rest[0].values()))
        pop_scope(self._mod_stack, path)

