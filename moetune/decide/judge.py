"""Is a trial faster than its parent? Short trainings stall now and then (a garbage collection, the
profiler's stop, a late rank): a few steps of seconds among steps of a few hundred ms. Means and
standard deviations are swamped by them, so a change is judged on the log's steady iterations by
their median and a rank test, which a stall moves by one rank only.

    judged_step(analysis)            -> the step time a decision judges by, with its spread
    noise_ms(parent, new, rel)       -> least gain that counts by the runs' spreads (2 standard errors)
    faster_p(parent_its, new_its)    -> one-sided Mann-Whitney p that the new steps are shorter (scipy)
    compare(parent_an, new_an, rel, alpha) -> Comparison (keep or not, and the evidence)

Keep when the median gain exceeds `rel` of the parent's median and, with enough steady log
iterations on both sides, the rank test gives p < alpha; with fewer (the trace's few NVTX steps
only), when the gain exceeds noise_ms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import mannwhitneyu

from moetune.analysis import figures

MIN_LOG_STEPS = figures.MIN_STEADY_STEPS  # steady log iterations needed to judge by the log
EXACT_UP_TO = 200  # steps on both sides together up to which U's exact distribution is computed


def steady_iterations(analysis: dict | None) -> np.ndarray:
    """The log's steady iteration times (moetune/analysis/figures.py steady_iterations: without
    warm-up and the iterations the log names unsteady)."""
    return np.array(figures.steady_iterations((analysis or {}).get("log")), dtype=float)


# the step time a decision judges by: the one definition every printer shows
judged_step = figures.judged_step


def noise_ms(parent: dict, new: dict, rel: float) -> float:
    """Least gain that counts: the relative threshold, or twice the standard error of the
    difference of the two runs' step times, whichever is larger."""
    def se(m):
        std, n = m.get("step_time_std_ms") or 0.0, max(int(m.get("steps") or 1), 1)
        return (std ** 2) / n
    return max(rel * parent["step_time_ms"], 2.0 * math.sqrt(se(parent) + se(new)))


def faster_p(parent_its, new_its) -> float:
    """One-sided Mann-Whitney U test that the new run's steps are shorter than the parent's: the
    chance of rank sums at least this far apart if both ran at one speed. Exact (scipy's
    distribution of U) for the 6 to 16 steps a side trials have; where steps tie, the normal
    approximation with scipy's tie and continuity corrections, since the exact one assumes none."""
    x, y = np.asarray(parent_its, float), np.asarray(new_its, float)
    if not x.size or not y.size:
        return 1.0
    ties = np.unique(np.concatenate([x, y])).size < x.size + y.size
    method = "asymptotic" if ties or x.size + y.size > EXACT_UP_TO else "exact"
    return float(mannwhitneyu(x, y, alternative="greater", method=method).pvalue)


@dataclass(frozen=True)
class Comparison:
    keep: bool
    parent_ms: float
    new_ms: float
    gain_ms: float
    least_gain_ms: float  # the relative floor (log) or noise_ms (trace steps)
    noise_ms: float
    p_faster: float | None
    judged_by: str
    spread_ms: tuple

    def why(self) -> str:
        test = (f"rank test p={self.p_faster:.3f}" if self.p_faster is not None
                else f"noise {self.noise_ms:.1f} ms")
        head = (f"{self.gain_ms / self.parent_ms:+.1%} faster" if self.keep
                else "slower" if self.gain_ms < 0 else "within noise")
        return f"{head}: {self.parent_ms:.1f} -> {self.new_ms:.1f} ms ({test})"

    def evidence(self) -> dict:
        return {"parent_step_time_ms": self.parent_ms, "step_time_ms": self.new_ms,
                "gain_ms": round(self.gain_ms, 4), "gain_share": round(self.gain_ms / self.parent_ms, 4),
                "least_gain_ms": round(self.least_gain_ms, 4), "noise_ms": round(self.noise_ms, 4),
                "p_faster": None if self.p_faster is None else round(self.p_faster, 5),
                "judged_by": self.judged_by, "spread_ms": list(self.spread_ms)}


def compare(parent_an: dict | None, new_an: dict | None, rel: float, alpha: float) -> Comparison:
    pj, nj = judged_step(parent_an), judged_step(new_an)
    old, new = pj["step_time_ms"], nj["step_time_ms"]
    gain, noise = old - new, noise_ms(pj, nj, rel)
    by_log = pj["source"] == nj["source"] == "log median"
    if by_log:
        p = faster_p(steady_iterations(parent_an), steady_iterations(new_an))
        least, keep = rel * old, gain > rel * old and p < alpha
    else:
        p, least, keep = None, noise, gain > noise
    return Comparison(keep=keep, parent_ms=old, new_ms=new, gain_ms=gain, least_gain_ms=least,
                      noise_ms=noise, p_faster=p, judged_by=nj["source"],
                      spread_ms=(pj["step_time_std_ms"], nj["step_time_std_ms"]))
