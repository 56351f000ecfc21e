"""The process group: one process (CPU or one GPU), or torchrun's ranks (NCCL on GPUs, gloo on
CPUs)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass
class Dist:
    """The process group: one process (world 1), or torchrun's ranks with FSDP2."""
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # setup_dist created the process group (close destroys it)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def mean(self, x: float) -> float:
        if self.world == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return float(t) / self.world

    def barrier(self):
        if self.world > 1:
            torch.distributed.barrier()

    def close(self) -> None:
        """After a run that ended normally on every rank: wait for all of them, then destroy
        the process group if ``setup_dist`` created it. Left to interpreter exit, a rank that
        finishes first tears its gloo connections down while its peer may still use them (a
        suspected cause of a rank aborting with SIGABRT at the end of a CPU run in CI)."""
        if self.world > 1 and self.owns_group:
            self.barrier()
            torch.distributed.destroy_process_group()
            self.owns_group = False


def setup_dist(device_name: str) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        name = device_name
        if name == "auto":
            name = "cuda" if torch.cuda.is_available() else "cpu"
        return Dist(0, 1, torch.device(name))
    use_cuda = torch.cuda.is_available() and device_name in ("auto", "cuda")
    owns = not torch.distributed.is_initialized()
    if owns:
        torch.distributed.init_process_group("nccl" if use_cuda else "gloo")
    rank, local = torch.distributed.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local)
        return Dist(rank, world, torch.device("cuda", local), owns)
    return Dist(rank, world, torch.device("cpu"), owns)
