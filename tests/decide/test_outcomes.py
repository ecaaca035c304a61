"""decide/outcomes.py: what a judged trial's outcome decides, row by row of OUTCOME_RULINGS, from an
explicit OutcomeContext (no tuner, no store, no files). The tuner that builds the context and
records the ruling runs in tests/tune/test_loop.py."""
from moetune.decide import outcomes
from moetune.decide.outcomes import (
    OutcomeContext,
    parent_kind,
    reads_parent_analysis,
    rule_outcome,
)
from moetune.store import Trial
from moetune.trial.run import TrialOutcome


def measured(step_ms: float, **extra) -> dict:
    """An analysis judged by its trace steps (no log iterations): 10 steps of 1 ms spread."""
    return {"wall": "host_overhead",
            "metrics": {"combined": {"step_time_ms": step_ms, "step_time_std_ms": 1.0, "steps": 10, **extra}}}


def ctx(state: str, parent: str = "baseline", **kw) -> OutcomeContext:
    out = kw.pop("outcome", None) or TrialOutcome(state, error="why", stage="render", last_lines=["last"])
    return OutcomeContext(outcome=out, parent=parent, **kw)


def test_stage_error_passes_over_whatever_the_parent():
    for parent in ("baseline", "unfit", "ran"):
        r = rule_outcome(ctx("stage_error", parent, fix="larger_micro_batch"))
        assert r.kind == "stage_error" and r.reason == "why"
        assert r.evidence["stage"] == "render" and r.evidence["last_lines"] == ["last"]
        assert r.line == "why; passed over"
    nameless = rule_outcome(ctx("stage_error", outcome=TrialOutcome("stage_error", stage="analyze")))
    assert nameless.reason == "analyze failed"


def test_no_fit_is_unfit_whatever_the_parent():
    for parent in ("baseline", "unfit", "ran"):
        r = rule_outcome(ctx("no_fit", parent))
        assert r.kind == "unfit" and r.reason == "why"
    assert rule_outcome(ctx("no_fit", outcome=TrialOutcome("no_fit"))).reason == "does not fit"


def test_completed_baseline_is_kept_with_its_step():
    out = TrialOutcome("completed", analysis=measured(461.7))
    r = rule_outcome(ctx("completed", outcome=out))
    assert r.kind == "keep" and r.reason == "baseline" and r.evidence["step_time_ms"] == 461.7
    assert r.line == "baseline 461.7 ms/step (mean of 10 traced steps ± 1.0 ms), wall host_overhead"
    assert r.evidence["parent"] is None and r.evidence["state"] == "completed"


def test_baseline_records_and_prints_the_judged_step_the_next_trial_is_compared_with():
    """A baseline with a stall in its profiled steps (mean 868.6 ms) and a steady log (median 461.7
    ms): its decision records, and its line prints, the judged median, the figure the next trial's
    comparison starts from; the profiled mean is kept beside it, labelled."""
    its = [5000.0, 3000.0, 2000.0] + [461.7, 450.0, 470.0, 455.0, 468.0, 440.0, 480.0, 461.7, 462.0]
    an = measured(868.6, step_time_std_ms=852.9, steps=4)
    an["log"] = {"iteration_ms": its, "first_iteration": 1, "iteration_tflops": [27212.0 / ms for ms in its],
                 "tokens_per_step": 32768}
    r = rule_outcome(ctx("completed", outcome=TrialOutcome("completed", analysis=an)))
    assert r.evidence["step_time_ms"] == 461.7 and r.evidence["profiled_step_time_ms"] == 868.6
    assert r.line.startswith("baseline 461.7 ms/step (median of 9 steady log steps")
    assert "70972 tokens/s, 58.9 TFLOP/s/GPU" in r.line
    nxt = rule_outcome(ctx("completed", "ran", fix="larger_micro_batch", verify="none",
                           outcome=TrialOutcome("completed", analysis=an), parent_analysis=an,
                           rel_noise=0.05, alpha=0.05))
    assert nxt.evidence["parent_step_time_ms"] == r.evidence["step_time_ms"]


def test_baseline_that_did_not_complete_is_reverted_whatever_its_state():
    for state in ("oom", "hung", "cancelled", "failed", "skipped", "timeout"):
        r = rule_outcome(ctx(state, "baseline"))
        assert r.kind == "revert" and r.reason == f"baseline {state}: why", state
        assert r.evidence["last_lines"] == ["last"]


def test_skipped_change_is_skipped():
    r = rule_outcome(ctx("skipped", "ran", fix="manual_gc"))
    assert r.kind == "skip" and r.reason == "why" and r.line == "skipped (why)"
    assert rule_outcome(ctx("skipped", "unfit", outcome=TrialOutcome("skipped"))).reason == "skipped"


def test_first_layout_that_fits_is_kept_over_an_unfit_parent():
    out = TrialOutcome("completed", analysis=measured(300.0))
    r = rule_outcome(ctx("completed", "unfit", outcome=out, fix="larger_micro_batch", parent_number=1,
                         parent_hash="u"))
    assert r.kind == "keep" and r.reason == "the first layout that fits: larger_micro_batch on top of trial 1"
    assert r.evidence["parent"] == "u" and r.evidence["step_time_ms"] == 300.0


def test_failed_change_is_reverted_with_its_failure():
    for state, parent in (("oom", "ran"), ("hung", "unfit"), ("cancelled", "ran"), ("host_oom", "ran")):
        log = {"failure": state, "failure_line": "torch.OutOfMemoryError"}
        out = TrialOutcome(state, error="why", analysis={"log": log}, last_lines=["x"])
        r = rule_outcome(ctx(state, parent, outcome=out, fix="larger_micro_batch"))
        assert r.kind == "revert" and r.reason == f"{state}: why" and r.line == f"{state}, reverted"
        assert r.evidence["failure"] == state and r.evidence["failure_line"] == "torch.OutOfMemoryError"


def test_completed_change_faster_beyond_the_noise_is_kept():
    out = TrialOutcome("completed", analysis=measured(80.0))
    r = rule_outcome(ctx("completed", "ran", outcome=out, fix="larger_micro_batch",
                         parent_analysis=measured(100.0), rel_noise=0.05, alpha=0.05))
    assert r.kind == "keep" and r.reason.startswith("+20.0% faster: 100.0 -> 80.0 ms")
    assert r.evidence["verify"] == "applied" and r.evidence["parent_step_time_ms"] == 100.0
    assert r.line == "larger_micro_batch kept, 100.0 -> 80.0 ms/step"


def test_completed_change_within_the_noise_is_reverted():
    out = TrialOutcome("completed", analysis=measured(99.0))
    r = rule_outcome(ctx("completed", "ran", outcome=out, fix="larger_micro_batch",
                         parent_analysis=measured(100.0), rel_noise=0.05, alpha=0.05))
    assert r.kind == "revert" and r.reason.startswith("within noise: 100.0 -> 99.0 ms")
    slower = rule_outcome(ctx("completed", "ran", outcome=TrialOutcome("completed", analysis=measured(120.0)),
                              parent_analysis=measured(100.0), rel_noise=0.05))
    assert slower.kind == "revert" and slower.reason.startswith("slower")


def test_completed_change_its_trace_does_not_show_is_not_applied_on_that_cluster_and_image():
    new = measured(50.0, kernel_class_count={"gemm": 10}, cuda_graph_launches=0)
    r = rule_outcome(ctx("completed", "ran", outcome=TrialOutcome("completed", analysis=new),
                         fix="cuda_graphs_local", verify="cuda_graphs", parent_analysis=measured(100.0),
                         cluster="c1", image="img:1", rel_noise=0.05))
    assert r.kind == "not_applied" and "graphs were not captured" in r.reason
    assert r.evidence["cluster"] == "c1" and r.evidence["image"] == "img:1"
    assert r.evidence["verify"] == "not_applied"
    assert r.line.startswith("cuda_graphs_local not applied (")


def test_every_ruling_records_the_parent_state_and_fit_first():
    fit = {"fits": True, "reason": "fits", "peak_gb": 60.0, "headroom_gb": 4.0, "capacity_gb": 80.0,
           "failure": None, "ranks": {}}
    out = TrialOutcome("oom", error="why", fit=fit)
    r = rule_outcome(ctx("oom", "ran", outcome=out, parent_hash="p"))
    assert list(r.evidence)[:3] == ["parent", "state", "fit"]
    assert r.evidence["fit"] == {k: v for k, v in fit.items() if k != "ranks"}
    assert "fit" not in rule_outcome(ctx("oom", "ran")).evidence


def test_table_rows_and_parent_kind():
    """One row compares with a measured parent, and only it reads the parent's analysis."""
    base = Trial(number=1, state="completed", config_hash="b")
    unfit = Trial(number=1, state="no_fit", config_hash="u")
    assert parent_kind(None) == "baseline" and parent_kind(base) == "ran" and parent_kind(unfit) == "unfit"
    assert [kind for _, kind, _ in outcomes.OUTCOME_RULINGS].count("ran") == 1
    assert reads_parent_analysis("completed", "ran")
    assert not any(reads_parent_analysis(s, k) for s, k in (("completed", "unfit"), ("completed", "baseline"),
                                                             ("oom", "ran"), ("skipped", "ran")))


def test_every_outcome_takes_the_decision_its_table_row_names():
    """OUTCOME_RULINGS, row by row: a stage error and an unfit trial whatever the parent, the
    baseline kept only when it completed, a skipped change skipped, the first layout that fits kept
    over an unfit parent, and a change that did not complete reverted with its failure."""
    base = Trial(number=1, state="completed", config_hash="b")
    unfit = Trial(number=1, state="no_fit", config_hash="u")
    cases = [("stage_error", base, "stage_error"), ("stage_error", None, "stage_error"),
             ("no_fit", None, "unfit"), ("no_fit", unfit, "unfit"),
             ("completed", None, "keep"), ("oom", None, "revert"), ("skipped", None, "revert"),
             ("skipped", base, "skip"), ("completed", unfit, "keep"),
             ("oom", base, "revert"), ("hung", unfit, "revert")]
    for state, parent, kind in cases:
        out = TrialOutcome(state, error="why", stage="render")
        c = OutcomeContext(outcome=out, fix="larger_micro_batch", parent=parent_kind(parent),
                           parent_number=parent.number if parent else None)
        assert rule_outcome(c).kind == kind, (state, parent)
