"""A study's state, read from the store alone: the incumbent, the trial to judge, what was tried
from which parent, which rules are barred and why, the budget spent. The loop keeps nothing else,
so a tuner killed anywhere and started again sees the same state."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from moetune.experiment.schema import Cluster

if TYPE_CHECKING:
    from moetune.store import Decision, Trial

# Every kind of decision a study records (store.decisions, each with its evidence), the one list.
DECISION_KINDS: dict[str, str] = {
    "preflight": "what the preflight found (its notes)",
    "resume": "a stopped study goes on: the preflight that stopped it passes now, or the budget it "
              "spent was raised",
    "apply": "a rule was chosen for a new trial",
    "retry": "the trial's job ended by a node failure or preemption, not the config: submitted again",
    "keep": "the trial becomes the incumbent (the baseline, the first layout that fits, or a change "
            "that beat the noise: decide/judge.py)",
    "revert": "the change was slower, within noise, out of memory, failed or hung",
    "not_applied": "the trace does not show the fix; the rule is blocked on this cluster + image",
    "unfit": "the trial's fit on one GPU kept it off the cluster; a memory fix is fitted next",
    "stage_error": "a stage of the trial raised: it measured nothing, and the study goes on",
    "skip": "a rule passed over (refused by the checker, its config already ran, it crashed earlier, "
            "the trial bank lacks it, the one-GPU step cannot hold it, the step-time model predicts "
            "it slower than the incumbent beyond the noise), or a trial not replayed",
    "stop": "why the study ended (also: a preflight problem that blocks trials, before the first)",
}
# the kinds that close a trial: a trial without one is the one to run and judge
JUDGED = ("keep", "revert", "not_applied", "skip", "unfit", "stage_error")
# trial states whose job never ran on the cluster (a fit alone is one GPU's minutes)
NOT_RUN = ("skipped", "pending", "no_fit")


def ran(trial) -> bool:
    """The trial's job ran on the cluster: what the trial budget and "trials run" count."""
    return trial.state not in NOT_RUN


def image_of(cluster: Cluster) -> str:
    """What identifies the software on a cluster: a rule not applied is retried when it changes."""
    return cluster.container_image or cluster.template


@dataclass
class StudyState:
    incumbent: Trial | None = None
    # before any trial ran: the trial whose fit kept it off the cluster with the lowest peak so far,
    # the parent of the next memory fix (experiment/fit.py; the rule table's fit_order; lowered())
    unfit: Trial | None = None
    pending: Trial | None = None
    tried: dict = field(default_factory=dict)  # parent config hash -> {rule ids}
    blocked: set = field(default_factory=set)  # rules not applied on this cluster + image
    crashed: dict = field(default_factory=dict)  # rule -> trial number whose job crashed (CRASH_MARKS)
    runs: int = 0  # trials whose job ran on the cluster (`ran`)
    gpu_hours: float = 0.0
    since_keep: int = 0
    stopped: Decision | None = None
    trials: list = field(default_factory=list)


# What a failed job's last lines show when the fix itself broke the run (a CUDA error during graph
# capture, a native crash), rather than a layout Megatron refused, which another parent may not hit.
# Looser than moetune/analysis/logs.py's FAILURES on purpose: those scan whole logs of runs that may have
# finished, these only the tail of a job already known to have failed.
CRASH_MARKS = ("CUDA error", "AcceleratorError", "cudaError", "SIGSEGV", "SIGABRT", "SIGBUS",
               "Segmentation fault", "illegal memory access")
CRASH_FAILURES = ("crash", "cuda_error")  # moetune/analysis/logs.py's names for the same


def crashed(evidence: dict) -> bool:
    """A reverted trial whose job failed with a native crash or a CUDA error: the log parser named
    it so, or one of CRASH_MARKS is in the last lines."""
    lines = evidence.get("last_lines") or []
    text = "\n".join(lines) if isinstance(lines, list) else str(lines)
    return evidence.get("state") == "failed" and (
        evidence.get("failure") in CRASH_FAILURES or any(m in text for m in CRASH_MARKS))


GPU_MEASURED = (None, "oom")  # a fit's failures that still tell of the GPU's memory (experiment/fit.py)


def measured_fit(evidence: dict | None) -> bool:
    """An unfit trial whose fit measured a peak or ran out of memory: the parent of the next memory
    fix. A fit that measured nothing (Megatron refused the config at start-up) is passed over: its
    fix stays tried from that parent, and the next one builds on the last fit that measured. So is
    one killed for the node's memory (`host_oom`): a GPU memory fix cannot mend it."""
    return ((evidence or {}).get("fit") or {}).get("failure") in GPU_MEASURED


MIN_DROP_SHARE = 0.002  # of the parent's peak: less is the same memory measured again


def lowered(peak: float | None, parent_peak: float | None) -> bool:
    """Did a memory fix lower its parent's measured peak? Only then is it the parent of the next
    one: a fix that freed nothing costs step time for no memory (core_attn recompute under fused
    attention held 1.2 GB more on Mixtral 8x7B on an H100), so the next fix goes on the
    parent instead. A parent that ran out of memory is beaten by any peak."""
    if parent_peak is None:
        return True
    return peak is not None and peak < parent_peak * (1 - MIN_DROP_SHARE)


@dataclass
class Spent:
    """The GPU-hours a study spent, whole jobs: its trials' (their jobs, every attempt), their
    fits' and its preflights', and how the trials' were counted (basis -> trials)."""
    trials: float = 0.0
    fits: float = 0.0
    preflight: float = 0.0
    basis: dict = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.trials + self.fits + self.preflight


def spent(store, trials: list, decisions: list) -> Spent:
    """What the budget counts (the loop's `gpu_hours_*` metrics and the preflight decisions'
    charged_gpu_hours); a trial judged before jobs were charged whole counts its `gpu_hours`."""
    out = Spent()
    for t in trials:
        m = store.metrics(t.id)
        out.trials += m.get("job_gpu_hours", m.get("gpu_hours", 0.0))
        out.fits += m.get("fit_gpu_hours", 0.0)
    for d in decisions:
        ev = d.evidence or {}
        if d.kind in ("preflight", "stop"):
            out.preflight += ev.get("charged_gpu_hours") or 0.0
        basis = (ev.get("cost") or {}).get("basis") if d.trial_id else None
        if basis:
            out.basis[basis] = out.basis.get(basis, 0) + 1
    return out


def study_state(store, study, cluster) -> StudyState:
    st = StudyState(trials=store.trials(study.id))
    by_id = {t.id: t for t in st.trials}
    decisions = store.decisions(study.id)
    judged = {d.trial_id for d in decisions if d.kind in JUDGED and d.trial_id}
    peaks = {}  # unfit trial id -> its fit's measured peak (None: out of memory)
    for d in decisions:
        parent = (d.evidence or {}).get("parent")
        if d.rule and parent and d.kind in ("apply",) + JUDGED:
            st.tried.setdefault(parent, set()).add(d.rule)
        if d.kind == "keep" and d.trial_id in by_id:
            st.incumbent, st.since_keep = by_id[d.trial_id], 0
        elif d.kind in ("revert", "not_applied", "unfit", "stage_error") or (d.kind == "skip" and d.trial_id):
            st.since_keep += 1 if d.kind != "skip" else 0
        if d.kind == "unfit" and st.incumbent is None and d.trial_id in by_id and measured_fit(d.evidence):
            peaks[d.trial_id] = ((d.evidence or {}).get("fit") or {}).get("peak_gb")
            if st.unfit is None or lowered(peaks[d.trial_id], peaks.get(st.unfit.id)):
                st.unfit = by_id[d.trial_id]
        if d.kind == "stop":
            st.stopped = d
        elif d.kind == "resume":  # a preflight that stopped the study passes now (tune/gate.py)
            st.stopped = None
        if d.kind == "revert" and d.rule and crashed(d.evidence or {}):
            st.crashed.setdefault(d.rule, by_id[d.trial_id].number if d.trial_id in by_id else "?")
    for t in st.trials:
        if t.id not in judged:
            st.pending = t
        if ran(t):
            st.runs += 1
    st.gpu_hours = spent(store, st.trials, decisions).total
    name, image = cluster.name, image_of(cluster)
    for s in store.studies():
        for d in store.decisions(s.id):
            ev = d.evidence or {}
            if d.kind == "not_applied" and ev.get("cluster") == name and ev.get("image") == image:
                st.blocked.add(d.rule)
    return st
