"""The rates the step-time model divides by: link speeds and efficiencies, one table of rows, each
with its source. A cluster's own measurement (a calibration) replaces a row by its name; a
prediction says which rows it used and where each came from.

Link rows are shares of a hardware figure of the GPU table (experiment/gpus.py: NVLink per direction,
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
_MEASURED = "measured by moetune: data/trial_bank/bank.jsonl"
_FLEX = ("measured by moetune: benchmarks/results/comm_4gpu.json (4 H200, NVLink, micro batch 4, no overlap), "
         "the bytes sent a step over the trace's all-to-all transfer (benchmarks/predict_calibration.py flex_nvlink)")
# The rows by what they price: links, compute, the host, and how much overlap hides
LINKS: tuple[Rate, ...] = (
    Rate("nic_gb_s", 48.5, "GB/s", "a 400 Gb/s NIC a GPU (DGX H100/H200), about 48-49 GB/s bus bandwidth "
         "in nccl-tests"),
    # DeepEP and HybridEP inside a domain, from the 4-H200 sweep's traces: the bytes the model counts
    # (one copy a peer rank) over the all-to-all's transfer, its kernels' own work in it (141 and
    # 263 GB/s; DeepEP's README measured 153 GB/s of deduplicated bytes on an H800 at EP 8)
    Rate("deepep_nvlink_dispatch", 0.3131, "share", f"{_FLEX}: DeepEP at EP 4, dispatch and combine together"),
    Rate("deepep_nvlink_combine", 0.3131, "share", f"{_FLEX}: DeepEP at EP 4, dispatch and combine together"),
    Rate("deepep_rdma_dispatch", 51 / 50, "share", f"{_DEEPEP}: 43-58 GB/s at EP 16-64 (51 at EP 64) "
         "of a 50 GB/s NIC"),
    Rate("deepep_rdma_combine", 50 / 50, "share", f"{_DEEPEP}: 43-57 GB/s at EP 16-64 (50 at EP 64) "
         "of a 50 GB/s NIC"),
    Rate("hybridep_nvlink", 0.5849, "share", f"{_FLEX}: HybridEP at EP 4, dispatch and combine together"),
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
    # measured by moetune (benchmarks/predict_calibration.py over the trial bank's traces; its
    # output benchmarks/results/predict_calibration.json)
    Rate("hbm_efficiency", 0.3026, "share", f"{_MEASURED}: the model's element-wise bytes over the trace's "
         "other kernel time (norms, activations, permutation, casts, optimizer), median of the H100 one-GPU "
         "trials without CUDA graphs"),
    Rate("kernel_table_rate", 1.0, "share", "measured by moetune: the kernel table's rates as its probe timed "
         "them (1); a cluster's calibration moves them by its GEMM sweep over the reference machine's; "
         "what a prediction's band moves them by"),
)
OVERLAP: tuple[Rate, ...] = (
    Rate("tp_overlap_hidden", 0.8, "share", "assumed share of TP collectives --tp-comm-overlap hides"),
    # measured as an A/B of one layout on 4 H200 (benchmarks/results/comm_4gpu.json: Qwen3-30B-A3B's
    # shapes, 16 layers, EP 4, micro batch 4, two micro-batches a step, the GPU setting the pace):
    # the overlap took 85.2 ms off a 1494.4 ms step whose all-to-all moved data for 240.7 ms; only
    # the micro-batches that run beside another's can hide theirs (step.ep_overlapped_share: half
    # of them here), so it hid 0.71 of what it could. Through host memory (NCCL_P2P_DISABLE=1, a
    # cross-node-like link, where the all-to-all outgrew the compute) it hid 0.13. Every A/B so far
    # ran with one CUDA connection (CUDA_DEVICE_MAX_CONNECTIONS=1, the sweep harness's default then;
    # Megatron asks for more for this overlap): with routing forced to balance the same pair hid
    # -0.66 over NVLink (it cost 60 ms) and 0.60 through host memory. The band runs down to nothing
    Rate("ep_overlap_hidden", 0.708, "share", "measured by moetune: benchmarks/results/comm_4gpu.json, EP 4 on "
         "4 H200 over NVLink: the share of the all-to-all beside another micro-batch's compute that "
         "--overlap-moe-expert-parallel-comm hid"),
)
HOST: tuple[Rate, ...] = (
    # TE's grouped GEMM launches each local expert's GEMMs (and, without gradient-accumulation fusion,
    # its gradient adds): a layer's launches grow with the experts a rank holds
    Rate("kernels_per_layer", 107.9592, "kernels", f"{_MEASURED} and benchmarks/results/comm_2gpu.json: launches "
         "a step per micro-batch and layer less kernels_per_local_expert's, least squares over moetune's traces "
         "without CUDA graphs or permute fusion (a fused trial's count with the fusion's launches added back) at 1, "
         "8 and 64 local experts (the H100 one-GPU trials, 99-176; the 2-H200 sweep's baseline, 515)"),
    Rate("kernels_per_local_expert", 6.3921, "kernels", f"{_MEASURED} and benchmarks/results/comm_2gpu.json: "
         "launches a step per micro-batch, MoE layer and expert the rank holds, the same least squares"),
    Rate("permute_fusion_launches_removed", 10.0, "kernels", f"{_MEASURED}: launches a MoE layer and micro-batch "
         "--moe-permute-fusion removes, qwen3_235b one-GPU trials 5 and 6 (the same layout without and with it)"),
    # A host-bound step's time over its launches, with no profiler in its way: the logs' iterations
    # outside nsys's capture (inside it the CUDA API's tracing slowed these steps 12-27 %). Not the
    # probe's 6.9 us launch: the host's Python, autograd and TE work between two launches is in it.
    # The CPUs a rank has do not enter: pinned to 2, 4 and 8 of 16 cores the one-GPU H200 host ran
    # 0.83-1.08 of its unpinned steps (benchmarks/results/host_cost.json), the 4-GPU host no faster
    # from 4 to 16 cores a rank (comm_4gpu.json host_cpus). Gradient-accumulation fusion cut that
    # layout's launches by 10 % (one a TE weight: step.grad_accumulation_fused) and its step to
    # 0.82-1.08 of its call's unfused runs, not resolved above their drift
    Rate("host_us_per_kernel", 82.96, "us", f"{_MEASURED}: the untraced step time over launches of the "
         "host-bound (GPU busy under half) H100 one-GPU trials (74-132; median of 7); the one-GPU H200 "
         "host with no profiler at all 64-90 (benchmarks/results/host_cost.json)"),
    # Measured with a training entry that reads a batch where Megatron's pretrain_gpt does (the first
    # stage's first virtual stage, the last's last): one reading a batch on every virtual stage, with a
    # seq x seq mask a sample, had made it 2-4 ms on the same shapes
    Rate("host_ms_per_virtual_stage_pass", 0.38, "ms", "measured by moetune: benchmarks/results/host_cost.json "
         "virtual_stages: one host-bound rank of PP 4 (Qwen3-30B-A3B, 4 or 8 layers, 8 micro-batches) at 2 and 4 "
         "virtual stages against 1, on one H100 host, the step's growth over the passes added (median of the "
         "11 steady pairs, 0.19-1.0; about 4 launches a pass, the rest the schedule's own host work)"),
    Rate("cuda_graph_te_launches_removed", 0.4251, "share", f"{_MEASURED}: launches TE CUDA graphs of attn, "
         "moe_router and moe_preprocess remove, qwen3_30b_a3b one-GPU trials 1 and 2 (split evenly "
         "among the scopes where fewer are graphed: assumed)"),
    Rate("fp8_launch_factor", 1.2059, "share", f"{_MEASURED}: launches with FP8 over BF16, trial bank "
         "te_gg_fp8 against te_gg (H200)"),
)
# The calibration probe (workloads/link_probe.py) on the machines the COMPUTE and HOST rows were measured
# on: a cluster's calibration moves those rows by its own probe's figures over these, since the rows
# are what a training step's kernels and launches reach there, which no probe measures directly. The
# GEMM figures are the H200's the kernel table was measured on; HBM and launches the H100's of the trials.
_REF = ("measured by moetune: the calibration probe, median of 4 runs in one call "
        "(benchmarks/predict_calibration.py reference)")
_H200 = f"{_REF} on the H200 device machine of the kernel table (benchmarks/calibration_h200)"
_H100 = f"{_REF} on the H100 device machine of the trials (benchmarks/calibration_h100)"
REFERENCE: tuple[Rate, ...] = (
    Rate("ref_gemm_top", 0.7075, "share", f"{_H200}: its GEMM sweep's fitted top (measured.gemm_curve)"),
    Rate("ref_gemm_half_gflop", 4.3155, "GFLOP", f"{_H200}: its GEMM sweep's fitted half size"),
    Rate("ref_hbm_share", 0.8829, "share", f"{_H100}: device-to-device copy over the data sheet's HBM rate"),
    Rate("ref_launch_us", 6.8778, "us", f"{_H100}: a small eager op's launch (host_us_per_kernel's host)"),
)
PUBLISHED: tuple[Rate, ...] = LINKS + COMPUTE + HOST + OVERLAP + REFERENCE


@dataclass(frozen=True)
class Curve:
    """A rate that depends on a ratio: (x, y) points, read between them on a straight line and held
    at the ends."""
    name: str
    points: tuple[tuple[float, float], ...]
    source: str

    def at(self, x: float) -> float:
        pts = ((0.0, 0.0),) + self.points if self.points[0][0] > 0 else self.points
        if x >= pts[-1][0]:
            return pts[-1][1]
        i = next(i for i, (px, _) in enumerate(pts) if px > x)
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def to_dict(self) -> dict:
        return {"points": [list(p) for p in self.points], "unit": "curve", "source": self.source}


CURVES: tuple[Curve, ...] = (
    # benchmarks/host_runahead.py: two Qwen3-30B-A3B layers on one H100 (TE, grouped GEMM, the
    # dropless all-to-all dispatcher, whose token counts the host waits for), its host's launches
    # and waits replayed against its kernels with the host scaled
    Curve("host_wait_excess", ((0.1, 0.0025), (0.2, 0.0074), (0.3, 0.0198), (0.4, 0.0422), (0.5, 0.0737),
                               (0.6, 0.1116), (0.7, 0.1504), (0.8, 0.1882), (0.9, 0.2243), (1.0, 0.2611),
                               (1.1, 0.1806), (1.2, 0.1204), (1.4, 0.0513), (1.6, 0.0184), (2.0, 0.0087),
                               (3.0, 0.0021), (5.0, 0.0008), (10.0, 0.0003)),
          "measured by moetune: benchmarks/host_runahead/qwen3_30b_a3b_2layer_1gpu.sqlite.xz (two "
          "Qwen3-30B-A3B layers on one H100, TE, grouped GEMM, dropless): a micro-batch's time over "
          "the larger of its host's launch time and its stream's, against host / stream, the trace's "
          "launches and waits replayed with the host scaled (benchmarks/host_runahead.py)"),
)


class Rates:
    """The rows a prediction reads, by name; `measured` rows (a calibration's) replace published ones."""

    def __init__(self, rows=PUBLISHED, measured: dict[str, tuple[float, str]] | None = None,
                 curves=CURVES):
        self.rows = {r.name: r for r in rows}
        self.curves = {c.name: c for c in curves}
        for name, (value, source) in (measured or {}).items():
            if name not in self.rows:
                raise KeyError(f"{name}: no such rate; known: {', '.join(sorted(self.rows))}")
            self.rows[name] = replace(self.rows[name], value=value, source=source)

    def __getitem__(self, name: str) -> float:
        return self.rows[name].value

    def curve(self, name: str) -> Curve:
        return self.curves[name]

    def to_dict(self) -> dict:
        return {**{n: r.to_dict() for n, r in self.rows.items()}, **{n: c.to_dict() for n, c in self.curves.items()}}
