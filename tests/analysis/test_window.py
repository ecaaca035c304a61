"""moetune/analysis/window.py: a rank's profiled window is its NVTX steps where it has them (from the first
kernel launched in the first step to the end of the last one launched in the last step), else the
span of its GPU activity, else empty; step times are the NVTX ranges' lengths."""
import pandas as pd

from moetune.analysis.window import find_window, step_ranges

NVTX_COLS = ["start", "end", "text"]


def frames(kernels=(), calls=(), ranges=()):
    k = pd.DataFrame(list(kernels), columns=["start", "end", "correlationId"])
    r = pd.DataFrame(list(calls), columns=["start", "end", "correlationId"])
    n = pd.DataFrame(list(ranges), columns=NVTX_COLS)
    return k, r, n


def test_steps_bound_the_window_by_the_kernels_they_launched():
    """Kernels launched inside the steps set the window, even one that runs past the last step's
    end; a kernel launched before the first step does not; step times are the ranges' lengths."""
    k, r, n = frames(kernels=[(5, 8, 1), (120, 180, 2), (250, 420, 3)],
                     calls=[(2, 3, 1), (110, 112, 2), (240, 245, 3)],
                     ranges=[(100, 200, "iteration 1"), (200, 400, "iteration 2"), (0, 500, "forward")])
    w = find_window(k, r, n)
    assert (w.start, w.end, w.steps, w.step_times_ns, w.source) == (120, 420, 2, (100, 200), "nvtx")
    assert w.ns == 300


def test_without_steps_the_window_is_the_gpu_span():
    """No range named like an iteration: the window is first kernel start to last kernel end."""
    k, r, n = frames(kernels=[(10, 20, 1), (50, 90, 2)], ranges=[(0, 100, "forward")])
    w = find_window(k, r, n)
    assert (w.start, w.end, w.steps, w.source) == (10, 90, 0, "gpu_span")


def test_no_kernels_is_an_empty_window_that_still_counts_the_steps():
    """A rank with steps but no kernels has an empty window with its step times."""
    k, r, n = frames(ranges=[(0, 100, "step 1"), (100, 250, "train_step")])
    w = find_window(k, r, n)
    assert (w.ns, w.steps, w.step_times_ns, w.source) == (0, 2, (100, 150), "empty")


def test_step_names_are_megatrons_and_are_sorted_by_start():
    """'iteration', 'iter', 'step', 'train_step', 'train-step' (any case) are steps; 'stepper' and
    'forward' are not; the steps come back in time order."""
    n = pd.DataFrame([(30, 40, "Step 3"), (0, 10, "iteration 1"), (10, 20, "iter 2"), (50, 60, "stepper"),
                      (60, 70, "forward"), (70, 80, "train-step")], columns=NVTX_COLS)
    assert step_ranges(n)["text"].tolist() == ["iteration 1", "iter 2", "Step 3", "train-step"]
