"""Which link each GPU-to-GPU transfer of a plan crosses: NVLink inside an NVLink domain
(an HGX board, a bridged pair of PCIe cards), PCIe between domains of one server, the
network (InfiniBand / RoCE) between servers.

Ranks are laid out as Megatron-LM (its default order, pipeline outermost) and torchtitan
lay them out: global rank = pipeline GPU x replicas + replica. So the data-parallel
replicas of a stage sit side by side (their all-reduce stays in a server while there are at
most `gpus_per_node` of them), and the hops between pipeline stages cross servers once
the stages' replicas fill one (a 4-stage pipeline of 8 replicas on 32 GPUs sends every
activation over the network).
"""

from __future__ import annotations

from dataclasses import dataclass

from popviz.target.gpu import LINKS, GpuTarget


@dataclass(frozen=True)
class Fabric:
    target: GpuTarget
    pipeline_gpus: int  # GPUs per replica (pipeline depth in GPUs)
    replicas: int  # data-parallel replicas

    def rank(self, gpu: int, replica: int = 0) -> int:
        return gpu * self.replicas + replica

    def _link(self, a: int, b: int) -> str:
        t = self.target
        if a // t.gpus_per_node != b // t.gpus_per_node:
            return "network"
        return "nvlink" if a // t.nvlink_gpus == b // t.nvlink_gpus else "pcie"

    def p2p_link(self, src: int, dst: int) -> str:
        """The link a pipeline transfer between GPUs `src` and `dst` of one replica
        crosses (every replica's pair is placed alike)."""
        return self._link(self.rank(src), self.rank(dst))

    def allreduce_link(self, gpu: int) -> str:
        """The slowest link of the ring all-reducing the gradients of `gpu`'s stages over
        the replicas (ranks gpu x replicas .. + replicas - 1)."""
        first, last = self.rank(gpu), self.rank(gpu, self.replicas - 1)
        return self._link(first, last) if self.replicas > 1 else "nvlink"

    def slowest(self) -> str:
        """The slowest link any transfer of the plan crosses (the profile's `gpu.link`)."""
        used = {self.p2p_link(g, g + 1) for g in range(self.pipeline_gpus - 1)}
        used |= {self.allreduce_link(g) for g in range(self.pipeline_gpus)
                 if self.replicas > 1}
        return max(used, key=LINKS.index) if used else "nvlink"
