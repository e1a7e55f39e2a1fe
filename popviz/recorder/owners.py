"""Who owns an op the module stack cannot name: a backward op (its autograd node), an
optimiser op (the module of the tensors it touches), a root-level op (the module that wrote
its input). Plain functions over the Recorder's storage table (`storages`: StorageImpl id ->
Storage), passed in by the Recorder (recorder.py)."""

from __future__ import annotations

import weakref

import torch

from popviz.recorder.tensors import Storage

META_KEY = "popviz"  # (module, layer, block) stamped into grad_fn.metadata


def latest_owner(storages: dict[int, Storage], inputs: list[torch.Tensor]) -> str:
    """Module of the input written last in the step: a loss goes with the stage that made
    its logits."""
    best, module = -2, ""
    for t in inputs:
        rec = storages.get(t.untyped_storage()._cdata)
        if rec is not None and rec.module and rec.writer > best:
            best, module = rec.writer, rec.module
    return module


def node_info(storages: dict[int, Storage]) -> tuple[str, str, str]:
    """(module, layer, block) of the autograd node the engine is running."""
    node = torch._C._current_autograd_node()
    if node is None:
        return ("", "", "")
    info = node.metadata.get(META_KEY)  # type: ignore[attr-defined]  # torch's stub: a method; a dict at run time
    if info is not None:
        return info
    for next_node, _ in node.next_functions:  # unstamped: its inputs' producers
        if next_node is not None:
            info = next_node.metadata.get(META_KEY)  # type: ignore[attr-defined]  # as above
            if info is not None:
                return info
    variable = getattr(node, "variable", None)  # AccumulateGrad: the parameter's module
    if isinstance(variable, torch.Tensor):
        rec = storages.get(variable.untyped_storage()._cdata)
        if rec is not None and rec.module is not None:
            return (rec.module, rec.layer or "", rec.block or "")
    return ("", "", "")


def owner_of(storages: dict[int, Storage], inputs: list[torch.Tensor]) -> str:
    """The one module whose tensors an optimiser op touches, else ''."""
    owners = set()
    for t in inputs:
        rec = storages.get(t.untyped_storage()._cdata)
        if rec is not None and rec.module:
            owners.add(rec.module)
    return owners.pop() if len(owners) == 1 else ""


def node_is_accumulate() -> bool:
    node = torch._C._current_autograd_node()
    return node is not None and type(node).__name__ == "AccumulateGrad"


def stamp_pending(pending: list[tuple[weakref.ref[torch.Tensor], tuple[str, str, str]]]
                  ) -> None:
    """Stamp module/layer/block into the autograd nodes of recent forward outputs (autograd
    attaches grad_fn only after the dispatch mode returns), and forget them."""
    for ref, info in pending:
        t = ref()
        if t is not None:
            node = t.grad_fn
            if node is not None:
                node.metadata[META_KEY] = info  # type: ignore[index]  # as above
    pending.clear()


def state_owners(opt: torch.optim.Optimizer, storages: dict[int, Storage]
                 ) -> list[tuple[torch.Tensor, Storage]]:
    """An optimiser's state from an earlier step (momentum, Adam moments, step counts) not
    seen yet in this step, with the Storage of the parameter whose module it belongs to."""
    found: dict[int, tuple[torch.Tensor, Storage]] = {}  # first owner of a storage wins
    for p, state in opt.state.items():
        owner = storages.get(p.untyped_storage()._cdata) if isinstance(p, torch.Tensor) \
            else None
        if owner is None or not owner.module:
            continue
        for value in state.values():
            if isinstance(value, torch.Tensor):
                cd = value.untyped_storage()._cdata
                if cd not in storages and cd not in found:
                    found[cd] = (value, owner)
    return list(found.values())


__all__ = ["META_KEY", "latest_owner", "node_info", "node_is_accumulate", "owner_of",
           "stamp_pending", "state_owners"]
