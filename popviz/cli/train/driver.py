"""The four kinds of `popviz train` (train.py) run: tutorial, CNN training, CNN inference
benchmark, plan.

flags.py parses and checks the flags and builds Options; these functions train for real,
record one step with `popviz.record` and print one summary line per run.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from popviz.models import build, input_channels
from popviz.models.common import SyntheticImages
from popviz.models.training import RunResult, evaluate, model_info, settle_optimiser, train

OptionsFactory = Callable[[argparse.Namespace, int, bool], Any]


def _recorder(args: argparse.Namespace, options: Any, profile_dir: Path,
              model: torch.nn.Module, info: dict[str, Any]) -> Callable[[], Any]:
    """A factory of `popviz.record` context managers for one step of this run."""
    import popviz

    def make() -> Any:
        return popviz.record(options, profile_dir=str(profile_dir), model=model,
                             name=info["name"], model_info=info, progress=not args.quiet,
                             command_line=args.command_line)

    return make


def _data(args: argparse.Namespace, stream: int) -> SyntheticImages:
    return SyntheticImages(args.num_classes, input_channels(args.name), args.image_size,
                           seed=args.seed, stream=stream)


def _model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    variant = {} if args.group_norm is None else {"group_norm": args.group_norm}
    return build(args.name, args.model_size, num_classes=args.num_classes,
                 image_size=args.image_size, variant=variant)


def _debug(args: argparse.Namespace, options: Any, model: torch.nn.Module) -> None:
    if not args.debug:
        return
    params = sum(p.numel() for p in model.parameters())
    print(f"model {args.name} {args.model_size or ''}: {params:,} parameters, "
          f"{len(getattr(model, 'popviz_split_names', []))} split names")
    print("options " + json.dumps(options.to_meta(), sort_keys=True))


def _line(title: str, result: RunResult, extra: str = "", unit: str = "steps") -> str:
    loss = (f"loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}" if result.losses
            else "no steps")
    profiles = ", ".join(str(p) for p in result.profiles)
    modelled = "".join(f"; modelled: {_modelled(s)}" for s in result.summaries)
    return (f"{title}: {len(result.losses)} {unit}, {loss}, "
            f"{result.samples_per_second:.1f} samples/s on this CPU{extra}{modelled}"
            + (f"; profile: {profiles}" if profiles else ""))


def run_tutorial(args: argparse.Namespace, make_options: OptionsFactory) -> int:
    """PopTorch pipelining tutorial: AdamW, gradient accumulation and device iterations for
    real; profiles in DIR/training and DIR/inference (the test pass)."""
    micro = args.batch_size[0]
    model = _model(args)
    optimiser = _optimiser(args, model)
    options = make_options(args, micro, True)
    _debug(args, options, model)
    data, test = _data(args, 1), _data(args, 2)
    per_call = micro * args.gradient_accumulation * args.device_iterations
    updates = max(1, args.dataset_size // per_call) * args.device_iterations
    info = model_info(model, "tutorial", args.image_size)
    total = RunResult()
    for epoch in range(args.epochs):
        recorder = None
        if args.profile and epoch == 0:
            recorder = _recorder(args, options, Path(args.profile_dir, "training"), model,
                                 info)
        result = train(model, optimiser, data, updates=updates, micro_batch=micro,
                       accumulation=args.gradient_accumulation,
                       desc=f"epoch {epoch + 1}/{args.epochs}", quiet=args.quiet,
                       record_at=min(1, updates - 1), recorder=recorder)
        _merge(total, result)
    print(_line(f"tutorial training ({args.strategy}, {args.epochs} epochs)", total))
    if args.no_validation:
        return 0
    test_options = make_options(args, args.test_batch_size, False)
    recorder = None
    if args.profile:
        recorder = _recorder(args, test_options, Path(args.profile_dir, "inference"), model,
                             info)
    batches = max(1, args.dataset_size // 10 // args.test_batch_size)
    result = evaluate(model, test, batches=batches, batch_size=args.test_batch_size,
                      quiet=args.quiet, recorder=recorder)
    print(_line("tutorial inference", result, f", accuracy {result.accuracy:.1%}",
                unit="batches"))
    return 0


def run_cnn(args: argparse.Namespace, make_options: OptionsFactory) -> int:
    """CNN app training: SGD with momentum on micro-batches of synthetic ImageNet-shaped
    data; the recorded step goes to DIR/profile.h5."""
    micro = args.batch_size[0]
    model = _model(args)
    optimiser = _optimiser(args, model)
    options = make_options(args, micro, True)
    _debug(args, options, model)
    data = _data(args, 1)
    updates = args.epochs * args.iterations
    recorder = None
    if args.profile:
        info = model_info(model, _title(args), args.image_size)
        recorder = _recorder(args, options, Path(args.profile_dir), model, info)
    result = train(model, optimiser, data, updates=updates, micro_batch=micro,
                   desc=_title(args), quiet=args.quiet,
                   record_at=min(1, updates - 1), recorder=recorder)
    print(_line(f"{_title(args)} training", result))
    if not args.no_validation:
        val = evaluate(model, _data(args, 2), batches=2, batch_size=micro, quiet=args.quiet)
        print(_line(f"{_title(args)} validation", val,
                    f", accuracy {val.accuracy:.1%}", unit="batches"))
    return 0


def run_inference(args: argparse.Namespace, make_options: OptionsFactory) -> int:
    """Forward-only benchmark: for each total batch size, record one forward pass of the
    per-IPU micro-batch and print the modelled latency and throughput."""
    model = _model(args)
    data = _data(args, 2)
    info = model_info(model, _title(args), args.image_size)
    rows = []
    for batch in args.batch_size:
        micro = batch // args.replicas
        options = make_options(args, micro, False)
        _debug(args, options, model)
        out = Path(args.profile_dir) if len(args.batch_size) == 1 else \
            Path(args.profile_dir, f"bs{batch}")
        summary = _inference_summary(args, options, model, data, micro, out, info)
        rows.append((batch, micro, summary))
    print(f"{'batch':>6} {'micro':>6} {'ipus':>5} {'latency ms':>11} {'images/s':>10} fits")
    for batch, micro, s in rows:
        print(f"{batch:>6} {micro:>6} {args.replicas * args.shards:>5} "
              f"{s.get('latency_ms', float('nan')):>11.3f} "
              f"{s.get('throughput', float('nan')):>10.1f} {s.get('fits')}")
    return 0


def _inference_summary(args: argparse.Namespace, options: Any, model: torch.nn.Module,
                       data: SyntheticImages, micro: int, out: Path,
                       info: dict[str, Any]) -> dict[str, Any]:
    """Record one forward pass; compile it (and write it with --profile)."""
    import popviz

    images, _ = data.batch(micro)
    model.eval()
    with torch.no_grad(), popviz.record(options, profile_dir=out if args.profile else None,
                                        model=model, name=info["name"], model_info=info,
                                        progress=not args.quiet,
                                        command_line=args.command_line) as rec:
        model(images)
    report = rec.report if rec.report is not None else _compile(rec)
    return dict(report.summary)


def run_plan(args: argparse.Namespace, make_options: OptionsFactory) -> int:
    """--plan-only: record one step on fake tensors at full size (nothing is computed) and
    print the modelled result; with --profile write it like a real run would."""
    tutorial = args.name == "tutorial"
    jobs: list[tuple[str, Path, bool, int]] = []
    if args.inference:
        for batch in args.batch_size:
            sub = () if len(args.batch_size) == 1 else (f"bs{batch}",)
            jobs.append((f"bs{batch}", Path(args.profile_dir, *sub), False,
                         batch // args.replicas))
    elif tutorial:
        jobs.append(("training", Path(args.profile_dir, "training"), True,
                     args.batch_size[0]))
        if not args.no_validation:
            jobs.append(("inference", Path(args.profile_dir, "inference"), False,
                         args.test_batch_size))
    else:
        jobs.append(("training", Path(args.profile_dir), True, args.batch_size[0]))
    for label, out, training, micro in jobs:
        options = make_options(args, micro, training)
        report, path = _plan_one(args, options, out if args.profile else None, training,
                                 micro)
        where = f"; profile: {path}" if path else ""
        print(f"{_title(args)} plan ({label}): {_modelled(report.summary)}{where}")
    return 0


def _plan_one(args: argparse.Namespace, options: Any, out: Path | None, training: bool,
              micro: int) -> tuple[Any, Path | None]:
    import popviz

    name = _title(args)
    info = {"name": name, "image_size": args.image_size, "num_classes": args.num_classes}
    with popviz.plan(options, profile_dir=out, name=name, model_info=info,
                     progress=not args.quiet, command_line=args.command_line) as session:
        model = _model(args)
        images = torch.randn(micro, input_channels(args.name), args.image_size,
                             args.image_size)
        labels = torch.randint(0, args.num_classes, (micro,))
        if training:
            optimiser = _optimiser(args, model)
            settle_optimiser(optimiser)  # a steady-state step, as a real run records
            with session.step(model=model):
                _, loss = model(images, labels)
                loss.backward()
                optimiser.step()
        else:
            model.eval()
            with torch.no_grad(), session.step(model=model):
                model(images)
    rec = session.recording
    report = rec.report if rec.report is not None else _compile(rec)
    return report, rec.profile_path


def _compile(rec: Any) -> Any:
    """Compile a recording made without a profile dir."""
    from popviz.compiler import compile as compile_program

    return compile_program(rec.program, rec.options)


def _optimiser(args: argparse.Namespace, model: torch.nn.Module) -> torch.optim.Optimizer:
    if args.name == "tutorial":
        return torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    return torch.optim.SGD(model.parameters(), lr=args.learning_rate, momentum=0.9)


def _title(args: argparse.Namespace) -> str:
    """The model's name in output and profiles: tutorial, resnet50, efficientnet-b4."""
    if args.name == "efficientnet":
        return f"efficientnet-b{args.model_size}"
    return "tutorial" if args.name == "tutorial" else f"{args.name}{args.model_size}"


def _modelled(summary: dict[str, Any]) -> str:
    """The modelled facts of a compiled summary, for the summary line."""
    parts = [f"fits {summary.get('fits')}"]
    if summary.get("total_gpus") is not None:  # a GPU target's plan
        parts.append(f"{summary['total_gpus']} GPU(s)")
    elif summary.get("total_ipus") is not None:
        parts.append(f"{summary['total_ipus']} IPUs")
    if summary.get("latency_ms") is not None:
        parts.append(f"latency {summary['latency_ms']:.3f} ms")
    if summary.get("throughput") is not None:
        parts.append(f"{summary['throughput']:.0f} samples/s modelled")
    return ", ".join(parts)


def _merge(total: RunResult, part: RunResult) -> None:
    total.losses += part.losses
    total.samples += part.samples
    total.seconds += part.seconds
    total.profiles += part.profiles
    total.summaries += part.summaries
