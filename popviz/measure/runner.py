"""Run a popviz reference model as a real pipeline on torch.distributed.pipelining.

    from popviz.measure import MeasureConfig, measure
    paths = measure(MeasureConfig(model="tutorial", ranks=2, microbatches=4,
                                  schedule="1F1B", profile_dir="measured"))

Ranks are spawned with torch.multiprocessing (gloo on 127.0.0.1, a free port), or, under
`torchrun` (one node or several), this process is one rank (RANK / WORLD_SIZE /
MASTER_ADDR from the environment). The recorded steps run inside `live.record`: every
rank saves its torch.profiler trace in `DIR/traces/`, rank 0 writes `DIR/profile.h5`.
"""

from __future__ import annotations

import atexit
import datetime
import math
import os
import socket
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from popviz.measure import split as splitting
from popviz.vocab import MEASURED_KIND

# CPU ranks only for now: NCCL needs the stages on CUDA devices and CUDA-event timers
# (perf_counter around an async kernel launch would time the launch), not built yet
BACKENDS = ("gloo",)
MAX_CLASSES = 1_000_000  # classifier outputs (ImageNet-21k has 21,841)


@dataclass
class MeasureConfig:
    """What to run: model, pipeline shape, schedule, steps, where to write."""

    model: str = "tutorial"
    model_size: Any = None
    ranks: int = 2
    microbatches: int = 4
    micro_batch_size: int = 2
    schedule: str = "1F1B"
    splits: list[str] = field(default_factory=list)
    steps: int = 2  # recorded training steps
    warmup: int = 1  # unrecorded steps first (stage set-up, shape inference, first-touch)
    profile_dir: str = "measure_profile"
    image_size: int | None = None
    num_classes: int = 10
    seed: int = 0
    learning_rate: float = 0.001
    backend: str = "gloo"
    threads: int = 1  # torch intra-op threads per rank
    out: str | None = None  # the profile's path (default: profile_dir/profile.h5)
    command_line: str = ""
    timeout_s: float = 300.0

    @property
    def stages_per_rank(self) -> int:
        return 2 if self.schedule in splitting.MULTI_STAGE else 1

    @property
    def num_stages(self) -> int:
        return self.ranks * self.stages_per_rank

    def validate(self) -> MeasureConfig:
        """Check what can be checked before any process starts; ValueError, one line."""
        from popviz import models

        self.schedule = splitting.canonical_schedule(self.schedule)
        self.model_size = models.check(self.model, self.model_size)
        for name in ("ranks", "microbatches", "micro_batch_size", "steps", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name.replace('_', ' ')} must be a whole number >= 1, "
                                 f"got {value!r}")
        if self.image_size is not None and (not isinstance(self.image_size, int)
                                            or self.image_size < 1):
            raise ValueError(f"image size must be a whole number >= 1, got "
                             f"{self.image_size!r}")
        self._check_values()
        if self.warmup < 1:
            raise ValueError("warmup must be >= 1: the first step sets the stages up")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.schedule != "GPipe" and self.microbatches < self.num_stages:
            raise ValueError(f"schedule {self.schedule} needs at least {self.num_stages} "
                             f"micro-batches (one per stage), got {self.microbatches}")
        if self.schedule in splitting.MULTI_STAGE and self.microbatches % self.ranks:
            raise ValueError(f"schedule {self.schedule} needs micro-batches divisible by "
                             f"the {self.ranks} ranks, got {self.microbatches}")
        model = _build(self)
        self.splits = splitting.check_splits(model, list(self.splits), self.num_stages)
        return self

    def _check_values(self) -> None:
        """The numbers and paths no rank should be the first to trip over."""
        rate = self.learning_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) \
                or not math.isfinite(rate) or rate <= 0:
            raise ValueError(f"learning rate must be a finite number > 0, got {rate!r}")
        if not isinstance(self.num_classes, int) or not 1 <= self.num_classes <= MAX_CLASSES:
            raise ValueError(f"num classes must be a whole number in 1..{MAX_CLASSES:,}, got "
                             f"{self.num_classes!r}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 63:
            raise ValueError(f"seed must be a whole number in 0..2**63-1, got {self.seed!r}")
        check_output_paths(self.profile_dir, self.out)


def check_output_paths(profile_dir: str | os.PathLike[str] | None,
                       out: str | os.PathLike[str] | None = None) -> None:
    """ValueError (one line) unless the profile folder, its traces/ and the profile's own
    path can be made and written: no file in their way (`user.txt/m`), not an existing
    file where a folder goes, not a folder or foreign file where the profile goes."""
    from popviz.errors import not_a_folder, os_error_line
    from popviz.format.writer import profile_path, refuse_foreign

    if profile_dir is None or not str(profile_dir).strip():
        raise ValueError("profile dir must be a folder's path, got an empty one")
    folders = [Path(profile_dir), Path(profile_dir, "traces")]
    for folder in folders:
        blocked = not_a_folder(folder, "the profile folder and its traces/ are folders")
        if blocked is not None:
            raise ValueError(os_error_line(blocked))
    try:
        refuse_foreign(profile_path(out if out is not None else profile_dir))
    except OSError as exc:
        raise ValueError(os_error_line(exc)) from None
    for folder in folders:
        existing = next(p for p in (folder, *folder.parents) if p.exists() or p == Path("/"))
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(f"{existing}: cannot write there (permission denied)")


def _build(config: MeasureConfig) -> torch.nn.Module:
    from popviz import models

    torch.manual_seed(config.seed)
    return models.build(config.model, config.model_size, num_classes=config.num_classes,
                        image_size=config.image_size)


def _title(config: MeasureConfig) -> str:
    if config.model == "efficientnet":
        return f"efficientnet-b{config.model_size}"
    return "tutorial" if config.model == "tutorial" else f"{config.model}{config.model_size}"


def _image_size(config: MeasureConfig) -> int:
    from popviz import models

    if config.image_size:
        return config.image_size
    return 28 if config.model == "tutorial" else min(64, models.native_resolution(
        config.model, config.model_size))


# ---- one rank ----
@dataclass
class RankPipeline:
    """One rank's share of the pipeline: its stages, torch's schedule, its optimiser."""

    config: MeasureConfig
    rank: int
    world: int
    model: torch.nn.Module  # the whole model (for meta); the stages hold traced copies
    cut: splitting.SplitModel
    mine: list[int]  # stage indices on this rank
    stages: list[Any]
    schedule: Any
    optimiser: torch.optim.Optimizer
    data: Any

    @property
    def first(self) -> bool:
        return 0 in self.mine

    @property
    def last(self) -> bool:
        return self.cut.num_stages - 1 in self.mine

    def train_step(self) -> float | None:
        """One real training step: the schedule over all micro-batches, then the update.
        Returns the mean micro-batch loss on the rank holding the last stage."""
        config = self.config
        images, labels = self.data.batch(config.micro_batch_size * config.microbatches)
        losses: list[torch.Tensor] | None = [] if self.last else None
        self.schedule.step(*((images,) if self.first else ()),
                           target=labels if self.last else None, losses=losses)

        self.optimiser.step()
        self.optimiser.zero_grad(set_to_none=True)
        return float(torch.stack(losses).detach().mean()) if losses else None


def build_rank(config: MeasureConfig, rank: int, world: int) -> RankPipeline:
    """Trace and cut the model (every rank the same, same seed) and build this rank's
    stages and schedule; the process group must be up."""
    from popviz.models.common import SyntheticImages

    torch.set_num_threads(config.threads)
    model = _build(config)
    size = _image_size(config)
    channels = 1 if config.model == "tutorial" else 3
    example = torch.zeros(config.micro_batch_size, channels, size, size)
    cut = splitting.split_model(model, example, config.splits)
    mine = splitting.rank_stages(config.schedule, rank, world, config.stages_per_rank)
    stages = splitting.build_stages(cut, config.schedule, mine, torch.device("cpu"))
    params = [p for s in stages for p in s.submod.parameters()]
    optimiser = torch.optim.AdamW(params, lr=config.learning_rate) \
        if config.model == "tutorial" else \
        torch.optim.SGD(params, lr=config.learning_rate, momentum=0.9)
    cls = splitting.schedule_class(config.schedule)
    schedule = cls(stages if config.stages_per_rank > 1 else stages[0],
                   n_microbatches=config.microbatches,
                   loss_fn=splitting.loss_function(model))
    data = SyntheticImages(config.num_classes, channels, size, seed=config.seed)
    return RankPipeline(config, rank, world, model, cut, mine, stages, schedule, optimiser,
                        data)


def run_rank(config: MeasureConfig, rank: int, world: int) -> Path | None:
    """Everything one rank does once its process group is up: warm-up steps, then the
    recorded ones under `live.record`; rank 0 returns the profile's path."""
    from popviz.measure import live

    pipe = build_rank(config, rank, world)
    losses: list[float] = []
    for _ in range(config.warmup):  # stage set-up, P2P warm-up, first touch: not recorded
        loss = pipe.train_step()
        if loss is not None:
            losses.append(loss)
    with live.record(config.profile_dir, adjust=_adjust(config, pipe, world),
                     out=config.out, command_line=config.command_line or None) as rec:
        for _ in range(config.steps):
            loss = pipe.train_step()
            if loss is not None:
                losses.append(loss)
            rec.step()
        rec.extra["losses"] = losses
    return rec.profile_path


def _adjust(config: MeasureConfig, pipe: RankPipeline, world: int) -> Any:
    """What the run knows beyond the traces, added on rank 0: the options it ran with,
    the model, each stage's layers, the losses."""
    def adjust(tables: dict[str, Any], meta: dict[str, Any],
               extras: list[dict[str, Any]]) -> None:
        ours = rank_meta(config, world, pipe.mine, pipe.model)
        # the schedule that ran, by the name it was given; what its traces show beside it
        # (None for Schedule1F1B, which annotates nothing)
        meta["measure"]["schedule_seen"] = meta["options"].get("schedule")
        meta["options"].update(ours["options"])
        meta["model"] = ours["model"]
        meta["target"]["name"] = ours["target"]["name"]
        meta["measure"].update(ours["measure"])
        meta["measure"]["losses"] = next((e["losses"] for e in extras if e.get("losses")),
                                         [])
        stages = tables["stages"]
        stages["first_layer"] = [pipe.cut.layers[s][0] for s in stages["stage"]]
        stages["last_layer"] = [pipe.cut.layers[s][1] for s in stages["stage"]]
    return adjust


def rank_meta(config: MeasureConfig, world: int, mine: list[int],
              model: torch.nn.Module) -> dict[str, Any]:
    from popviz.options import Options

    options = Options(target=f"cpu-{config.backend}", strategy="pipelined",
                      schedule=config.schedule, gradient_accumulation=config.microbatches,
                      micro_batch_size=config.micro_batch_size, precision="32.32",
                      splits=list(config.splits), num_ipus=world).to_meta()
    options.update(microbatches=config.microbatches, stages_per_rank=config.stages_per_rank,
                   steps=config.steps, warmup=config.warmup)
    del mine
    params = sum(p.numel() for p in model.parameters())
    return {
        "kind": MEASURED_KIND,
        "target": {"name": f"cpu-{config.backend}", "num_ipus": world, "tiles_per_ipu": 1,
                   "bytes_per_tile": 0, "clock_hz": 1e9},
        "options": options,
        "model": {"name": _title(config), "parameters": int(params),
                  "parameter_bytes": int(sum(p.nbytes for p in model.parameters())),
                  "batch_size": config.micro_batch_size * config.microbatches,
                  "image_size": _image_size(config), "num_classes": config.num_classes,
                  "split_names": splitting.valid_splits(model)},
        "measure": {"world_size": world, "backend": config.backend,
                    "num_stages": config.num_stages, "threads": config.threads,
                    "config": asdict(config)},
    }


# ---- process management ----
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_group(config: MeasureConfig, rank: int, world: int) -> None:
    import torch.distributed as dist

    dist.init_process_group(config.backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=config.timeout_s))


def end_spawned_rank() -> None:
    """End a spawned rank whose work is done and handed over without the interpreter's
    teardown: torch's C++ statics (the profiler's and gloo's threads) are destroyed there,
    and one still running aborts the process now and then ("terminate called without an
    active exception"), which made the whole run fail after its profile was complete."""
    atexit._run_exitfuncs()  # Python's own exit work still runs (multiprocessing's)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
