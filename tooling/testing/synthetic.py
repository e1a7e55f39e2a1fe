"""Synthetic Reports with every contract table, for tests, benches and notebooks.

The numbers are shaped like a modelled pipelined training step (BSP slots, a grouped
pipeline with ramp-up and ramp-down, liveness that rises through the forward pass and falls
through the backward pass) but they are generated, not compiled: never use them as results.
`popviz.format.memory.ReportProfile` wraps one in the read API of `popviz.open` so the
analysis, figures and app can run without a file.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from popviz.compiler.report import Report
from popviz.vocab import MODELLED_KIND, ipu_label

# docs/hardware.md: tiles, SRAM per tile, clock
TARGETS: dict[str, dict[str, Any]] = {
    "mk1": {"name": "mk1", "tiles_per_ipu": 1216, "bytes_per_tile": 256 * 1024,
            "clock_hz": 1.6e9},
    "mk2": {"name": "mk2", "tiles_per_ipu": 1472, "bytes_per_tile": 624 * 1024,
            "clock_hz": 1.33e9},
}

KiB = 1024


KINDS = np.array(["compute", "exchange", "sync", "idle"])


def _slot_events(ipu: int, item: tuple[int, int, str] | None,
                 durations: tuple[np.ndarray, np.ndarray] | None, t0: int, busy: int,
                 slot_len: int, recomputation: bool,
                 layers: list[list[str]]) -> dict[str, np.ndarray]:
    """One IPU's events in one BSP slot: compute/exchange pairs, idle, then the sync."""
    sync_at = t0 + slot_len - 20
    if item is None or durations is None:
        starts, ends = np.array([t0]), np.array([sync_at])
        kind, ps_arr, ops, mb = np.array([3]), np.array([""]), np.array(["idle"]), -1
    else:
        _, mb, ps = item
        comp, exch = durations
        n = len(comp)
        if recomputation and ps == "B":
            pass_arr = np.where(np.arange(n) < n // 3, "R", "B")
        else:
            pass_arr = np.full(n, ps)
        d = np.empty(2 * n, dtype=np.int64)
        d[0::2], d[1::2] = comp, exch
        starts = t0 + np.concatenate([[0], np.cumsum(d)[:-1]])
        ends = starts + d
        kind = np.tile([0, 1], n)
        ps_arr = np.repeat(pass_arr, 2)
        names = np.array(layers[ipu])
        ops = np.where(kind == 1, "internal exchange", names[np.arange(2 * n) // 2 % len(names)])
        if t0 + busy < sync_at:  # waiting for the slowest IPU at the sync
            starts, ends = np.append(starts, t0 + busy), np.append(ends, sync_at)
            kind, ps_arr = np.append(kind, 3), np.append(ps_arr, "")
            ops = np.append(ops, "idle")
    n = len(starts) + 1
    return {"ipu": np.full(n, ipu, dtype=np.int64),
            "start": np.append(starts, sync_at).astype(np.int64),
            "end": np.append(ends, t0 + slot_len).astype(np.int64),
            "kind": np.append(kind, 2), "stage": np.full(n, ipu, dtype=np.int64),
            "microbatch": np.full(n, mb, dtype=np.int64),
            "pass": np.append(ps_arr, "").astype(str), "op": np.append(ops, "sync").astype(str)}


def _trace(rng: np.random.Generator, num_ipus: int, microbatches: int, events: int,
           recomputation: bool, layers: list[list[str]]) -> tuple[pd.DataFrame, int]:
    """A grouped pipeline in BSP slots: every IPU computes, syncs, then exchanges."""
    stages = num_ipus
    fwd_slots = microbatches + stages - 1
    slots = 2 * fwd_slots + 1  # forward ramp, backward ramp, weight update
    # compute + exchange pairs in each IPU's 2 * microbatches + 1 busy slots
    per_slot = max(1, events // (num_ipus * (2 * microbatches + 1) * 2))
    weight = 1.0 + 0.5 * np.linspace(1, 0, num_ipus)  # earlier stages heavier
    parts: list[dict[str, np.ndarray]] = []
    t0 = 0
    for slot in range(slots):
        work: list[tuple[int, int, str] | None] = []
        for ipu in range(num_ipus):
            if slot < fwd_slots:
                mb, ps = slot - ipu, "F"
            elif slot < 2 * fwd_slots:
                mb, ps = slot - fwd_slots - (stages - 1 - ipu), "B"
            else:
                mb, ps = -1, "WU"
            active = ps == "WU" or 0 <= mb < microbatches
            work.append((ipu, mb, ps) if active else None)
        durations: list[tuple[np.ndarray, np.ndarray] | None] = []
        for item in work:
            if item is None:
                durations.append(None)
                continue
            ipu, mb, ps = item
            scale = weight[ipu] * (2.0 if ps == "B" else 0.5 if ps == "WU" else 1.0)
            comp = rng.integers(40, 160, per_slot) * scale
            exch = rng.integers(5, 30, per_slot)
            durations.append((comp.astype(np.int64) + 1, exch.astype(np.int64) + 1))
        busy = [0 if d is None else int(d[0].sum() + d[1].sum()) for d in durations]
        slot_len = max(busy) + 20
        for ipu, item in enumerate(work):
            parts.append(_slot_events(ipu, item, durations[ipu], t0, busy[ipu], slot_len,
                                      recomputation, layers))
        t0 += slot_len
    trace = pd.DataFrame({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})
    trace["kind"] = KINDS[trace["kind"].to_numpy()]
    trace = trace.sort_values(["ipu", "start"], kind="stable").reset_index(drop=True)
    for col in ("kind", "pass", "op"):
        trace[col] = trace[col].astype(str)
    return trace, t0


def _stages_from_trace(trace: pd.DataFrame, step: int, stash: np.ndarray,
                       peak: np.ndarray, amps: list[float],
                       layers: list[list[str]]) -> pd.DataFrame:
    dur = trace["end"] - trace["start"]
    rows = []
    for ipu in sorted(trace["ipu"].unique()):
        m = trace["ipu"] == ipu
        comp = m & (trace["kind"] == "compute")
        rows.append({
            "stage": int(ipu), "ipu": int(ipu),
            "forward_cycles": int(dur[comp & (trace["pass"] == "F")].sum()),
            "backward_cycles": int(dur[comp & (trace["pass"] == "B")].sum()),
            "recompute_cycles": int(dur[comp & (trace["pass"] == "R")].sum()),
            "exchange_cycles": int(dur[m & (trace["kind"] == "exchange")].sum()),
            "idle_cycles": int(dur[m & trace["kind"].isin(["idle", "sync"])].sum()),
            "stash_bytes": int(stash[ipu]), "peak_bytes": int(peak[ipu]),
            "optimiser_cycles": int(dur[comp & (trace["pass"] == "WU")].sum()),
            "amp": float(amps[ipu]), "first_layer": layers[ipu][0],
            "last_layer": layers[ipu][-1], "num_ops": len(layers[ipu]),
        })
    stages = pd.DataFrame(rows)
    assert int(stages[["forward_cycles", "backward_cycles", "recompute_cycles",
                       "exchange_cycles", "idle_cycles", "optimiser_cycles"]]
               .sum(axis=1).max()) <= step
    return stages


def _liveness(rng: np.random.Generator, num_ipus: int, steps: int, microbatches: int,
              always: np.ndarray, scale: np.ndarray) -> pd.DataFrame:
    """Per IPU: activations pile up through the forward pass, drain through the backward."""
    x = np.arange(steps)
    half = steps // 2
    frames = []
    for ipu in range(num_ipus):
        ramp = np.where(x < half, x / max(half, 1), (steps - x) / max(steps - half, 1))
        # one bump per micro-batch: temporaries of its big ops
        bumps = 0.25 * np.abs(np.sin(np.pi * x * microbatches / max(steps, 1))) ** 8
        noise = rng.random(steps) * 0.02
        nal = (scale[ipu] * (0.6 * ramp + bumps + noise)).astype(np.int64)
        frames.append(pd.DataFrame({
            "ipu": ipu, "step": x, "phase": np.where(x < half, "forward", "backward"),
            "always_live_bytes": np.int64(always[ipu]), "not_always_live_bytes": nal,
            "label": [f"op{i}" for i in x] if steps <= 50_000 else "op",
            "op_id": x, "microbatch": (x * microbatches // max(steps, 1)) % microbatches,
            "stage": ipu,
        }))
    return pd.concat(frames, ignore_index=True)


def synthetic_report(num_ipus: int = 4, target: str = "mk2", events: int = 4000,
                     steps: int = 400, microbatches: int = 4, seed: int = 0,
                     oom_ipu: int | None = None, recomputation: bool = False,
                     tile_liveness_ipus: int | None = None, num_ops: int = 200,
                     model: str = "synthetic") -> Report:
    """A deterministic Report of about `events` trace events and `steps` liveness steps.

    `oom_ipu` makes that IPU overflow on a few tiles; `tile_liveness_ipus` limits how many
    IPUs get the (IPU, step, tile) array (it is the big one)."""
    rng = np.random.default_rng(seed)
    tgt = dict(TARGETS[target], num_ipus=num_ipus)
    tiles, cap = tgt["tiles_per_ipu"], tgt["bytes_per_tile"]
    layers = [[f"s{i}/layer{j}" for j in range(6)] for i in range(num_ipus)]
    splits = [layers[i][0] for i in range(1, num_ipus)]
    amps = [0.6 if i != oom_ipu else 0.3 for i in range(num_ipus)]
    trace, step_cycles = _trace(rng, num_ipus, microbatches, events, recomputation, layers)

    # tile memory: code + always-live spread evenly, not-always-live peaks on hot tiles
    tid = np.arange(tiles)
    tm_frames = []
    unit = KiB * cap / (624 * KiB)  # the shapes below are for Mk2 tiles; scale to the target
    for ipu in range(num_ipus):
        code = rng.integers(40, 80, tiles) * unit
        alive = rng.integers(60, 140, tiles) * unit * (1.3 if ipu == 0 else 1.0)
        hot = np.exp(-((tid - tiles * (0.3 + 0.1 * ipu)) / (tiles * 0.05)) ** 2)
        nal = (rng.random(tiles) * 120 + 200 * hot) * unit
        exch = rng.integers(10, 40, tiles) * unit
        if ipu == oom_ipu:
            nal[tiles // 2: tiles // 2 + 7] += cap  # seven tiles overflow
        frame = pd.DataFrame({
            "ipu": ipu, "tile": tid, "capacity_bytes": np.int64(cap),
            "code": code.astype(np.int64), "always_live": alive.astype(np.int64),
            "not_always_live_peak": nal.astype(np.int64), "exchange": exch.astype(np.int64),
        })
        frame.insert(3, "total_bytes", frame[["code", "always_live", "not_always_live_peak",
                                              "exchange"]].sum(axis=1))
        tm_frames.append(frame)
    tile_memory = pd.concat(tm_frames, ignore_index=True)
    per_ipu = tile_memory.groupby("ipu")
    always = (per_ipu["code"].sum() + per_ipu["always_live"].sum() + per_ipu["exchange"].sum())
    nal_total = per_ipu["not_always_live_peak"].sum().to_numpy()
    liveness = _liveness(rng, num_ipus, steps, microbatches, always.to_numpy(), nal_total)
    peak = liveness.assign(t=liveness.always_live_bytes + liveness.not_always_live_bytes
                           ).groupby("ipu")["t"].max().to_numpy()
    mb_act = 6 * 2**20
    stash = np.array([(2 * (num_ipus - i - 1) + 1) * mb_act if i < num_ipus - 1 else 0
                      for i in range(num_ipus)])
    stages = _stages_from_trace(trace, step_cycles, stash, peak, amps, layers)

    oom_rows = tile_memory[tile_memory.total_bytes > tile_memory.capacity_bytes]
    oom = pd.DataFrame({
        "ipu": oom_rows.ipu.to_numpy(), "tile": oom_rows.tile.to_numpy(),
        "bytes_over": (oom_rows.total_bytes - oom_rows.capacity_bytes).to_numpy(),
        "variables": [f"s{i}/layer3.conv.out (312 KiB)" for i in oom_rows.ipu],
    })

    # exchange: activations forward, gradients back, host in / out
    ex_rows: list[tuple[int | str, ...]] = []
    t = 0
    for mb in range(microbatches):
        for i in range(num_ipus - 1):
            t = (mb + i + 1) * step_cycles // (2 * (microbatches + num_ipus))
            ex_rows.append((i, i + 1, 2**20 * (4 - i % 3), t, t + 800,
                            "activation", i, mb))
            ex_rows.append((i + 1, i, 2**20 * (4 - i % 3), step_cycles // 2 + t,
                            step_cycles // 2 + t + 800, "gradient", i + 1, mb))
        ex_rows.append(("host", 0, 600_000, mb * 1000, mb * 1000 + 500, "host_in", 0, mb))
        ex_rows.append((num_ipus - 1, "host", 4_000, step_cycles // 2 + mb * 900,
                        step_cycles // 2 + mb * 900 + 50, "host_out", num_ipus - 1, mb))
    exchange = pd.DataFrame(ex_rows, columns=["src", "dst", "bytes", "start", "end", "kind",
                                              "stage", "microbatch"])
    exchange = exchange.sort_values("start", kind="stable").reset_index(drop=True)
    for col in ("src", "dst"):  # IPU index or "host", as the reader returns them
        exchange[col] = exchange[col].astype(object)

    classes = np.array(["conv", "matmul", "elementwise", "norm", "reduction"])
    phases = np.array(["forward", "backward", "optimiser"])
    op_ipu = np.arange(num_ops) * num_ipus // max(num_ops, 1)
    cls = classes[rng.integers(0, len(classes), num_ops)]
    ops = pd.DataFrame({
        "op_id": np.arange(num_ops, dtype=np.int64),
        "op": np.char.add("aten.", cls.astype(str)).astype(str),
        "op_class": cls,
        "phase": phases[np.minimum(np.arange(num_ops) * 3 // max(num_ops, 1), 2)],
        "module": [f"s{i}.layer{j % 6}" for i, j in zip(op_ipu, range(num_ops))],
        "layer": [layers[i][j % 6] for i, j in zip(op_ipu, range(num_ops))],
        "block": [f"B{i}" for i in op_ipu],
        "flops": rng.integers(10**6, 10**9, num_ops),
        "bytes_read": rng.integers(10**4, 10**7, num_ops),
        "bytes_written": rng.integers(10**4, 10**7, num_ops), "stage": op_ipu, "ipu": op_ipu,
        "cycles": rng.integers(100, 100_000, num_ops),
        "temp_bytes": rng.integers(0, 2**22, num_ops),
        "amp_used": np.array(amps)[op_ipu],
        "amp_ignored": (cls == "conv") & (rng.random(num_ops) < 0.1),
    })
    for col in ("op", "op_class", "phase", "module", "layer", "block"):
        ops[col] = ops[col].astype(str)

    var_rows = []
    for ipu in range(num_ipus):
        for j in range(12):
            first = j * steps // 24
            var_rows.append((ipu, f"s{ipu}/layer{j % 6}.out#{j}",
                             "activation" if j % 3 else "temporary",
                             int(2**20 * (1 + j % 5)), first, steps - 1 - first))
    variables = pd.DataFrame(var_rows, columns=["ipu", "name", "category", "bytes",
                                                "first_step", "last_step"])

    arrays: dict[str, np.ndarray] = {}
    n_tl = num_ipus if tile_liveness_ipus is None else min(tile_liveness_ipus, num_ipus)
    if n_tl:
        curve = liveness.pivot(index="step", columns="ipu",
                               values="not_always_live_bytes").to_numpy()[:, :n_tl]
        share = tile_memory.pivot(index="tile", columns="ipu",
                                  values="not_always_live_peak").to_numpy()[:, :n_tl]
        share = share / share.sum(axis=0, keepdims=True)
        tl = np.empty((n_tl, steps, tiles), dtype=np.uint32)
        for ipu in range(n_tl):
            tl[ipu] = (curve[:, ipu, None].astype(np.float32)
                       * share[None, :, ipu].astype(np.float32)).astype(np.uint32)
        arrays["tile_liveness"] = tl

    fits = oom.empty
    samples = microbatches
    clock = tgt["clock_hz"]
    summary = {
        "fits": bool(fits), "oom_tiles": len(oom), "step_cycles": int(step_cycles),
        "step_ms": step_cycles / clock * 1e3,
        "throughput": samples / (step_cycles / clock),
        "stages": stages[["stage", "ipu", "forward_cycles", "backward_cycles"]]
        .to_dict("records"),
        "peak_liveness_bytes": {str(i): int(p) for i, p in enumerate(peak)},
    }
    options = {
        "strategy": "pipelined", "schedule": "Grouped", "gradient_accumulation": microbatches,
        "device_iterations": 1, "replication_factor": 1,
        "available_memory_proportion": {ipu_label(i): a for i, a in enumerate(amps)},
        "precision": "16.16", "recomputation": recomputation, "splits": splits,
        "micro_batch_size": 1, "training": True,
    }
    meta = {"target": tgt, "options": options,
            "model": {"name": model, "parameters": 1_000_000, "batch_size": microbatches},
            "kind": MODELLED_KIND}
    tables = {"stages": stages, "trace": trace, "liveness": liveness,
              "tile_memory": tile_memory, "exchange": exchange, "ops": ops,
              "variables": variables, "oom": oom,
              "tensors": pd.DataFrame(columns=["tensor_id", "name", "bytes", "category"])}
    return Report(meta=meta, tables=tables, arrays=arrays, summary=summary)

