"""The rates the step-time model divides by: link speeds and efficiencies, one table of rows, each
with its source. A cluster's own measurement (a calibration) replaces a row by its name; a
prediction says which rows it used and where each came from.

Link rows are shares of a hardware figure of the GPU table (spec/gpus.py: NVLink per direction,
HBM) or of the NIC's rate, so that one published measurement on one GPU carries over to another.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Rate:
    name: str
    value: float
    unit: str  # "share" of a hardware figure, "GB/s", "us", "kernels"
    source: str

    def to_dict(self) -> dict:
        return {"value": self.value, "unit": self.unit, "source": self.source}


# DeepEP's README, normal kernels on H800 (about 160 GB/s of NVLink measured, data sheet 200 GB/s a
# direction; one CX7 400 Gb/s NIC a GPU, about 50 GB/s): intranode EP 8 dispatch 153, combine 158
# GB/s; internode dispatch 43/58/51 and combine 43/57/50 GB/s at EP 16/32/64.
_DEEPEP = "DeepEP README, normal kernels on H800"
# The rows by what they price: links, compute, the host, and how much overlap hides
LINKS: tuple[Rate, ...] = (
    Rate("nic_gb_s", 48.5, "GB/s", "a 400 Gb/s NIC a GPU (DGX H100/H200), about 48-49 GB/s bus bandwidth "
         "in nccl-tests"),
    Rate("deepep_nvlink_dispatch", 153 / 200, "share", f"{_DEEPEP}: 153 GB/s at EP 8 of 200 GB/s NVLink"),
    Rate("deepep_nvlink_combine", 158 / 200, "share", f"{_DEEPEP}: 158 GB/s at EP 8 of 200 GB/s NVLink"),
    Rate("deepep_rdma_dispatch", 51 / 50, "share", f"{_DEEPEP}: 43-58 GB/s at EP 16-64 (51 at EP 64) "
         "of a 50 GB/s NIC"),
    Rate("deepep_rdma_combine", 50 / 50, "share", f"{_DEEPEP}: 43-57 GB/s at EP 16-64 (50 at EP 64) "
         "of a 50 GB/s NIC"),
    Rate("hybridep_nvlink", 153 / 200, "share", "assumed DeepEP's dispatch rate until measured"),
    Rate("hybridep_rdma", 50 / 50, "share", "assumed DeepEP's combine rate until measured"),
    Rate("alltoall_nvlink", 0.5, "share", "assumed: NCCL all-to-all of MoE-sized messages inside a node, "
         "a default until measured"),
    Rate("alltoall_rdma", 0.75, "share", "assumed: NCCL all-to-all across nodes, of the NIC's rate, "
         "a default until measured"),
    Rate("collective_nvlink", 0.8, "share", "assumed: NCCL all-gather/reduce-scatter bus bandwidth "
         "inside a node, of NVLink's rate a direction"),
    Rate("collective_rdma", 1.0, "share", "NCCL ring collectives across nodes reach the NIC's "
         "nccl-tests rate (nic_gb_s)"),
)
COMPUTE: tuple[Rate, ...] = (
    Rate("gemm_efficiency", 0.6, "share", "assumed share of the data sheet's dense tensor TFLOP/s "
         "that Transformer Engine's GEMMs reach at training shapes"),
    Rate("grouped_gemm_efficiency", 0.45, "share", "assumed: grouped expert GEMMs, smaller and uneven "
         "per expert"),
    Rate("attention_efficiency", 0.45, "share", "assumed: fused (flash) attention, causal"),
    Rate("hbm_efficiency", 0.7, "share", "assumed share of the data sheet's HBM bandwidth that "
         "element-wise kernels reach"),
)
OVERLAP: tuple[Rate, ...] = (
    Rate("tp_overlap_hidden", 0.8, "share", "assumed share of TP collectives --tp-comm-overlap hides"),
    Rate("ep_overlap_hidden", 0.8, "share", "assumed share of the expert all-to-all that "
         "--overlap-moe-expert-parallel-comm hides behind the other micro-batch's compute"),
)
HOST: tuple[Rate, ...] = (
    Rate("kernels_per_layer", 176, "kernels", "moetune's one-GPU study of qwen3_30b_a3b on an H100 "
         "(benchmarks/one_gpu_tuning, baseline trial: 33,871 kernels a step of 4 micro-batches, 48 "
         "layers), forward and backward"),
    Rate("host_us_per_kernel", 20.0, "us", "assumed for a DGX-class host; the GPU machine's 16 vCPUs "
         "launched one kernel every 88 us (the same trial), which the cluster's calibration replaces"),
    Rate("min_cpus_per_rank", 4, "cpus", "assumed: a rank's Python thread, its data loader and NCCL's "
         "proxy threads; fewer slow the host in proportion"),
)
PUBLISHED: tuple[Rate, ...] = LINKS + COMPUTE + HOST + OVERLAP


class Rates:
    """The rows a prediction reads, by name; `measured` rows (a calibration's) replace published ones."""

    def __init__(self, rows=PUBLISHED, measured: dict[str, tuple[float, str]] | None = None):
        self.rows = {r.name: r for r in rows}
        for name, (value, source) in (measured or {}).items():
            if name not in self.rows:
                raise KeyError(f"{name}: no such rate; known: {', '.join(sorted(self.rows))}")
            self.rows[name] = replace(self.rows[name], value=value, source=source)

    def __getitem__(self, name: str) -> float:
        return self.rows[name].value

    def to_dict(self) -> dict:
        return {n: r.to_dict() for n, r in self.rows.items()}
