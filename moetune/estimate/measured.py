"""A calibration's measured rows (workloads/link_probe.py) as rows of the rate table (rates.py): which
measurement stands for which rate, the message sizes the probe is asked to measure, and the
measured value with its source. A rate no measured row covers keeps its published value.

Shares are of the same hardware figure the model multiplies them by (comm.py: the GPU's NVLink
rate a direction, the NIC's rate), so the model's link time equals the measured one."""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import NamedTuple

from moetune.estimate.flops import BF16, tokens
from moetune.estimate.rates import PUBLISHED, Rates
from moetune.experiment import gpus
from moetune.experiment.config import TrainingConfig
from moetune.experiment.model import ModelArch

LATENCY_BYTES = 4096  # a small message: its time is the link's latency
BANDWIDTH_BYTES = 64 << 20  # a gradient bucket's order: the link's bandwidth


class Source(NamedTuple):
    """One rate from measured rows: rows of `kind` and `ops` over group shape `group`, their bus
    bandwidth (mean of the ops), at the size `size` picks, divided by the hardware figure `of`."""
    kind: str
    ops: tuple[str, ...]
    group: str | None
    size: str  # "a2a": nearest the layout's all-to-all message; "largest"
    of: str | None  # "nvlink" | "nic" | None (the value itself)
    field: str = "busbw_gb_s"


MEASURED_BY: dict[str, Source] = {
    "nic_gb_s": Source("collective", ("all_reduce",), "across", "largest", None),
    "alltoall_nvlink": Source("collective", ("all_to_all",), "node", "a2a", "nvlink"),
    "alltoall_rdma": Source("collective", ("all_to_all",), "across", "a2a", "nic"),
    "collective_nvlink": Source("collective", ("all_gather", "reduce_scatter"), "node", "largest", "nvlink"),
    "collective_rdma": Source("collective", ("all_gather", "reduce_scatter"), "across", "largest", "nic"),
    "deepep_nvlink_dispatch": Source("deep_ep", ("dispatch",), "node", "largest", "nvlink", "gb_s"),
    "deepep_nvlink_combine": Source("deep_ep", ("combine",), "node", "largest", "nvlink", "gb_s"),
    "hybridep_nvlink": Source("hybrid_ep", ("dispatch", "combine"), "node", "largest", "nvlink", "gb_s"),
}
# rows measured on the GPU itself carry over only from a GPU of the cluster's type
ON_GPU = {"deep_ep", "hybrid_ep"}
# the GEMM curve's half size, searched on a log grid from 0.1 to 1000 GFLOP
HALF_GFLOP_GRID = tuple(10 ** (i / 100) for i in range(-100, 301))


def a2a_bytes(m: ModelArch, c: TrainingConfig) -> int:
    """A rank's expert all-to-all send buffer of one micro-batch and layer (comm.a2a's)."""
    return int(tokens(m, c) / c.tp * m.moe_router_topk * m.hidden_size * BF16)


def probe_sizes(m: ModelArch, configs, cap: int) -> list[int]:
    """The message sizes to measure: the latency size, each layout's all-to-all and sequence-parallel
    messages and a bucket's, rounded to a power of two and at most `cap` bytes."""
    sizes = {LATENCY_BYTES, BANDWIDTH_BYTES}
    for c in configs:
        sizes.add(a2a_bytes(m, c))
        sizes.add(int(tokens(m, c) * m.hidden_size * BF16))
    return sorted({min(cap, 1 << max(0, round(math.log2(max(s, 1))))) for s in sizes})


def _pick(rows: list[dict], size: str, want: int | None) -> list[dict]:
    """The rows at the one size the rate reads: the largest, or the nearest `want` (log scale)."""
    sizes = sorted({r.get("bytes", 0) for r in rows})
    if size == "a2a" and want:
        at = min(sizes, key=lambda s: abs(math.log(max(s, 1) / want)))
    else:
        at = sizes[-1]
    return [r for r in rows if r.get("bytes", 0) == at]


def _on_cluster_gpu(record: dict, gpu_type: str) -> bool:
    return record.get("backend") == "nccl" and gpu_type.lower() in str(record.get("device", "")).lower()


def _gflop(row: dict) -> float:
    return row.get("gflop") or 2 * row["n"] ** 3 / 1e9  # a record of the square product only: n^3


def gemm_curve(rows: list[dict], peak_tflops: float, half_at: float) -> tuple[float, float]:
    """(top, half GFLOP) of the curve `top x size / (size + half)` (share of the BF16 peak a GEMM of
    `size` GFLOP reaches) through the measured GEMMs, least squares in
    relative error; with one size only the top moves, through it, and the half stays `half_at`."""
    pts = [(_gflop(r), r["tflop_s"] / peak_tflops) for r in rows]
    if len({f for f, _ in pts}) == 1:
        f, eff = pts[0]
        return eff * (f + half_at) / f, half_at

    def fit(half: float) -> tuple[float, float]:
        xs = [(f / (f + half), eff) for f, eff in pts]
        top = sum(x / y for x, y in xs) / sum((x / y) ** 2 for x, y in xs)
        return sum((top * x / y - 1) ** 2 for x, y in xs), top
    _, top, half = min(fit(h) + (h,) for h in HALF_GFLOP_GRID)
    return top, half


def probe_figures(record: dict, gpu_type: str, half_at: float) -> dict[str, float]:
    """The probe's own figures of one GPU of `gpu_type` in a record, those it has: the GEMM
    sweep's fitted `gemm_top` and `gemm_half_gflop` (gemm_curve; `half_at` for a record of one
    size), the device-to-device copy's `hbm_share` of the HBM rate, a small op's `launch_us`."""
    rows, g = record.get("rows") or [], gpus.GPUS[gpu_type]
    out: dict[str, float] = {}
    gemms = [r for r in rows if r.get("kind") == "gemm" and r.get("tflop_s")]
    if gemms:
        out["gemm_top"], out["gemm_half_gflop"] = gemm_curve(gemms, g.bf16_tflops, half_at)
    d2d = [r["gb_s"] for r in rows if r.get("kind") == "copy" and r.get("op") == "d2d" and r.get("gb_s")]
    if d2d:
        out["hbm_share"] = max(d2d) / (g.hbm_tb_s * 1e3)
    launch = [r["us"] for r in rows if r.get("kind") == "launch" and r.get("us")]
    if launch:
        out["launch_us"] = launch[0]
    return out


# The COMPUTE and HOST rows are what a step's kernels and launches reach on the reference machine;
# a cluster's probe moves them by its figure over the same figure there (rates.REFERENCE), so the
# same probe on the reference machine leaves them as they are: (the rows a figure moves, that
# figure's reference row, whether only a GPU of the cluster's type counts).
RELATIVE = {"gemm_top": (("kernel_table_rate",), "ref_gemm_top", True),  # the kernel table's GEMMs and attention
            "hbm_share": (("hbm_efficiency",), "ref_hbm_share", True),
            # a CUDA launch, any GPU: the host's speed, which the schedule's own passes share
            "launch_us": (("host_us_per_kernel", "host_ms_per_virtual_stage_pass"), "ref_launch_us", False)}


def _relative_rates(record: dict, gpu_type: str, published: Rates, label: str) -> dict[str, tuple[float, str]]:
    if record.get("backend") != "nccl":  # a CPU run's figures say nothing of a GPU or its launches
        return {}
    same_gpu = _on_cluster_gpu(record, gpu_type)
    out = {}
    for figure, value in probe_figures(record, gpu_type, published["ref_gemm_half_gflop"]).items():
        if figure not in RELATIVE:  # the sweep's half size: its top alone compares GPUs
            continue
        rates, ref, gpu_only = RELATIVE[figure]
        if gpu_only and not same_gpu:
            continue
        by = value / published[ref]
        for name in rates:
            out[name] = (published[name] * by, f"measured: {label}: {figure} {value:.4g} against the "
                                               f"reference's {published[ref]:.4g}: x{by:.4g}")
    return out


def measured_rates(record: dict, gpu_type: str, nic_published: float, want_a2a: int | None,
                   label: str) -> dict[str, tuple[float, str]]:
    """{rate name: (value, source)} of the rates the record's rows measure, for a cluster of
    `gpu_type`; `label` names the calibration in each source."""
    g = gpus.GPUS[gpu_type]
    rows = record.get("rows") or []
    out: dict[str, tuple[float, str]] = {}
    nic = nic_published
    for name, src in MEASURED_BY.items():  # nic_gb_s first: the shares of the NIC read it
        if src.kind in ON_GPU and not _on_cluster_gpu(record, gpu_type):
            continue
        found = [r for r in rows if r.get("kind") == src.kind and r.get("op") in src.ops
                 and (src.group is None or r.get("group") == src.group) and r.get(src.field)]
        if not found:
            continue
        found = _pick(found, src.size, want_a2a)
        value = sum(r[src.field] for r in found) / len(found)
        hw = {"nvlink": g.nvlink_gb_s, "nic": nic, None: 1.0}[src.of]
        r = found[0]
        size = f", {int(r['bytes']):d} bytes" if "bytes" in r else ""
        what = (f"{'/'.join(src.ops)} {r.get('ranks', 1)} rank(s) on {r.get('nodes', 1)} node(s)"
                f"{size}: {value:.4g} {src.field}")
        of = f" of {hw:.4g} ({src.of})" if src.of else ""
        out[name] = (value / hw, f"measured: {label}: {what}{of}")
        if name == "nic_gb_s":
            nic = value
    out.update(_relative_rates(record, gpu_type, Rates(), label))
    return out


LINK_TABLES = Path(__file__).resolve().parent / "link_tables"
# the rows a shipped link table sets: NCCL inside one node, which moetune measured on a lent machine
LINK_TABLE_ROWS = ("alltoall_nvlink", "collective_nvlink")


@functools.cache
def _link_record(gpu_type: str) -> dict | None:
    path = LINK_TABLES / f"{gpu_type}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def link_table(gpu_type: str) -> tuple[dict, str] | None:
    """(the link probe's record shipped for this GPU type, its label), or one of a GPU of the same
    generation and NVLink rate (the H100 and H200 SXM: NVLink 4, 18 links, 450 GB/s a direction,
    the same NVSwitch); None: the published rows stand."""
    for other in gpus.stand_ins(gpu_type, "generation", "nvlink_gb_s"):
        record = _link_record(other)
        if record:
            standing = "" if other == gpu_type else f", an {other}'s standing for the {gpu_type}"
            return record, f"link table {other} ({record.get('machine', 'shipped')}{standing})"
    return None


@functools.lru_cache(maxsize=256)
def _shipped_link_rates(gpu_type: str, nic: float, want_a2a: int | None) -> tuple[tuple[str, tuple[float, str]], ...]:
    """The shipped link table's NVLink rows for this GPU type, as (name, (value, source)) pairs: a
    tuple, so no caller can change the cached entry. Cached: the table is constant and plan prices
    thousands of layouts over a few all-to-all sizes."""
    table = link_table(gpu_type)
    if not table:
        return ()
    rows = measured_rates(table[0], gpu_type, nic, want_a2a, table[1])
    return tuple((k, v) for k, v in rows.items() if k in LINK_TABLE_ROWS)


def rates_for(row, cluster, model: ModelArch, config: TrainingConfig) -> tuple[Rates, str | None]:
    """(the rate table with a stored calibration's rows (the store's Calibration, or None) over the
    shipped link table's NVLink rows over the published ones, which calibration or None); one taken
    on another GPU type is not used."""
    nic = next(r.value for r in PUBLISHED if r.name == "nic_gb_s")
    want = a2a_bytes(model, config)
    # a fresh dict over the cached tuple: the calibration's rows below update it
    found: dict[str, tuple[float, str]] = dict(_shipped_link_rates(cluster.gpu_type, nic, want))
    if row is None or (row.gpu_type and row.gpu_type != cluster.gpu_type):
        return Rates(measured=found), None
    label = f"calibration {row.id} of cluster {cluster.name} (job {row.job_id}, {row.created_at})"
    found.update(measured_rates(row.record, cluster.gpu_type, nic, want, label))
    return Rates(measured=found), label
