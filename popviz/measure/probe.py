"""Timers on torch.distributed.pipelining: what each rank did, when, and what it held.

Nothing here schedules or communicates; torch's PipelineStage and schedules do. The probe
wraps, on one rank:

- the stage's `forward_one_chunk`, `backward_one_chunk`, `backward_weight_one_chunk` and
  `perform_reduce_grad` (compute actions), and the schedule's `_maybe_compute_loss`;
- the stage's `get_{fwd,bwd}_{send,recv}_ops`, to tag every `dist.P2POp` with its
  micro-batch, stage and kind (activation / gradient);
- `schedules._batch_p2p`, through which every schedule posts its isend / irecv (and
  batch_isend_irecv): the post time of each op, and the returned works wrapped so that
  each `wait()` is timed (the blocking interval).

Activation stash: saved-tensor hooks count the bytes autograd keeps for a micro-batch's
backward during its forward (parameters excluded), plus the stage's cached inputs and
outputs; the bytes are released when that micro-batch's backward runs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch

now = time.perf_counter_ns


def _storages(tensors: Iterable[Any]) -> dict[int, int]:
    """storage pointer -> bytes, for the tensors among `tensors`."""
    found: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            found[storage.data_ptr()] = storage.nbytes()
    return found


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flatten(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flatten(v)]
    return [value]


class _TimedWork:
    """A dist.Work whose wait() notes the blocking interval on its P2P records."""

    def __init__(self, work: Any, records: list[dict[str, Any]]) -> None:
        self._work = work
        self._records = records

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        start = now()
        result = self._work.wait(*args, **kwargs)
        end = now()
        for rec in self._records:
            rec["wait_start"] = start if rec["wait_start"] < 0 else min(rec["wait_start"],
                                                                         start)
            rec["wait_end"] = max(rec["wait_end"], end)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class Probe:
    """Instruments the stages and schedule of one rank while `recording` is True."""

    def __init__(self, rank: int, stages: list[Any], schedule: Any,
                 optimiser: torch.optim.Optimizer | None = None) -> None:
        self.rank = rank
        self.stages = stages
        self.schedule = schedule
        self.optimiser = optimiser
        self.recording = False
        self.step = 0
        self.compute: list[dict[str, Any]] = []
        self.p2p: list[dict[str, Any]] = []
        self.liveness: list[dict[str, Any]] = []
        self.variables: list[dict[str, Any]] = []  # stashes, for "what is live at step k"
        self._opened: dict[tuple[int, int], int] = {}  # (stage, mb) -> liveness step
        self._stash: dict[tuple[int, int], int] = {}  # (stage, micro-batch) -> bytes
        self.peak_stash: dict[int, int] = {}
        self.stash_depth: dict[int, int] = {}
        self._seq: dict[tuple[int, str], int] = defaultdict(int)
        self._params = [p for s in stages for p in s.submod.parameters()]
        self._param_ptrs = set(_storages(self._params))
        self._saved: dict[int, int] = {}
        self._undo: list[Callable[[], None]] = []

    # ---- install / remove ----
    def install(self) -> Probe:
        from torch.distributed.pipelining import schedules

        for stage in self.stages:
            self._wrap(stage, "forward_one_chunk", self._forward(stage))
            self._wrap(stage, "backward_one_chunk", self._backward(stage, "backward"))
            self._wrap(stage, "backward_weight_one_chunk",
                       self._backward(stage, "backward weight"))
            self._wrap(stage, "perform_reduce_grad", self._reduce(stage))
            for name, kind in (("get_fwd_recv_ops", "activation"),
                               ("get_fwd_send_ops", "activation"),
                               ("get_bwd_recv_ops", "gradient"),
                               ("get_bwd_send_ops", "gradient")):
                self._wrap(stage, name, self._tagger(stage, kind))
        self._wrap(self.schedule, "_maybe_compute_loss", self._loss())
        original = schedules._batch_p2p
        schedules._batch_p2p = self._batch_p2p(original)
        self._undo.append(lambda: setattr(schedules, "_batch_p2p", original))
        return self

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> Probe:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _wrap(self, obj: Any, name: str, make: Callable[[Callable], Callable]) -> None:
        original = getattr(obj, name)  # the bound method
        setattr(obj, name, make(original))
        self._undo.append(lambda: delattr(obj, name))

    # ---- compute ----
    def _event(self, stage: Any, mb: int, pass_: str, op: str, start: int, end: int) -> None:
        if self.recording:
            self.compute.append({"rank": self.rank, "stage": int(stage.stage_index),
                                 "microbatch": int(mb), "pass": pass_, "op": op,
                                 "start": start, "end": end, "step": self.step})

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._param_ptrs:
            self._saved[ptr] = storage.nbytes()
        return tensor

    def _with_saved(self, run: Callable[[], Any]) -> tuple[Any, dict[int, int]]:
        self._saved = {}
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            result = run()
        return result, self._saved

    def _forward(self, stage: Any) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def forward_one_chunk(mb: int, *args: Any, **kwargs: Any) -> Any:
                start = now()
                output, saved = self._with_saved(lambda: original(mb, *args, **kwargs))
                end = now()
                cached = _storages(_flatten(stage.fwd_cache.get(mb, ())))
                held = {**cached, **saved}
                self._stash[(stage.stage_index, mb)] = sum(
                    b for p, b in held.items() if p not in self._param_ptrs)
                self._note_peak(stage.stage_index)
                self._event(stage, mb, "F", "forward", start, end)
                self._snapshot(stage, mb, "F", "forward")
                if self.recording:
                    self._opened[(stage.stage_index, mb)] = len(self.liveness) - 1
                return output
            return forward_one_chunk
        return make

    def _backward(self, stage: Any, label: str) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def backward(mb: int, *args: Any, **kwargs: Any) -> Any:
                start = now()
                result = original(mb, *args, **kwargs)
                end = now()
                full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
                released = None
                if label == "backward weight" or full:
                    released = self._stash.pop((stage.stage_index, mb), None)
                self._event(stage, mb, "B", label, start, end)
                self._snapshot(stage, mb, "B", label)
                if released is not None:
                    self._close_stash(stage.stage_index, mb, released)
                return result
            return backward
        return make

    def _reduce(self, stage: Any) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def perform_reduce_grad(*args: Any, **kwargs: Any) -> Any:
                start = now()
                result = original(*args, **kwargs)
                self._event(stage, -1, "WU", "scale gradients", start, now())
                return result
            return perform_reduce_grad
        return make

    def _loss(self) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def maybe_compute_loss(stage: Any, output: Any, target_mbs: Any, mb: int,
                                   *args: Any, **kwargs: Any) -> Any:
                if not stage.is_last:
                    return original(stage, output, target_mbs, mb, *args, **kwargs)
                start = now()
                result, saved = self._with_saved(
                    lambda: original(stage, output, target_mbs, mb, *args, **kwargs))
                end = now()
                key = (stage.stage_index, mb)
                self._stash[key] = self._stash.get(key, 0) + sum(saved.values())
                self._note_peak(stage.stage_index)
                self._event(stage, mb, "F", "loss", start, end)
                return result
            return maybe_compute_loss
        return make

    def optimiser_step(self, run: Callable[[], Any]) -> Any:
        """Time the weight update (zero_grad + step) as one WU action."""
        start = now()
        result = run()
        end = now()
        if self.recording:
            self._event(self.stages[0], -1, "WU", "optimiser step", start, end)
            self._snapshot(self.stages[0], -1, "WU", "optimiser step")
        return result

    # ---- liveness ----
    def _close_stash(self, stage_index: int, mb: int, nbytes: int) -> None:
        """A micro-batch's stash as a not-always-live variable: live from its forward's
        liveness step to the step before its backward's (which shows it released)."""
        first = self._opened.pop((stage_index, mb), None)
        if first is None or not self.recording:
            return
        self.variables.append({
            "ipu": self.rank, "name": f"stash stage {stage_index} mb{mb} (step {self.step})",
            "category": "stash", "bytes": int(nbytes), "first_step": first,
            "last_step": len(self.liveness) - 2, "stage": stage_index, "microbatch": mb,
            "training_step": self.step})

    def _note_peak(self, stage_index: int) -> None:
        if not self.recording:
            return
        held = [b for (s, _), b in self._stash.items() if s == stage_index]
        self.peak_stash[stage_index] = max(self.peak_stash.get(stage_index, 0), sum(held))
        self.stash_depth[stage_index] = max(self.stash_depth.get(stage_index, 0), len(held))

    def always_live_bytes(self) -> int:
        total = 0
        for p in self._params:
            total += p.untyped_storage().nbytes()
            if p.grad is not None:
                total += p.grad.untyped_storage().nbytes()
        if self.optimiser is not None:
            for state in self.optimiser.state.values():
                total += sum(_storages(state.values()).values())
        return total

    def _snapshot(self, stage: Any, mb: int, pass_: str, label: str) -> None:
        if not self.recording:
            return
        phase = {"F": "forward", "B": "backward", "WU": "optimiser"}[pass_]
        self.liveness.append({
            "ipu": self.rank, "step": len(self.liveness), "phase": phase,
            "always_live_bytes": self.always_live_bytes(),
            "not_always_live_bytes": sum(self._stash.values()),
            "label": f"{label} mb{mb}" if mb >= 0 else label, "microbatch": int(mb),
            "stage": int(stage.stage_index), "pass": pass_, "training_step": self.step,
            "stashed_microbatches": len(self._stash),
        })

    # ---- point to point ----
    def _tagger(self, stage: Any, kind: str) -> Callable[[Callable], Callable]:
        def make(original: Callable) -> Callable:
            def get_ops(mb: int, *args: Any, **kwargs: Any) -> list[Any]:
                ops = original(mb, *args, **kwargs)
                for op in ops:
                    op._popviz = {"stage": int(stage.stage_index), "microbatch": int(mb),
                                  "kind": kind}
                return ops
            return get_ops
        return make

    def _batch_p2p(self, original: Callable) -> Callable:
        import torch.distributed as dist

        def batch_p2p(p2p_ops: list[Any], desc: str | None = None) -> list[Any]:
            if not self.recording or not p2p_ops:
                return original(p2p_ops, desc=desc)
            records = []
            post = now()
            for op in p2p_ops:
                tag = getattr(op, "_popviz", None) or {"stage": -1, "microbatch": -1,
                                                       "kind": "other"}
                direction = "send" if op.op is dist.isend else "recv"
                key = (int(op.peer), direction)
                records.append({
                    "rank": self.rank, "peer": int(op.peer), "direction": direction,
                    "kind": tag["kind"], "stage": tag["stage"],
                    "microbatch": tag["microbatch"], "step": self.step,
                    "seq": self._seq[key], "bytes": int(op.tensor.nbytes),
                    "post": post, "wait_start": -1, "wait_end": -1,
                })
                self._seq[key] += 1
            works = original(p2p_ops, desc=desc)
            posted = now()
            for rec in records:
                rec["post_end"] = posted
                rec["batch"] = len(records)
                rec["works"] = len(works)
            self.p2p.extend(records)
            if len(works) == len(records):  # one work per op (gloo, homogeneous batches)
                return [_TimedWork(w, [r]) for w, r in zip(works, records)]
            return [_TimedWork(w, records) for w in works]  # coalesced (NCCL)
        return batch_p2p
