"""The layout search `moetune plan` shows: the layouts of an experiment on its cluster that pass the
constraints and fit (estimate/space.py, the speed order; memory.plan, the memory order), the
baseline among them, each with the measured peak the store holds of it, ranked by predicted
tokens/s/GPU (price), or least model parallelism first."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from moetune.estimate.memory import (
    OUT_OF_MEMORY,
    Layout,
    TooFewGPUs,
    baseline_layout,
    plan,
    plan_cluster,
)
from moetune.estimate.pricing import price
from moetune.estimate.readings import StoreReadings
from moetune.estimate.space import CPS, MAX_PP, TPS, Space, search_space
from moetune.experiment.config import TrainingConfig, run_args
from moetune.experiment.schema import cluster_section

# Fields that do not change a layout's memory: how long it runs and what is profiled. Routing's
# capacity fields are left out too, since a fit runs the layout with static routing.
_NOT_LAYOUT = {"train_iters", "profile_step_start", "profile_step_end", "capacity_factor", "pad_to_capacity"}


def layout_key(config: dict) -> str:
    """A config's fields that set its memory, as one comparable string."""
    return json.dumps({k: v for k, v in config.items() if k not in _NOT_LAYOUT}, sort_keys=True)


def measured_peaks(exp, world: int, readings: StoreReadings, capacity_gb: float) -> dict[str, float]:
    """{layout key: highest measured peak (GB, Megatron's max allocated)} of the trials in the store
    of this model at this GPU count; OUT_OF_MEMORY where a run or fit of the layout ran out of memory
    on a GPU with at least `capacity_gb` (on a smaller one it says nothing of this GPU)."""
    out: dict[str, float] = {}
    for study, t, metrics in readings.trials():
        if study.model not in (exp.name, exp.model.name):
            continue
        cluster = cluster_section((study.experiment or {}).get("cluster") or {})
        if cluster.world != world:
            continue
        # a run's peak, else its fit's (the layout measured on one GPU: experiment/fit.py)
        peak = t.peak_memory_gb if t.peak_memory_gb is not None else metrics.get("fit_peak_gb")
        if (t.state == "oom" or metrics.get("fit_oom")) and cluster.memory_gb >= capacity_gb:
            peak = OUT_OF_MEMORY
        if peak is None:
            continue
        key = layout_key(TrainingConfig.from_dict(t.config).to_dict())
        out[key] = max(out.get(key, 0.0), float(peak))
    return out


@dataclass
class Search:
    """The layouts found (`base`: the baseline's, None where the GPUs cannot hold it), on `world`
    GPUs of `capacity_gb` each; `predicted`: id(layout) -> its prediction's headline."""
    layouts: list[Layout]
    base: Layout | None
    world: int
    capacity_gb: float
    predicted: dict[int, dict] = field(default_factory=dict)
    refused: list[list] = field(default_factory=list)  # memory.plan's: each candidate left out, why
    space: Space | None = None  # the speed search's counts (estimate/space.py); None for --order memory

    def common_refusal(self) -> list:
        """The constraint violations (of the first candidate) whose rules refused every candidate
        the search left out, where none fitted; empty where memory or differing rules did."""
        if self.layouts or not self.refused or not all(self.refused):
            return []
        common = set.intersection(*({v.code for v in vs} for vs in self.refused))
        return [v for v in self.refused[0] if v.code in common]

    def headline(self, layout: Layout) -> dict | None:
        """The layout's predicted tokens/s/GPU, step and compute source; None where not priced."""
        return self.predicted.get(id(layout))


def batch_bound(exp, world: int) -> str | None:
    """Why no layout on `world` GPUs can run where the global batch is what bounds them (one line):
    it feeds at most global batch / micro batch data-parallel ranks, so at most that many times
    the search's largest TP×PP×CP GPUs; None where it can feed `world`."""
    base = exp.baseline
    ranks = base.global_batch // max(base.micro_batch, 1)
    cp = max(base.cp, *CPS)
    parallel = max(TPS) * MAX_PP * cp
    most = ranks * parallel
    if world <= most:
        return None
    return (f"baseline.global_batch {base.global_batch} with micro batch {base.micro_batch} feeds at most "
            f"{ranks} data-parallel ranks, {most} GPUs at the search's largest TP×PP×CP "
            f"({max(TPS)}×{MAX_PP}×{cp}); {world} GPUs need a global batch of "
            f"{-(-world // parallel) * max(base.micro_batch, 1)} or more")


def ranked(exp, layouts: list[Layout], gpus: int | None, gpu_type: str | None,
           readings: StoreReadings) -> tuple[list[Layout], dict[int, dict]]:
    """(the layouts by predicted tokens/s/GPU, fastest first, compute measured where the store
    holds a fit of the layout; their headlines by id). One the model cannot price (its batch does
    not divide) goes last."""
    predicted: dict[int, dict] = {}
    for lay in layouts:
        try:
            p = price(exp, lay.config, readings, gpus, gpu_type)
        except ValueError:
            continue
        predicted[id(lay)] = {"tokens_per_s_per_gpu": round(p.tokens_per_s_per_gpu),
                              "step_time_ms": round(p.step_time_ms, 1), "compute_source": p.compute_source}
    return sorted(layouts, key=lambda lay: -predicted.get(id(lay), {}).get("tokens_per_s_per_gpu", -1)), predicted


def banded(exp, layouts: list[Layout], predicted: dict[int, dict], gpus: int | None, gpu_type: str | None,
           readings: StoreReadings) -> None:
    """Each shown layout's headline with its band (band.py: the low and high step and the rows that
    make it), priced for these alone: a band costs a few dozen prices."""
    for lay in layouts:
        head = predicted.get(id(lay))
        if head is None:
            continue
        b = price(exp, lay.config, readings, gpus, gpu_type, with_band=True).band
        if b is None:
            continue
        head.update(step_time_low_ms=round(b.low_ms, 1), step_time_high_ms=round(b.high_ms, 1),
                    band_rows=[r.name for r in b.dominant()])


def search(exp, readings: StoreReadings, gpus: int | None = None, gpu_type: str | None = None,
           order: str = "speed", limit: int = 10, baseline: bool = False, fixed: dict | None = None) -> Search:
    """The feasible layouts (at most `limit`) by `order` ("speed": predicted tokens/s/GPU, VPP
    pipelines among them; "memory": least model parallelism first), the baseline first where it
    fits and the grid does not hold it; `baseline`: the baseline's layout alone, fitting or not
    (TooFewGPUs where the GPUs cannot hold it). `fixed`: fields every candidate keeps (memory.plan)."""
    _, world, capacity = plan_cluster(exp, gpus, gpu_type)
    peaks = measured_peaks(exp, world, readings, capacity)

    def measured(cfg: TrainingConfig) -> float | None:
        return peaks.get(layout_key(cfg.to_dict()))

    if baseline:  # TooFewGPUs where the GPUs cannot hold it
        alone = baseline_layout(exp, gpus, gpu_type, measured=measured)
        return Search([alone], alone, world, capacity)
    base: Layout | None
    try:
        base = baseline_layout(exp, gpus, gpu_type, measured=measured)
    except TooFewGPUs:
        base = None
    if order == "speed":
        return _by_speed(exp, readings, gpus, gpu_type, limit, fixed, base, world, capacity,
                         measured if peaks else None)
    refused: list[list] = []
    layouts = plan(exp, gpus, gpu_type, limit=limit, measured=measured, refused=refused, fixed=fixed)
    # the baseline is a candidate too, where it fits and the search's grid does not hold it
    if base is not None and base.fits and all(layout_key(lay.config.to_dict()) != layout_key(
            base.config.to_dict()) for lay in layouts):
        layouts.insert(0, base)
    return Search(layouts, base, world, capacity, {}, refused)


def _same_layout(a: TrainingConfig, b: TrainingConfig) -> bool:
    """Whether two configs are one layout (layout_key), the cheap fields compared first."""
    return (a.tp, a.pp, a.ep, a.vpp, a.cp, a.micro_batch) == (b.tp, b.pp, b.ep, b.vpp, b.cp, b.micro_batch) \
        and layout_key(a.to_dict()) == layout_key(b.to_dict())


def _by_speed(exp, readings: StoreReadings, gpus: int | None, gpu_type: str | None, limit: int,
              fixed: dict | None, base: Layout | None, world: int, capacity: float, measured) -> Search:
    """The `limit` fastest of the search space (estimate/space.py), the baseline among them where it
    fits and the space does not hold it, each with its band."""
    space = search_space(exp, readings, gpus, gpu_type, keep=max(limit, 10), fixed=fixed, measured=measured)
    m = exp.model
    layouts = [Layout(f.config, [], f.memory_gb, f.breakdown, f.config.tp * f.config.pp, capacity_gb=capacity,
                      measured_gb=f.measured_gb) for f in space.fit[:limit]]
    if base is not None and base.fits and not any(_same_layout(f.config, base.config) for f in space.fit):
        layouts.append(base)
    layouts, predicted = ranked(exp, layouts, gpus, gpu_type, readings)
    layouts = layouts[:limit]
    for lay in layouts:
        if not lay.args:
            lay.args = lay.config.to_args(m) + run_args()
    banded(exp, layouts, predicted, gpus, gpu_type, readings)
    return Search(layouts, base, world, capacity, predicted, space.refused, space)
