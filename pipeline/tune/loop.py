"""The tuning loop: baseline → profile → classify → best untried rule → run → keep or revert.

The loop keeps no state of its own: every step reads the study from the store (`StudyState`) and
writes one decision back, so a tuner killed at any point and started again continues where it
was, runs no config twice (one trial per config hash) and ends with the same best config.

Decisions (store.decisions, each with its evidence):
  keep         the trial becomes the incumbent (the baseline, or a change that beat the noise;
               judged by pipeline.judge: median of the log's steady steps and a rank test)
  apply        a rule was chosen for a new trial
  revert       the change was slower, within noise, out of memory, failed or hung
  not_applied  the trace does not show the fix; the rule is blocked on this cluster + image
  skip         a rule the checker refused, whose config already ran, that crashed earlier in the
               study, or that the bank lacks
  stop         why the study ended
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from moetune.pipeline.decide import applied

from moetune.pipeline.decide import rules as rules_mod

from moetune.pipeline.trial import run as runner
from moetune.pipeline.decide.judge import compare, judged_step
from moetune.pipeline.spec.config import TrainingConfig
from moetune.pipeline.trial.run import TunerError, attr
from moetune.pipeline.spec.section import as_dict

JUDGED = ("keep", "revert", "not_applied", "skip")
DEFAULTS = {"budget_trials": 8, "budget_gpu_hours": 10.0, "noise_threshold": 0.02, "patience": 3,
            "hang_timeout_s": 600.0, "significance": 0.05}


@dataclass
class StudyState:
    incumbent: object | None = None
    pending: object | None = None
    tried: dict = field(default_factory=dict)  # parent config hash -> {rule ids}
    blocked: set = field(default_factory=set)  # rules not applied on this cluster + image
    crashed: dict = field(default_factory=dict)  # rule -> trial number whose job crashed (CRASH_MARKS)
    runs: int = 0  # trials whose job ran
    gpu_hours: float = 0.0
    since_keep: int = 0
    stopped: object | None = None
    trials: list = field(default_factory=list)


def tuning_value(experiment, key: str, override=None):
    if override is not None:
        return override
    v = attr(experiment.tuning, key)
    return DEFAULTS[key] if v is None else v


# What a failed job's last lines show when the fix itself broke the run (a CUDA error during graph
# capture, a native crash), rather than a layout Megatron refused, which another parent may not hit.
# Looser than analysis/logs.py's FAILURES on purpose: those scan whole logs of runs that may have
# finished, these only the tail of a job already known to have failed.
CRASH_MARKS = ("CUDA error", "AcceleratorError", "cudaError", "SIGSEGV", "SIGABRT", "SIGBUS",
               "Segmentation fault", "illegal memory access")
CRASH_FAILURES = ("crash", "cuda_error")  # analysis/logs.py's names for the same


def crashed(evidence: dict) -> bool:
    """A reverted trial whose job failed with a native crash or a CUDA error: the log parser named
    it so, or one of CRASH_MARKS is in the last lines."""
    lines = evidence.get("last_lines") or []
    text = "\n".join(lines) if isinstance(lines, list) else str(lines)
    return evidence.get("state") == "failed" and (
        evidence.get("failure") in CRASH_FAILURES or any(m in text for m in CRASH_MARKS))


def study_state(store, study, cluster) -> StudyState:
    st = StudyState(trials=store.trials(study.id))
    by_id = {t.id: t for t in st.trials}
    decisions = store.decisions(study.id)
    judged = {d.trial_id for d in decisions if d.kind in JUDGED and d.trial_id}
    for d in decisions:
        parent = (d.evidence or {}).get("parent")
        if d.rule and parent and d.kind in ("apply",) + JUDGED:
            st.tried.setdefault(parent, set()).add(d.rule)
        if d.kind == "keep" and d.trial_id in by_id:
            st.incumbent, st.since_keep = by_id[d.trial_id], 0
        elif d.kind in ("revert", "not_applied") or (d.kind == "skip" and d.trial_id):
            st.since_keep += 1 if d.kind != "skip" else 0
        if d.kind == "stop":
            st.stopped = d
        if d.kind == "revert" and d.rule and crashed(d.evidence or {}):
            st.crashed.setdefault(d.rule, by_id[d.trial_id].number if d.trial_id in by_id else "?")
    for t in st.trials:
        if t.id not in judged:
            st.pending = t
        if t.state not in ("skipped", "pending"):
            st.runs += 1
            st.gpu_hours += store.metrics(t.id).get("gpu_hours", 0.0)
    name, image = attr(cluster, "name", "cluster"), runner.image_of(cluster)
    for s in store.studies():
        for d in store.decisions(s.id):
            ev = d.evidence or {}
            if d.kind == "not_applied" and ev.get("cluster") == name and ev.get("image") == image:
                st.blocked.add(d.rule)
    return st


def _combined(analysis: dict | None) -> dict:
    return ((analysis or {}).get("metrics") or {}).get("combined") or {}


def _load_analysis(store, runs_root: Path, study: str, trial) -> dict | None:
    p = runner.trial_folder(runs_root, study, store.trial(trial.id)) / "analysis.json"
    return json.loads(p.read_text()) if p.exists() else None


def _gpu_hours(analysis: dict | None, gpus: int) -> float:
    its = ((analysis or {}).get("log") or {}).get("iteration_ms") or []
    return sum(its) / 3.6e6 * gpus


class Tuner:
    def __init__(self, experiment, store, *, executor: str, runs_root: Path, study_name: str,
                 max_trials=None, bank_dir=None, progress=True, rules=None):
        self.exp, self.store, self.executor = experiment, store, executor
        self.runs_root, self.study_name = Path(runs_root), study_name
        self.bank_dir = Path(bank_dir) if bank_dir else None
        self.progress = progress
        self.rules = rules if rules is not None else rules_mod.load_rules()
        self.rule_by_id = {r.id: r for r in self.rules}
        self.max_trials = int(tuning_value(experiment, "budget_trials", max_trials))
        self.budget_gpu_hours = float(tuning_value(experiment, "budget_gpu_hours"))
        self.rel_noise = float(tuning_value(experiment, "noise_threshold"))
        self.alpha = float(tuning_value(experiment, "significance"))
        self.patience = int(tuning_value(experiment, "patience"))
        self.hang_timeout_s = float(tuning_value(experiment, "hang_timeout_s"))
        self.study = store.create_study(study_name, experiment.model.name, {
            "experiment": experiment.name, "executor": "local" if executor == "replay" else executor,
            "replay": executor == "replay", "model": experiment.model.to_dict(),
            "cluster": as_dict(experiment.cluster), "tuning": as_dict(experiment.tuning),
            "baseline": experiment.baseline.to_dict()})
        self.gpus = runner.gpus_of(experiment.baseline, experiment.cluster)

    # -- output -------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        if self.progress:
            print(f"[moetune] {msg}", file=sys.stderr, flush=True)

    def decide(self, kind, reason, trial=None, rule=None, **evidence):
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
        while True:
            st = study_state(self.store, self.study, self.exp.cluster)
            bar.n = min(st.runs, bar.total or st.runs)
            bar.refresh()
            if st.stopped:
                break
            if st.pending is not None:
                self.judge(st.pending)
                continue
            if st.incumbent is None:
                if st.trials:  # the baseline ran and was not kept
                    self.stop(f"baseline trial did not complete ({st.trials[0].state}); "
                              "fix the baseline first")
                    continue
                cfg = self.exp.baseline
                self.store.add_trial(self.study.id, cfg.to_dict(), cfg.config_hash(), fix=None)
                self.say(f"trial 1: baseline {cfg.config_hash()}")
                continue
            reason = self.stop_reason(st)
            if reason:
                self.stop(reason)
                continue
            if not self.propose(st):
                inc = st.incumbent
                self.stop(f"no untried rule applies to trial {inc.number} (wall {inc.wall})")
        return summary(self.store, self.study_name, self.runs_root)

    def stop_reason(self, st: StudyState) -> str | None:
        if st.runs >= self.max_trials:
            return f"trial budget spent ({st.runs} of {self.max_trials})"
        if st.gpu_hours >= self.budget_gpu_hours:
            return f"GPU-hour budget spent ({st.gpu_hours:.2f} of {self.budget_gpu_hours})"
        if st.since_keep >= self.patience:
            return f"no gain in the last {st.since_keep} trials (patience {self.patience})"
        return None

    def stop(self, reason: str) -> None:
        self.say(f"stop: {reason}")
        self.decide("stop", reason)
        self.store.set_study_state(self.study.id, "done")

    def propose(self, st: StudyState) -> bool:
        """Pick the best untried rule for the incumbent and add its trial. False: none left."""
        inc = st.incumbent
        analysis = _load_analysis(self.store, self.runs_root, self.study_name, inc)
        if analysis is None:
            raise TunerError(f"trial {inc.number}: analysis.json is missing; run "
                             f"`moetune stage analyze --trial {inc.id}`")
        config = TrainingConfig.from_dict(inc.config)
        tried = st.tried.get(inc.config_hash, set())
        props = rules_mod.proposals(analysis, config, self.exp.model, self.exp.cluster,
                                    self.exp.tuning, check=runner.constraint_check, rules=self.rules)
        ev = {"parent": inc.config_hash, "wall": analysis.get("wall"),
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
            h = p.config.config_hash()
            seen = self.store.trial_by_hash(self.study.id, h)
            if seen is not None:
                self.decide("skip", f"its config already ran as trial {seen.number}", rule=rid, **ev)
                continue
            trial = self.store.add_trial(self.study.id, p.config.to_dict(), h, parent_id=inc.id,
                                         fix=rid)
            change = {k: list(v) for k, v in config.diff(p.config).items()}
            self.decide("apply", f"{analysis.get('wall')} wall: {p.rule.rationale}", trial, rid,
                        change=change, source=p.rule.source,
                        deciding=analysis.get("evidence") or [], **ev)
            self.say(f"trial {trial.number}: {rid} {change}")
            return True
        return False

    def judge(self, trial) -> None:
        self._judge(trial)
        runner.record_decide(self.store, trial, self.runs_root, self.executor)

    def _judge(self, trial) -> None:
        out = runner.run_trial(self.store, trial, self.exp, executor=self.executor,
                               runs_root=self.runs_root, study=self.study_name,
                               bank_dir=self.bank_dir, hang_timeout_s=self.hang_timeout_s)
        m = _combined(out.analysis)
        values = {"state": out.state, "wall": (out.analysis or {}).get("wall"),
                  "step_time_ms": m.get("step_time_ms"), "step_time_std_ms": m.get("step_time_std_ms"),
                  "tflops_per_gpu": m.get("tflops_per_gpu") or ((out.analysis or {}).get("log") or {}).get("tflops_per_gpu"),
                  "peak_memory_gb": m.get("peak_memory_gb"), "ended_at": runner._now()}
        self.store.update_trial(trial.id, **values)
        scalars = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        scalars["gpu_hours"] = _gpu_hours(out.analysis, self.gpus)
        judged_ms = judged_step(out.analysis).get("step_time_ms")
        if judged_ms is not None:
            scalars["judged_step_time_ms"] = judged_ms
        self.store.set_metrics(trial.id, scalars)
        parent = self.store.trial(trial.parent_id) if trial.parent_id else None
        ev = {"parent": parent.config_hash if parent else None, "state": out.state}
        rid = trial.fix
        if parent is None:  # the baseline
            if out.state == "completed":
                self.decide("keep", "baseline", trial, None, step_time_ms=m.get("step_time_ms"),
                            **ev)
                self.say(f"trial {trial.number}: baseline {m.get('step_time_ms')} ms/step, "
                         f"wall {values['wall']}")
            else:
                self.decide("revert", f"baseline {out.state}: {out.error}", trial, None,
                            last_lines=out.last_lines, **ev)
            return
        if out.state == "skipped":
            self.decide("skip", out.error or "skipped", trial, rid, **ev)
            self.say(f"trial {trial.number}: skipped ({out.error})")
            return
        if out.state != "completed":
            log = (out.analysis or {}).get("log") or {}
            self.decide("revert", f"{out.state}: {out.error}", trial, rid, last_lines=out.last_lines,
                        failure=log.get("failure"), failure_line=log.get("failure_line"), **ev)
            self.say(f"trial {trial.number}: {out.state}, reverted")
            return
        rule = self.rule_by_id.get(rid)
        parent_an = _load_analysis(self.store, self.runs_root, self.study_name, parent)
        verdict = applied.verify(rule.verify if rule else "none", out.analysis, parent_an)
        ev.update(verify=verdict.status, verify_reason=verdict.reason, verify_evidence=verdict.evidence)
        if not verdict.applied:
            self.decide("not_applied", verdict.reason, trial, rid,
                        cluster=attr(self.exp.cluster, "name", "cluster"),
                        image=runner.image_of(self.exp.cluster), **ev)
            self.say(f"trial {trial.number}: {rid} not applied ({verdict.reason})")
            return
        c = compare(parent_an, out.analysis, self.rel_noise, self.alpha)
        ev.update(c.evidence())
        if c.keep:
            self.decide("keep", c.why(), trial, rid, **ev)
            self.say(f"trial {trial.number}: {rid} kept, {c.parent_ms:.1f} -> {c.new_ms:.1f} ms/step")
        else:
            self.decide("revert", c.why(), trial, rid, **ev)
            self.say(f"trial {trial.number}: {rid} reverted, {c.why()}")


def decide_trial(store, trial, analysis: dict) -> dict:
    """The decide stage's content (pipeline.stages): this trial's stored decisions."""
    ds = [d for d in store.decisions(trial.study_id) if d.trial_id == trial.id]
    return {"trial": trial.number, "config_hash": trial.config_hash, "fix": trial.fix,
            "wall": analysis.get("wall"),
            "decisions": [{"kind": d.kind, "rule": d.rule, "reason": d.reason,
                           "evidence": d.evidence, "at": d.created_at} for d in ds]}


def summary(store, study_name: str, runs_root: Path | None = None) -> dict:
    """The study in one dict: budget used, baseline and best, how it stopped."""
    study = store.study(study_name)
    trials = store.trials(study.id)
    decisions = store.decisions(study.id)
    kept = [d.trial_id for d in decisions if d.kind == "keep"]
    by_id = {t.id: t for t in trials}
    best = by_id.get(kept[-1]) if kept else None
    base = trials[0] if trials else None
    stop = next((d.reason for d in reversed(decisions) if d.kind == "stop"), None)
    out = {"study": study_name, "state": study.state,
           "trials": sum(1 for t in trials if t.state not in ("skipped", "pending")),
           "trials_total": len(trials),
           "skipped": sum(1 for t in trials if t.state == "skipped"),
           "baseline_step_time_ms": base.step_time_ms if base else None,
           "best_step_time_ms": best.step_time_ms if best else None,
           "best_trial": best.number if best else None,
           "best_config_hash": best.config_hash if best else None,
           "best_config": best.config if best else None,
           "kept_fixes": [by_id[i].fix for i in kept if i in by_id and by_id[i].fix],
           "stop_reason": stop}
    judged = lambda t: store.metrics(t.id).get("judged_step_time_ms") if t else None
    out["baseline_judged_step_time_ms"] = judged(base)
    out["best_judged_step_time_ms"] = judged(best)
    if best and base and base.step_time_ms and best.step_time_ms:
        out["speedup"] = round(base.step_time_ms / best.step_time_ms, 4)
    if out["baseline_judged_step_time_ms"] and out["best_judged_step_time_ms"]:
        out["judged_speedup"] = round(out["baseline_judged_step_time_ms"]
                                      / out["best_judged_step_time_ms"], 4)
    if best and runs_root is not None:
        cmd = runner.trial_folder(runs_root, study_name, store.trial(best.id)) / "command.txt"
        out["best_command"] = cmd.read_text().strip() if cmd.exists() else None
    return out


def tune(experiment_name: str, store, *, executor: str = "auto", runs_root="runs",
         max_trials=None, progress: bool = True, bank_dir=None, study_name: str | None = None) -> dict:
    """Run (or resume) the study of an experiment; returns `summary`."""
    import shutil
    exp = runner.load_experiment(experiment_name)
    if executor == "auto":
        executor = "slurm" if shutil.which("sbatch") else "local"
    if executor not in ("slurm", "local", "replay"):
        raise TunerError(f"executor {executor!r}: use auto, slurm, local or replay")
    if executor == "replay":
        from moetune.pipeline.job.replay import DEFAULT_BANK, load_bank
        bank_dir = Path(bank_dir or DEFAULT_BANK)
        load_bank(bank_dir)  # a clear error now rather than in every job
    name = study_name or (f"{exp.name}-replay" if executor == "replay" else exp.name)
    from moetune.pipeline.tune.lock import study_lock
    with study_lock(runs_root, name):  # one tuner per study; a killed one's lock goes with it
        t = Tuner(exp, store, executor=executor, runs_root=Path(runs_root), study_name=name,
                  max_trials=max_trials, bank_dir=bank_dir, progress=progress)
        return t.run()


def _progress_bar(total: int, enabled: bool):
    """A progress bar over the trial budget (stderr; off with progress=False or no terminal)."""
    from tqdm import tqdm
    return tqdm(total=total, desc="trials", unit="trial", disable=not enabled or not sys.stderr.isatty(),
                leave=False)
