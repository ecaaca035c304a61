"""Real fit logs (one H200, megatron-core 0.19.2 `--fake-process-group`, TE 2.20.2; recorded by
benchmarks/device/fit.sh into benchmarks/fit_lease/) parsed by analysis/logs.py. The device's own
summary (benchmarks/device/fit.py, its own regexes, results.jsonl) is the reference."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.analysis.logs import parse_log

FIT = Path(__file__).resolve().parent.parent / "benchmarks" / "fit_lease"
RESULTS = {r["name"]: r for r in map(json.loads, (FIT / "results.jsonl").read_text().splitlines())}


def test_every_layout_has_its_log():
    logs = {p.name.removesuffix(".log.xz") for p in (FIT / "logs").glob("*.log.xz")}
    assert logs == set(RESULTS) and len(logs) == 15


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_fit_log_parses_like_the_device_summary(name):
    row = RESULTS[name]
    got = parse_log(FIT / "logs" / f"{name}.log.xz")
    assert got["failure"] is None
    assert got["max_allocated_gb"] == pytest.approx(row["max_allocated_mb"] / 1024, abs=1e-3)
    assert got["max_reserved_gb"] == pytest.approx(row["max_reserved_mb"] / 1024, abs=1e-3)
    assert got["iteration_ms"] == row["iteration_ms"] and got["iterations"] == 3
    assert got["max_reserved_gb"] >= got["max_allocated_gb"]


def test_qwen3_235b_baseline_rank0_figures():
    """TP2 PP2 EP32 of 256 GPUs, rank 0: 83.9 GB allocated at its peak, more than an 80 GB H100 holds."""
    got = parse_log(FIT / "logs" / "qwen3_235b-baseline-r0.log.xz")
    assert got["max_allocated_gb"] == pytest.approx(85919.27 / 1024, abs=1e-3)
    assert got["max_reserved_gb"] == pytest.approx(86702.0 / 1024, abs=1e-3)
    assert got["iteration_ms"] == [13371.1, 10507.2, 8375.9]
    assert got["step_time_ms"] == pytest.approx(8375.9)  # iterations after the first 2


def test_max_reserved_absent_in_older_logs(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("[Rank 0] (after 2 iterations) memory (MB) | allocated: 10.0 | max allocated: 2048.0\n")
    got = parse_log(log)
    assert got["max_allocated_gb"] == 2.0 and got["max_reserved_gb"] is None
