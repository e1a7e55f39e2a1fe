"""The IPU target's description (`Target`): its published figures, the cost model that
goes with it, and what a profile records of it. The built-in IPUs are in ipus.py, the
registry in machines.py."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from popviz.target.costmodel import DEFAULT_COST, CostModel
from popviz.target.gpu import IPU_FAMILY

KIB = 1024


@dataclass(frozen=True)
class Target:
    """One IPU-like tiled accelerator. Rates are whole-IPU published figures; the
    per-tile-per-cycle rates the cost model uses are derived properties."""

    name: str
    tiles_per_ipu: int
    bytes_per_tile: int
    clock_hz: float
    peak_fp16_flops: float  # per IPU, fp16 inputs on the AMP units
    peak_fp32_flops: float
    memory_bytes_per_s: float  # on-chip SRAM bandwidth, whole IPU
    exchange_bytes_per_s: float  # on-chip tile-to-tile exchange, whole IPU
    ipu_link_bytes_per_s: float  # one IPU to its neighbours
    ipu_link_latency_s: float = 1.0e-6  # assumed
    # a pipeline stage's copy to the next IPU: the links joining those two IPUs, one
    # direction (0 = ipu_link_bytes_per_s)
    stage_link_bytes_per_s: float = 0.0
    host_bytes_per_s: float = 32.0e9
    host_latency_s: float = 2.0e-6  # assumed
    # Multi-rack Pods: IPU-Links join the IPUs of one rack (a Pod64); racks are joined by
    # the GW-Links of each IPU-Machine's IPU-Gateway. 0 = no gateway links (one rack at most).
    gw_link_bytes_per_s: float = 0.0  # one IPU-Machine's GW-Links, each direction
    ipus_per_machine: int = 4
    ipus_per_rack: int = 64
    description: str = ""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    cost: CostModel = DEFAULT_COST  # modelling constants, each with its provenance

    family = IPU_FAMILY  # the other family is popviz.target.gpu's GpuTarget

    # ---- modelling constants, read from the cost model (kept as attributes so that
    # compile code and target files keep their names) ----
    @property
    def sync_cycles(self) -> int:
        return int(self.cost.sync_cycles)

    @property
    def exchange_code_bytes_per_op_per_tile(self) -> int:
        return int(self.cost.exchange_code_bytes_per_op_per_tile)

    @property
    def tile_overhead_bytes(self) -> int:
        return int(self.cost.tile_overhead_bytes)

    @property
    def host_call_cycles(self) -> float:
        return float(self.cost.host_call_s) * self.clock_hz

    # ---- derived per-tile, per-cycle rates ----
    def _per_tile_cycle(self, per_second: float) -> float:
        return per_second / (self.tiles_per_ipu * self.clock_hz)

    @property
    def flops_per_tile_cycle_fp16(self) -> float:
        return self._per_tile_cycle(self.peak_fp16_flops)

    @property
    def flops_per_tile_cycle_fp32(self) -> float:
        return self._per_tile_cycle(self.peak_fp32_flops)

    @property
    def memory_bytes_per_tile_cycle(self) -> float:
        return self._per_tile_cycle(self.memory_bytes_per_s)

    @property
    def exchange_bytes_per_tile_cycle(self) -> float:
        return self._per_tile_cycle(self.exchange_bytes_per_s)

    @property
    def bytes_per_ipu(self) -> int:
        return self.tiles_per_ipu * self.bytes_per_tile

    def _transfer_cycles(self, nbytes: float, latency_s: float, bytes_per_s: float) -> float:
        if nbytes <= 0:
            return 0.0
        return (latency_s + nbytes / bytes_per_s) * self.clock_hz

    def ring_cycles(self, nbytes: float) -> float:
        """Cycles for each IPU of a ring to send `nbytes` on while it takes as many in:
        all its IPU-Links one way, half of `ipu_link_bytes_per_s`, which counts them both
        ways (Mk2: 10 links x 16 GB/s each way = 320 GB/s in all), latency included."""
        return self._transfer_cycles(nbytes, self.ipu_link_latency_s,
                                     self.ipu_link_bytes_per_s / 2)

    def stage_copy_cycles(self, nbytes: float) -> float:
        """Cycles to copy `nbytes` from one pipeline stage's IPU to a neighbour's."""
        return self._transfer_cycles(nbytes, self.ipu_link_latency_s,
                                     self.stage_link_bytes_per_s or self.ipu_link_bytes_per_s)

    def racks(self, ipus: int) -> int:
        """Racks (IPU-Link domains) that `ipus` IPUs span: one unless gateway links exist."""
        if self.gw_link_bytes_per_s <= 0 or ipus <= self.ipus_per_rack:
            return 1
        return math.ceil(ipus / self.ipus_per_rack)

    def allreduce_cycles(self, nbytes: float, replicas: int, ipus_per_replica: int = 1) -> float:
        """Cycles of one gradient all-reduce of `nbytes` per replica over `replicas`.

        Within a rack a ring over IPU-Links: each IPU sends 2(r-1)/r of the bytes while
        it receives as many, so at most its links' one-way rate (`ring_cycles`), in
        2(r-1) transfers.
        When the replicas span R racks the reduction is hierarchical: reduce-scatter in
        each rack, an all-reduce of each IPU's 1/r shard across the racks over the
        GW-Links (a ring: 2(R-1)/R of the shard, 2(R-1) transfers; the IPUs of one
        IPU-Machine share its gateway), then an all-gather in the rack."""
        if replicas <= 1 or nbytes <= 0:
            return 0.0
        racks = self.racks(replicas * ipus_per_replica)
        r = max(1, replicas // racks)  # replicas in one rack
        lat = self.ipu_link_latency_s
        cycles = (self.ring_cycles(2.0 * (r - 1) / r * nbytes)
                  + 2 * (r - 1) * lat * self.clock_hz) if r > 1 else 0.0
        if racks > 1:
            shard = nbytes / r
            per_ipu = self.gw_link_bytes_per_s / self.ipus_per_machine
            cycles += (2.0 * (racks - 1) / racks * shard / per_ipu
                       + 2 * (racks - 1) * lat) * self.clock_hz
        return cycles

    def host_cycles(self, nbytes: float) -> float:
        return self._transfer_cycles(nbytes, self.host_latency_s, self.host_bytes_per_s)

    def to_meta(self, num_ipus: int) -> dict[str, Any]:
        """The `target` dict of the profile contract (JSON-safe), plus the model constants."""
        meta = {k: v for k, v in asdict(self).items() if k not in ("sources", "cost")}
        meta.update(self.cost.to_dict())
        meta["num_ipus"] = int(num_ipus)
        return meta
