"""estimate/measured.py: a calibration's rows as rates, on hand-made records: each rate is
the measured figure over the hardware figure the model multiplies it by, the all-to-all read at
the size nearest the layout's message, the NIC's shares of the measured NIC, GPU rows only from a
GPU of the cluster's type, and the sizes the probe is asked for."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from moetune.experiment.config import TrainingConfig
from moetune.experiment.schema import load_experiment
from moetune.paths import ROOT
from moetune.estimate.measured import (LINK_TABLE_ROWS, a2a_bytes, gemm_curve, link_table, measured_rates,
                                       probe_sizes, rates_for)
from moetune.estimate.rates import Rates


def _coll(op, group, nbytes, busbw, ranks=8, nodes=1):
    return {"kind": "collective", "op": op, "group": group, "bytes": nbytes, "busbw_gb_s": busbw,
            "ranks": ranks, "nodes": nodes, "us": 1.0}


RECORD = {"backend": "nccl", "device": "NVIDIA H100 80GB HBM3", "rows": [
    _coll("all_to_all", "node", 1 << 20, 100.0), _coll("all_to_all", "node", 64 << 20, 300.0),
    _coll("all_to_all", "across", 64 << 20, 30.0, 2, 2),
    _coll("all_reduce", "across", 1 << 20, 10.0, 2, 2), _coll("all_reduce", "across", 64 << 20, 40.0, 2, 2),
    _coll("all_gather", "node", 64 << 20, 350.0), _coll("reduce_scatter", "node", 64 << 20, 330.0),
    {"kind": "gemm", "op": "matmul", "tflop_s": 700.0, "us": 1.0, "n": 8192},
    {"kind": "copy", "op": "d2d", "bytes": 1 << 28, "gb_s": 2680.0, "us": 1.0},
    {"kind": "deep_ep", "op": "dispatch", "group": "node", "bytes": 1 << 26, "gb_s": 150.0, "us": 1.0},
    {"kind": "hybrid_ep", "op": "dispatch", "group": "node", "bytes": 1 << 26, "gb_s": 120.0, "us": 1.0},
    {"kind": "hybrid_ep", "op": "combine", "group": "node", "bytes": 1 << 26, "gb_s": 140.0, "us": 1.0},
]}


def test_each_rate_is_the_measurement_over_its_hardware_figure():
    """H100 (450 GB/s NVLink a direction, 989 BF16 TFLOP/s, 3.35 TB/s): NIC 40 GB/s (all-reduce
    across, largest size); all-to-all across 30/40 of it; inside a node 300/450 at 64 MiB, 100/450
    for a 1 MiB message; all-gather/reduce-scatter their mean; DeepEP's dispatch 150/450 (its
    combine, unmeasured, absent); HybridEP the mean of its two, 130/450. The trace-measured rates
    move by the probe's figure over the reference machine's: the one GEMM size's efficiency (its
    curve through it at the reference half) over the reference top, HBM 2680/3350 over the
    reference share; the kernel table's rate by it too (the same figure as the reference's moves
    nothing); every source says measured and names the label."""
    got = measured_rates(RECORD, "H100", 48.5, 64 << 20, "cal 1")
    pub = Rates()
    f = 2 * 8192 ** 3 / 1e9
    by_top = 700 / 989 * (f + pub["ref_gemm_half_gflop"]) / f / pub["ref_gemm_top"]
    want = {"nic_gb_s": 40.0, "alltoall_rdma": 30 / 40, "alltoall_nvlink": 300 / 450, "collective_nvlink": 340 / 450,
            "kernel_table_rate": by_top,
            "hbm_efficiency": pub["hbm_efficiency"] * 2680 / 3350 / pub["ref_hbm_share"],
            "deepep_nvlink_dispatch": 150 / 450, "hybridep_nvlink": 130 / 450}
    assert {k: v for k, (v, _) in got.items()} == pytest.approx(want)
    assert all(s.startswith("measured: cal 1: ") for _, s in got.values())
    small = measured_rates(RECORD, "H100", 48.5, 900_000, "cal 1")
    assert small["alltoall_nvlink"][0] == pytest.approx(100 / 450)


def test_rows_of_another_gpu_or_of_cpu_leave_the_gpu_rates_published():
    """The same rows from an H200, and from gloo on CPU: the links are taken, the GEMM, HBM, DeepEP
    and HybridEP rates are not."""
    for record in ({**RECORD, "device": "NVIDIA H200"}, {**RECORD, "backend": "gloo", "device": "cpu"}):
        got = measured_rates(record, "H100", 48.5, None, "x")
        assert not {"kernel_table_rate", "hbm_efficiency", "deepep_nvlink_dispatch",
                    "hybridep_nvlink", "host_us_per_kernel"} & set(got)
        assert {"nic_gb_s", "alltoall_nvlink", "alltoall_rdma", "collective_nvlink"} <= set(got)


def test_a_stored_calibration_applies_to_its_gpu_type_only():
    """rates_for: no row, or a row taken on another GPU type, names no calibration; a row of the
    cluster's type replaces what it measured and names the calibration."""
    exp = load_experiment("qwen3_30b_a3b")
    cluster = exp.cluster
    row = SimpleNamespace(id=7, gpu_type=cluster.gpu_type, job_id="42", created_at="t", record=RECORD)
    assert rates_for(None, cluster, exp.model, exp.baseline)[1] is None
    other = SimpleNamespace(**{**vars(row), "gpu_type": "B200"})
    assert rates_for(other, cluster, exp.model, exp.baseline)[1] is None
    rates, label = rates_for(row, cluster, exp.model, exp.baseline)
    assert label.startswith(f"calibration 7 of cluster {cluster.name}")
    assert rates["nic_gb_s"] == 40.0 and rates.rows["nic_gb_s"].source.startswith("measured:")
    assert not rates.rows["ep_overlap_hidden"].source.startswith("measured:")


def test_without_a_calibration_the_shipped_link_table_sets_nvlinks_rows_only():
    """An H100 cluster with no calibration reads NCCL's NVLink rows from the H200's shipped link
    table (same NVLink), each the probe's bus bandwidth at the size nearest the layout's all-to-all
    over NVLink's 450 GB/s, never above what it measured; every other row stays published; a
    stored calibration's rows win over the table's; a GPU of another NVLink has no table."""
    exp = load_experiment("qwen3_30b_a3b")
    rates, label = rates_for(None, exp.cluster, exp.model, exp.baseline)
    assert label is None
    record, table = link_table("H100")
    assert "H200" in table and "standing for the H100" in table
    busbw = {r["op"]: r["busbw_gb_s"] for r in record["rows"] if r["bytes"] == max(record["sizes"])}
    for name in LINK_TABLE_ROWS:
        assert rates.rows[name].source.startswith(f"measured: {table}")
        assert rates[name] <= max(busbw.values()) / 450
    assert rates["collective_nvlink"] == pytest.approx((busbw["all_gather"] + busbw["reduce_scatter"]) / 2 / 450)
    assert not {n for n, r in rates.rows.items() if r.source.startswith("measured:")} - set(LINK_TABLE_ROWS)
    row = SimpleNamespace(id=7, gpu_type=exp.cluster.gpu_type, job_id="42", created_at="t", record=RECORD)
    calibrated, _ = rates_for(row, exp.cluster, exp.model, exp.baseline)
    assert calibrated.rows["alltoall_nvlink"].source.startswith("measured: calibration 7")
    # the table's rows are cached: the calibration's update above must not have reached the cache
    again, _ = rates_for(None, exp.cluster, exp.model, exp.baseline)
    assert {n: again.rows[n].source for n in LINK_TABLE_ROWS} == {n: rates.rows[n].source for n in LINK_TABLE_ROWS}
    assert link_table("B200") is None


def test_probe_sizes_are_the_layouts_messages_as_powers_of_two_under_the_cap():
    """qwen3_30b_a3b's baseline: its all-to-all message (tokens / TP x top-k x hidden x 2 bytes) and
    its sequence-parallel message, rounded to a power of two, beside the 4 KiB latency size and a
    64 MiB bucket; a cap keeps every size at or under it."""
    exp = load_experiment("qwen3_30b_a3b")
    c: TrainingConfig = exp.baseline
    m = exp.model
    a2a = (c.seq_length or m.seq_length) * c.micro_batch / c.tp * m.moe_router_topk * m.hidden_size * 2
    assert a2a_bytes(m, c) == int(a2a)
    sizes = probe_sizes(m, [c], 1 << 40)
    assert 4096 in sizes and 64 << 20 in sizes and all(s & (s - 1) == 0 for s in sizes)
    assert any(s / 2 ** 0.5 <= a2a <= s * 2 ** 0.5 for s in sizes)
    assert max(probe_sizes(m, [c], 1 << 20)) == 1 << 20


def _sweep(top: float, half: float) -> list[dict]:
    out = []
    for gflop in (3.2, 8.6, 12.9, 34.4, 103.1, 412.3, 1649.3):
        eff = top * gflop / (gflop + half)
        out.append({"kind": "gemm", "op": "mnk", "gflop": gflop, "tflop_s": eff * 989, "us": 1.0})
    return out


def test_gemm_curve_recovers_the_curve_a_sweep_was_drawn_from():
    """gemm_curve: GEMMs drawn from top 0.74, half at 10 GFLOP (on the search grid) give back both;
    one size alone moves only the top, through that point, at the half it is given."""
    top, half = gemm_curve(_sweep(0.74, 10.0), 989, 4.9)
    assert (top, half) == (pytest.approx(0.74, rel=1e-6), pytest.approx(10.0, rel=1e-6))
    one = [{"gflop": 100.0, "tflop_s": 0.5 * 989}]
    top, half = gemm_curve(one, 989, 25.0)
    assert half == 25.0 and top * 100 / 125 == pytest.approx(0.5)


def test_a_cluster_probe_moves_the_trace_rates_by_its_ratio_to_the_reference_machine():
    """A reference-machine run (benchmarks/calibration_h100/run1.json) against the same run with
    every GEMM twice as fast, launches 1.5 times as long and copies 10 % slower: the kernel table's
    rate doubles, host_us_per_kernel and the host's time a virtual-stage pass (the same host's
    speed) grow 1.5 times, HBM falls 10 %; the ratio is what moves,
    whatever the reference's own figures."""
    run = json.loads((ROOT / "benchmarks" / "calibration_h100" / "run1.json").read_text())
    other = json.loads(json.dumps(run))
    for r in other["rows"]:
        if r["kind"] == "gemm":
            r["tflop_s"] *= 2
        elif r["kind"] == "launch":
            r["us"] *= 1.5
        elif r["kind"] == "copy":
            r["gb_s"] *= 0.9
    a = {k: v for k, (v, _) in measured_rates(run, "H100", 48.5, None, "a").items()}
    b = {k: v for k, (v, _) in measured_rates(other, "H100", 48.5, None, "b").items()}
    assert set(a) == {"kernel_table_rate", "hbm_efficiency", "host_us_per_kernel", "host_ms_per_virtual_stage_pass"}
    assert b["kernel_table_rate"] / a["kernel_table_rate"] == pytest.approx(2.0, rel=1e-6)
    assert b["host_us_per_kernel"] / a["host_us_per_kernel"] == pytest.approx(1.5)
    assert b["host_ms_per_virtual_stage_pass"] / a["host_ms_per_virtual_stage_pass"] == pytest.approx(1.5)
    assert b["hbm_efficiency"] / a["hbm_efficiency"] == pytest.approx(0.9)
    # and the reference's own run stays near the published rates (the reference is its runs' median)
    pub = Rates()
    for k in ("kernel_table_rate", "hbm_efficiency"):
        assert a[k] == pytest.approx(pub[k], rel=0.05), k
