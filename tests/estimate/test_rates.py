"""estimate/rates.py: the rate table's calibrated rows are what moetune's own measurements
give (benchmarks/predict_calibration.py over the trial bank), each says so, and a measured row
replaces a published one by name."""
import sys

import pytest

from moetune.paths import ROOT
from moetune.estimate import PUBLISHED, Rates, kernels

sys.path.insert(0, str(ROOT / "benchmarks"))
import host_runahead  # noqa: E402
import predict_calibration  # noqa: E402

CALIBRATED = ("hbm_efficiency", "kernels_per_layer", "kernels_per_local_expert", "permute_fusion_launches_removed",
              "deepep_nvlink_dispatch", "deepep_nvlink_combine", "hybridep_nvlink",
              "host_us_per_kernel",
              "cuda_graph_te_launches_removed", "fp8_launch_factor")


def test_calibrated_rows_equal_the_calibration_script():
    """Each calibrated row holds the value the calibration computes now from the trial bank (so
    neither can drift), and its source names moetune's measurement; the host rate's source gives the
    range its trials ran. No row prices GEMMs or attention: the kernel table does."""
    result = predict_calibration.calibrate()["rates"]
    r = Rates()
    for name in CALIBRATED:
        assert r[name] == result[name]["value"], name
        assert r.rows[name].source.startswith("measured by moetune: "), name
    assert not {"gemm_efficiency", "grouped_gemm_efficiency", "attention_efficiency",
                "fp8_matrix_time_factor"} & set(r.rows)
    lo, hi = result["host_us_per_kernel"]["range"]
    assert f"({lo:.0f}-{hi:.0f}; median of {len(result['host_us_per_kernel']['trials'])})" in \
        r.rows["host_us_per_kernel"].source


def test_calibration_reads_no_public_figure():
    """The calibration's trials are moetune's own (trial bank entries), none of the public rows."""
    result = predict_calibration.calibrate()
    assert result["source"] == "data/trial_bank/bank.jsonl"
    for v in result["rates"].values():
        assert v["trials"] and all("/" not in t for t in v["trials"])


def test_a_measured_row_replaces_a_published_one():
    """A calibration's row replaces the published one by name, with its own source; an unknown
    name is refused."""
    r = Rates(measured={"nic_gb_s": (25.0, "calibration of cluster x")})
    assert r["nic_gb_s"] == 25.0 and r.rows["nic_gb_s"].source == "calibration of cluster x"
    assert Rates()["nic_gb_s"] == next(p.value for p in PUBLISHED if p.name == "nic_gb_s")
    with pytest.raises(KeyError, match="no such rate"):
        Rates(measured={"warp_speed": (1.0, "x")})


def test_reference_rows_equal_the_probe_runs_on_the_reference_machine():
    """rates.REFERENCE holds the medians predict_calibration.reference computes now from the
    stored probe runs (so neither can drift), each says it is moetune's own measurement and on which
    machine: the GEMM figures the H200's of the kernel table, HBM and launches the H100's of the
    trials."""
    ref = predict_calibration.reference()
    r = Rates()
    assert set(ref) == {"ref_gemm_top", "ref_gemm_half_gflop", "ref_hbm_share", "ref_launch_us"}
    for name, v in ref.items():
        assert r[name] == v["value"], name
        assert len(v["runs"]) >= 3 and min(v["runs"]) <= v["value"] <= max(v["runs"]), name
        assert r.rows[name].source.startswith("measured by moetune: "), name
        assert v["source"] in r.rows[name].source and v["gpu"] in r.rows[name].source, name
    assert ref["ref_gemm_top"]["gpu"] == kernels.REFERENCE_GPU


def test_the_host_wait_curve_equals_the_replay_of_its_trace():
    """rates.CURVES host_wait_excess holds what benchmarks/host_runahead.py replays now from the
    trace benchmarks/host_runahead/moe_proxy_te_1gpu (so neither can drift), and its source says it
    is moetune's own."""
    c = Rates().curve("host_wait_excess")
    assert c.points == host_runahead.curve()
    assert c.source.startswith("measured by moetune: ") and host_runahead.CURVE_TRACE.name.split(".")[0] in c.source
