"""The tuning loop: baseline → profile → classify → best untried rule → run → keep or revert.

The loop keeps no state of its own: every step reads the study from the store (`StudyState`) and
writes one decision back, so a tuner killed at any point and started again continues where it
was, runs no config twice (one trial per config hash) and ends with the same best config.

Each decision's kind is one of tune/state.py DECISION_KINDS; a pending trial is run and judged
by `Tuner.run_and_judge`, its outcome deciding through decide/outcomes.py OUTCOME_RULINGS.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from tqdm import tqdm

from moetune import settings
from moetune.decide import one_gpu as one_gpu_step
from moetune.decide import outcomes
from moetune.decide import rules as rules_mod
from moetune.decide.judge import judged_step
from moetune.errors import MoetuneError
from moetune.experiment import fit
from moetune.experiment.config import TrainingConfig, diff_text
from moetune.experiment.constraints import check
from moetune.experiment.placement import Placement
from moetune.experiment.schema import Experiment, load_experiment
from moetune.job import executors, slurm
from moetune.job.paths import TrialPaths
from moetune.job.render import time_minutes
from moetune.job.replay import find as find_entry
from moetune.job.replay import load_bank
from moetune.paths import trial_folder
from moetune.store import now
from moetune.trial import run as runner
from moetune.trial import stages
from moetune.tune import budget, gate, predicted
from moetune.tune.lock import study_lock
from moetune.tune.state import DECISION_KINDS, StudyState, image_of, study_state
from moetune.tune.summary import summary

RETRY_CAP = 2  # re-submits of one trial after node failures; then it is judged as it ended


class TunerError(MoetuneError):
    """A problem with the study an engineer can act on (one line)."""


def _combined(analysis: dict | None) -> dict:
    return ((analysis or {}).get("metrics") or {}).get("combined") or {}


def _load_analysis(store, runs_root: Path, study: str, trial) -> dict | None:
    p = TrialPaths(trial_folder(runs_root, study, store.trial(trial.id))).analysis
    return json.loads(p.read_text()) if p.exists() else None


def fit_analysis(fitted: dict) -> dict:
    """A fit that did not fit, as the analysis the rule table reads: the memory wall, with the
    measured peak against what the GPU leaves after the headroom (experiment/fit.py)."""
    room = (fitted.get("capacity_gb") or 0) - (fitted.get("headroom_gb") or 0)
    oom = any(r.get("failure") == "oom" for r in (fitted.get("ranks") or {}).values())
    return {"wall": "memory", "confidence": 1.0, "gpu_memory_gb": fitted.get("capacity_gb"),
            "evidence": [{"rule": "fit_exceeds", "wall": "memory", "metric": "fit_peak_gb",
                          "value": fitted.get("peak_gb"), "threshold": round(room, 2),
                          "source": "moe-optimization-workflow.md (Phase 1: make the run memory-feasible)",
                          "reason": fitted.get("reason")}],
            "metrics": {"combined": {"peak_memory_gb": fitted.get("peak_gb")}},
            "log": {"failure": "oom" if oom else None}}


class Tuner:
    def __init__(self, experiment, store, *, executor: str, runs_root: Path, study_name: str,
                 max_trials=None, bank_dir=None, progress=True, rules=None, max_gpu_hours=None):
        self.exp, self.store, self.executor = experiment, store, executor
        self.runs_root, self.study_name = Path(runs_root), study_name
        self.bank_dir = Path(bank_dir) if bank_dir else None
        self.runner = executors.of_kind(executor, self.bank_dir)  # asked what it can run, not named
        self.progress = progress
        self.rules = rules if rules is not None else rules_mod.load_rules()
        self.rule_by_id = {r.id: r for r in self.rules}
        self.fit_order = rules_mod.load_fit_order(rules=self.rules)
        self.max_trials = int(experiment.tuning.budget_trials if max_trials is None else max_trials)
        self.budget_gpu_hours = float(experiment.tuning.budget_gpu_hours if max_gpu_hours is None else max_gpu_hours)
        if self.max_trials < 1 or self.budget_gpu_hours <= 0:
            raise TunerError(f"a budget of {self.max_trials} trials and {self.budget_gpu_hours} GPU-hours: "
                             "give at least one trial and more than 0 GPU-hours")
        self.note: str | None = None  # why a study stopped before this run stays stopped
        self._charged: dict = {}  # the judged trial's GPU-hours and their basis (_charge)
        self.rel_noise = experiment.tuning.noise_threshold
        self.alpha = experiment.tuning.significance
        self.patience = experiment.tuning.patience
        self.hang_timeout_s = experiment.tuning.hang_timeout_s
        # where trials run, decided once (experiment/placement.py): one GPU (tuning.one_gpu) runs
        # every trial as one rank of the layout alone (the slowest MoE stage's), so a trial costs
        # one GPU's time and only the rules one rank can show are proposed
        record = experiment.to_stored()
        # the one-GPU step, planned now for every trial the study can propose (decide/one_gpu.py)
        samples = self._plan_samples() if experiment.tuning.one_gpu else None
        decided = Placement.decide(experiment.tuning, experiment.cluster.world, samples)
        if decided.one_gpu:
            record["tuning"]["one_gpu_samples"] = decided.samples
        record.update({"executor": "local" if executor == "replay" else executor,
                       "replay": executor == "replay", "plan": self._plan(decided),
                       "placement": decided.to_dict()})
        self.study_name = self._study_for(study_name, record["plan"])
        self.study = store.create_study(self.study_name, experiment.model.name, record)
        # a resumed study keeps the placement it started with (one stored before placements
        # were kept: the one its tuning implied)
        self.placement = Placement.of_study(self.study.experiment, experiment.cluster.world)
        self.gpus = self.placement.gpus
        # fit first (experiment/fit.py): every multi-GPU layout measured on one GPU before it is submitted
        fit_first = experiment.tuning.fit_first
        if fit_first is None:
            fit_first = experiment.cluster.workload == "megatron"
        self.fit_first = bool(fit_first) and self.runner.runs_jobs and experiment.cluster.world > 1
        # the step-time model (tune/predicted.py); not in a one-GPU study, whose trials measure one
        # rank alone, not the cluster's step the model predicts
        self.model = None if self.placement.one_gpu else predicted.Model(experiment, store)
        self.rank_moves = self.model is not None and experiment.tuning.predict_moves

    # -- what the study measures, fixed at its start ------------------------------------
    def _plan_samples(self) -> int:
        try:
            return one_gpu_step.plan_samples(self.exp.baseline, self.exp.model, self.exp.cluster,
                                             self.exp.tuning, self.rules, check)
        except one_gpu_step.StepError as e:
            raise TunerError(f"{self.exp.path}: {e}") from None

    def _plan(self, placement: Placement) -> dict:
        """What makes trials of a study comparable: the baseline, the world it runs in, and
        (one GPU) the step every trial runs."""
        return {"baseline": self.exp.baseline.config_hash(), "world": self.exp.cluster.world,
                "one_gpu_samples": placement.samples}

    def _study_for(self, name: str, plan: dict) -> str:
        """`name`, unless a study of that name was planned otherwise (the experiment's baseline,
        world or one-GPU step changed since): its trials would not compare with this one's, so the
        changed experiment gets a study of its own, named by its plan, and says so."""
        found = next((s for s in self.store.studies() if s.name == name), None)
        old = (found.experiment or {}).get("plan") if found else None
        if old is None or old == plan:
            return name
        key = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:8]
        changed = ", ".join(f"{k} {old.get(k)} -> {v}" for k, v in plan.items() if old.get(k) != v)
        self.say(f"study {name} was planned otherwise ({changed}); its trials would not compare: "
                 f"this experiment is study {name}-{key}")
        return f"{name}-{key}"

    # -- output -------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        if self.progress:
            print(f"[moetune] {msg}", file=sys.stderr, flush=True)

    def decide(self, kind, reason, trial=None, rule=None, **evidence):
        """One decision into the store, the study's record (DECISION_KINDS)."""
        if kind not in DECISION_KINDS:
            raise TunerError(f"decision kind {kind!r} is not one of {', '.join(DECISION_KINDS)}")
        self.store.add_decision(self.study.id, kind, reason, trial_id=trial.id if trial else None,
                                rule=rule, evidence=evidence)

    # -- the loop -----------------------------------------------------------------------
    def run(self) -> dict:
        bar = _progress_bar(self.max_trials, self.progress)
        try:
            return self._run(bar)
        finally:
            bar.close()

    def _run(self, bar) -> dict:
        earlier = True  # a stop seen first is one of an earlier run: a raised budget resumes it
        while True:
            st = study_state(self.store, self.study, self.exp.cluster)
            bar.n = min(st.runs, bar.total or st.runs)
            bar.refresh()
            if st.stopped:
                if earlier and self.resume(st):
                    earlier = False
                    continue
                break
            earlier = False
            if st.pending is not None:
                self.run_and_judge(st.pending)
                continue
            if st.incumbent is None:
                if st.trials and st.unfit is not None and self.propose_fit(st):
                    continue
                if st.unfit is not None:
                    self.stop(f"no memory fix left to try on trial {st.unfit.number}, which does not fit "
                              "one GPU; add GPUs or change the layout")
                    continue
                if st.trials:  # the baseline ran and was not kept, or its fit measured nothing
                    base = st.trials[0]
                    why = next((d.reason for d in self.store.decisions(self.study.id)
                                if d.trial_id == base.id and d.kind in ("unfit", "stage_error")), base.state)
                    self.stop(f"baseline trial did not complete ({why}); fix the baseline first")
                    continue
                cfg = self.exp.baseline
                self.store.add_trial(self.study.id, cfg.to_dict(), cfg.config_hash(), fix=None)
                self.say(f"trial 1: baseline {cfg.config_hash()}")
                continue
            reason = self.stop_reason(st)
            if reason:
                spent = self.budget_spent(st)
                self.stop(reason, **({"budget": spent[0]} if spent else {}))
                continue
            if not self.propose(st):
                inc = st.incumbent
                self.stop(f"no untried rule applies to trial {inc.number} (wall {inc.wall})")
        out = summary(self.store, self.study_name, self.runs_root)
        return {**out, "note": self.note} if self.note else out

    def budget_spent(self, st: StudyState) -> tuple[str, str] | None:
        """(the budget spent: trials or gpu_hours, the stop's reason); None while both last."""
        return budget.spent_line(st.runs, st.gpu_hours, self.max_trials, self.budget_gpu_hours)

    def resume(self, st: StudyState) -> bool:
        """A study stopped before this run goes on where its budget stopped it and the budget was
        raised since (a `resume` decision says why); otherwise it stays stopped, and `note` says so."""
        if (st.stopped.evidence or {}).get("blocking"):  # the preflight's, this run's (tune/gate.py)
            return False
        which = budget.stopped_on(st.stopped)
        now = self.stop_reason(st) if which else None
        if which is None or now is not None:
            self.note = budget.stays_stopped(self.study_name, now or st.stopped.reason, which if now else None)
            return False
        reason = (f"the budget was raised to {self.max_trials} trials and {self.budget_gpu_hours} GPU-hours "
                  f"({st.runs} trials and {st.gpu_hours:.3f} GPU-hours spent); it had stopped: "
                  f"{st.stopped.reason}")
        self.decide("resume", reason, budget=which, max_trials=self.max_trials,
                    budget_gpu_hours=self.budget_gpu_hours, runs=st.runs, gpu_hours=st.gpu_hours)
        self.store.set_study_state(self.study.id, "running")
        self.say(f"resume: {reason}")
        return True

    def stop_reason(self, st: StudyState) -> str | None:
        spent = self.budget_spent(st)
        if spent:
            return spent[1]
        if st.since_keep >= self.patience:
            return f"no gain in the last {st.since_keep} trials (patience {self.patience})"
        return None

    def stop(self, reason: str, **evidence) -> None:
        self.say(f"stop: {reason}")
        self.decide("stop", reason, **evidence)
        self.store.set_study_state(self.study.id, "done")

    def propose(self, st: StudyState) -> bool:
        """Pick the best untried rule for the incumbent and add its trial. False: none left."""
        inc = st.incumbent
        analysis = _load_analysis(self.store, self.runs_root, self.study_name, inc)
        if analysis is None:
            raise TunerError(f"trial {inc.number}: analysis.json is missing; run "
                             f"`moetune stage analyze --trial {inc.id}`")
        props = rules_mod.proposals(analysis, TrainingConfig.from_dict(inc.config), self.exp.model,
                                    self.exp.cluster, self.exp.tuning, check=check, rules=self.rules)
        props = self._measurable(props)
        if not self.rank_moves:
            return self._propose(st, inc, analysis, props)
        terms, bands = self.model.moves(props)
        model_ms = {rid: predicted.expected_ms(t, bands.get(rid)) for rid, t in terms.items()}
        return self._propose(st, inc, analysis, predicted.ranked(props, model_ms), terms, bands)

    def _measurable(self, props: list) -> list:
        """In a one-GPU study, the proposals whose rule one rank alone can show (rules.yaml one_gpu)."""
        return [p for p in props if p.rule.one_gpu] if self.placement.one_gpu else props

    def propose_fit(self, st: StudyState) -> bool:
        """Nothing fits yet: the next memory fix on top of the last trial that did not fit, in the
        table's fit order, to be fitted on one GPU in its turn. False: none left."""
        parent = st.unfit
        fitted = stages.load_fit(stages.TrialContext(self.store, parent.id, self.runs_root))
        analysis = fit_analysis(fitted)
        props = rules_mod.proposals(analysis, TrainingConfig.from_dict(parent.config), self.exp.model,
                                    self.exp.cluster, self.exp.tuning, check=check, rules=self.rules)
        order = {rid: i for i, rid in enumerate(self.fit_order)}
        props = sorted((p for p in self._measurable(props) if p.rule.id in order), key=lambda p: order[p.rule.id])
        return self._propose(st, parent, analysis, props)

    def _propose(self, st: StudyState, parent, analysis: dict, props: list,
                 model_terms: dict | None = None, bands: dict | None = None) -> bool:
        """Add the trial of the first proposal not tried from this parent, not barred, not refused,
        not run before and not predicted slower beyond its band (`model_terms`: rule id -> the
        model's step of its config by parts, or None, for the layout moves; `bands`: rule id -> its
        prediction's band); record every one passed over."""
        config = TrainingConfig.from_dict(parent.config)
        corr = predicted.study_correction(self.store, self.study.id) if model_terms else None
        tried = st.tried.get(parent.config_hash, set())
        ev = {"parent": parent.config_hash, "wall": analysis.get("wall"),
              "confidence": analysis.get("confidence")}
        for p in props:
            rid = p.rule.id
            if rid in tried:
                continue
            if rid in st.crashed:  # a CUDA error or native crash is the fix's, not the parent's
                self.decide("skip", f"{rid} crashed in trial {st.crashed[rid]} of this study; not "
                                    "tried again", rule=rid, **ev)
                continue
            if rid in st.blocked:
                self.decide("skip", f"{rid} did not take effect before on this cluster and image",
                            rule=rid, **ev)
                continue
            if p.refused:
                self.decide("skip", "refused by the constraint checker: " + "; ".join(p.refused),
                            rule=rid, **ev)
                continue
            short = one_gpu_step.refusal(p.config, self.placement.samples) if self.placement.one_gpu else None
            if short:  # the study's step is fixed: a trial it cannot hold would not compare
                self.decide("skip", f"the study's one-GPU step cannot hold it: {short}", rule=rid, **ev)
                continue
            h = p.config.config_hash()
            seen = self.store.trial_by_hash(self.study.id, h)
            if seen is not None:
                self.decide("skip", f"its config already ran as trial {seen.number}", rule=rid, **ev)
                continue
            lacking = self.runner.not_proposed(p.config)
            if lacking:
                self.decide("skip", lacking, rule=rid, **ev)
                continue
            forecast = self._forecast(parent, p.config, (model_terms or {}).get(rid), corr, (bands or {}).get(rid))
            if forecast and forecast["slower"]:
                self.decide("skip", f"predicted {forecast['step_time_ms']:.1f} ms a step "
                            f"({forecast['step_time_low_ms']:.1f}-{forecast['step_time_high_ms']:.1f}) against "
                            f"the incumbent's {forecast['incumbent_ms']:.1f} ms: slower beyond the band and "
                            f"the noise ({self.rel_noise:.0%})", rule=rid, prediction=forecast, **ev)
                continue
            trial = self.store.add_trial(self.study.id, p.config.to_dict(), h, parent_id=parent.id,
                                         fix=rid)
            change = {k: list(v) for k, v in config.diff(p.config).items()}
            self.decide("apply", f"{p.rule.wall} wall: {p.rule.rationale}", trial, rid,
                        change=change, source=p.rule.source,
                        deciding=analysis.get("evidence") or [],
                        **({"prediction": forecast} if forecast else {}), **ev)
            self.say(f"trial {trial.number}: {rid} {diff_text(change)}")
            return True
        return False

    def _forecast(self, parent, config: TrainingConfig, terms: dict | None,
                  corr: predicted.TermCorrection | None, band=None) -> dict | None:
        """A layout move's prediction against the incumbent (None: not priced): the model's step
        (`terms`, by parts) corrected part by part by the study's trials (`corr`:
        predicted.study_correction), its band (the model's band, `band`, scaled alike), the
        incumbent's judged step, whether it is slower beyond the band and the noise, and the
        GPU-hours its trial would cost."""
        if terms is None or corr is None:
            return None
        ms = corr.apply(terms)
        banded = predicted.banded(ms, band)
        inc = self.store.metrics(parent.id).get("judged_step_time_ms") or parent.step_time_ms
        if not inc:
            return None
        minutes = time_minutes(self.exp.cluster.time_limit)
        return {"step_time_ms": round(ms, 3), "model_ms": round(sum(terms.values()), 3),
                "model_terms_ms": {g: round(v, 3) for g, v in terms.items()}, "correction": corr.to_dict(),
                **banded, "incumbent_ms": inc, "noise_threshold": self.rel_noise,
                "slower": predicted.slower(ms, inc, self.rel_noise, banded["step_time_low_ms"]),
                "gpu_hours": round(predicted.gpu_hours(self.gpus, ms, config.train_iters, minutes), 6),
                "gpu_hours_basis": f"{self.gpus} GPUs x predicted step x {config.train_iters} "
                                   f"iterations, at most the {minutes}-minute time limit"}

    # -- a pending trial: run it, record its figures, decide ------------------------------
    def run_and_judge(self, trial) -> None:
        """The pending trial from its first stage to its decision: run (node failures retried),
        its figures into the store, the decision its outcome takes (decide/outcomes.py), and
        decision.json beside its files."""
        out = self.run_with_retries(trial)
        self.record_figures(trial, out)
        parent = self.store.trial(trial.parent_id) if trial.parent_id else None
        ruling = outcomes.rule_outcome(self._outcome_context(trial, out, parent))
        self.decide(ruling.kind, ruling.reason, trial, trial.fix, **ruling.evidence,
                    cost=self._charged)
        if ruling.line:
            self.say(f"trial {trial.number}: {ruling.line}")
        runner.write_decision_file(self.store, trial, self.runs_root, self.executor)

    def _outcome_context(self, trial, out, parent) -> outcomes.OutcomeContext:
        """What the outcome rulings read of this trial, its parent and the study."""
        kind = outcomes.parent_kind(parent)
        rule = self.rule_by_id.get(trial.fix)
        parent_an = (_load_analysis(self.store, self.runs_root, self.study_name, parent)
                     if outcomes.reads_parent_analysis(out.state, kind) else None)
        return outcomes.OutcomeContext(
            outcome=out, fix=trial.fix, parent=kind, parent_number=parent.number if parent else None,
            parent_hash=parent.config_hash if parent else None, parent_analysis=parent_an,
            verify=rule.verify if rule else "none", cluster=self.exp.cluster.name,
            image=image_of(self.exp.cluster), rel_noise=self.rel_noise, alpha=self.alpha)

    def _run_trial(self, trial, resubmit: bool = False):
        return runner.run_trial(self.store, trial, executor=self.executor, runs_root=self.runs_root,
                                bank_dir=self.bank_dir, hang_timeout_s=self.hang_timeout_s,
                                fit_first=self.fit_first, resubmit=resubmit)

    def run_with_retries(self, trial):
        """The trial's outcome, its job submitted again (up to RETRY_CAP times) while it ends by a
        node failure or preemption, which says nothing about the config (job/scheduler.py OUTCOMES
        retry=True): the same trial runs again, on the nodes left. Each retry is a decision."""
        out = self._run_trial(trial)
        for attempt in range(1, RETRY_CAP + 1):
            if not out.retry:
                break
            self.decide("retry", f"{out.state}: {out.error}; submitted again ({attempt} of "
                        f"{RETRY_CAP})", trial, trial.fix, state=out.state, attempt=attempt,
                        job_id=out.job_id, last_lines=out.last_lines)
            self.say(f"trial {trial.number}: {out.state}, submitted again")
            out = self._run_trial(trial, resubmit=True)
        return out

    def record_figures(self, trial, out) -> None:
        """The trial's row (state, wall, step time, ...) and its scalar metrics in the store."""
        m = _combined(out.analysis)
        self.store.update_trial(
            trial.id, state=out.state, wall=(out.analysis or {}).get("wall"),
            step_time_ms=m.get("step_time_ms"), step_time_std_ms=m.get("step_time_std_ms"),
            tflops_per_gpu=m.get("tflops_per_gpu") or ((out.analysis or {}).get("log") or {}).get("tflops_per_gpu"),
            peak_memory_gb=m.get("peak_memory_gb"), ended_at=now())
        scalars = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        scalars.update(self._charge(trial, out))
        judged_ms = judged_step(out.analysis).get("step_time_ms")
        if judged_ms is not None:
            scalars["judged_step_time_ms"] = judged_ms
        if out.fit:
            scalars.update(fit.fit_metrics(out.fit))
        scalars.update(self._predicted(trial))
        self.store.set_metrics(trial.id, scalars)

    def _charge(self, trial, out) -> dict:
        """The trial's GPU-hours, whole jobs (tune/budget.py); how they were counted is kept for
        its decision's evidence."""
        row = self.store.trial(trial.id)
        folder = trial_folder(self.runs_root, self.study_name, row) if row.folder else None
        entry = find_entry(TrainingConfig.from_dict(trial.config), self.bank_dir) \
            if self.executor == "replay" and out.state != "skipped" else None
        its = ((out.analysis or {}).get("log") or {}).get("iteration_ms")
        charged, basis = budget.trial_charge(folder, out, self.gpus, entry, its)
        self._charged = {"gpu_hours": round(charged["gpu_hours"], 6), "basis": basis,
                         "fit_gpu_hours": round(charged["fit_gpu_hours"], 6)}
        return charged

    def _predicted(self, trial) -> dict:
        """The model's step time of the trial's config, part by part, and corrected by the trials
        completed before it: recorded beside what it measured (the next correction's input)."""
        terms = self.model.terms(TrainingConfig.from_dict(trial.config)) if self.model else None
        if terms is None:
            return {}
        corr = predicted.study_correction(self.store, self.study.id)
        out = {"predicted_model_ms": sum(terms.values()), "prediction_scale": corr.scale,
               "predicted_step_time_ms": corr.apply(terms)}
        out.update({f"predicted_{g}_ms": v for g, v in terms.items()})
        return out


def tune(experiment: str | Experiment, store, *, executor: str = "auto", runs_root="runs",
         max_trials=None, progress: bool = True, bank_dir=None, study_name: str | None = None,
         one_gpu: bool = False, max_gpu_hours=None) -> dict:
    """Run (or resume) the study of an experiment; returns `summary`. `one_gpu`: as if the
    experiment said tuning.one_gpu (its study is named NAME-1gpu, apart from the cluster's).
    `max_trials`, `max_gpu_hours`: the budget, over the experiment's (raised: a study its budget
    stopped goes on).
    `experiment`: loaded already (`moetune tune` loads its YAML once), else its name or path."""
    if (max_trials is not None and max_trials < 1) or (max_gpu_hours is not None and max_gpu_hours <= 0):
        raise TunerError(f"budget: max_trials {max_trials}, max_gpu_hours {max_gpu_hours}: give at least "
                         "one trial and more than 0 GPU-hours")
    exp = experiment if isinstance(experiment, Experiment) else load_experiment(experiment)
    if one_gpu:
        exp.tuning = exp.tuning.model_copy(update={"one_gpu": True})
    if executor == "auto":
        executor = "slurm" if slurm.available() else "local"
    if executor not in executors.KINDS:
        *kinds, last = executors.KINDS
        raise TunerError(f"executor {executor!r}: use auto, {', '.join(kinds)} or {last}")
    if executor == "replay":
        bank_dir = Path(bank_dir or settings.bank())
        load_bank(bank_dir)  # a clear error now rather than in every job
        # the demo submits nothing to a cluster: its jobs render for this machine, whatever the
        # experiment's cluster runs them in (a container needs Slurm's pyxis)
        exp.cluster = exp.cluster.model_copy(update={"template": "venv", "executor": "local"})
        # the bank's baseline ran on one GPU (benchmarks/device/tune.sh --one-gpu): replay it so
        entry = find_entry(exp.baseline, bank_dir)
        if entry and entry.get("one_gpu") and not exp.tuning.one_gpu:
            exp.tuning = exp.tuning.model_copy(update={"one_gpu": True})
    name = exp.name + ("-1gpu" if exp.tuning.one_gpu else "")
    name = study_name or (f"{name}-replay" if executor == "replay" else name)
    with study_lock(runs_root, name):  # one tuner per study; a killed one's lock goes with it
        verdict = gate.preflight_gate(exp, store, executor, Path(runs_root))  # sets exp.cluster's probed keys
        t = Tuner(exp, store, executor=executor, runs_root=Path(runs_root), study_name=name,
                  max_trials=max_trials, bank_dir=bank_dir, progress=progress,
                  max_gpu_hours=max_gpu_hours)
        gate.record_preflight(t, *verdict)
        return t.run()


def _progress_bar(total: int, enabled: bool):
    """A progress bar over the trial budget (stderr; off with progress=False or no terminal)."""
    return tqdm(total=total, desc="trials", unit="trial", disable=not enabled or not sys.stderr.isatty(),
                leave=False)
