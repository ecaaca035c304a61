"""tune/dryrun.py, `moetune tune EXPERIMENT --dry-run`: the baseline and the first moves the rule
table would propose before anything is measured, each priced by estimate.price and charged as a
whole job with its band, the budget from the YAML or the flags; nothing written."""
from __future__ import annotations

import pytest

from moetune.cli.main import main
from moetune.estimate import StoreReadings, price
from moetune.experiment.schema import load_experiment
from moetune.tune import dryrun


def test_baseline_priced_by_price_and_charged_as_a_whole_job():
    """The baseline's predicted step and its band are price()'s; its GPU-hours are the GPUs x
    (iterations x step + start-up), low and high at the band's ends and the bank's start-up range."""
    exp = load_experiment("moe_proxy")
    plan = dryrun.dry_run(exp)
    p = price(exp, exp.baseline, StoreReadings.empty(), with_band=True)
    step = p.step_time_ms
    assert plan.baseline.step_ms == pytest.approx(step)
    assert plan.baseline.step_band_ms == pytest.approx((p.band.low_ms, p.band.high_ms))
    lo_s, mid_s, hi_s = dryrun.START_UP_S
    iters, gpus = exp.baseline.train_iters, plan.gpus
    lo, mid, hi = plan.baseline.gpu_hours
    assert mid == pytest.approx(gpus * (iters * step / 1e3 + mid_s) / 3600)
    assert lo == pytest.approx(gpus * (iters * p.band.low_ms / 1e3 + lo_s) / 3600)
    assert hi == pytest.approx(gpus * (iters * p.band.high_ms / 1e3 + hi_s) / 3600)
    assert lo < mid < hi and mid > gpus * iters * step / 1e3 / 3600  # more than the iterations alone


def test_a_long_step_is_charged_at_most_the_time_limit():
    """A job the time limit would end is charged the limit, as Slurm would end it there."""
    lo, mid, hi = dryrun._whole_job_hours(4, (9_000_000.0, 10_000_000.0, 11_000_000.0), 20, 30)
    assert lo == mid == hi == pytest.approx(4 * 0.5)


def test_first_moves_need_no_measurement_and_follow_the_loops_order():
    """Before the baseline is measured only rules without a metric condition can be proposed; the
    fit step's memory fixes come in the table's fit order; a refused change is not listed."""
    exp = load_experiment("qwen3_30b_a3b")
    plan = dryrun.dry_run(exp, max_trials=3, max_gpu_hours=5.0)
    assert (plan.max_trials, plan.max_gpu_hours) == (3, 5.0)
    assert plan.budget_from == "--max-trials and --max-gpu-hours"
    from moetune.decide import rules as rules_mod
    rules = {r.id: r for r in rules_mod.load_rules()}
    fit_order = rules_mod.load_fit_order()
    mem = [t.label for t in plan.moves["memory"]]
    assert mem and mem == sorted(mem, key=fit_order.index)
    for moves in plan.moves.values():
        for t in moves:
            assert not rules[t.label].when or all(c[1] in ("ne", "not_in", "lacks") for c in rules[t.label].when)
            assert t.step_ms is not None and " -> " in t.change


def test_cli_dry_run_prints_the_plan_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """`moetune tune NAME --dry-run` prints the baseline's predicted step and GPU-hours with their
    bands and the budget, and leaves no store, runs or reports folder, no lock."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MOETUNE_DB", raising=False)
    assert main(["tune", "moe_proxy", "--dry-run", "--max-trials", "3"]) == 0
    out = capsys.readouterr().out
    exp = load_experiment("moe_proxy")
    step = price(exp, exp.baseline, StoreReadings.empty()).step_time_ms
    assert f"baseline {step:.1f} (" in " ".join(out.split())
    assert "budget: 3 trials" in out and "--max-trials" in out and "with their band" in out
    assert list(tmp_path.iterdir()) == []
    assert main(["demo", "--dry-run"]) == 0
    assert "moe_proxy: dry run" in capsys.readouterr().out and list(tmp_path.iterdir()) == []


def test_the_error_note_quotes_the_scoring_results():
    """The note beside every dry run's step times gives the built-on and unseen medians of
    benchmarks/results/predict_scoring.json (the current model's built on, the frozen model's
    unseen) and the trial bank's, to a tenth of a per cent, so the note cannot drift from them."""
    import json
    import statistics
    import sys

    from moetune.paths import ROOT
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import predict_validation
    r = json.loads((ROOT / "benchmarks" / "results" / "predict_scoring.json").read_text())
    built, unseen = r["built_on/current"], r["unseen/frozen"]
    bank = statistics.median(abs(x["error"]) for x in predict_validation.bank_rows())
    note = " ".join(dryrun.STEP_ERROR_SOURCE.split())
    assert f"{built['median_abs_error']:.1%} on the {built['rows']} public H100 rows it was built beside" in note
    assert f"{unseen['median_abs_error']:.1%} (as frozen) on {unseen['rows']} it was not shaped on" in note
    assert f"are off by {bank:.1%}" in note
