"""The step-time model (experiment/predict) in the tuner's hands: the order in which layout and
dispatcher moves are tried, the moves not worth a trial, and the study's own correction of the
model from what its trials measured.

    moves_layout(rule)               does the rule change a LAYOUT_FIELDS field
    Model(experiment, store).terms(cfg) the model's step split into the parts a trace measures
                                     (TERM_GROUPS), priced as `moetune predict` prices it;
                                     None where it cannot price the layout
    correction(pairs)                the study's scale: median measured / model of its completed trials
    term_correction(rows)            the study's correction of each part (TermCorrection)
    study_correction(store, study_id) both, from the completed trials' metrics in the store, read once
    Model(...).priced(cfg)           the parts and the prediction's band (estimate/band.py)
    ranked(props, model_ms)          layout moves re-ordered by expected step time in the slots they held
    slower(predicted, incumbent, rel, low) slower beyond the band: even the move's fast end is slower
                                     than the incumbent's slow end (its judged step plus the noise)?
    gpu_hours(gpus, ms, iters, limit) what a skipped trial would have cost

The study corrects the model part by part: a trial's trace splits its judged step into exposed
communication (exposed_comm_share), GPU idle (gpu_idle_share: the host's launches and the pipeline
bubble) and the rest (compute), and each part of a later prediction is multiplied by the median of
measured / model of that part over the completed trials (where the model gives it at least
TERM_FLOOR of the step; a part the model never gives that much is added as the median of measured
minus model instead). A cluster's kernels may run at another rate than the model's while its links
match the published ones, or the other way round: one scale would carry the one part's error into
layouts that have more of the other. The single scale (median of measured / model of the whole
step) is still reported: it says how far off the model is overall.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from moetune.estimate import StoreReadings, price
from moetune.estimate.band import Band
from moetune.estimate.memory import plan_cluster
from moetune.experiment.config import TrainingConfig

# config fields a layout or dispatcher move changes: the moves the model can rank
LAYOUT_FIELDS = ("tp", "pp", "vpp", "ep", "etp", "cp", "dispatcher", "flex_backend")
MS_PER_HOUR = 3.6e6
# the model's terms (estimate/step.py) by the part of a trial's trace that measures them
TERM_GROUPS = {"compute": ("compute", "optimizer"),
               "comm": ("ep_a2a", "tp_collectives", "pp_sends", "cp_exchange", "dp_grad_reduce", "dp_param_gather"),
               "idle": ("host_launch", "pipeline_bubble")}
TERM_FLOOR = 0.05  # a part the model gives less of the step than this says little of its own error


def moves_layout(rule) -> bool:
    return any(k in LAYOUT_FIELDS for k in rule.change)


class Model:
    """The experiment's model and cluster priced through estimate.price with the readings of
    `store` (its calibration of the cluster, its fits), as `moetune predict --db` prices them;
    without a store, at the published rates with analytic compute."""

    def __init__(self, experiment, store=None):
        self.experiment = experiment
        self.readings = StoreReadings(store=store) if store is not None else StoreReadings.empty()
        self.world = plan_cluster(experiment)[1]

    def terms(self, config: TrainingConfig) -> dict[str, float] | None:
        """The model's step of `config` by TERM_GROUPS (ms each), or None: a layout the model cannot
        price (its GPU count does not divide, a CPU stand-in's cluster without GPUs)."""
        got = self._price(config, False)
        return got[0] if got else None

    def priced(self, config: TrainingConfig) -> tuple[dict[str, float], Band | None] | None:
        """(terms() of `config`, its prediction's band), or None where the model cannot price it."""
        return self._price(config, True)

    def moves(self, props: list) -> tuple[dict, dict]:
        """({rule id: terms() or None}, {rule id: band}) of the layout moves among the proposals."""
        priced = {p.rule.id: self.priced(p.config) for p in props if p.ok and moves_layout(p.rule)}
        return ({rid: q[0] if q else None for rid, q in priced.items()},
                {rid: q[1] for rid, q in priced.items() if q})

    def _price(self, config: TrainingConfig, with_band: bool) -> tuple[dict[str, float], Band | None] | None:
        self.readings.refresh()  # the study records fits and calibrations as it runs
        try:
            p = price(self.experiment, config, self.readings, with_band=with_band)
        except (ValueError, KeyError, ZeroDivisionError):
            return None
        return {g: sum(p.terms[k] for k in keys) for g, keys in TERM_GROUPS.items()}, p.band


def correction(pairs: list[tuple[float, float]]) -> tuple[float, int]:
    """(scale, trials it comes from): median of measured / model over (measured, model) pairs."""
    ratios = [m / p for m, p in pairs if m and p]
    return (statistics.median(ratios), len(ratios)) if ratios else (1.0, 0)


@dataclass
class TermCorrection:
    """Per part of the step: a scale on the model's ms, or (a part the model never gave enough of
    the step to scale) an offset added in ms; `trials` how many completed trials it comes from.
    `scale`: the single scale on the whole step (correction()), reported beside it, from
    `scale_trials` trials."""
    scales: dict[str, float] = field(default_factory=dict)
    offsets: dict[str, float] = field(default_factory=dict)
    trials: int = 0
    scale: float = 1.0
    scale_trials: int = 0

    def apply(self, terms: dict[str, float]) -> float:
        return sum(v * self.scales.get(g, 1.0) + self.offsets.get(g, 0.0) for g, v in terms.items())

    def to_dict(self) -> dict:
        return {"scales": {g: round(v, 4) for g, v in self.scales.items()},
                "offsets_ms": {g: round(v, 3) for g, v in self.offsets.items()}, "trials": self.trials}


def measured_terms(m: dict) -> dict[str, float] | None:
    """A trial's judged step split as TERM_GROUPS by its trace's shares; None without them."""
    step, comm, idle = m.get("judged_step_time_ms"), m.get("exposed_comm_share"), m.get("gpu_idle_share")
    if not step or comm is None or idle is None:
        return None
    return {"compute": step * max(0.0, 1 - comm - idle), "comm": step * comm, "idle": step * idle}


def term_correction(rows: list[tuple[dict, dict]]) -> TermCorrection:
    """The correction from (measured parts, model parts) of completed trials (module docstring)."""
    out = TermCorrection(trials=len(rows))
    for g in TERM_GROUPS:
        ratios = [m[g] / p[g] for m, p in rows if p[g] >= TERM_FLOOR * sum(p.values()) > 0]
        if ratios:
            out.scales[g] = statistics.median(ratios)
        elif rows:
            out.offsets[g] = statistics.median(m[g] - p[g] for m, p in rows)
    return out


def study_correction(store, study_id: int) -> TermCorrection:
    """The study's correction from its completed trials' measured parts and recorded model parts,
    and its single scale from their measured and model steps: each trial's metrics read once."""
    rows, pairs = [], []
    for t in store.trials(study_id):
        if t.state != "completed":
            continue
        m = store.metrics(t.id)
        pairs.append((m.get("judged_step_time_ms"), m.get("predicted_model_ms")))
        measured = measured_terms(m)
        model = {g: m.get(f"predicted_{g}_ms") for g in TERM_GROUPS}
        if measured and None not in model.values():
            rows.append((measured, model))
    out = term_correction(rows)
    out.scale, out.scale_trials = correction(pairs)
    return out


def ranked(props: list, model_ms: dict) -> list:
    """The proposals with the layout moves among them sorted by predicted step time (fastest
    first, so the largest expected gain first; unpriced ones after, in table order), each in one
    of the slots layout moves held, so the other moves keep the table's place. `model_ms`: rule
    id -> predicted (expected: expected_ms) ms or None."""
    slots = [i for i, p in enumerate(props) if moves_layout(p.rule)]
    order = sorted((props[i] for i in slots),
                   key=lambda p: (model_ms.get(p.rule.id) is None, model_ms.get(p.rule.id) or 0.0))
    out = list(props)
    for i, p in zip(slots, order, strict=True):
        out[i] = p
    return out


def slower(predicted_ms: float, incumbent_ms: float, rel_noise: float, low_ms: float | None = None) -> bool:
    """Slower beyond the band: the move's optimistic end (`low_ms`, its band's low end; the
    prediction itself where it has no band) is still slower than the incumbent's pessimistic end,
    its measured step plus the judge's relative noise threshold. A move the model thinks slower by
    less than its own uncertainty is worth a trial."""
    return (predicted_ms if low_ms is None else low_ms) > incumbent_ms * (1 + rel_noise)


def banded(ms: float, band: Band | None) -> dict:
    """A corrected prediction's band: the model's band scaled as the prediction was (its ends over
    the model's step), and the rows that dominate it; the prediction alone without a band."""
    low, high = band.relative() if band is not None else (1.0, 1.0)
    return {"step_time_low_ms": round(ms * low, 3), "step_time_high_ms": round(ms * high, 3),
            "band_rows": [r.name for r in band.dominant()] if band is not None else []}


def expected_ms(terms: dict[str, float] | None, band: Band | None) -> float | None:
    """What a move is expected to take, to rank moves by expected gain over the incumbent: the
    band's expected step (Band.expected_ms) where it has one, else the model's step."""
    if terms is None:
        return None
    return band.expected_ms() if band is not None else sum(terms.values())


def gpu_hours(gpus: int, step_ms: float, iterations: int, limit_minutes: int) -> float:
    """A trial's GPU-hours: its GPUs x the predicted step x its iterations, or x the job's time
    limit where that is shorter (the job would have been ended there)."""
    return gpus * min(step_ms * iterations, limit_minutes * 60e3) / MS_PER_HOUR
