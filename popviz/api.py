"""The public composition: record -> compile -> write, and compare by path.

`popviz.record(...)` and `popviz.plan(...)` record one step (popviz.recorder), compile it
(popviz.compiler) and write `<profile_dir>/profile.h5` (popviz.format). This is the one
module that ties those layers together; the recorder itself returns a Program only."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from popviz.annotate import STATE, auto_stages, check_stages
from popviz.compiler import compile as compile_program
from popviz.format.profile import Profile
from popviz.format.writer import write_report
from popviz.options import Options
from popviz.recorder.names import check_split_names, splits_to_layers
from popviz.recorder.program import Program
from popviz.recorder.recorder import Recorder
from popviz.recorder.steps import train_step

if TYPE_CHECKING:  # analysis loads only when comparing
    from popviz.analysis.compare import Comparison


class Recording:
    """What `popviz.record(...)` yields: `.program` after the step, `.profile_path`,
    `.report` and `.options` (the options it was compiled with) after the profile is written."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.program: Program | None = None
        self.report: Any = None
        self.options: Options | None = None
        self.profile_path: Path | None = None
        self.job_rank = 0  # this process's global rank in a torchrun / distributed job


def job_rank() -> int:
    """This process's global rank: torch.distributed's when a process group is up, else
    torchrun's `RANK` (set on every node of a job), else 0 (a plain run)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    try:
        return max(int(os.environ.get("RANK", "0")), 0)
    except ValueError:
        return 0


def compile_options(options: Options, program: Program) -> Options:
    """The options a program is compiled with: the user's, plus what recording found out
    (micro-batch size, stages from the blocks seen). Raises ValueError on a Stage that
    names a block the step never entered."""
    opts = options.copy()
    opts.splits = splits_to_layers(program, opts.splits)  # module paths -> layers
    blocks = list(program.model.get("blocks", []))
    check_stages(opts, blocks)
    auto_stages(opts, blocks, dict(program.model.get("block_ipus", {})))
    if program.model.get("batch_size"):
        opts.micro_batch_size = int(program.model["batch_size"])
    return opts.validate()


def finish(recording: Recording, options: Options, profile_dir: str | Path | None,
           command_line: str | None) -> None:
    """Compile the recorded program and write the profile (atomic: the writer renames a
    complete temporary file, so nothing is written unless all of it is)."""
    program = recording.recorder.program
    assert program is not None
    recording.program = program
    recording.options = compile_options(options, program)
    recording.job_rank = job_rank()
    # in a torchrun job every rank runs the same step: rank 0 writes the one profile (on its
    # node), the others record and check it (a wrong split name fails on every rank)
    if profile_dir is None or recording.job_rank != 0:
        return
    # compiling never needs torch; keep fake-tensor modes out of it in plan mode
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        recording.report = compile_program(program, recording.options)
        recording.profile_path = write_report(
            recording.report, profile_dir,
            command_line=command_line if command_line is not None else " ".join(sys.argv))


@contextlib.contextmanager
def record(options: Options | None = None, profile_dir: str | Path | None = "profile",
           model: torch.nn.Module | None = None, name: str | None = None,
           model_info: dict[str, Any] | None = None, *, progress: bool | None = None,
           command_line: str | None = None, mode: str = "measured") -> Iterator[Recording]:
    """Record ONE training step (forward, backward, optimiser step) run inside the block,
    compile it for `options` and write `<profile_dir>/profile.h5`. `profile_dir=None`
    records and checks without writing. An exception in the step writes nothing. In a
    torchrun job (any number of nodes) only global rank 0 writes; every rank records and
    checks (`recording.job_rank`)."""
    options = options if options is not None else Options()
    if model is not None:  # a wrong split name fails before the step runs
        check_split_names(model, options)
    recorder = Recorder(model, name=name, model_info=model_info, mode=mode, progress=progress)
    if options.stages:  # a Stage naming a block the forward never entered: before the update
        recorder.before_update = lambda: check_stages(options, list(STATE.block_ipus))
    recording = Recording(recorder)
    with recorder:
        yield recording
    finish(recording, options, profile_dir, command_line)


class PlanSession:
    """Yielded by `popviz.plan(...)`: build model, optimiser and inputs in the `with` body
    (they are fake tensors), then run the step inside `session.step(model=...)`."""

    def __init__(self, options: Options, profile_dir: str | Path | None, name: str | None,
                 model_info: dict[str, Any] | None, progress: bool | None,
                 command_line: str | None) -> None:
        self.options = options
        self.profile_dir = profile_dir
        self.name = name
        self.model_info = model_info
        self.progress = progress
        self.command_line = command_line
        self.recording: Recording | None = None

    @contextlib.contextmanager
    def step(self, model: torch.nn.Module | None = None) -> Iterator[Recording]:
        with record(self.options, self.profile_dir, model=model, name=self.name,
                    model_info=self.model_info, progress=self.progress,
                    command_line=self.command_line, mode="plan") as recording:
            self.recording = recording
            yield recording

    @property
    def program(self) -> Program | None:
        return self.recording.program if self.recording else None

    @property
    def profile_path(self) -> Path | None:
        return self.recording.profile_path if self.recording else None


@contextlib.contextmanager
def plan(options: Options | None = None, profile_dir: str | Path | None = "profile", *,
         name: str | None = None, model_info: dict[str, Any] | None = None,
         progress: bool | None = None, command_line: str | None = None
         ) -> Iterator[PlanSession]:
    """Plan mode: inside the block every tensor is fake (FakeTensorMode), so full-size
    models record without memory or compute. Usage:

        with popviz.plan(options, profile_dir="rn50_plan") as p:
            model = resnet50(); opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x, y = torch.randn(64, 3, 224, 224), torch.randint(0, 1000, (64,))
            with p.step(model=model):
                F.cross_entropy(model(x), y).backward(); opt.step()
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from popviz.recorder.tensors import PlanScalars

    session = PlanSession(options if options is not None else Options(), profile_dir, name,
                          model_info, progress, command_line)
    with FakeTensorMode(), PlanScalars():
        yield session


def plan_step(build_model: Callable[[], torch.nn.Module],
              make_batch: Callable[[], tuple[Any, torch.Tensor]],
              options: Options | None = None, profile_dir: str | Path | None = "profile", *,
              optimiser: Callable[[Any], torch.optim.Optimizer] | None = None,
              loss_fn: Callable[..., torch.Tensor] | None = None, name: str | None = None,
              model_info: dict[str, Any] | None = None, progress: bool | None = None
              ) -> Recording:
    """Plan one `train_step` of a model built by `build_model()` on a batch from
    `make_batch()` (both called under FakeTensorMode). Optimiser defaults to SGD(lr=0.1)."""
    make_opt = optimiser or (lambda params: torch.optim.SGD(params, lr=0.1))
    with plan(options, profile_dir, name=name, model_info=model_info,
              progress=progress) as session:
        model = build_model()
        opt = make_opt(model.parameters())
        inputs, target = make_batch()
        with session.step(model=model) as recording:
            train_step(model, opt, inputs, target, loss_fn)
    return recording


def compare(a: Profile | str | os.PathLike[str],
            b: Profile | str | os.PathLike[str], judge: str | None = None) -> Comparison:
    """`popviz.compare(a, b)`: compare two profiles, each an open Profile or a path to one
    (analysis.compare.compare takes open profiles; opening files is not analysis' job).
    `judge`: "total" or "per-device" when they run on different numbers of devices; None
    gives both answers."""
    from popviz.analysis.compare import compare as compare_profiles
    from popviz.format.reader import open as open_profile

    opened: list[Profile] = []
    try:
        sides: list[Profile] = []
        for p in (a, b):
            if isinstance(p, (str, os.PathLike)):
                p = open_profile(p)
                opened.append(p)
            sides.append(p)
        return compare_profiles(sides[0], sides[1], judge)
    finally:
        for p in opened:
            p.close()
