"""The flags of `popviz train` / `python train.py`: declared, defaulted and checked, and the
Options they set (docs/train.md says what each flag does).

Flags follow the PopTorch pipelining tutorial and Graphcore's TensorFlow CNN application
(docs/hardware.md). A bad combination raises UsageError (one line, exit code 2).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import popviz.models as models
from popviz.argtypes import non_empty_path
from popviz.cli.command import UsageError
from popviz.compiler.gpu_recipe import RECIPES
from popviz.options import RECOMPUTE_GRANULARITIES, SCHEDULES, SEVERAL_STAGES_PER_GPU

IPU_TARGETS = ("mk1", "mk2", "bow", "c600")
GPU_TARGET_NAMES = ("h100", "h100-pcie", "h200", "a100")
TARGETS = IPU_TARGETS + GPU_TARGET_NAMES



def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and data")
    g.add_argument("--model", choices=("resnet", "resnext", "efficientnet"),
                   help="CNN application model (default: the PopTorch tutorial's MNIST CNN)")
    g.add_argument("--model-size", type=int, help="ResNet 18/34/50/101/152, ResNeXt "
                   "50/101, EfficientNet 0-4 (default 50, 101, 0)")
    g.add_argument("--group-norm", type=int, metavar="GROUPS",
                   help="CNN app: group norm of GROUPS groups (fewer where a layer has "
                   "fewer channels) in place of every batch norm, as Graphcore's TensorFlow "
                   "CNNs train by default (32 for ResNet / ResNeXt, 4 for EfficientNet)")
    g.add_argument("--dataset", choices=("imagenet",), default="imagenet",
                   help="CNN app dataset shape (1000 classes); data is always synthetic")
    g.add_argument("--num-classes", type=int, help="classes (default 10 tutorial, 1000 CNN)")
    g.add_argument("--image-size", type=int, help="input height/width (default 28 tutorial, "
                   "224 ResNet/ResNeXt, EfficientNet's native 224-380); small values keep "
                   "CPU runs quick")
    g.add_argument("--synthetic-data", action="store_true",
                   help="accepted for the CNN app; data is always synthetic and learnable")
    g.add_argument("--generated-data", action="store_true", help="same as --synthetic-data")
    g.add_argument("--dataset-size", type=int, default=8000,
                   help="tutorial: synthetic training samples per epoch (default 8000)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of the weights and synthetic data (default 0)")

    g = p.add_argument_group("training")
    g.add_argument("--batch-size", type=int, nargs="+", help="micro-batch size (default 40 "
                   "tutorial, 4 CNN); with --inference the total over IPUs, several for a "
                   "table")
    g.add_argument("--test-batch-size", type=int, default=8, help="tutorial test batch")
    g.add_argument("--epochs", type=int, help="epochs (default 3 tutorial, 1 CNN)")
    g.add_argument("--iterations", type=int, help="CNN: weight updates per epoch (default 3)")
    g.add_argument("--learning-rate", type=float,
                   help="default 0.001 (tutorial, AdamW) or 0.01 (CNN, SGD with momentum)")
    g.add_argument("--gradient-accumulation", "--gradient-accumulation-count",
                   dest="gradient_accumulation", type=int,
                   help="micro-batches per weight update (default 10 tutorial; CNN 1, or "
                   "2 x shards when pipelined)")
    g.add_argument("--device-iterations", type=int,
                   help="weight updates per host call (default 10 tutorial, 1 CNN)")
    g.add_argument("--no-validation", action="store_true", help="skip the validation pass")
    g.add_argument("--inference", action="store_true",
                   help="CNN inference benchmark: forward only, modelled latency/throughput")

    g = p.add_argument_group("placement (modelled IPUs)")
    g.add_argument("--target", choices=TARGETS, default="mk2",
                   help="IPU (mk1, mk2, bow, c600) or GPU (h100, h100-pcie, h200, a100: kernels on "
                   "streams, PyTorch's caching allocator, times in ns; --shards are GPUs; "
                   "docs/cost-model.md, GPU targets); default mk2")
    g.add_argument("--strategy", choices=("pipelined", "sharded"), default="pipelined",
                   help="tutorial execution strategy")
    g.add_argument("--replicas", "--num-ipus", dest="replicas", type=int, default=1,
                   help="data-parallel replicas (with --inference: IPUs, one session each)")
    g.add_argument("--shards", type=int, default=1, help="IPUs the model is split over")
    g.add_argument("--pipeline", action="store_true", help="pipeline the shards")
    g.add_argument("--pipeline-splits", "--pipeline-split", dest="pipeline_splits",
                   nargs="+", default=[], metavar="NAME",
                   help="first layer of each next stage (shards - 1 names): the model's split "
                   "names or module paths from model.named_modules() (e.g. layer3.0); with "
                   "--shards 1 the recomputation sections")
    g.add_argument("--pipeline-schedule", choices=SCHEDULES, default=None,
                   help="IPU: Grouped (default), Interleaved, Sequential (the default on one "
                   "IPU with splits); GPU targets: GPipe, 1F1B, Interleaved1F1B, Zero "
                   "Bubble's ZB1P / ZB2P (one stage per GPU, the weight gradients deferred) "
                   "and torch's InterleavedZB and ZBV (ScheduleInterleavedZeroBubble, "
                   "ScheduleZBVZeroBubble). Interleaved1F1B and InterleavedZB loop k stages "
                   "round the --shards GPUs, ZBV places 2 per GPU in a V: give k x shards - "
                   "1 splits; docs/hardware.md")
    g.add_argument("--recompute-granularity", choices=RECOMPUTE_GRANULARITIES,
                   default="full",
                   help="with --enable-recomputation: full (IPU: each section's forward; "
                   "GPU targets: each repeated block, every stage's, as Megatron-LM's "
                   "uniform method) or, GPU targets, selective (only each attention core: "
                   "its scores, softmax and dropout, as Megatron-LM's "
                   "--recompute-granularity selective)")
    g.add_argument("--enable-recomputation", action="store_true",
                   help="recompute each stage's forward from its checkpoints (the split "
                   "names) in the backward pass instead of stashing every activation")
    g.add_argument("--available-memory-proportion", type=float, nargs="+", metavar="P",
                   help="AMP in (0, 1]: one value, or two per stage (conv then matmul); "
                   "default 0.6; IPU only")
    g.add_argument("--precision", choices=("16.16", "16.32", "32.32"),
                   help="compute.weight-update precision (default 32.32 tutorial, 16.16 CNN)")
    g.add_argument("--gpu-precision", choices=tuple(RECIPES), default="as-recorded",
                   metavar="NAME",
                   help="GPU targets: how training state is held and which dtype "
                   "activations and GEMMs run in: " + "; ".join(
                       f"{r.name}: {r.description}" for r in RECIPES.values())
                   + " (default as-recorded)")
    g.add_argument("--enable-half-partials", action="store_true",
                   help="accumulate conv / matmul partial sums in fp16 (faster vertices, "
                   "half the partials' memory)")
    g.add_argument("--offload-optimiser", action="store_true",
                   help="optimiser state in host memory, streamed in for each update")
    g.add_argument("--replicated-tensor-sharding", action="store_true",
                   help="shard the optimiser state over the replicas")
    g.add_argument("--outlining", action="store_true",
                   help="repeated layers share their code (PopART / PopTorch outlining)")
    g.add_argument("--io-tiles", type=int, default=0, metavar="N",
                   help="tiles of each IPU kept for host streams (PopTorch numIOTiles): the "
                   "model runs on the rest and the next device iteration's input copies "
                   "overlap this one's compute (default 0: none); IPU only")
    g.add_argument("--stable-norm", action=argparse.BooleanOptionalAction, default=None,
                   help="norms' statistics the stable way, mean first (TensorFlow's "
                   "norms.use_stable_statistics): one more pass and reduction per norm. "
                   "Default: on for resnext and efficientnet, as the TensorFlow CNN app "
                   "forces it for them, off otherwise (Graphcore's ResNet-50 configs set "
                   "it); IPU only")
    g.add_argument("--fold-batch-norms", action="store_true",
                   help="with --inference: batch norms folded into their convolutions, as "
                   "an ONNX export in eval mode leaves them for PopRT (a bias add each)")

    g = p.add_argument_group("profiling")
    g.add_argument("--profile", action="store_true", help="record one step after a warm-up")
    g.add_argument("--profile-dir", default="profile", type=non_empty_path,
                   help="where profiles go (./profile)")
    g.add_argument("--force", action="store_true",
                   help="replace the profiles an earlier run left in --profile-dir "
                   "(default: refuse before the run starts, naming the first)")
    g.add_argument("--plan-only", action="store_true",
                   help="record with fake tensors at full size, without training")
    g.add_argument("--measure", action="store_true",
                   help="run the pipeline for real, one process per stage (gloo), and time "
                   "it with torch.profiler: DIR/traces/rank{r}.json + one DIR/profile.h5 "
                   "(docs/measure.md)")
    g.add_argument("--debug", action="store_true", help="print options and model facts")
    g.add_argument("--quiet", action="store_true", help="no progress bars")


# the models whose TensorFlow CNN application forces stable norm statistics on (ImageNet)
STABLE_NORM_MODELS = ("resnext", "efficientnet")


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill mode-dependent defaults and check what argparse cannot (UsageError)."""
    tutorial = args.model is None
    try:
        args.model_size = models.check(args.model or "tutorial", args.model_size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    args.name = "tutorial" if tutorial else args.model
    if args.group_norm is not None and (tutorial or args.group_norm < 1):
        _error("--group-norm is for the CNN app (--model)" if tutorial else
               f"--group-norm {args.group_norm}: give a positive number of groups")
    if args.group_norm is not None and args.fold_batch_norms:
        _error("--group-norm leaves no batch norm for --fold-batch-norms to fold")
    # the TF CNN app feeds EfficientNet its native resolution (B4: 380)
    native = models.native_resolution(args.name, args.model_size)
    _default(args, "image_size", native)
    _default(args, "num_classes", 10 if tutorial else 1000)
    _default(args, "batch_size", [40 if tutorial else 4])
    _default(args, "epochs", 3 if tutorial else 1)
    _default(args, "iterations", 3)
    _default(args, "learning_rate", 0.001 if tutorial else 0.01)
    _default(args, "device_iterations", 10 if tutorial else 1)
    _default(args, "precision", "32.32" if tutorial else "16.16")
    if args.gradient_accumulation is None:
        args.gradient_accumulation = 10 if tutorial else (
            2 * args.shards if args.pipeline and args.shards > 1 else 1)

    for flag in ("epochs", "iterations", "device_iterations", "gradient_accumulation",
                 "replicas", "shards", "test_batch_size", "dataset_size", "num_classes"):
        if getattr(args, flag) < 1:
            _error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if not (math.isfinite(args.learning_rate) and args.learning_rate > 0):  # nan too
        _error(f"--learning-rate must be a finite number > 0, got {args.learning_rate:g}")
    if any(b < 1 for b in args.batch_size):
        _error(f"--batch-size must be >= 1, got {args.batch_size}")
    if len(args.batch_size) > 1 and not args.inference:
        _error("several --batch-size values are only for --inference")
    if args.inference and tutorial:
        _error("--inference needs --model (the tutorial always runs its test pass)")
    if args.fold_batch_norms and not args.inference:
        _error("--fold-batch-norms is for --inference (training computes batch statistics)")
    if args.io_tiles < 0:
        _error(f"--io-tiles must be >= 0, got {args.io_tiles}")
    if args.io_tiles and args.target in GPU_TARGET_NAMES:
        _error(f"--io-tiles are an IPU's tiles kept for host streams; {args.target} is a GPU")
    if args.stable_norm and args.target in GPU_TARGET_NAMES:
        _error(f"--stable-norm models TensorFlow's IPU norms; {args.target} is a GPU")
    if args.stable_norm is None:  # graphcore/examples Models/resnext.py, efficientnet.py
        args.stable_norm = args.name in STABLE_NORM_MODELS and \
            args.target not in GPU_TARGET_NAMES
    if args.fold_batch_norms and args.target in GPU_TARGET_NAMES:
        _error(f"--fold-batch-norms models PopRT's ONNX export on an IPU; {args.target} is "
               "a GPU")
    if args.inference:
        for b in args.batch_size:
            if b % args.replicas:
                _error(f"--batch-size {b} is not divisible by {args.replicas} "
                             "replicas/IPUs (it is the total over IPUs)")
    # below these the last feature maps are a pixel or less; EfficientNet's BN then sees one
    # value per sample and channel and tiny batches blow up
    minimum = {"tutorial": 16, "efficientnet": 64}.get(args.name, 32)
    if args.image_size < minimum:
        _error(f"--image-size {args.image_size} is too small for {args.name} "
                     f"(needs >= {minimum})")
    if args.gpu_precision != "as-recorded" and args.target not in GPU_TARGET_NAMES:
        _error(f"--gpu-precision {args.gpu_precision} is for GPU targets "
               f"({', '.join(GPU_TARGET_NAMES)}); {args.target} takes --precision instead")
    _check_splits(args)
    _check_amp(args)
    return args


def _error(message: str) -> None:
    raise UsageError(message)


def _default(args: argparse.Namespace, name: str, value: Any) -> None:
    """Fill a flag the user did not give (None), keeping an explicit 0 for the checks."""
    if getattr(args, name) is None:
        setattr(args, name, value)


def _check_splits(args: argparse.Namespace) -> None:
    if args.name == "tutorial":
        if args.pipeline_splits or args.shards > 1:
            _error("the tutorial places its blocks B1-B4 itself; --shards and "
                         "--pipeline-splits need --model")
        return
    from popviz.recorder.names import closest_names, valid_split_names

    model = models.build(args.name, args.model_size, num_classes=1)
    # the model's split names, or module paths from model.named_modules() (no edits)
    valid = valid_split_names(model)
    split_names = list(model.popviz_split_names)  # type: ignore[arg-type]  # set by models.build
    unknown = [s for s in args.pipeline_splits if s not in valid]
    if unknown:
        _error(f"unknown split name(s) {' '.join(unknown)} for {args.name}"
                     f"{args.model_size}; closest: {closest_names(unknown, valid)}; valid "
                     f"names: {' '.join(split_names)} or a module path (model.named_modules())")
    if len(set(args.pipeline_splits)) != len(args.pipeline_splits):
        _error(f"--pipeline-splits repeats a name: {' '.join(args.pipeline_splits)}")
    if all(s in split_names for s in args.pipeline_splits):  # module paths: the compiler
        order = [split_names.index(s) for s in args.pipeline_splits]  # checks the order
        if order != sorted(order):
            _error(f"--pipeline-splits must be in forward order: "
                         f"{' '.join(args.pipeline_splits)}")
    stages = len(args.pipeline_splits) + 1
    if args.target in GPU_TARGET_NAMES and args.pipeline_schedule in SEVERAL_STAGES_PER_GPU \
            and args.shards > 1:  # --shards is the GPUs, each holding several stages
        per_gpu = 2 if args.pipeline_schedule == "ZBV" else max(1, stages // args.shards)
        if stages != per_gpu * args.shards:
            want = "2 x" if args.pipeline_schedule == "ZBV" else "a multiple of"
            _error(f"--pipeline-schedule {args.pipeline_schedule} on {args.shards} GPUs "
                   f"runs {want} {args.shards} stages: give {per_gpu * args.shards - 1} "
                   f"--pipeline-splits names, got {len(args.pipeline_splits)}")
        return
    if args.shards > 1 and len(args.pipeline_splits) != args.shards - 1:
        _error(f"--shards {args.shards} needs {args.shards - 1} --pipeline-splits "
                     f"names, got {len(args.pipeline_splits)}")


def _check_amp(args: argparse.Namespace) -> None:
    amp = args.available_memory_proportion
    if not amp:
        return
    bad = [p for p in amp if not 0.0 < p <= 1.0]
    if bad:
        _error(f"--available-memory-proportion {bad[0]:g} is outside (0, 1]; "
                     "a reasonable range is 0.05-0.6")
    if args.target in GPU_TARGET_NAMES:  # a GPU: said, not an error (a script may pass it)
        print(f"popviz: warning: --available-memory-proportion is an IPU compiler option; "
              f"a GPU target ({args.target}) has none, so it is ignored", file=sys.stderr)
        return
    stages = 1 if args.name == "tutorial" else args.shards
    if len(amp) not in (1, 2 * stages):
        _error(f"--available-memory-proportion takes 1 value or 2 per stage "
                     f"({2 * stages} for {stages} stage(s)), got {len(amp)}")


def amp_setting(args: argparse.Namespace) -> Any:
    """One float for every IPU, or {ipu: (conv, matmul)}."""
    amp = args.available_memory_proportion
    if not amp:
        return {}
    if len(amp) == 1:
        return amp[0]
    return {i: (amp[2 * i], amp[2 * i + 1]) for i in range(len(amp) // 2)}


def make_options(args: argparse.Namespace, micro_batch: int, training: bool) -> Any:
    """The popviz Options of this run (what the compiler models)."""
    from popviz.options import Options

    tutorial = args.name == "tutorial"
    options = Options(
        target=args.target,
        gradient_accumulation=args.gradient_accumulation if training else 1,
        device_iterations=args.device_iterations,
        replication_factor=args.replicas,
        micro_batch_size=micro_batch,
        precision=args.precision,
        half_partials=args.enable_half_partials,
        optimiser_offload=args.offload_optimiser,
        replicated_tensor_sharding=args.replicated_tensor_sharding,
        outlining=args.outlining,
        io_tiles=args.io_tiles,
        fold_batch_norms=args.fold_batch_norms and not training,
        stable_norm_statistics=args.stable_norm,
        training=training,
        gpu_precision=args.gpu_precision,
    )
    options.set_available_memory_proportion(amp_setting(args))
    if tutorial:
        options.strategy = args.strategy  # one stage per block, B1-B4 on IPUs 0-3
        options.schedule = args.pipeline_schedule or "Grouped"
    else:
        options.strategy = "sharded" if args.shards > 1 and not args.pipeline else "pipelined"
        options.num_ipus = args.shards
        options.splits = list(args.pipeline_splits)
        # shards 1 with splits: the splits are recomputation sections on one IPU, run one
        # after another (docs/hardware.md, Sequential)
        default = "Sequential" if args.shards == 1 and args.pipeline_splits else "Grouped"
        options.schedule = args.pipeline_schedule or default
        options.recomputation = args.enable_recomputation and training
        options.recompute_granularity = args.recompute_granularity
    return options.validate()
