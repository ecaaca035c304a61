"""A prediction's band: how far its step time moves when each rate it read is taken at the low and
the high end of what is known of it.

Each row of the rate table (rates.py) gets a width from WIDTHS by where its value came from: a
spread measured for that row where one is known (SPREADS), else the width of its kind (measured by
moetune, a cluster's calibration, a published figure, an assumption). The layout is priced again
with one row at a time at each end; the band adds the rows' moves in quadrature (the rows' errors
are taken as independent, so they seldom all sit at their ends at once), the moves down and up
apart, since a row may move the step more one way than the other."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from moetune.estimate.rates import Curve, Rate, Rates

# (low factor, high factor, why) of a row's value, by where it came from
WIDTHS: dict[str, tuple[float, float, str]] = {
    "calibration": (0.9, 1.1, "a cluster's own probe: its GEMM fit and copy repeat within 2 % over four runs "
                              "on the reference machine (docs/prediction.md), carried into a step's kernels "
                              "by a ratio"),
    "measured": (0.85, 1.15, "measured by moetune on one machine and a few models' trials; carried to other "
                             "shapes and models"),
    "published": (0.8, 1.2, "a published figure, measured on other hardware or software than the cluster's"),
    "assumed": (0.5, 1.5, "assumed, not measured"),
}
# rows whose own spread is known: (low factor, high factor, why)
SPREADS: dict[str, tuple[float, float, str]] = {
    "host_us_per_kernel": (0.77, 1.59, "the host-bound trials it is the median of ran 74-132 us a launch outside "
                                       "nsys's capture (benchmarks/results/predict_calibration.json); the one-GPU "
                                       "H200 host with no profiler at all 64-90 (benchmarks/results/host_cost.json)"),
    "host_ms_per_virtual_stage_pass": (0.5, 2.63, "its 11 steady pairs ran 0.19-1.0 ms a pass on one H100 host "
                                                   "(benchmarks/results/host_cost.json virtual_stages)"),
    "hbm_efficiency": (0.72, 1.34, "its trials ran 0.218-0.405 (benchmarks/results/predict_calibration.json)"),
    "kernel_table_rate": (0.9, 1.0, "never above what the probe measured the GPU to reach on random data (zeros "
                                    "run 15 % faster: kernel_tables/H200.json); below it by as much as a step's "
                                    "calls may run apart from the probe's back-to-back ones"),
    "deepep_rdma_dispatch": (0.5, 1.0, "DeepSeek's H800 figure; users report far less on H100 clusters (DeepEP "
                                       "issues 155, 397, 493), never more"),
    "deepep_rdma_combine": (0.5, 1.0, "as deepep_rdma_dispatch"),
    "ep_overlap_hidden": (0.0, 1.0, "over NVLink it hid 0.71 of what it could, through host memory (a "
                                    "cross-node-like link) 0.13; with routing forced to balance -0.66 and 0.60, "
                                    "all with one CUDA connection (benchmarks/results/comm_4gpu.json)"),
}
# rows that are no rate of a step: the reference figures a calibration divides by
# (a calibrated row carries its own width)
NOT_RATES = ("ref_gemm_top", "ref_gemm_half_gflop", "ref_hbm_share", "ref_launch_us")
DOMINANT = 3  # rows named as the band's


def kind(source: str) -> str:
    """calibration | measured | assumed | published, from a row's source."""
    if source.startswith("measured:"):
        return "calibration"
    if source.startswith("measured by moetune"):
        return "measured"
    if source.startswith("assumed"):
        return "assumed"
    return "published"


def width(name: str, source: str) -> tuple[float, float, str, str]:
    """(low factor, high factor, why, kind) of a row's value: its own measured spread where SPREADS
    has one (unless a calibration replaced it), else its kind's width."""
    k = kind(source)
    if name in SPREADS and k != "calibration":
        return (*SPREADS[name], k)
    return (*WIDTHS[k], k)


def _ends(r: Rate) -> tuple[float, float, str, str]:
    lo, hi, why, k = width(r.name, r.source)
    high = r.value * hi
    if r.unit == "share" and r.value <= 1:  # a share of a peak, a link or a count: never past the whole
        high = min(high, 1.0)
    return r.value * lo, high, why, k


@dataclass(frozen=True)
class RowEffect:
    """One row's move of the step at its two ends."""
    name: str  # the rate row (or curve)
    kind: str  # calibration | measured | published | assumed
    value: float  # as priced
    low_value: float  # the row's low end
    high_value: float  # its high end
    down_ms: float  # how far the faster of its two ends takes the step below the prediction
    up_ms: float  # how far the slower end takes it above
    why: str  # where its width comes from

    def to_dict(self) -> dict:
        return {"kind": self.kind, "value": round(self.value, 6),
                "ends": [round(self.low_value, 6), round(self.high_value, 6)],
                "down_ms": round(self.down_ms, 3), "up_ms": round(self.up_ms, 3), "width_from": self.why}


@dataclass
class Band:
    """A prediction's step time, low to high, and the rows that make it."""
    step_time_ms: float  # the prediction itself
    low_ms: float  # the step with every row's faster end, added in quadrature
    high_ms: float  # with every row's slower end
    rows: list[RowEffect] = field(default_factory=list)  # rows that move the step, largest first

    def dominant(self, n: int = DOMINANT) -> list[RowEffect]:
        """The n rows that move the step most (either way)."""
        return self.rows[:n]

    def relative(self) -> tuple[float, float]:
        """(low, high) over the prediction: what a corrected prediction of the same layout is scaled by."""
        return self.low_ms / self.step_time_ms, self.high_ms / self.step_time_ms

    def expected_ms(self) -> float:
        """The mean of a triangular spread over low, the prediction, high: an asymmetric band moves
        what a move is expected to take toward its longer side."""
        return (self.low_ms + self.step_time_ms + self.high_ms) / 3

    def text(self) -> str:
        """'1234-1567 ms (host_us_per_kernel, ep_overlap_hidden, ...)'."""
        names = ", ".join(r.name for r in self.dominant())
        return f"{self.low_ms:.0f}-{self.high_ms:.0f} ms" + (f" (most from {names})" if names else "")

    def to_dict(self) -> dict:
        return {"low_ms": round(self.low_ms, 3), "high_ms": round(self.high_ms, 3),
                "dominant": [r.name for r in self.dominant()],
                "rows": {r.name: r.to_dict() for r in self.rows},
                "how": "each row priced at its two ends alone; the moves down and up each added in quadrature"}


def _with_row(rates: Rates, name: str, value: float) -> Rates:
    out = Rates.__new__(Rates)
    out.rows = {**rates.rows, name: replace(rates.rows[name], value=value)}
    out.curves = rates.curves
    return out


def _with_curve(rates: Rates, name: str, factor: float) -> Rates:
    c = rates.curves[name]
    out = Rates.__new__(Rates)
    out.rows = rates.rows
    out.curves = {**rates.curves, name: Curve(c.name, tuple((x, y * factor) for x, y in c.points), c.source)}
    return out


def band(step_ms: Callable[[Rates], float], rates: Rates, nominal_ms: float) -> Band:
    """The band of a prediction of `nominal_ms` at `rates`: `step_ms(rates)` prices the same layout
    at other rates (pricing.price passes the prediction with its setup read once)."""
    effects = []
    variants: list[tuple[str, str, float, float, float, str, Rates, Rates]] = []
    for r in rates.rows.values():
        if r.name in NOT_RATES:
            continue
        lo, hi, why, k = _ends(r)
        if lo == hi == r.value:
            continue
        variants.append((r.name, k, r.value, lo, hi, why, _with_row(rates, r.name, lo), _with_row(rates, r.name, hi)))
    for c in rates.curves.values():
        lo, hi, why, k = width(c.name, c.source)
        variants.append((c.name, k, 1.0, lo, hi, why, _with_curve(rates, c.name, lo), _with_curve(rates, c.name, hi)))
    for name, k, value, lo, hi, why, at_lo, at_hi in variants:
        ends = (step_ms(at_lo), step_ms(at_hi))
        down, up = max(0.0, nominal_ms - min(ends)), max(0.0, max(ends) - nominal_ms)
        if down > 1e-9 * nominal_ms or up > 1e-9 * nominal_ms:
            effects.append(RowEffect(name, k, value, lo, hi, down, up, why))
    effects.sort(key=lambda e: -max(e.down_ms, e.up_ms))
    low = nominal_ms - math.sqrt(sum(e.down_ms ** 2 for e in effects))
    high = nominal_ms + math.sqrt(sum(e.up_ms ** 2 for e in effects))
    return Band(nominal_ms, max(low, 0.0), high, effects)
