"""Run a real pipeline on torch.distributed.pipelining and write one profile per rank.

    from popviz.measure import MeasureConfig, measure
    paths = measure(MeasureConfig(model="tutorial", ranks=2, microbatches=4,
                                  schedule="1F1B", profile_dir="measured"))

Ranks are spawned with torch.multiprocessing (gloo on 127.0.0.1, a free port), or, under
`torchrun`, this process is one rank (RANK / WORLD_SIZE / MASTER_ADDR from the
environment). Each rank writes `DIR/rank{r}/profile.h5` (kind `measured`).
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from popviz.measure import split as splitting
from popviz.vocab import MEASURED_KIND

# CPU ranks only for now: NCCL needs the stages on CUDA devices and CUDA-event timers
# (perf_counter around an async kernel launch would time the launch), not built yet
BACKENDS = ("gloo",)


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
    merge: str | None = None  # also merge the rank files into this path
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

        self.schedule = splitting.schedule_name(self.schedule)
        self.model_size = models.check(self.model, self.model_size)
        for name in ("ranks", "microbatches", "micro_batch_size", "steps", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name.replace('_', ' ')} must be a whole number >= 1, "
                                 f"got {value!r}")
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


# ---- clock ----
def sync_clock(rounds: int = 5) -> tuple[int, dict[str, Any]]:
    """The local perf_counter_ns that is t = 0 on every rank, and how it was found.

    Each rank notes perf_counter_ns right after each of `rounds` barriers; the readings
    are all-gathered. t = 0 is rank 0's reading after one more barrier. On one host
    perf_counter_ns reads the same CLOCK_MONOTONIC in every process, so the offset is 0;
    across hosts a rank's offset is the median over rounds of (its reading - rank 0's),
    exact up to the barrier's release skew (reported as spread_ns)."""
    import torch.distributed as dist

    from popviz.measure.probe import now

    local = []
    for _ in range(rounds):
        dist.barrier()
        local.append(now())
    mine = torch.tensor(local, dtype=torch.int64)
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    hosts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    ref = everyone[0].tolist()
    diffs = sorted(a - b for a, b in zip(local, ref))
    one_host = len(set(hosts)) == 1
    offset = 0 if one_host else diffs[len(diffs) // 2]
    # t = 0 is one last barrier, after the gathers above, so that their time is not the
    # first thing on the trace; one small broadcast of rank 0's reading follows it
    dist.barrier()
    mark = torch.tensor([now()], dtype=torch.int64)
    dist.broadcast(mark, src=0)
    info = {"offset_ns": int(offset), "spread_ns": int(diffs[-1] - diffs[0]),
            "rounds": rounds, "one_host": one_host}
    return int(mark.item() + offset), info


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

    def train_step(self, probe: Any = None) -> float | None:
        """One real training step: the schedule over all micro-batches, then the update.
        Returns the mean micro-batch loss on the rank holding the last stage."""
        config = self.config
        images, labels = self.data.batch(config.micro_batch_size * config.microbatches)
        losses: list[torch.Tensor] | None = [] if self.last else None
        self.schedule.step(*((images,) if self.first else ()),
                           target=labels if self.last else None, losses=losses)

        def update() -> None:
            self.optimiser.step()
            self.optimiser.zero_grad(set_to_none=True)

        if probe is not None:
            probe.optimiser_step(update)
        else:
            update()
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
    mine = [rank + k * world for k in range(config.stages_per_rank)]
    stages = [cut.pipe.build_stage(i, torch.device("cpu")) for i in mine]
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


def run_rank(config: MeasureConfig, rank: int, world: int) -> Path:
    """Everything one rank does once its process group is up; returns its profile path."""
    import torch.distributed as dist

    from popviz.measure.probe import Probe

    pipe = build_rank(config, rank, world)
    run_id = [uuid.uuid4().hex if rank == 0 else None]
    dist.broadcast_object_list(run_id, src=0)
    probe = Probe(rank, pipe.stages, pipe.schedule, pipe.optimiser)
    losses: list[float] = []
    origin, clock = 0, dict[str, Any]()
    with probe:
        for step in range(config.warmup + config.steps):
            if step == config.warmup:
                origin, clock = sync_clock()
                probe.recording = True
            probe.step = step - config.warmup
            loss = pipe.train_step(probe)
            if loss is not None:
                losses.append(loss)
        probe.recording = False
    return _write_rank(config, rank, world, probe, origin, clock, str(run_id[0]), pipe.cut,
                       pipe.mine, pipe.model, losses)


def _write_rank(config: MeasureConfig, rank: int, world: int, probe: Any, origin: int,
                clock: dict[str, Any], run_id: str, cut: Any, mine: list[int],
                model: torch.nn.Module, losses: list[float]) -> Path:
    import torch.distributed as dist

    from popviz.format.writer import write_profile
    from popviz.measure import tables

    p2p_mine = tables.to_common(probe.p2p, origin, ("post", "post_end", "wait_start", "wait_end"))
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, p2p_mine)
    p2p = tables.match_p2p(p2p_mine, [r for part in everyone for r in part])
    compute = tables.to_common(probe.compute, origin, ("start", "end"))
    trace = tables.trace_table(compute, p2p)
    liveness = pd_frame(probe.liveness, tables.LIVENESS_COLUMNS)
    sent = p2p[(p2p["direction"] == "send") & (p2p["kind"] == "activation")]
    info = [{"stage": s, "ipu": rank, "first_layer": cut.layers[s][0],
             "last_layer": cut.layers[s][1], "stash_bytes": probe.peak_stash.get(s, 0),
             "stash_depth": probe.stash_depth.get(s, 0),
             "boundary_bytes": int(sent.loc[sent["stage"] == s, "bytes"].sum()
                                   // max(1, config.microbatches * config.steps))}
            for s in mine]
    meta = rank_meta(config, rank, world, run_id, clock, mine, model, losses)
    result = {
        "trace": trace, "p2p": p2p, "liveness": liveness,
        "stages": tables.stages_table(trace, liveness, info, config.steps),
        "exchange": tables.exchange_table(p2p), "ops": tables.ops_table(trace, p2p),
        "tile_memory": tables.empty_tile_memory(),
        "variables": pd_frame(probe.variables, tables.VARIABLE_COLUMNS),
    }
    path = Path(config.profile_dir, f"rank{rank}", "profile.h5")
    return write_profile(path, meta=meta, tables=result,
                         summary=tables.summary(result, meta), kind=MEASURED_KIND,
                         command_line=config.command_line or " ".join(sys.argv))


def pd_frame(rows: list[dict[str, Any]], columns: list[str]) -> Any:
    import pandas as pd

    return pd.DataFrame(rows, columns=columns)


def rank_meta(config: MeasureConfig, rank: int, world: int, run_id: str,
              clock: dict[str, Any], mine: list[int], model: torch.nn.Module,
              losses: list[float]) -> dict[str, Any]:
    from popviz.options import Options

    options = Options(target=f"cpu-{config.backend}", strategy="pipelined",
                      schedule=config.schedule, gradient_accumulation=config.microbatches,
                      micro_batch_size=config.micro_batch_size, precision="32.32",
                      splits=list(config.splits), num_ipus=world).to_meta()
    options.update(microbatches=config.microbatches, stages_per_rank=config.stages_per_rank,
                   steps=config.steps, warmup=config.warmup)
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
        "measure": {"run_id": run_id, "rank": rank, "world_size": world,
                    "backend": config.backend, "stages": mine,
                    "num_stages": config.num_stages, "clock": clock,
                    "losses": losses, "host": socket.gethostname(),
                    "threads": config.threads, "config": asdict(config)},
    }


# ---- process management ----
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init(config: MeasureConfig, rank: int, world: int) -> None:
    import torch.distributed as dist

    dist.init_process_group(config.backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=config.timeout_s))


def _spawned(rank: int, config: MeasureConfig, port: int) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    _init(config, rank, config.ranks)
    try:
        run_rank(config, rank, config.ranks)
    finally:
        dist.destroy_process_group()


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def measure(config: MeasureConfig) -> list[Path]:
    """Run the pipeline; return the rank profile paths (all of them when spawning, this
    rank's under torchrun). With `config.merge`, also write the merged profile there."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        config.ranks = world
        config.validate()
        _init(config, rank, world)
        try:
            paths = [run_rank(config, rank, world)]
            dist.barrier()
            if config.merge and rank == 0:
                _merge(config, world)
        finally:
            dist.destroy_process_group()
        return paths
    config.validate()
    mp.spawn(_spawned, args=(config, free_port()), nprocs=config.ranks, join=True)
    paths = [Path(config.profile_dir, f"rank{r}", "profile.h5") for r in range(config.ranks)]
    if config.merge:
        _merge(config, config.ranks)
    return paths


def _merge(config: MeasureConfig, world: int) -> Path:
    from popviz.measure.merge import merge_profiles

    files: list[str | os.PathLike[str]] = [Path(config.profile_dir, f"rank{r}", "profile.h5")
                                          for r in range(world)]
    return merge_profiles(files, str(config.merge),
                          command_line=config.command_line or " ".join(sys.argv))

