"""Options: how a recorded program is placed and scheduled (PopTorch-like).

Facts behind the defaults (AMP 0.6, schedules, stash) are in docs/hardware.md.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

from popviz.vocab import ipu_label

DEFAULT_AMP = 0.6
STRATEGIES = ("pipelined", "sharded")
# PopART's names, then torch.distributed.pipelining's (GPU plans; IPU plans read them too)
SCHEDULES = ("Grouped", "Interleaved", "Sequential", "GPipe", "1F1B", "Interleaved1F1B", "ZB1P",
             "ZB2P", "InterleavedZB", "ZBV")
# GPU schedules that may run several stages on each device (num_ipus: the GPUs, splits + 1
# a multiple of them; ZBV exactly two per GPU): placed by compiler.schedule_zb.stage_gpus
SEVERAL_STAGES_PER_GPU = ("Interleaved1F1B", "InterleavedZB", "ZBV")
PRECISIONS = ("16.16", "16.32", "32.32")
RECOMPUTE_GRANULARITIES = ("full", "selective")
# how a GPU plan holds its training state (popviz.compiler.gpu_recipe.RECIPES, same order)
GPU_PRECISIONS = ("as-recorded", "megatron-fp16", "megatron-bf16", "megatron-fp16-distopt",
                  "megatron-bf16-distopt", "amp")

# One AMP value for both convolutions and matmuls, or (conv, matmul).
AMP = float | tuple[float, float]


def _check_amp_value(value: float, where: str) -> float:
    try:
        amp = float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"availableMemoryProportion {value!r} for {where} is not a number"
        ) from None
    if not 0.0 < amp <= 1.0:
        raise ValueError(
            f"availableMemoryProportion {amp:g} for {where} is outside (0, 1]; "
            "a reasonable range is 0.05-0.6"
        )
    return amp


def _parse_ipu_key(key: Any) -> int:
    """'IPU3' or 3 -> 3; 'all' or -1 -> -1 (the value for every IPU not named)."""
    if isinstance(key, int) and key >= -1:
        return key
    if str(key).strip().lower() == "all":
        return -1
    text = str(key).strip()
    if text.upper().startswith("IPU"):
        text = text[3:]
    if not text.isdigit():
        raise ValueError(f"availableMemoryProportion key {key!r} is not an IPU (use 'IPU0' or 0)")
    return int(text)


def normalise_amp(value: Any) -> dict[int, AMP]:
    """Accept PopTorch's {"IPU0": 0.5}, {0: (0.2, 0.4)}, a float for every IPU, or a list
    with one entry per IPU; return {ipu: amp} with every value checked. A single float is
    stored under -1 ('all'): `amp_for` uses it for every IPU not named."""
    if value is None:
        return {}
    if isinstance(value, (int, float)):
        return {-1: _check_amp_value(value, "every IPU")}
    if isinstance(value, (list, tuple)) and not isinstance(value, dict):
        return {i: _normalise_one(v, ipu_label(i)) for i, v in enumerate(value)}
    if isinstance(value, dict):
        result: dict[int, AMP] = {}
        for key, amp in value.items():
            ipu = _parse_ipu_key(key)
            result[ipu] = _normalise_one(amp, "every IPU" if ipu == -1 else ipu_label(ipu))
        return result
    raise ValueError(f"availableMemoryProportion {value!r} is neither a number nor a dict")


def _normalise_one(value: Any, where: str) -> AMP:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError(
                f"availableMemoryProportion for {where} takes one value or two (conv, matmul), "
                f"got {len(value)}"
            )
        return (_check_amp_value(value[0], where), _check_amp_value(value[1], where))
    return _check_amp_value(value, where)


@dataclass
class Options:
    """Placement, schedule and precision of a recorded program. See docs/internals.md."""

    target: str = "mk2"
    strategy: str = "pipelined"
    schedule: str = "Grouped"
    gradient_accumulation: int = 1
    device_iterations: int = 1
    replication_factor: int = 1
    micro_batch_size: int = 1
    available_memory_proportion: dict[int, AMP] = field(default_factory=dict)
    precision: str = "16.16"
    half_partials: bool = False
    recomputation: bool = False
    splits: list[str] = field(default_factory=list)
    stages: list[list[str]] = field(default_factory=list)
    stage_ipus: list[int] = field(default_factory=list)
    num_ipus: int | None = None
    optimiser_offload: bool = False
    training: bool = True
    replicated_tensor_sharding: bool = False
    outlining: bool = False
    gpu_precision: str = "as-recorded"  # GPU targets: popviz/compiler/gpu_recipe.py
    # with recomputation, what is recomputed: "full" (each section's forward) or, GPU
    # targets, "selective" (the attention core only: Megatron-LM's --recompute-granularity)
    recompute_granularity: str = "full"
    # IPU tiles set aside for host streams (PopTorch TensorLocations.numIOTiles, PopART
    # numIOTiles, PopRT num_iotiles): the program computes on the others and the host
    # copies of the next device iteration overlap this one's compute
    io_tiles: int = 0
    # inference: each batch norm folded into its convolution (an ONNX export in eval mode,
    # PopRT): a per-channel bias add instead of the running-statistics scale and shift
    fold_batch_norms: bool = False
    # norms' statistics the numerically stable way: the mean reduced and subtracted before
    # the sum of squares (TensorFlow's IPUConfig norms.use_stable_statistics, the flag
    # Graphcore's CNN applications call --stable-norm); slower, as its documentation says
    stable_norm_statistics: bool = False

    # ---- PopTorch-like setters (each returns self so calls chain) ----
    def set_available_memory_proportion(self, value: Any) -> Options:
        self.available_memory_proportion = normalise_amp(value)
        return self

    def set_gradient_accumulation(self, count: int) -> Options:
        self.gradient_accumulation = int(count)
        self.validate()
        return self

    def set_device_iterations(self, count: int) -> Options:
        self.device_iterations = int(count)
        self.validate()
        return self

    def set_replication_factor(self, count: int) -> Options:
        self.replication_factor = int(count)
        self.validate()
        return self

    def set_precision(self, precision: str, half_partials: bool | None = None) -> Options:
        self.precision = str(precision)
        if half_partials is not None:
            self.half_partials = bool(half_partials)
        self.validate()
        return self

    def set_gpu_precision(self, name: str) -> Options:
        """How a GPU plan holds the training state and which dtype its activations and
        GEMMs run in: "as-recorded" (the default), "megatron-fp16", "megatron-bf16",
        "megatron-fp16-distopt", "megatron-bf16-distopt" or "amp" (torch.autocast);
        popviz/compiler/gpu_recipe.py. IPU targets use `set_precision` instead."""
        self.gpu_precision = str(name)
        self.validate()
        return self

    def set_execution_strategy(self, execution: Any) -> Options:
        """Take a `popviz.PipelinedExecution` / `ShardedExecution` (see annotate.py), or a
        strategy's name ("pipelined", "sharded") to keep the blocks' own placement."""
        if isinstance(execution, str):
            self.strategy = execution
        elif hasattr(execution, "apply_to"):
            execution.apply_to(self)
        else:
            raise TypeError("set_execution_strategy takes popviz.PipelinedExecution(...), "
                            "popviz.ShardedExecution(...) or a strategy name "
                            f"({', '.join(STRATEGIES)}), got {type(execution).__name__}")
        self.validate()
        return self

    def set_schedule(self, schedule: str) -> Options:
        self.schedule = str(schedule)
        self.validate()
        return self

    def set_num_ipus(self, count: int) -> Options:
        """IPUs the model is split over (pipeline splits: one fewer than IPUs)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"num_ipus must be a whole number >= 1, got {count!r}")
        self.num_ipus = count
        return self

    def set_pipeline_splits(self, *names: str) -> Options:
        """Where the next stage starts: module paths from `model.named_modules()` (e.g.
        "transformer.h.6") or a popviz model's split names. With one IPU they are
        recomputation sections. Unknown names fail before the recorded step runs."""
        flat = [n for name in names for n in ([name] if isinstance(name, str) else name)]
        bad = [n for n in flat if not isinstance(n, str) or not n.strip()]
        if bad:
            raise ValueError(f"pipeline split names must be non-empty strings, got {bad!r}")
        self.splits = flat
        self.validate()
        return self

    def set_recomputation(self, enabled: bool = True, granularity: str = "full") -> Options:
        self.recomputation = bool(enabled)
        self.recompute_granularity = str(granularity)
        self.validate()
        return self

    def set_target(self, target: str) -> Options:
        self.target = str(target)
        return self

    def set_optimiser_offload(self, enabled: bool = True) -> Options:
        """Optimiser state off chip (PopART's optimizerStateTensorLocation OffChip): each
        weight's state is streamed in for its update and out after it."""
        self.optimiser_offload = bool(enabled)
        return self

    def set_replicated_tensor_sharding(self, enabled: bool = True) -> Options:
        """Shard the optimiser state (on or off chip) over the replicas: each replica holds
        and updates 1 / replication_factor of it (PopART's ReplicatedTensorSharding.On)."""
        self.replicated_tensor_sharding = bool(enabled)
        return self

    def set_io_tiles(self, count: int) -> Options:
        """Tiles of each IPU kept for host streams (PopTorch's
        `TensorLocations.numIOTiles`): the program runs on the rest, and with device
        iterations the next iteration's host copies overlap this one's compute."""
        self.io_tiles = count
        self.validate()
        return self

    def set_fold_batch_norms(self, enabled: bool = True) -> Options:
        """Inference: batch norms folded into their convolutions (what an ONNX export in
        eval mode gives PopRT): a bias add where the running statistics' scale and shift
        would be."""
        self.fold_batch_norms = bool(enabled)
        self.validate()
        return self

    def set_stable_norm_statistics(self, enabled: bool = True) -> Options:
        """Norms' statistics the numerically stable way (TensorFlow's
        IPUConfig.norms.use_stable_statistics): the mean reduced and subtracted before the
        sum of squares, one more pass and reduction per norm; IPU targets."""
        self.stable_norm_statistics = bool(enabled)
        self.validate()
        return self

    def set_outlining(self, enabled: bool = True) -> Options:
        """Identical ops of repeated layers share one copy of their code, vertex state and
        exchange code (PopART / PopTorch outlining, on by default there; TensorFlow's CNN
        applications do not outline)."""
        self.outlining = bool(enabled)
        return self

    # ---- queries ----
    def amp_for(self, ipu: int, op_kind: str = "conv") -> float:
        """AMP that applies to a conv or matmul on `ipu`."""
        value = self.available_memory_proportion.get(
            ipu, self.available_memory_proportion.get(-1, DEFAULT_AMP)
        )
        if isinstance(value, tuple):
            return value[0] if op_kind == "conv" else value[1]
        return float(value)

    def validate(self) -> Options:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"strategy {self.strategy!r} is not one of {', '.join(STRATEGIES)}"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"pipeline schedule {self.schedule!r} is not one of {', '.join(SCHEDULES)}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}"
            )
        if self.recompute_granularity not in RECOMPUTE_GRANULARITIES:
            raise ValueError(f"recompute granularity {self.recompute_granularity!r} is not "
                             f"one of {', '.join(RECOMPUTE_GRANULARITIES)}")
        if self.gpu_precision not in GPU_PRECISIONS:
            raise ValueError(f"GPU precision {self.gpu_precision!r} is not one of "
                             f"{', '.join(GPU_PRECISIONS)}")
        for name in ("gradient_accumulation", "device_iterations", "replication_factor",
                     "micro_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{name.replace('_', ' ')} must be a whole number >= 1, got {value!r}"
                )
        if isinstance(self.io_tiles, bool) or not isinstance(self.io_tiles, int) \
                or self.io_tiles < 0:
            raise ValueError(f"io tiles must be a whole number >= 0, got {self.io_tiles!r}")
        if self.fold_batch_norms and self.training:
            raise ValueError("folding batch norms into convolutions is for inference "
                             "(training=False): training computes batch statistics")
        if self.num_ipus is not None and self.num_ipus < 1:
            raise ValueError(f"num_ipus must be >= 1, got {self.num_ipus!r}")
        self.available_memory_proportion = normalise_amp(self.available_memory_proportion)
        if self.stage_ipus:
            if any(i < 0 for i in self.stage_ipus):
                raise ValueError(f"stage IPU ids must be >= 0, got {self.stage_ipus}")
            # in order, except that the last stages may come back to the first stage's IPU:
            # PopART BERT runs its MLM / NSP heads, tied to the word embedding, as the last
            # pipeline stage on the embedding's IPU 0 (graphcore/examples nlp/bert/popart/
            # bert_model.py, commit 09b7c672, init_device_placement)
            ipus = list(self.stage_ipus)
            tail = len(ipus)
            while tail > 1 and ipus[tail - 1] == ipus[0] and len(set(ipus[:tail])) > 1:
                tail -= 1
            if any(b < a for a, b in itertools.pairwise(ipus[:tail])):
                raise ValueError(
                    f"stages must be placed on IPUs in order (the last ones may return to "
                    f"the first stage's IPU), got IPUs {self.stage_ipus}")
        if len(set(self.splits)) != len(self.splits):
            raise ValueError(f"pipeline splits repeat a name: {self.splits}")
        return self

    def copy(self, **changes: Any) -> Options:
        """A validated copy with some fields changed (used when re-planning)."""
        new = copy.deepcopy(self)
        for key, value in changes.items():
            if not hasattr(new, key):
                raise ValueError(f"unknown option {key!r}")
            setattr(new, key, value)
        if "available_memory_proportion" in changes:
            new.available_memory_proportion = normalise_amp(changes["available_memory_proportion"])
        return new.validate()

    def to_meta(self) -> dict[str, Any]:
        """The `options` dict of the profile contract (JSON-safe)."""
        meta = asdict(self)
        meta["available_memory_proportion"] = {
            ("all" if k == -1 else ipu_label(k)): (list(v) if isinstance(v, tuple) else v)
            for k, v in sorted(self.available_memory_proportion.items())
        }
        return meta

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Options:
        """Rebuild Options from a profile's `meta['options']` (for re-planning)."""
        known = {k: v for k, v in meta.items() if k in cls.__dataclass_fields__}
        amp = known.pop("available_memory_proportion", {}) or {}
        options = cls(**known)
        options.available_memory_proportion = normalise_amp(amp)
        return options.validate()
