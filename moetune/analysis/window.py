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
    ks, ke = kernels["start"].to_numpy(), kernels["end"].to_numpy()
    inside = _kernels_launched_in(kernels, runtime, lo, hi)
    if not inside.any():
        inside = (ks >= lo) & (ks < hi)
    if not inside.any():
        return Window(lo, lo, len(steps), (), "empty")
    times = tuple(int(x) for x in (steps["end"] - steps["start"]).to_numpy())
    return Window(int(ks[inside].min()), int(ke[inside].max()), len(steps), times, "nvtx")


def _kernels_launched_in(kernels, runtime, lo, hi) -> np.ndarray:
    """A mask of the kernels whose launch call began in [lo, hi)."""
    if runtime.empty:
        return np.zeros(len(kernels), dtype=bool)
    rs = runtime["start"].to_numpy()
    calls = runtime["correlationId"].to_numpy()[(rs >= lo) & (rs < hi)]
    return np.isin(kernels["correlationId"].to_numpy(), calls)
