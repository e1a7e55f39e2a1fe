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
"""

from __future__ import annotations

import gc
import sys
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
from torch.utils._python_dispatch import TorchDispatchMode

from popviz.annotate import STATE
from popviz.recorder import flops as _flops
from popviz.recorder.build import CHECKPOINT, build_program
from popviz.recorder.owners import _META_KEY, Owners
from popviz.recorder.program import Program
from popviz.recorder.scopes import ModuleScopes
from popviz.recorder.tensors import Storage, dummy_scalar, mutated_args, shape_str, tensors_in

aten = torch.ops.aten
_SCALAR_READ = aten._local_scalar_dense.default
_HOST_COPIES = {"_to_copy", "copy_", "lift_fresh", "lift_fresh_copy", "clone", "contiguous"}
# record_function markers and tensor-metadata queries (fake tensors answer `.device`,
# `.is_contiguous()` ... through dispatch): not work, and absent from real runs
_NOT_WORK = {"profiler", "prim"}
_METADATA_QUERIES = {
    aten.is_contiguous.default, aten.is_contiguous.memory_format,
    aten.is_strides_like_format.default, aten.is_non_overlapping_and_dense.default,
    aten.size.default, aten.sym_size.default, aten.stride.default, aten.sym_stride.default,
    aten.storage_offset.default, aten.sym_storage_offset.default, aten.numel.default,
    aten.sym_numel.default, aten.dim.default, aten.sym_is_contiguous.default,
}


class _Mode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # no torch._disable_dynamo wrapper around every op (~5 us each): nothing compiles
        # inside a recorded step
        return False

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.recorder._on_op(func, args, kwargs or {})


class Recorder(ModuleScopes, Owners):
    """Context manager around one step; `.program` holds the Program after a clean exit.

    `mode="plan"` is for steps on fake tensors (FakeTensorMode): nothing is computed,
    `host_ns` is 0 and `.item()` returns a placeholder (1, 1.0 or False).
    """

    def __init__(self, model: torch.nn.Module | None = None, *, name: str | None = None,
                 model_info: dict[str, Any] | None = None, mode: str = "measured",
                 progress: bool | None = None, count_bookkeeping: bool = False) -> None:
        if mode not in ("measured", "plan"):
            raise ValueError(f"record mode {mode!r} is not 'measured' or 'plan'")
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

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> Recorder:
        if self._active:
            raise RuntimeError("this Recorder is already recording")
        self._ops: list[list[Any]] = []
        self._storages: dict[int, Storage] = {}
        self._rows: list[Storage] = []
        # id(overload) -> _func_info (keyed by id: an OpOverload hashes in Python, ~0.3 us;
        # the tuple holds the overload, so the id stays its own)
        self._funcs: dict[int, tuple[str, str, str, bool, tuple[int, ...], bool, Any]] = {}
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
        self._batch_dims: list[int] = []
        self._call_counted = True
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
        self._bar = self._progress_bar()
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
        self._mode = _Mode(self)
        self._mode.__enter__()
        self._active = True
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self._mode.__exit__(exc_type, exc, tb)
        finally:
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
                self._resolve_pending()
                self.program = build_program(self)
            self._pending.clear()
        finally:
            if self._gc_was_enabled:
                gc.enable()

    def _progress_bar(self) -> Any:
        if self.progress is False:
            return None
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover - tqdm is a dependency
            return None
        # disable=None: tqdm shows itself only on a terminal unless progress=True
        return tqdm(desc=f"popviz {self.mode}", unit=" ops", file=sys.stderr,
                    disable=None if self.progress is None else False, mininterval=0.5)

    # ---------------------------------------------------------------- optimiser
    def _optimiser_pre(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._opt_depth += 1
        if self.before_update is not None:
            check, self.before_update = self.before_update, None
            check()
        if not any(ref() is opt for ref in self._optimisers):
            self._optimisers.append(weakref.ref(opt))
        # state from an earlier step (momentum, Adam moments, step counts) belongs to its
        # parameter's module, so the updates that read only the state go with it too
        storages = self._storages
        for p, state in opt.state.items():
            owner = storages.get(p.untyped_storage()._cdata) if isinstance(p, torch.Tensor) \
                else None
            if owner is None or not owner.module:
                continue
            for value in state.values():
                if isinstance(value, torch.Tensor) and \
                        value.untyped_storage()._cdata not in storages:
                    rec = self._register_existing(value)
                    rec.module, rec.layer, rec.block = owner.module, owner.layer, owner.block

    def _optimiser_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._opt_depth = max(0, self._opt_depth - 1)

    # ---------------------------------------------------------------- checkpoints
    def _mark_checkpoint(self, t: Any) -> None:
        if not isinstance(t, torch.Tensor):
            return
        rec = self._storages.get(t.untyped_storage()._cdata)
        if rec is not None and rec.writer >= 0:  # an in-place result: its last writer
            self._ops[rec.writer][CHECKPOINT] = True

    # ---------------------------------------------------------------- ops
    def _resolve_pending(self) -> None:
        """Stamp module/layer/block into the autograd nodes of recent forward outputs
        (autograd attaches grad_fn only after the dispatch mode returns)."""
        for ref, info in self._pending:
            t = ref()
            if t is not None:
                node = t.grad_fn
                if node is not None:
                    node.metadata[_META_KEY] = info  # type: ignore[index]  # torch stubs: metadata is a dict
        self._pending.clear()

    def _on_op(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        info = self._funcs.get(id(func))
        if info is None:
            info = self._func_info(func)
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
                self._resolve_pending()
            self._record(func, info, args, kwargs, out, host_ns)
            self.bookkeeping_ns += time.thread_time_ns() - start
        else:
            if self._pending:
                self._resolve_pending()
            self._record(func, info, args, kwargs, out, host_ns)
        return out

    def _phase_and_owner(self, func: Any, name: str, inputs: list[torch.Tensor]
                         ) -> tuple[str, str, str]:
        """(phase, module, block) of the op being recorded."""
        stack = self._mod_stack
        if self._opt_depth:
            module = self._owner_of(inputs)
            return "optimiser", module, self._module_block.get(module, "")
        if torch._C._current_graph_task_id() != -1:
            self._backward_seen = True
            info = self._node_info()
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
                module = self._owner_of(inputs)  # e.g. gradient clipping before step()
                self._from_grads = True
                return "optimiser", module, self._module_block.get(module, "")
        if not module and not STATE.block_stack:
            # outside every module, or in the root's own code (a loss), and not placed by a
            # Block scope: with the module that wrote its input
            # (else with the op before it: labels reshaped for the loss, decoder inputs)
            module = self._latest_owner(inputs) or self._last_module
        else:
            self._last_module = module
        block = STATE.current_block()
        if module not in self._module_block:
            self._module_block[module] = block
        return "forward", module, block

    def _func_info(self, func: Any) -> tuple[str, str, str, bool, tuple[int, ...], bool, Any]:
        """(kind, packet name, overload name, is a view, mutated args, not work, the
        overload), once per overload: `_on_op` looks in the cache first."""
        info: tuple[str, str, str, bool, tuple[int, ...], bool, Any]
        if func.namespace in _NOT_WORK or func in _METADATA_QUERIES:
            info = ("", "", "", False, (), True, func)
        else:
            kind = _flops.kind_of(func)
            info = (kind, func._overloadpacket.__name__, str(func),
                    kind == "data_movement" and func.is_view, mutated_args(func), False, func)
        self._funcs[id(func)] = info
        return info

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
        layer = self._layer_of(module)
        storages = self._storages
        in_shapes = [t.shape for t in inputs]
        out_shapes = [t.shape for t in outputs]
        bytes_read = bytes_written = 0
        dtype = None
        read: list[str] = []
        written: list[str] = []
        # lift_fresh turns a constant made by torch.tensor(...) into a tensor: the output
        # is new in this step (fake mode copies it, real mode aliases it)
        for t in inputs if name != "lift_fresh" else ():
            rec = storages.get(t.untyped_storage()._cdata)
            if rec is None:  # exists from before the step
                rec = self._register_existing(t)
            rec.last = op_id
            read.append(rec.tid_str)
            if rec.module is None:
                rec.module, rec.layer, rec.block = module, layer, block
            elif rec.block is None and phase == "forward":
                rec.block = block
            if not is_view:
                bytes_read += t.nbytes
            if dtype is None and t.dtype.is_floating_point:
                dtype = t.dtype
        grad_owner = phase == "backward" and self._node_is_accumulate()
        if name == "native_batch_norm" and len(args) > 5 and args[5]:
            mutated = (3, 4)  # running stats, updated in training but not annotated so
        if mutated:  # written in place without being returned
            outputs = [*outputs, *tensors_in(args[i] for i in mutated if i < len(args))]
        for t in outputs:
            storage = t.untyped_storage()
            cd = storage._cdata
            rec = storages.get(cd)
            if rec is None:
                rec = Storage(len(self._rows), t, storage, op_id, module, layer, block,
                               self._shape(t.shape))
                storages[cd] = rec
                self._rows.append(rec)
            else:
                rec.last = op_id
                if not is_view:
                    rec.writer = op_id
            written.append(rec.tid_str)
            if grad_owner or self._from_grads:
                self._grad_cds.add(cd)
            if not is_view:
                bytes_written += t.nbytes
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
        ])
        # also with grad mode off: a custom Function's forward, whose output gets its node
        # (the Function's backward) once apply returns
        if outputs and phase in ("forward", "recompute"):
            self._pending.append((weakref.ref(outputs[0]), (module, layer, block)))
        if self._bar is not None and op_id % 256 == 255:
            self._bar.update(256)
