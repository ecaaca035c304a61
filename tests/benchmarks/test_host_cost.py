"""benchmarks/host_cost.py: the host's cost a launch from the one-GPU H200 runs in
benchmarks/host_cost/, the record rates.py's host_us_per_kernel cites."""
import json
import sys

import pytest

from moetune.estimate import Rates
from moetune.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import host_cost  # noqa: E402


@pytest.fixture(scope="module")
def record():
    """What the script computes from the committed logs and traces, read once for the module (the
    tests only read it)."""
    return host_cost.measure()


def test_a_run_name_says_profiler_fusion_and_cores():
    assert host_cost.kind("plain_again") == {"profiler": "none", "fusion": False, "cores": 16}
    assert host_cost.kind("gaf_nsys") == {"profiler": "nsys", "fusion": True, "cores": 16}
    assert host_cost.kind("cpus2") == {"profiler": "none", "fusion": False, "cores": 2}


def test_the_committed_record_is_what_the_runs_give_now(record):
    """benchmarks/results/host_cost.json holds what the script computes from the committed logs and
    traces (neither can drift), and every run of ORDER was read."""
    assert json.loads((ROOT / "benchmarks" / "results" / "host_cost.json").read_text()) == \
        json.loads(json.dumps(record))
    assert len(record["runs"]) == sum(len(v) for v in host_cost.ORDER.values())


def test_fusion_saves_one_add_a_te_weight_and_tracing_slows_the_host(record):
    """The fused trace launches fewer kernels a step by one gradient add for each weight TE
    accumulates itself (attention's two, each local expert's two), the same every captured
    iteration; nsys slows the step outside its capture and more inside it."""
    s = record["summary"]
    assert s["fusion_launches_saved"]["per_layer_and_micro_batch"] == 2 + 2 * host_cost.LOCAL_EXPERTS
    for r in record["runs"]:
        if "traced" in r:
            assert len({t["launches"] for t in r["traced"]}) == 1
            assert 1 < r["over_no_profiler"] < r["captured_over_no_profiler"]


def test_the_rate_table_cites_this_record_and_no_cpu_ratio(record):
    """host_us_per_kernel's source gives the no-profiler range this record measured, and no row
    scales a launch by a rank's CPUs: the pinned runs did not slow beyond their call's spread."""
    lo, hi = json.loads((ROOT / "benchmarks" / "results" / "host_cost.json").read_text())[
        "summary"]["us_per_launch_no_profiler"]["range"]
    r = Rates()
    assert f"{lo:.0f}-{hi:.0f} (benchmarks/results/host_cost.json)" in r.rows["host_us_per_kernel"].source
    assert not any("cpus" in name for name in r.rows)
    assert all(p["within_unpinned_spread"] for p in record["summary"]["fewer_cores"])


def test_cuda_graphs_take_memory_that_grows_with_layers_and_micro_batches(record):
    """Every graph run peaks above its run without graphs; what the graphs add grows with the layers
    and, at PP 1 where Megatron captures one micro-batch, with the micro-batches of a step too (the
    regular pool's, which the 4-micro-batch rows leave out)."""
    g = record["cuda_graph_memory"]
    by = {(r["layers"], r["micro_batches"]): r for r in g["runs"]}
    assert all(r["graphs_add_mib"] > 0 for r in g["runs"])
    assert by[8, 4]["graphs_add_mib"] < by[16, 4]["graphs_add_mib"] < by[16, 8]["graphs_add_mib"]
    assert all(v > 0 for v in g["per_layer_and_micro_batch_mib"].values())


def test_the_estimate_prices_graph_pools_by_this_record_and_it_holds_on_a_trial_it_did_not_see(record):
    """memory.py's two graph rows are this record's (one home: the runs), the saved tensors double
    with the layers, and the rows price the 48-layer graphed trial of near_capacity.json (not among
    the runs they come from) within 5 % of its reserved memory over its most allocated."""
    from moetune.estimate import memory
    g = record["cuda_graph_memory"]
    assert memory.CUDA_GRAPH_POOL_FACTOR == g["pools"]["factor"]
    assert round(memory.CUDA_GRAPH_FIXED_GB * 1024) == g["pools"]["fixed_mib"]
    by = {(r["layers"], r["micro_batches"]): r["saved_mib"] for r in g["runs"]}
    assert by[16, 4] == 2 * by[8, 4] == by[16, 8]  # PP 1: one micro-batch captured
    assert abs(g["check"]["error"]) < 0.05
    # that trial's fits (reserved peaks) without and with layernorm recompute, each within 2 % of the
    # estimate less its fixed overhead, which the recompute lowers in the pools as well
    fits = {f["fix"]: f for f in g["check"]["fits"]}
    for f in fits.values():
        assert len(f["peaks_gb"]) == 2
        assert abs(f["estimate_gb"] / (sum(f["peaks_gb"]) / 2) - 1) < 0.02
    assert fits["recompute_layernorm"]["cuda_graphs_gb"] < fits["baseline"]["cuda_graphs_gb"]


def test_graph_pools_at_pp_above_one_are_what_the_runs_measured(record):
    """Each graphed run beside its call's run without graphs: at PP 2 and 4 (4 or 8 layers a stage,
    every micro-batch in flight captured) the graphs added about as much as the pools are priced
    (within 25 %), at PP 1 with 16 layers nearly twice as much on these H100s (the rows were
    measured on an H200 at 3660 MiB): the record keeps both, the estimate's rows unmoved."""
    runs = [r for r in record["cuda_graph_pools"]["runs"] if r["graphs"] and "graphs_add_mib" in r]
    pipelined = [r for r in runs if r["pp"] > 1]
    single = [r for r in runs if r["pp"] == 1]
    assert len(pipelined) >= 3 and len(single) >= 3
    assert all(r["graphs_add_mib"] > 0 for r in runs)
    assert all(abs(r["error"]) < 0.25 for r in pipelined)
    assert all(r["graphs_add_mib"] > 1.5 * r["priced_mib"] for r in single)


def test_a_virtual_stage_pass_costs_the_host_what_the_rate_table_says(record):
    """Every run with 2, 4 or 8 virtual stages ran slower than its call's run with one (the same rank's
    layers, so the same GPU work), by under a millisecond or so a pass, and only about 4 launches a
    pass: the rate table's row is this record's median over the entry that reads batches as a
    training does (one home) and the band's spread its range."""
    from moetune.estimate.band import SPREADS
    v = record["virtual_stages"]
    added = [r for r in v["runs"] if "ms_per_pass" in r and r["entry"] == v["priced_entry"]]
    assert len(added) == v["ms_per_pass"]["n"] >= 6
    assert all(0 < r["ms_per_pass"] < 1.5 for r in added)
    launches = v["launches_per_pass"][v["priced_entry"]]
    assert launches and all(2 <= n <= 6 for n in launches)
    assert Rates()["host_ms_per_virtual_stage_pass"] == v["ms_per_pass"]["median"]
    lo, hi, _ = SPREADS["host_ms_per_virtual_stage_pass"]
    median, (low, high) = v["ms_per_pass"]["median"], v["ms_per_pass"]["range"]
    assert (round(low / median, 2), round(high / median, 2)) == (lo, hi)


def test_reading_a_batch_on_every_virtual_stage_cost_the_host_what_the_ab_shows(record):
    """The entry that read a batch (with its seq x seq mask) on every virtual stage: each of its runs
    slower than the same run of the entry that reads as Megatron's pretrain_gpt does, in the same
    call, the more so the more virtual stages; its passes cost several times the priced ones."""
    v = record["virtual_stages"]
    ab = {a["run"]: a["every_chunk_ms"] - a["first_and_last_ms"] for a in v["entry_ab"]}
    assert {"vppL16M8P4V1", "vppL16M8P4V2", "vppL16M8P4V4"} <= set(ab)
    assert 0 < ab["vppL16M8P4V1"] < ab["vppL16M8P4V2"] < ab["vppL16M8P4V4"]
    assert v["ms_per_pass_every_chunk"]["median"] > 3 * v["ms_per_pass"]["median"]


def test_a_vpp_name_says_its_shape_profiler_and_send_overlap():
    assert host_cost.vpp_kind("vppL16M8P4V4_nop2p") == {
        "layers": 16, "micro_batches": 8, "pp": 4, "vpp": 4, "profiler": "none", "p2p_overlap": False,
        "prev_entry": False}
    assert host_cost.vpp_kind("vppL16M8P4V2_prev")["prev_entry"] is True
    assert host_cost.vpp_kind("vppL16M8P4V2_nsys")["profiler"] == "nsys"
    with pytest.raises(ValueError, match="not a vppLxMyPzVw run"):
        host_cost.vpp_kind("memL16M4")
