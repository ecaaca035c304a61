"""benchmarks/host_cost.py: the host's cost a launch from the one-GPU H200 runs in
benchmarks/host_cost/, the record rates.py's host_us_per_kernel cites."""
import json
import sys

from moetune.estimate import Rates
from moetune.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import host_cost  # noqa: E402


def test_a_run_name_says_profiler_fusion_and_cores():
    assert host_cost.kind("plain_again") == {"profiler": "none", "fusion": False, "cores": 16}
    assert host_cost.kind("gaf_nsys") == {"profiler": "nsys", "fusion": True, "cores": 16}
    assert host_cost.kind("cpus2") == {"profiler": "none", "fusion": False, "cores": 2}


def test_the_committed_record_is_what_the_runs_give_now():
    """benchmarks/results/host_cost.json holds what the script computes from the committed logs and
    traces (neither can drift), and every run of ORDER was read."""
    record = host_cost.measure()
    assert json.loads((ROOT / "benchmarks" / "results" / "host_cost.json").read_text()) == \
        json.loads(json.dumps(record))
    assert len(record["runs"]) == sum(len(v) for v in host_cost.ORDER.values())


def test_fusion_saves_one_add_a_te_weight_and_tracing_slows_the_host():
    """The fused trace launches fewer kernels a step by one gradient add for each weight TE
    accumulates itself (attention's two, each local expert's two), the same every captured
    iteration; nsys slows the step outside its capture and more inside it."""
    record = host_cost.measure()
    s = record["summary"]
    assert s["fusion_launches_saved"]["per_layer_and_micro_batch"] == 2 + 2 * host_cost.LOCAL_EXPERTS
    for r in record["runs"]:
        if "traced" in r:
            assert len({t["launches"] for t in r["traced"]}) == 1
            assert 1 < r["over_no_profiler"] < r["captured_over_no_profiler"]


def test_the_rate_table_cites_this_record_and_no_cpu_ratio():
    """host_us_per_kernel's source gives the no-profiler range this record measured, and no row
    scales a launch by a rank's CPUs: the pinned runs did not slow beyond their call's spread."""
    lo, hi = json.loads((ROOT / "benchmarks" / "results" / "host_cost.json").read_text())[
        "summary"]["us_per_launch_no_profiler"]["range"]
    r = Rates()
    assert f"{lo:.0f}-{hi:.0f} (benchmarks/results/host_cost.json)" in r.rows["host_us_per_kernel"].source
    assert not any("cpus" in name for name in r.rows)
    assert all(p["within_unpinned_spread"] for p in host_cost.measure()["summary"]["fewer_cores"])


def test_cuda_graphs_take_memory_that_grows_with_layers_and_micro_batches():
    """Every graph run peaks above its run without graphs; what the graphs add grows with the layers
    and, at PP 1 where Megatron captures one micro-batch, with the micro-batches of a step too (the
    regular pool's, which the 4-micro-batch rows leave out)."""
    g = host_cost.measure()["cuda_graph_memory"]
    by = {(r["layers"], r["micro_batches"]): r for r in g["runs"]}
    assert all(r["graphs_add_mib"] > 0 for r in g["runs"])
    assert by[8, 4]["graphs_add_mib"] < by[16, 4]["graphs_add_mib"] < by[16, 8]["graphs_add_mib"]
    assert all(v > 0 for v in g["per_layer_and_micro_batch_mib"].values())


def test_the_estimate_prices_graph_pools_by_this_record_and_it_holds_on_a_trial_it_did_not_see():
    """memory.py's two graph rows are this record's (one home: the runs), the saved tensors double
    with the layers, and the rows price the 48-layer graphed trial of near_capacity.json (not among
    the runs they come from) within 5 % of its reserved memory over its most allocated."""
    from moetune.estimate import memory
    g = host_cost.measure()["cuda_graph_memory"]
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
