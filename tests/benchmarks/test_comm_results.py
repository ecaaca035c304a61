"""The communication sweep's overlap A/B (benchmarks/comm_results.py): each run with the EP overlap
beside the same run without it, the share it hid of what the paired micro-batches could hide."""
import importlib.util
from pathlib import Path

import pytest

from moetune.experiment.config import TrainingConfig

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
    from moetune.estimate.rates import Rates
    record = json.loads((Path(results.__file__).parent / "results" / "comm_4gpu.json").read_text())
    nvlink = next(x for x in record["overlap_ab"] if not x["env"])
    assert Rates()["ep_overlap_hidden"] == pytest.approx(nvlink["hidden_share"], abs=5e-4)
