"""Who owns an op the module stack cannot name: a backward op (its autograd node), an
optimiser op (the module of the tensors it touches), a root-level op (the module that wrote
its input). A mixin of `Recorder` (recorder.py); the attributes are set there."""

from __future__ import annotations

import torch

from popviz.recorder.tensors import Storage

_META_KEY = "popviz"  # (module, layer, block) stamped into grad_fn.metadata


class Owners:
    _storages: dict[int, Storage]

    def _latest_owner(self, inputs: list[torch.Tensor]) -> str:
        """Module of the input written last in the step: a loss goes with the stage that
        made its logits."""
        best, module = -2, ""
        storages = self._storages
        for t in inputs:
            rec = storages.get(t.untyped_storage()._cdata)
            if rec is not None and rec.module and rec.writer > best:
                best, module = rec.writer, rec.module
        return module

    def _node_info(self) -> tuple[str, str, str]:
        node = torch._C._current_autograd_node()
        if node is None:
            return ("", "", "")
        info = node.metadata.get(_META_KEY)  # type: ignore[attr-defined]  # torch stubs: metadata is a dict, not a method
        if info is not None:
            return info
        for next_node, _ in node.next_functions:  # unstamped: its inputs' producers
            if next_node is not None:
                info = next_node.metadata.get(_META_KEY)  # type: ignore[attr-defined]  # torch stubs: metadata is a dict
                if info is not None:
                    return info
        variable = getattr(node, "variable", None)  # AccumulateGrad: the parameter's module
        if isinstance(variable, torch.Tensor):
            rec = self._storages.get(variable.untyped_storage()._cdata)
            if rec is not None and rec.module is not None:
                return (rec.module, rec.layer or "", rec.block or "")
        return ("", "", "")

    def _owner_of(self, inputs: list[torch.Tensor]) -> str:
        """The one module whose tensors an optimiser op touches, else ''."""
        owners = set()
        for t in inputs:
            rec = self._storages.get(t.untyped_storage()._cdata)
            if rec is not None and rec.module:
                owners.add(rec.module)
        return owners.pop() if len(owners) == 1 else ""

    @staticmethod
    def _node_is_accumulate() -> bool:
        node = torch._C._current_autograd_node()
        return node is not None and type(node).__name__ == "AccumulateGrad"
