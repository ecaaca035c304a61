"""The step-time model (spec/predict) in the tuner's hands: the order in which layout and
dispatcher moves are tried, the moves not worth a trial, and the study's own correction of the
model from what its trials measured.

    moves_layout(rule)               does the rule change a LAYOUT_FIELDS field
    Model(experiment).model_ms(cfg)  the model's step time; None where it cannot price the layout
    correction(pairs)                the study's scale: median measured / model of its completed trials
    study_scale(store, study_id)     the same, from the trials' metrics in the store
    ranked(props, model_ms)          layout moves re-ordered by predicted step time in the slots they held
    slower(predicted, incumbent, rel) predicted slower than the incumbent by more than the noise?
    gpu_hours(gpus, ms, iters, limit) what a skipped trial would have cost

The correction is one scale on the whole prediction: measured = scale x model, the scale the
median of measured / model over the study's completed trials (1 before any), applied to every
later prediction. The model's absolute error on a cluster (host speed, kernel efficiency) is
mostly such a factor; its ranking of layouts is what the tuner leans on.
"""
from __future__ import annotations

import statistics

from moetune.pipeline.spec.config import TrainingConfig
from moetune.pipeline.spec.predict import Node, predict
from moetune.pipeline.spec.section import gpu_count

# config fields a layout or dispatcher move changes: the moves the model can rank
LAYOUT_FIELDS = ("tp", "pp", "vpp", "ep", "etp", "cp", "dispatcher", "flex_backend")
MS_PER_HOUR = 3.6e6


def moves_layout(rule) -> bool:
    return any(k in LAYOUT_FIELDS for k in rule.change)


class Model:
    """The experiment's model and cluster, priced by spec/predict (analytic compute)."""

    def __init__(self, experiment):
        self.model, self.cluster = experiment.model, experiment.cluster
        self.world = gpu_count(experiment.cluster)

    def model_ms(self, config: TrainingConfig) -> float | None:
        """The model's step time of `config`, or None: a layout the model cannot price (its GPU
        count does not divide, a CPU stand-in's cluster without GPUs) is ranked by the table alone."""
        try:
            return predict(self.model, config, Node.of(self.cluster), self.world).step_time_ms
        except (ValueError, KeyError, ZeroDivisionError):
            return None


def correction(pairs: list[tuple[float, float]]) -> tuple[float, int]:
    """(scale, trials it comes from): median of measured / model over (measured, model) pairs."""
    ratios = [m / p for m, p in pairs if m and p]
    return (statistics.median(ratios), len(ratios)) if ratios else (1.0, 0)


def study_scale(store, study_id: int) -> tuple[float, int]:
    """The study's correction from its completed trials' recorded measured and model step times."""
    pairs = []
    for t in store.trials(study_id):
        if t.state == "completed":
            m = store.metrics(t.id)
            pairs.append((m.get("judged_step_time_ms"), m.get("predicted_model_ms")))
    return correction(pairs)


def ranked(props: list, model_ms: dict) -> list:
    """The proposals with the layout moves among them sorted by predicted step time (fastest
    first; unpriced ones after, in table order), each in one of the slots layout moves held, so
    the other moves keep the table's place. `model_ms`: rule id -> predicted ms or None."""
    slots = [i for i, p in enumerate(props) if moves_layout(p.rule)]
    order = sorted((props[i] for i in slots),
                   key=lambda p: (model_ms.get(p.rule.id) is None, model_ms.get(p.rule.id) or 0.0))
    out = list(props)
    for i, p in zip(slots, order):
        out[i] = p
    return out


def slower(predicted_ms: float, incumbent_ms: float, rel_noise: float) -> bool:
    """Predicted slower than the incumbent by more than the judge's relative noise threshold."""
    return predicted_ms > incumbent_ms * (1 + rel_noise)


def gpu_hours(gpus: int, step_ms: float, iterations: int, limit_minutes: int) -> float:
    """A trial's GPU-hours: its GPUs x the predicted step x its iterations, or x the job's time
    limit where that is shorter (the job would have been ended there)."""
    return gpus * min(step_ms * iterations, limit_minutes * 60e3) / MS_PER_HOUR
