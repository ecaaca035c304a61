"""estimate/band.py: a prediction's band comes from the spread of the rates it read, each row's
width by where its value came from, and names the rows that dominate it."""
from __future__ import annotations

import json

import pytest

from moetune.estimate import StoreReadings, price
from moetune.estimate.band import WIDTHS, band, kind, width
from moetune.estimate.rates import PUBLISHED, Rate, Rates
from moetune.experiment.schema import load_experiment
from moetune.paths import ROOT


def test_each_row_kind_gets_its_stated_width_and_a_known_spread_wins():
    assert kind("assumed: x") == "assumed" and kind("measured: calibration 1") == "calibration"
    assert kind("measured by moetune: bank") == "measured" and kind("DeepEP README") == "published"
    assert width("alltoall_nvlink", "assumed: x")[:2] == (0.5, 1.5)
    assert width("nic_gb_s", "a NIC")[:2] == (0.8, 1.2)
    lo, hi, why, _ = width("host_us_per_kernel", "measured by moetune: bank")
    assert (lo, hi) != WIDTHS["measured"][:2] and "74-132" in why
    # its spread covers every launch cost measured: the trials it is the median of, and the
    # no-profiler runs of benchmarks/results/host_cost.json
    us = Rates()["host_us_per_kernel"]
    record = json.loads((ROOT / "benchmarks" / "results" / "host_cost.json").read_text())
    calibration = json.loads((ROOT / "benchmarks" / "results" / "predict_calibration.json").read_text())
    measured = [*calibration["rates"]["host_us_per_kernel"]["range"],
                *record["summary"]["us_per_launch_no_profiler"]["range"]]
    assert lo * us <= min(measured) + 0.5 and hi * us >= max(measured) - 0.5
    # a calibration's own measurement replaces the published spread
    assert width("host_us_per_kernel", "measured: calibration 1")[:2] == WIDTHS["calibration"][:2]


def test_every_published_row_has_a_width_that_is_stated():
    for r in PUBLISHED:
        lo, hi, why, _ = width(r.name, r.source)
        # a hidden share may hide nothing at its low end; a rate never runs at zero
        assert (0 < lo or r.unit == "share") and 0 <= lo <= 1 <= hi and why, r.name


def test_the_band_holds_the_prediction_and_names_the_rows_that_move_it():
    exp = load_experiment("qwen3_30b_a3b")
    p = price(exp, exp.baseline, StoreReadings.empty(), with_band=True)
    b = p.band
    assert b.low_ms < p.step_time_ms < b.high_ms
    assert b.step_time_ms == p.step_time_ms
    moves = [max(r.down_ms, r.up_ms) for r in b.rows]
    assert moves == sorted(moves, reverse=True) and len(b.dominant()) == 3
    # EP 16 over two nodes: the all-to-all across nodes is the step's largest term, its rate assumed
    assert b.dominant()[0].name == "alltoall_rdma" and b.dominant()[0].kind == "assumed"
    # a row the layout does not read (no DeepEP here) does not move it
    assert "deepep_rdma_dispatch" not in {r.name for r in b.rows}
    assert price(exp, exp.baseline, StoreReadings.empty()).band is None  # only where asked


def test_rows_add_in_quadrature_and_a_share_stays_at_most_one():
    rows = (Rate("a", 1.0, "share", "assumed: a"), Rate("b", 2.0, "GB/s", "published b"))
    rates = Rates(rows=rows, curves=())
    seen = []

    def step(r: Rates) -> float:  # 100 ms plus 10 ms for each unit a, minus 5 for each unit of b
        seen.append(r["a"])
        return 100 + 10 * r["a"] - 5 * r["b"]

    b = band(step, rates, step(rates))
    assert step(rates) == 100
    # a at 0.5..1.5, but a share: at most 1 -> moves down 5 and not up; b at 1.6..2.4 -> +-2
    assert b.low_ms == pytest.approx(100 - (5 ** 2 + 2 ** 2) ** 0.5)
    assert b.high_ms == pytest.approx(102)
    assert max(seen) <= 1.0
    assert [r.name for r in b.rows] == ["a", "b"]
