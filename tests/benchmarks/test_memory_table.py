"""benchmarks/memory_table.py's comparison of any fit entries with their device results: the unseen
models' entries (benchmarks/fit_lease/unseen.json, models read back from their argv) are estimated
at each rank's own pipeline stage, and a result, once there, gives the error."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from moetune.estimate.memory import estimate
from moetune.experiment.config import TrainingConfig
from moetune.experiment.model import ModelArch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
SPEC = importlib.util.spec_from_file_location("memory_table", BENCH / "memory_table.py")
table = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(table)
UNSEEN = BENCH / "fit_lease" / "unseen.json"


def test_unseen_entries_compare_once_measured(tmp_path, capsys):
    """Each unseen entry gets its stage's estimate; a measured one gets (estimate - measured) /
    measured, an out-of-memory one no error, one not run 'not measured'; the printed table says so."""
    entries = json.loads(UNSEEN.read_text())
    first, last = entries[0], next(e for e in entries if e["rank"] > 0)
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({"name": first["name"], "max_allocated_mb": 30 * 1024, "max_reserved_mb": 31 * 1024,
                                   "iteration_ms": [1.0], "oom": False}) + "\n"
                       + json.dumps({"name": last["name"], "max_allocated_mb": 10 * 1024, "oom": True}) + "\n")
    rows = {r["layout"]: r for r in table.fit_rows(UNSEEN, results)}
    assert set(rows) == {e["name"] for e in entries}
    for e in (first, last):
        cfg = TrainingConfig.from_dict(e["config"])
        stage = e["rank"] // (e["world_size"] // cfg.pp)
        est = estimate(ModelArch.from_args(e["argv"], e["model"]), cfg, e["world_size"], stage=stage)
        assert rows[e["name"]]["estimate_gb"] == pytest.approx(est.model_state_gb + est.activations_gb)
        assert rows[e["name"]]["stage"] == stage
    assert rows[last["name"]]["stage"] == TrainingConfig.from_dict(last["config"]).pp - 1
    assert rows[first["name"]]["error"] == pytest.approx((rows[first["name"]]["estimate_gb"] - 30) / 30)
    assert rows[last["name"]]["error"] is None and rows[last["name"]]["failure"] == "out of memory"
    table.compare(UNSEEN, results)
    out = capsys.readouterr().out
    assert "not measured" in out and f"1 of {len(entries)} entries measured" in out
