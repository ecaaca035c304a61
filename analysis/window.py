"""The profiled window of each rank: the steps, their count and mean time.

Steps are NVTX ranges named like Megatron iterations (`iteration 12`, `step 3`, `train_step`);
without them the window is the span of the rank's GPU activity (the capture range).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

STEP_RANGE = re.compile(r"^\s*(iteration|iter|step|train_step|train-step)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Window:
    start: int  # ns, GPU timeline
    end: int
    steps: int
    step_times_ns: tuple[int, ...]  # per step, from NVTX; empty without steps
    source: str  # nvtx | gpu_span | empty

    @property
    def ns(self) -> int:
        return max(0, self.end - self.start)


def step_ranges(nvtx: pd.DataFrame) -> pd.DataFrame:
    if nvtx.empty:
        return nvtx
    steps = nvtx[nvtx["text"].str.match(STEP_RANGE)]
    return steps.sort_values("start")


def find_window(kernels: pd.DataFrame, runtime: pd.DataFrame, nvtx: pd.DataFrame) -> Window:
    """One rank's window; all frames are already that rank's rows."""
    steps = step_ranges(nvtx)
    if kernels.empty:
        return Window(0, 0, len(steps), tuple(int(x) for x in (steps["end"] - steps["start"])),
                      "empty")
    if steps.empty:
        return Window(int(kernels["start"].min()), int(kernels["end"].max()), 0, (), "gpu_span")
    lo, hi = int(steps["start"].iloc[0]), int(steps["end"].iloc[-1])
    inside = _kernels_launched_in(kernels, runtime, lo, hi)
    if inside.empty:
        inside = kernels[(kernels["start"] >= lo) & (kernels["start"] < hi)]
    if inside.empty:
        return Window(lo, lo, len(steps), (), "empty")
    times = tuple(int(x) for x in (steps["end"] - steps["start"]).to_numpy())
    return Window(int(inside["start"].min()), int(inside["end"].max()), len(steps), times, "nvtx")


def _kernels_launched_in(kernels, runtime, lo, hi) -> pd.DataFrame:
    if runtime.empty:
        return kernels.iloc[0:0]
    calls = runtime[(runtime["start"] >= lo) & (runtime["start"] < hi)]
    return kernels[np.isin(kernels["correlationId"].to_numpy(), calls["correlationId"].to_numpy())]
