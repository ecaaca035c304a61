"""Keep or revert: the median of the log's steady steps and a one-sided rank test."""
import json
from pathlib import Path

import numpy as np
import pytest

from moetune.decide.judge import compare, faster_p, judged_step, noise_ms, steady_iterations

REPO = Path(__file__).resolve().parents[2]
# the device run judged by 2 standard errors (its store and analyses; commit 22ab968 has the rest)
PREV = REPO / "tests" / "data" / "gpu" / "tuning_2se"
# the device run judged by the rank test (benchmarks/device_tuning)
RUNS = REPO / "benchmarks" / "device_tuning" / "runs"


def _an(its):
    return {"log": {"iteration_ms": [3000.0, 2000.0, 1000.0] + list(its)}}


def test_rank_test_p():
    """The rank test's p-value is about 0.5 for equal samples, near 0 or 1 for clear gains or losses,
    and 1 without spread or data."""
    same = [300.0, 310, 290, 305, 295, 300]
    assert 0.3 < faster_p(same, same) < 0.7
    assert faster_p([500.0] * 3 + [510.0] * 3, [300.0, 301, 302, 303, 304, 305]) < 0.01
    assert faster_p([300.0, 301, 302, 303, 304, 305], [500.0] * 6) > 0.99
    assert faster_p([7.0] * 6, [7.0] * 6) == 1.0  # no spread at all: nothing to test
    assert faster_p([], [1.0]) == 1.0


def test_one_stall_does_not_hide_a_real_gain():
    """One stalled step does not hide a real gain judged on log medians; a gain under the relative floor
    is not kept."""
    rng = np.random.default_rng(0)
    parent = list(400 + rng.normal(0, 20, 12))
    new = list(330 + rng.normal(0, 20, 12))
    new[5] = 4000.0  # the profiler's stop lands in one step
    c = compare(_an(parent), _an(new), rel=0.02, alpha=0.05)
    assert c.keep and c.p_faster < 0.01 and c.judged_by == "log median"
    # the same gain within the relative floor is not kept however sure the test is
    c = compare(_an(parent), _an([x - 5 for x in parent]), rel=0.02, alpha=0.05)
    assert not c.keep and c.why().startswith("within noise")


def test_without_log_steps_the_trace_steps_and_noise_decide():
    """Without log steps the trace's step times decide, against the noise threshold."""
    a = {"metrics": {"combined": {"step_time_ms": 500.0, "step_time_std_ms": 5.0, "steps": 4}}}
    b = {"metrics": {"combined": {"step_time_ms": 400.0, "step_time_std_ms": 5.0, "steps": 4}}}
    c = compare(a, b, rel=0.02, alpha=0.05)
    assert c.keep and c.p_faster is None and c.judged_by == "trace steps"
    assert c.least_gain_ms == pytest.approx(noise_ms(judged_step(a), judged_step(b), 0.02))


@pytest.mark.parametrize("parent, new, keep", [(3, 4, True), (3, 5, False), (1, 2, False), (1, 3, True)])
def test_device_tuning_run_under_two_standard_errors(parent, new, keep):
    """The earlier device run: micro batch 4 → 8 (trial 3 → 4) is -29 % by the median; the
    2-standard-error rule it ran under called that noise (gain 105.8 ms, noise 108.3 ms) because of
    3-4 s stalls; the rank test keeps it. manual_gc (3 → 5) stays out."""
    an = [json.loads((PREV / f"analysis_{i}.json").read_text()) for i in (parent, new)]
    c = compare(an[0], an[1], rel=0.02, alpha=0.05)
    assert c.keep is keep, c.why()
    if (parent, new) == (3, 4):
        assert c.gain_ms < c.noise_ms  # what the old rule saw


@pytest.mark.parametrize("parent, new, keep", [(1, 2, True), (2, 3, True), (3, 4, False), (3, 6, False)])
def test_device_tuning_run_under_the_rank_test(parent, new, keep):
    """The device run made under the rank test decides the same again from its stored analyses:
    micro batch 2 → 4 → 8 kept, manual_gc and EP overlap on top of micro batch 8 not."""
    an = [json.loads((RUNS / str(i) / "analysis.json").read_text()) for i in (parent, new)]
    c = compare(an[0], an[1], rel=0.02, alpha=0.05)
    assert c.keep is keep, c.why()
    assert c.judged_by == "log median"


def test_noise_threshold_uses_the_runs_spread():
    """The noise threshold is the relative floor for quiet runs and grows with a run's spread."""
    quiet = {"step_time_ms": 100.0, "step_time_std_ms": 0.1, "steps": 4}
    noisy = {"step_time_ms": 100.0, "step_time_std_ms": 10.0, "steps": 4}
    assert noise_ms(quiet, quiet, 0.02) == pytest.approx(2.0)
    assert noise_ms(noisy, noisy, 0.02) > 10.0


def test_judged_step_is_robust_to_a_stall():
    """The judged step is the log median after warm-up, untouched by one stall; too few log steps fall
    back to the trace's."""
    steady = [1300.0, 1200.0, 1100.0] + [500.0, 505.0, 495.0, 2200.0, 498.0, 502.0, 500.0]
    j = judged_step({"log": {"iteration_ms": steady},
                     "metrics": {"combined": {"step_time_ms": 800.0}}})
    assert j["source"] == "log median" and j["step_time_ms"] == pytest.approx(500.0, abs=3)
    assert j["step_time_std_ms"] < 20  # the one 2.2 s stall does not swamp the spread
    short = judged_step({"log": {"iteration_ms": [900.0, 500.0]},
                         "metrics": {"combined": {"step_time_ms": 510.0, "steps": 3}}})
    assert short["source"] == "trace steps" and short["step_time_ms"] == 510.0


def test_a_cuda_error_far_from_the_log_end_is_still_a_crash():
    """The rank-test device run's trial 5 (local CUDA graphs): the CUDA error is 40 lines above the
    end, past two nsys epilogues, so the last lines alone miss it; the log parser names it."""
    from moetune.analysis.logs import parse_log
    from moetune.tune.state import crashed
    log = parse_log(RUNS / "5" / "log.txt.xz")
    assert log["failure"] == "cuda_error"
    assert "capturing stream" in log["failure_line"]
    assert not any("CUDA error" in x for x in log["last_lines"])
    assert crashed({"state": "failed", "failure": log["failure"], "last_lines": log["last_lines"]})
    assert not crashed({"state": "failed", "failure": "oom", "last_lines": log["last_lines"]})


def test_the_log_names_its_profiled_and_capture_iterations():
    """Megatron's argument dump says which iterations nsys profiled and when CUDA graphs were captured
    (the one-GPU run on an H100: 2.0 and 6.3 s profiled, 4.7 s capturing, against 1.5 to 1.6 s)."""
    from pathlib import Path
    from moetune.analysis.logs import parse_log
    run = Path(__file__).resolve().parents[2] / "benchmarks" / "one_gpu_tuning" / "runs"
    graphed = parse_log(run / "2" / "log.txt.xz")
    assert graphed["unsteady_iterations"] == [1, 2, 3, 4, 11, 12] and graphed["first_iteration"] == 1
    plain = parse_log(run / "1" / "log.txt.xz")
    assert plain["unsteady_iterations"] == [11, 12]
    steady = steady_iterations({"log": graphed})
    its = graphed["iteration_ms"]
    assert list(steady) == its[4:10] and max(steady) < min(its[3], its[10], its[11])


def test_too_few_quiet_steps_fall_back_to_the_steps_after_warm_up():
    """With too few quiet steps the judge keeps all steps after warm-up."""
    log = {"iteration_ms": [900.0, 500.0, 400.0] + [100.0] * 6, "first_iteration": 1,
           "unsteady_iterations": [5, 6]}
    assert list(steady_iterations({"log": log})) == [100.0] * 6  # 4 quiet ones only: all 6
