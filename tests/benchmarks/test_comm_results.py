"""The communication sweep's overlap A/B (benchmarks/comm_results.py): each run with the EP overlap
beside the same run without it, the share it hid of what the paired micro-batches could hide."""
import importlib.util
from pathlib import Path

import pytest

from moetune.experiment.config import TrainingConfig
from moetune.estimate.rates import Rates

SPEC = importlib.util.spec_from_file_location(
    "comm_results", Path(__file__).resolve().parents[2] / "benchmarks" / "comm_results.py")
results = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(results)


def _row(name, ms, transfer=None, env=None):
    return {"name": name, "measured_ms": ms, "a2a_transfer_ms": transfer, "env": env or {}}


def test_the_overlap_ab_pairs_runs_and_reads_the_hidden_share():
    """EP 4, global batch 32 at micro batch 4: 2 micro-batches a rank, half the passes pair up. Over
    NVLink the traced transfer is the denominator; on the slow link, untraced, the NVLink twin's
    transfer plus the step the slow link added; a run without its other side is left out."""
    cfg = TrainingConfig(ep=4, micro_batch=4, global_batch=32)
    rows = [_row("ep4_mbs4", 1500.0, 240.0), _row("ep4_mbs4_overlap", 1416.0),
            _row("ep4_slow_mbs4", 3500.0, env={"NCCL_P2P_DISABLE": "1"}),
            _row("ep4_slow_mbs4_overlap", 3278.0, env={"NCCL_P2P_DISABLE": "1"}),
            _row("ep4_lonely_overlap", 1000.0)]
    configs = {r["name"]: cfg.replace(overlap_ep_a2a=r["name"].endswith("overlap")) for r in rows}
    ab = {x["with"]: x for x in results.overlap_ab(rows, configs, 4)}
    assert set(ab) == {"ep4_mbs4_overlap", "ep4_slow_mbs4_overlap"}
    fast, slow = ab["ep4_mbs4_overlap"], ab["ep4_slow_mbs4_overlap"]
    assert fast["paired_share"] == 0.5 and fast["saved_ms"] == 84.0
    assert fast["hidden_share"] == pytest.approx(84.0 / (240.0 * 0.5), abs=1e-3)
    assert slow["a2a_transfer_ms"] == 240.0 + 2000.0 and "ep4_mbs4" in slow["transfer_from"]
    assert slow["hidden_share"] == pytest.approx(222.0 / (2240.0 * 0.5), abs=1e-3)


def test_the_committed_sweep_gives_the_rate_row_its_share():
    """benchmarks/results/comm_4gpu.json's NVLink A/B is the share rates.py's ep_overlap_hidden holds."""
    import json

    record = json.loads((Path(results.__file__).parent / "results" / "comm_4gpu.json").read_text())
    nvlink = next(x for x in record["overlap_ab"] if x["with"] == "ep4_mbs4_overlap")
    assert Rates()["ep_overlap_hidden"] == pytest.approx(nvlink["hidden_share"], abs=5e-4)


def test_the_committed_pinned_runs_are_flat_and_the_model_prices_them_alike():
    """The pinned runs are in the record with their cores; the host-bound baseline ran no slower on
    4 cores a rank than on 16, and the model, which no longer scales a launch by a rank's cores,
    prices the three runs alike."""
    import json

    record = json.loads((Path(results.__file__).parent / "results" / "comm_4gpu.json").read_text())
    assert {x["cpus_a_rank"] for x in record["host_cpus"]["runs"]} == {4, 8}
    assert record["host_cpus"]["flat_from_cpus_a_rank"] == 4
    assert not any("cpus" in name for name in Rates().rows)
    baseline = {r["name"]: r["predicted_ms"] for r in record["sweep"] if r["name"].startswith("ep4_baseline")
                and r["name"].endswith("_balanced")}
    assert len(baseline) == 3 and len(set(baseline.values())) == 1


def test_balanced_runs_pair_with_their_balanced_twins_and_tp_and_pinned_runs_are_read():
    """A run forced to balance pairs with its balanced twin, never the unbalanced one; the TP-comm
    overlap pairs with its run without it; a pinned run with its unpinned twin, flat when within the
    two spreads."""
    cfg = TrainingConfig(ep=4, micro_batch=4, global_batch=32)
    rows = [_row("ep4_mbs4", 1500.0, 240.0), _row("ep4_mbs4_balanced", 1300.0, 180.0),
            _row("ep4_mbs4_overlap_balanced", 1210.0)]
    configs = {r["name"]: cfg.replace(overlap_ep_a2a="overlap" in r["name"]) for r in rows}
    (ab,) = results.overlap_ab(rows, configs, 4)
    assert (ab["without"], ab["saved_ms"]) == ("ep4_mbs4_balanced", 90.0)
    tp = [dict(_row("ep4_tp2_balanced", 2000.0), predicted_terms_ms={"tp_collectives": 30.0}),
          _row("ep4_tp2_tpoverlap_balanced", 1800.0)]
    assert results.tp_overlap_ab(tp) == [{"without": "ep4_tp2_balanced", "with": "ep4_tp2_tpoverlap_balanced",
                                          "saved_ms": 200.0, "predicted_tp_collectives_ms": 30.0}]
    pinned = [dict(_row("ep4_baseline", 3800.0), measured_spread_ms=100.0),
              dict(_row("ep4_baseline_cpus2", 5000.0, env={"CPUS": "8"}), measured_spread_ms=100.0),
              dict(_row("ep4_baseline_cpus4", 3900.0, env={"CPUS": "16"}), measured_spread_ms=100.0)]
    host = results.host_cpus(pinned, 4)
    assert [x["cpus_a_rank"] for x in host["runs"]] == [2, 4] and host["flat_from_cpus_a_rank"] == 4


def test_repricing_keeps_every_measurement_and_the_committed_predictions_are_current():
    """--reprice prices the committed 4-GPU record again: its measured and traced figures stay as they
    are, its predictions are what this checkout's model gives (the committed ones are current), and
    priced with the sweep's own probe as the cluster's calibration every run gets a second prediction,
    its host rows moved by that host's launch."""
    import copy
    import json

    from moetune.experiment.schema import load_experiment
    committed = json.loads((Path(results.__file__).parent / "results" / "comm_4gpu.json").read_text())
    again = results.reprice(copy.deepcopy(committed), load_experiment(committed["experiment"]), "H200",
                            committed["calibrated_by"])
    assert again == committed
    measured = ("measured_ms", "measured_spread_ms", "exposed_a2a_ms", "a2a_wait_ms", "kernels_per_step", "wall")
    bare = results.reprice(copy.deepcopy(committed), load_experiment(committed["experiment"]), "H200")
    for before, after in zip(committed["sweep"], bare["sweep"]):
        assert {k: before.get(k) for k in measured} == {k: after.get(k) for k in measured}
    base = next(r for r in committed["sweep"] if r["name"] == "ep4_baseline_balanced")
    launch = next(r["us"] for r in committed["probes"]["4gpu"]["rows"] if r["kind"] == "launch")
    assert (base["predicted_calibrated_ms"] > base["predicted_ms"]) == (launch > Rates()["ref_launch_us"])


def test_a_setting_pairs_with_the_run_without_it_and_says_whether_its_cost_is_resolved():
    """Recompute and virtual stages, read as the step they add: NAME_recompute_X beside NAME and
    NAME_vppN beside NAME, balanced runs with balanced twins only, measured beside predicted, and
    resolved only where the difference exceeds the two runs' spreads together."""
    def r(name, ms, spread, pred):
        return dict(_row(name, ms), measured_spread_ms=spread, predicted_ms=pred)
    rows = [r("ep4_mbs4_balanced", 1000.0, 10.0, 900.0), r("ep4_mbs4", 1100.0, 10.0, 900.0),
            r("ep4_mbs4_recompute_moe_balanced", 1200.0, 20.0, 960.0),
            r("ep4_mbs4_recompute_act_norm_balanced", 1015.0, 10.0, 905.0),
            r("ep4_pp2_balanced", 800.0, 5.0, 700.0), r("ep4_pp2_vpp4_balanced", 780.0, 5.0, 690.0)]
    rec = results.setting_ab(rows, "recompute_")
    assert [(x["without"], x["with"], x["added_ms"], x["resolved"], x["predicted_added_ms"]) for x in rec] == [
        ("ep4_mbs4_balanced", "ep4_mbs4_recompute_moe_balanced", 200.0, True, 60.0),
        ("ep4_mbs4_balanced", "ep4_mbs4_recompute_act_norm_balanced", 15.0, False, 5.0)]
    (vpp,) = results.setting_ab(rows, "vpp")
    assert (vpp["without"], vpp["added_ms"], vpp["spread_ms"], vpp["resolved"]) == \
        ("ep4_pp2_balanced", -20.0, 10.0, True)
