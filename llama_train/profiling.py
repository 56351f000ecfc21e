"""Where a step's time and memory go.

* ``StepProfiler``: steps N and N+1 under torch.profiler on rank 0; OUT/step_breakdown.json has
  the GPU time per step by kernel category (GEMM, quantize, dequantize, attention,
  communication, other), the top kernels, and the host operations with the most CPU time.
* ``peak_memory``: the peak allocated and reserved memory of every GPU (OUT/memory.json).
* ``peak_flops``: the device's peak, for the MFU figure.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .distributed import Dist

PEAK_FLOPS = {"cpu": 1e11}  # nominal, for an MFU figure on CPU only


def peak_flops(device: torch.device) -> float:
    if device.type in PEAK_FLOPS:
        return PEAK_FLOPS[device.type]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return 989e12 if ("H100" in name or "H200" in name) else 312e12


class StepProfiler:
    """torch.profiler over steps ``first`` and ``first + 1`` (None: no profiling); then
    OUT/step_breakdown.json. A run that ends after ``first`` has a breakdown of that one step;
    on an error the profiler is stopped without one (a profiler left running at exit crashes
    the process)."""

    def __init__(self, first: int | None, device: torch.device, out: Path):
        self.first, self.device, self.out = first, device, out
        self.prof = None

    def step_begins(self, step: int) -> None:
        if step == self.first:
            self.prof = torch.profiler.profile(activities=_profiler_activities(self.device))
            self.prof.start()

    def step_ends(self, step: int) -> None:
        if self.prof is not None and step == self.first + 1:
            self._finish(2)

    def _finish(self, steps: int) -> None:
        self.prof.stop()
        (self.out / "step_breakdown.json").write_text(
            json.dumps(step_breakdown(self.prof, steps), indent=1))
        self.prof = None

    def __enter__(self) -> StepProfiler:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if self.prof is None:
            return
        if exc_type is None:
            self._finish(1)
        else:
            self.prof.stop()
            self.prof = None


def _profiler_activities(device):
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def peak_memory(dist: Dist) -> dict:
    """Peak allocated and reserved GPU memory of every rank, in GiB."""
    mine = torch.tensor([torch.cuda.max_memory_allocated(dist.device),
                         torch.cuda.max_memory_reserved(dist.device)],
                        dtype=torch.float64, device=dist.device) / 2**30
    if dist.world > 1:
        every = [torch.zeros_like(mine) for _ in range(dist.world)]
        torch.distributed.all_gather(every, mine)
    else:
        every = [mine]
    return {"allocated_gb": [float(t[0]) for t in every],
            "reserved_gb": [float(t[1]) for t in every]}


# GPU kernels by name: first matching category wins
KERNEL_CATEGORIES = (
    ("communication", ("nccl",)),
    ("dequantize", ("dequantize_kernel",)),
    ("quantize", ("quantize_kernel", "quantize_rows32_kernel", "quantize_cols32_kernel",
                  "quantize_gfx950_kernel", "fold_kernel", "fold_rows_kernel",
                  "fold_rows_finish_kernel", "transpose_kernel", "qdq_both_axes_kernel",
                  "columns_kernel")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul")),
    ("attention", ("flash", "fmha", "attention", "attn")),
)


def kernel_category(name: str) -> str:
    low = name.lower()
    for cat, keys in KERNEL_CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def breakdown_from_kernels(kernels: list[tuple[str, float, int]], steps: int) -> dict:
    """GPU milliseconds per step by category from (kernel name, total microseconds, calls).
    Communication overlaps compute under FSDP2, so the categories may add up to more than the
    step time."""
    cats: dict[str, float] = {}
    for name, us, _ in kernels:
        c = kernel_category(name)
        cats[c] = cats.get(c, 0.0) + us / 1e3 / steps
    top = sorted(kernels, key=lambda k: -k[1])[:20]
    return {"steps": steps, "gpu_ms_per_step": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
            "top_kernels": [{"name": n[:160], "category": kernel_category(n),
                             "ms_per_step": us / 1e3 / steps, "calls_per_step": c / steps}
                            for n, us, c in top]}


def step_breakdown(prof, steps: int) -> dict:
    """The GPU breakdown (``breakdown_from_kernels``) and, for the host side, the operations
    the profiler saw on the CPU with the most self time per step (``top_host_ops``: aten ops,
    the ocpmx custom ops with their Python implementations, CUDA runtime calls; under the
    profiler, whose own overhead these times include) and their sum (``host_ops_ms_per_step``)."""
    kernels, host = [], []
    for e in prof.key_averages():
        kind = str(getattr(e, "device_type", ""))
        if kind.endswith("CUDA"):
            us = getattr(e, "self_device_time_total", None)
            if us is None:
                us = getattr(e, "self_cuda_time_total", 0.0)
            if us:
                kernels.append((e.key, float(us), int(e.count)))
        elif kind.endswith("CPU") and e.self_cpu_time_total:
            host.append((e.key, float(e.self_cpu_time_total), int(e.count)))
    out = breakdown_from_kernels(kernels, steps)
    out["host_ops_ms_per_step"] = sum(us for _, us, _ in host) / 1e3 / steps
    out["top_host_ops"] = [{"name": n[:160], "self_ms_per_step": us / 1e3 / steps,
                            "calls_per_step": c / steps}
                           for n, us, c in sorted(host, key=lambda h: -h[1])[:20]]
    return out
