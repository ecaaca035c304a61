"""`moetune fit MODEL [--tp N --pp N --ep N --etp N --micro-batch N] [--executor E]`: one layout's
memory-bounding ranks measured on one GPU each (experiment/fit.py), as the fit stage of a trial of the
study MODEL-fit; prints each rank's peak and step time and whether the layout fits. Its arguments
are in cli/common.py (add_fit_arguments), so that `moetune --help` does not load this module."""
from __future__ import annotations

from pathlib import Path

from moetune.analysis.usage import Parser
from moetune.cli.common import LAYOUT_OPTIONS
from moetune.experiment.config import TrainingConfig
from moetune.trial import stages


def fit_config(exp, args, notes: list[str] | None = None) -> TrainingConfig:
    """The layout a fit measures: the baseline with the layout flags given, by the rules `predict`
    and `plan` apply (cli/predict.layout_config): a PP changed does not inherit an uneven split made
    for the baseline's PP, it is recomputed (the split said in `notes`)."""
    from moetune.cli.predict import add_layout_args, layout_config
    p = Parser(add_help=False)
    add_layout_args(p)
    flags = p.parse_args([])  # every layout flag unset, then fit's own
    for k in LAYOUT_OPTIONS:
        setattr(flags, k, getattr(args, k, None))
    return layout_config(exp.baseline, flags, exp.model, notes)


def run(store, args, exp, config: TrainingConfig) -> tuple[dict, int]:
    """(fit.json's content, trial id) of the layout's fit (`config`, fit_config's), measured now."""
    study = store.create_study(f"{exp.name}-fit", exp.model.name, {
        **exp.to_stored(), "experiment": str(exp.path), "executor": args.executor})
    trial = store.trial_by_hash(study.id, config.config_hash()) or \
        store.add_trial(study.id, config.to_dict(), config.config_hash(), fix="fit")
    stages.run_stage(store, trial.id, stages.FIT, force=True, runs_root=Path(args.runs),
                     executor=args.executor)
    return stages.load_fit(stages.TrialContext(store, trial.id, Path(args.runs), args.executor)), trial.id


def exit_code(fitted: dict) -> int:
    """0 when the layout fits; 1 when it does not (a peak measured, or out of memory); 2 when a rank
    could not measure at all (its log names why: a missing module, a refusal at start-up), which
    says nothing of the layout's memory."""
    if fitted.get("fits"):
        return 0
    return 1 if fitted.get("failure") in (None, "oom") else 2


def render(fitted: dict, layout: str) -> str:
    lines = [f"{layout} on {fitted['world']} GPUs: {fitted['reason']}",
             f"  {'rank':>6} {'max allocated GB':>17} {'max reserved GB':>16} {'step ms':>9}  failure"]

    def num(v, f: str) -> str:
        return format(v, f) if isinstance(v, (int, float)) else "-".rjust(int(f.split(".")[0]))

    for rank, r in sorted(fitted["ranks"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"  {rank:>6} {num(r.get('max_allocated_gb'), '17.2f')} "
                     f"{num(r.get('max_reserved_gb'), '16.2f')} {num(r.get('step_time_ms'), '9.1f')}  "
                     f"{r.get('failure') or '-'}")
    return "\n".join(lines)
