"""A one-GPU study's step, planned before any job (tuning.one_gpu; experiment/fit.py one_gpu_config).

Every trial of a one-GPU study runs the same step, so that their times compare: a number of
sequences per data-parallel rank that must hold each trial's micro batch a whole number of times,
and at least as many micro-batches as its pipeline has stages. The step is sized at the study's
start for the baseline and for every PP and micro batch the study's rules could propose within
STEP_CHANGES changes of either; a change the step cannot hold is not proposed (`refusal`).

    plan_samples(baseline, model, cluster, tuning, rules)  -> the study's step (explicit or derived)
    refusal(config, samples)                               -> why the step cannot hold config, or None
"""
from __future__ import annotations

from moetune.decide.rules import Rule, context, holds, known
from moetune.errors import MoetuneError
from moetune.experiment import fit
from moetune.experiment.config import TrainingConfig
from moetune.experiment.constraints import check as constraint_check

# Changes of PP or micro batch past the baseline's the step is sized for. Each doubling it holds
# doubles every trial's step: one keeps the step within twice the least that fills the pipeline
# (deepseek_v3's PP-16 rank 0 ran 2.0 s a step at 16 samples, H100), and the rules' next doubling
# (micro batch 1 -> 2 on a host-bound baseline) can still be tried.
STEP_CHANGES = 1
STEP_FIELDS = ("pp", "micro_batch")


class StepError(MoetuneError):
    """An explicit one-GPU step that cannot run the study's baseline (one line)."""


def _could_hold(cond, ctx: dict) -> bool:
    """A precondition as known before the trial: one on a measured figure (memory used, absent
    until the trial ran) might hold, so it is taken to."""
    return not known(ctx, cond[0]) or holds(cond, ctx)


def step_layouts(config: TrainingConfig, model, cluster, tuning=None, rules: list[Rule] = (),
                 check=constraint_check, changes: int = STEP_CHANGES) -> set[tuple[int, int]]:
    """(PP, micro batch) of `config` and of every config the one-GPU rules that change them could
    propose within `changes` changes, their preconditions and the constraint checker permitting."""
    movers = [r for r in rules if r.one_gpu and set(r.change) & set(STEP_FIELDS)]
    layouts = {(config.pp, config.micro_batch)}
    frontier = [config]
    for _ in range(changes):
        reached = {}
        for c in frontier:
            ctx = context({}, c, model, cluster, tuning)
            for rule in movers:
                if not all(_could_hold(cond, ctx) for cond in rule.requires):
                    continue
                new = rule.apply(c)
                if new is None or new == c or check(new, model, cluster):
                    continue
                reached.setdefault(new.config_hash(), new)
        frontier = list(reached.values())
        layouts |= {(c.pp, c.micro_batch) for c in frontier}
    return layouts


def plan_samples(baseline: TrainingConfig, model, cluster, tuning, rules: list[Rule],
                 check=constraint_check) -> int:
    """The study's step: tuning.one_gpu_samples where the experiment sets it (it must hold the
    baseline), else the least that holds every layout of step_layouts()."""
    explicit = tuning.one_gpu_samples
    if explicit is not None:
        why = fit.one_gpu_problem(baseline, int(explicit))
        if why:
            raise StepError(f"the baseline: {why}; or leave tuning.one_gpu_samples unset to size the "
                            "step from the layout")
        return int(explicit)
    return fit.one_gpu_samples(step_layouts(baseline, model, cluster, tuning, rules, check))


def refusal(config: TrainingConfig, samples: int) -> str | None:
    """Why the study's one-GPU step cannot hold `config` (a rule's change): it is then not proposed."""
    return fit.one_gpu_problem(config, samples)
