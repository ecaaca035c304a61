"""GPU types: memory and architecture generation, the one table every module reads.

Memory is what the device reports to CUDA as its capacity, in GB (NVIDIA's data sheets). CPUs per
GPU are the hardware threads of NVIDIA's reference system for that GPU (DGX A100: 2x64-core EPYC
7742; DGX H100/H200 and DGX B200: 2x56-core Xeon; DGX B300: 2x64-core Xeon; Grace: 72 cores per
superchip, two per four GPUs on GB200/GB300 NVL72) divided by its GPUs: what a rank gets where
neither the cluster section, the preflight nor Slurm says what a node has."""
from __future__ import annotations

from typing import NamedTuple


class Gpu(NamedTuple):
    memory_gb: float
    generation: str  # ampere | hopper | blackwell: what kernels and FP8 recipes it runs
    cpus_per_gpu: int  # hardware threads per GPU on the reference node


GPUS: dict[str, Gpu] = {
    "A100": Gpu(80.0, "ampere", 32),
    "H100": Gpu(80.0, "hopper", 28),
    "H800": Gpu(80.0, "hopper", 28),
    "H200": Gpu(141.0, "hopper", 28),
    "GH200": Gpu(96.0, "hopper", 72),
    "B200": Gpu(180.0, "blackwell", 28),
    "B300": Gpu(270.0, "blackwell", 32),
    "GB200": Gpu(186.0, "blackwell", 36),
    "GB300": Gpu(279.0, "blackwell", 36),
}
GPU_TYPES = tuple(GPUS)


def memory_gb(gpu_type: str | None) -> float | None:
    gpu = GPUS.get(str(gpu_type or ""))
    return gpu.memory_gb if gpu else None


def generation(gpu_type: str | None, default: str = "unknown") -> str:
    gpu = GPUS.get(str(gpu_type or ""))
    return gpu.generation if gpu else default


def cpus_per_gpu(gpu_type: str | None) -> int | None:
    gpu = GPUS.get(str(gpu_type or ""))
    return gpu.cpus_per_gpu if gpu else None
