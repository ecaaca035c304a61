"""`moetune tune EXPERIMENT --dry-run`: the trials a study would try first and what they would cost,
before anything runs. Nothing is written: no store, no runs folder, no lock.

    dry_run(experiment, readings, ...) -> DryRun   # the plan
    render(plan) -> str                             # as printed

The baseline is known; the moves after it depend on the wall the baseline's trace shows, so for
each wall the first moves the rule table proposes on that wall alone (a rule whose metric condition
needs a measurement is left out: it cannot be known yet), in the loop's order (layout moves ranked
by the model's prediction where the loop ranks them, tune/predicted.py; the memory wall's fixes in
the table's fit order). Each trial is priced by the estimate's price(), the one entry the tuner
prices through, and charged as the budget charges it: the whole job (job/cost.py), so its
iterations at the predicted step plus the job's start-up, warm-up and profiling (START_UP_S).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from moetune.analysis.walls import WALL_ORDER
from moetune.decide import rules as rules_mod
from moetune.estimate import StoreReadings, price
from moetune.estimate.memory import plan_cluster
from moetune.experiment.config import TrainingConfig, diff_text
from moetune.experiment.constraints import check
from moetune.experiment.schema import Experiment
from moetune.job.render import time_minutes
from moetune.tune import predicted

# what the step's band stands beside: docs/prediction.md "Validation" and "Scored on unseen runs"
# (benchmarks/results/predict_scoring.json; tests/tune/test_dryrun.py keeps the figures equal)
STEP_ERROR_SOURCE = ("step times with their band (each rate at the ends of its spread, docs/prediction.md); "
                     "the model's median absolute error is 16.3% on the 19 public H100 rows it was built beside "
                     "and 12.1% (as frozen) on 10 it was not shaped on (its trial-bank rows, a small proxy on "
                     "2x H200, are off by 55.8%)")
# a job's time beyond its iterations at the judged step: start-up, warm-up, the profiled window;
# the trial bank's 30 completed jobs (data/trial_bank/bank.jsonl wall_s less 16 iterations x the
# judged step, 2x and 1x H200, no Slurm queue): median 49 s, 35 s to 73 s
START_UP_S = (35.0, 49.0, 73.0)
MOVES_PER_WALL = 2  # first moves shown for each wall the baseline may show


@dataclass
class PlannedTrial:
    """One trial the study would try."""
    label: str  # "baseline", or the rule's id
    change: str  # the config change, `field old -> new` ("" for the baseline)
    config: TrainingConfig  # what it would run
    step_ms: float | None = None  # predicted step time (None: the model cannot price the layout)
    step_band_ms: tuple[float, float] | None = None  # its band's (low, high)
    why_unpriced: str | None = None  # why not, where not
    gpu_hours: tuple[float, float, float] | None = None  # (low, predicted, high), whole job


@dataclass
class DryRun:
    """What `moetune tune --dry-run` prints."""
    experiment: str  # the experiment's name
    gpus: int  # GPUs a trial holds
    gpu_type: str  # the cluster's GPU type
    iterations: int  # training iterations a trial runs
    limit_min: int  # the job's time limit, minutes
    max_trials: int  # the trial budget
    max_gpu_hours: float  # the GPU-hour budget
    budget_from: str  # where the budget came from (the YAML's keys, the flags)
    baseline: PlannedTrial  # trial 1
    moves: dict[str, list[PlannedTrial]] = field(default_factory=dict)  # wall -> its first moves
    notes: list[str] = field(default_factory=list)  # what the figures leave out


def _whole_job_hours(gpus: int, steps_ms: tuple[float, float, float], iterations: int,
                     limit_min: int) -> tuple[float, float, float]:
    """(low, predicted, high) GPU-hours of a job: its iterations at the (low, predicted, high) step
    plus START_UP_S, at most the time limit (the job would be ended there)."""
    cap = limit_min * 60.0

    def hours(step_ms: float, start_s: float) -> float:
        return gpus * min(iterations * step_ms / 1e3 + start_s, cap) / 3600.0
    return tuple(hours(ms, s) for ms, s in zip(steps_ms, START_UP_S, strict=True))  # type: ignore[return-value]


def _planned(exp: Experiment, readings, label: str, change: str, config: TrainingConfig, gpus: int,
             priced: bool, limit_min: int) -> PlannedTrial:
    t = PlannedTrial(label, change, config)
    if not priced:
        t.why_unpriced = "a one-GPU study measures one rank alone, not the step the model predicts"
        return t
    try:
        p = price(exp, config, readings, with_band=True)
    except (ValueError, KeyError, ZeroDivisionError) as e:
        t.why_unpriced = str(e).splitlines()[0] if str(e) else type(e).__name__
        return t
    t.step_ms = p.step_time_ms
    t.step_band_ms = (p.band.low_ms, p.band.high_ms) if p.band else (p.step_time_ms, p.step_time_ms)
    t.gpu_hours = _whole_job_hours(gpus, (t.step_band_ms[0], t.step_ms, t.step_band_ms[1]), config.train_iters,
                                   limit_min)
    return t


def first_moves(exp: Experiment, wall: str, rules: list, one_gpu: bool, readings, rank_moves: bool,
                base_ms: float | None = None, lacking=None) -> list:
    """The proposals the loop would make on a baseline whose trace shows `wall` and nothing else
    known (no metric), in the loop's order; left out: those refused by the constraints, those
    `lacking(config)` names a reason for (the demo's bank), and layout moves predicted slower than
    the baseline's `base_ms` beyond their band and the noise (the loop skips them)."""
    analysis: dict = {"wall": wall, "confidence": None, "evidence": [], "metrics": {"combined": {}}, "log": {}}
    props = rules_mod.proposals(analysis, exp.baseline, exp.model, exp.cluster, exp.tuning,
                                check=check, rules=rules)
    props = [p for p in props if p.ok and (p.rule.one_gpu or not one_gpu)
             and not (lacking and lacking(p.config))]
    if wall == "memory":  # nothing fits: the fit step's memory fixes in the table's fit order
        order = {rid: i for i, rid in enumerate(rules_mod.load_fit_order(rules=rules))}
        return sorted((p for p in props if p.rule.id in order), key=lambda p: order[p.rule.id])
    if not rank_moves:
        return props

    def model(cfg):
        try:
            return price(exp, cfg, readings, with_band=True)
        except (ValueError, KeyError, ZeroDivisionError):
            return None
    priced = {p.rule.id: model(p.config) for p in props if predicted.moves_layout(p.rule)}
    ms = {rid: q.band.expected_ms() if q else None for rid, q in priced.items()}
    rel = exp.tuning.noise_threshold
    return [p for p in predicted.ranked(props, ms) if not (base_ms and (q := priced.get(p.rule.id))
            and predicted.slower(q.step_time_ms, base_ms, rel, q.band.low_ms))]


def dry_run(exp: Experiment, readings: StoreReadings | None = None, *, max_trials=None,
            max_gpu_hours=None, rules: list | None = None, lacking=None) -> DryRun:
    """The plan of a study of `exp` (tuning.one_gpu already applied by the caller), priced with
    `readings` (the store's calibration and fits, read only; None: the published rates).
    `lacking(config)`: why the executor would not propose a config (the demo's bank), or None."""
    readings = readings or StoreReadings.empty()
    rules = rules if rules is not None else rules_mod.load_rules()
    one_gpu = bool(exp.tuning.one_gpu)
    gpus = 1 if one_gpu else plan_cluster(exp)[1]
    limit_min = time_minutes(exp.cluster.time_limit)
    trials = exp.tuning.budget_trials if max_trials is None else max_trials
    hours = exp.tuning.budget_gpu_hours if max_gpu_hours is None else max_gpu_hours
    src = [("--max-trials" if max_trials is not None else "tuning.budget_trials"),
           ("--max-gpu-hours" if max_gpu_hours is not None else "tuning.budget_gpu_hours")]
    base = _planned(exp, readings, "baseline", "", exp.baseline, gpus, not one_gpu, limit_min)
    plan = DryRun(exp.name, gpus, exp.cluster.gpu_type, exp.baseline.train_iters, limit_min, int(trials),
                  float(hours), " and ".join(src), base)
    rank = not one_gpu and exp.tuning.predict_moves
    for wall in WALL_ORDER:
        props = first_moves(exp, wall, rules, one_gpu, readings, rank, base.step_ms, lacking)[:MOVES_PER_WALL]
        plan.moves[wall] = [
            _planned(exp, readings, p.rule.id,
                     diff_text({k: list(v) for k, v in exp.baseline.diff(p.config).items()}),
                     p.config, gpus, not one_gpu, limit_min) for p in props]
    plan.notes.append(STEP_ERROR_SOURCE)
    lo, mid, hi = START_UP_S
    plan.notes.append(f"GPU-hours are whole jobs, as the budget counts them: {gpus} GPU"
                      f"{'s' if gpus > 1 else ''} x ({plan.iterations} iterations x the step + start-up, "
                      f"warm-up and profiling, {mid:.0f} s ({lo:.0f}-{hi:.0f} s: the trial bank's jobs)), at "
                      f"most the {limit_min}-minute time limit")
    if exp.tuning.fit_first is not False and exp.cluster.world > 1 and not one_gpu:
        plan.notes.append("a fit on one GPU before each new layout (tuning.fit_first) is charged too and "
                          "not priced here")
    return plan


def _ms(t: PlannedTrial) -> str:
    if t.step_ms is None:
        return "not priced"
    lo, hi = t.step_band_ms or (t.step_ms, t.step_ms)
    return f"{t.step_ms:.1f} ({lo:.1f}-{hi:.1f})"


def _hours(t: PlannedTrial) -> str:
    if t.gpu_hours is None:
        return "-"
    lo, mid, hi = t.gpu_hours
    return f"{mid:.3f} ({lo:.3f}-{hi:.3f})"


def _row(n: str, t: PlannedTrial) -> str:
    return f"  {n:>5}  {t.label:<26} {_ms(t):>28}  {_hours(t):<26} {t.change}"


def render(plan: DryRun) -> str:
    """The plan as `moetune tune --dry-run` prints it."""
    lines = [f"{plan.experiment}: dry run, nothing submitted or written",
             f"budget: {plan.max_trials} trials, {plan.max_gpu_hours:g} GPU-hours ({plan.budget_from}); "
             f"a trial: {plan.gpus} x {plan.gpu_type}, {plan.iterations} iterations, time limit {plan.limit_min} min",
             f"  {'trial':>5}  {'move':<26} {'predicted ms/step (band)':>28}  {'GPU-hours (band)':<26} change",
             _row("1", plan.baseline)]
    if plan.baseline.why_unpriced:
        lines.append(f"         not priced: {plan.baseline.why_unpriced}")
    groups: dict[tuple, list[str]] = {}  # walls whose first moves are the same, said once
    for wall, moves in plan.moves.items():
        groups.setdefault(tuple(t.label for t in moves), []).append(wall)
    for labels, walls in groups.items():
        named = [w for w in walls if w != "memory"]
        walls_text = " or ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
        lead = ([f"shows the {walls_text} wall"] if named else []) + \
            (["does not fit"] if "memory" in walls else [])
        moves = plan.moves[walls[0]]
        if not labels:
            lines.append(f"  if the baseline {' or '.join(lead)}: no move known before it is measured")
            continue
        lines.append(f"  if the baseline {' or '.join(lead)}:")
        lines += [_row("2" if i == 0 else "then", t) for i, t in enumerate(moves)]
    if plan.baseline.gpu_hours:
        fits = plan.max_gpu_hours / plan.baseline.gpu_hours[1]
        lines.append(f"at the baseline's predicted cost the GPU-hour budget holds about {fits:.0f} trials; "
                     f"the trial budget stops at {plan.max_trials}")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)
