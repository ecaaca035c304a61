"""GPU types: memory and architecture generation, the one table every module reads.

Memory is what the device reports to CUDA as its capacity, in GiB (2**30 bytes, the unit of every
memory estimate and of Megatron's and PyTorch's figures): measured where moetune or a public device
query read it (MEMORY_SOURCES), else the data sheet's GB, which overstates CUDA's figure by about a
percent (the H100's "80 GB" is 79.18 GiB to CUDA, the H200's "141 GB" 139.80). CPUs per
GPU are the hardware threads of NVIDIA's reference system for that GPU (DGX A100: 2x64-core EPYC
7742; DGX H100/H200 and DGX B200: 2x56-core Xeon; DGX B300: 2x64-core Xeon; Grace: 72 cores per
superchip, two per four GPUs on GB200/GB300 NVL72) divided by its GPUs: what a rank gets where
neither the cluster section, the preflight nor Slurm says what a node has.

Rates are the data sheets' dense figures (no sparsity), SXM parts: peak BF16 and FP8 tensor TFLOP/s
(Ampere has no FP8: its BF16 figure), HBM TB/s, and NVLink GB/s per GPU in one direction (half the
data sheet's bidirectional total). The step-time model (experiment/predict) reads them."""
from __future__ import annotations

from typing import NamedTuple


class Gpu(NamedTuple):
    memory_gb: float
    generation: str  # ampere | hopper | blackwell: what kernels and FP8 recipes it runs
    cpus_per_gpu: int  # hardware threads per GPU on the reference node
    bf16_tflops: float = 0.0
    fp8_tflops: float = 0.0
    hbm_tb_s: float = 0.0
    nvlink_gb_s: float = 0.0  # one direction


GPUS: dict[str, Gpu] = {
    "A100": Gpu(80.0, "ampere", 32, 312, 312, 2.04, 300),
    "H100": Gpu(79.18, "hopper", 28, 989, 1979, 3.35, 450),
    "H800": Gpu(79.18, "hopper", 28, 989, 1979, 3.35, 200),
    "H200": Gpu(139.80, "hopper", 28, 989, 1979, 4.8, 450),
    "GH200": Gpu(96.0, "hopper", 72, 989, 1979, 4.0, 450),
    "B200": Gpu(178.35, "blackwell", 28, 2250, 4500, 8.0, 900),
    "B300": Gpu(270.0, "blackwell", 32, 2250, 4500, 8.0, 900),
    "GB200": Gpu(186.0, "blackwell", 36, 2500, 5000, 8.0, 900),
    "GB300": Gpu(279.0, "blackwell", 36, 2500, 5000, 8.0, 900),
}
GPU_TYPES = tuple(GPUS)

# Where each GPU's memory figure comes from; a type not named here has its data sheet's GB.
MEMORY_SOURCES = {
    "H100": "measured by moetune: CUDA's total capacity on the lent H100 SXM machines (PyTorch's "
            "out-of-memory line, benchmarks/one_gpu_tuning)",
    "H800": "the H100's: the same 80 GB HBM3 part (not measured)",
    "H200": "measured by moetune: CUDA's total capacity on the lent H200 SXM machines (PyTorch's "
            "out-of-memory line)",
    "B200": "a public device query (cudaGetDeviceProperties' total global memory: pytorch/ao pull "
            "request 4002)",
}


def memory_gb(gpu_type: str | None) -> float | None:
    gpu = GPUS.get(str(gpu_type or ""))
    return gpu.memory_gb if gpu else None


def memory_source(gpu_type: str) -> str:
    """Where a known type's figure comes from, in a few words: 'as CUDA reports it' or 'data sheet'."""
    return "as CUDA reports it" if gpu_type in MEMORY_SOURCES else "data sheet"


def memory_text(gpu_type: str | None) -> str | None:
    """A known type's memory with its source and unit ('H200 as CUDA reports it: 139.8 GiB', 'B300
    data sheet: 270 GB'); None for an unknown type."""
    gb = memory_gb(gpu_type)
    if not gb or not gpu_type:
        return None
    return f"{gpu_type} {memory_source(gpu_type)}: {gb:g} {'GiB' if gpu_type in MEMORY_SOURCES else 'GB'}"


def generation(gpu_type: str | None, default: str = "unknown") -> str:
    gpu = GPUS.get(str(gpu_type or ""))
    return gpu.generation if gpu else default


def cpus_per_gpu(gpu_type: str | None) -> int | None:
    gpu = GPUS.get(str(gpu_type or ""))
    return gpu.cpus_per_gpu if gpu else None


def stand_ins(gpu_type: str, *fields: str) -> list[str]:
    """`gpu_type` first, then the other types (in the table's order) whose named Gpu fields all equal
    its own: those whose measured tables may stand for it. [] for a type not in the table."""
    g = GPUS.get(gpu_type)
    if g is None:
        return []
    key = [getattr(g, f) for f in fields]
    return [gpu_type] + [t for t, h in GPUS.items() if t != gpu_type and [getattr(h, f) for f in fields] == key]
