"""The dispatch mode that hands every aten op of a recorded step to the Recorder, and the
recording's progress bar."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

OnOp = Callable[[Any, Any, dict[str, Any]], Any]  # (overload, args, kwargs) -> its result


class OpMode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # no torch._disable_dynamo wrapper around every op (~5 us each): nothing compiles
        # inside a recorded step
        return False

    def __init__(self, on_op: OnOp) -> None:
        super().__init__()
        self.on_op = on_op

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.on_op(func, args, kwargs or {})


def progress_bar(mode: str, progress: bool | None) -> Any:
    """A tqdm bar of ops recorded; None when `progress` is False. None = on a terminal only."""
    if progress is False:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    # disable=None: tqdm shows itself only on a terminal unless progress=True
    return tqdm(desc=f"popviz {mode}", unit=" ops", file=sys.stderr,
                disable=None if progress is None else False, mininterval=0.5)
