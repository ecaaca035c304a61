"""GPU types: memory and architecture generation, the one table every module reads.

Memory is what the device reports to CUDA as its capacity, in GB (NVIDIA's data sheets)."""
from __future__ import annotations

from typing import NamedTuple


class Gpu(NamedTuple):
    memory_gb: float
    generation: str  # ampere | hopper | blackwell: what kernels and FP8 recipes it runs


GPUS: dict[str, Gpu] = {
    "A100": Gpu(80.0, "ampere"),
    "H100": Gpu(80.0, "hopper"),
    "H800": Gpu(80.0, "hopper"),
    "H200": Gpu(141.0, "hopper"),
    "GH200": Gpu(96.0, "hopper"),
    "B200": Gpu(180.0, "blackwell"),
    "B300": Gpu(270.0, "blackwell"),
    "GB200": Gpu(186.0, "blackwell"),
    "GB300": Gpu(279.0, "blackwell"),
}
GPU_TYPES = tuple(GPUS)


def memory_gb(gpu_type: str | None) -> float | None:
    gpu = GPUS.get(str(gpu_type or ""))
    return gpu.memory_gb if gpu else None


def generation(gpu_type: str | None, default: str = "unknown") -> str:
    gpu = GPUS.get(str(gpu_type or ""))
    return gpu.generation if gpu else default
