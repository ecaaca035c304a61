"""What a judged trial's outcome decides: OUTCOME_RULINGS, a table from the trial's state and its
parent's kind to a ruling, each a pure function of an `OutcomeContext` the tuner builds (the
outcome, the parent's figures, the rule applied, the noise thresholds). The tuner records the
`Ruling` it returns as the trial's decision (tune/state.py DECISION_KINDS).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from moetune.analysis import figures
from moetune.decide import applied
from moetune.decide.judge import compare
from moetune.trial.run import TrialOutcome

ANY = "*"


@dataclass(frozen=True)
class OutcomeContext:
    """Everything a ruling reads. `parent` is parent_kind's column (baseline, unfit, ran);
    `parent_analysis` is read only where a completed change is compared with a measured parent
    (reads_parent_analysis), None elsewhere; `verify` is the applied rule's trace check
    (rules.yaml, "none" for the baseline or a rule no longer in the table)."""
    outcome: TrialOutcome
    fix: str | None = None
    parent: str = "baseline"
    parent_number: int | None = None
    parent_hash: str | None = None
    parent_analysis: dict | None = None
    verify: str = "none"
    cluster: str = "cluster"
    image: str = "default"
    rel_noise: float = 0.0
    alpha: float = 1.0


@dataclass(frozen=True)
class Ruling:
    """A judged trial's decision: its kind (tune/state.py DECISION_KINDS), its reason, its
    evidence (what every judged trial records first, then the ruling's own) and the progress
    line (None: nothing said)."""
    kind: str
    reason: str
    evidence: dict = field(default_factory=dict)
    line: str | None = None


def parent_kind(parent) -> str:
    """The column OUTCOME_RULINGS matches a trial's parent on: `baseline` (the trial has none),
    `unfit` (its fit kept the parent off the cluster: nothing ran before it to beat), else `ran`."""
    if parent is None:
        return "baseline"
    return "unfit" if parent.state == "no_fit" else "ran"


def _stage_error(ctx: OutcomeContext) -> Ruling:  # measured nothing: the study goes on
    out = ctx.outcome
    return Ruling("stage_error", out.error or f"{out.stage} failed",
                  {"stage": out.stage, "last_lines": out.last_lines}, f"{out.error}; passed over")


def _unfit(ctx: OutcomeContext) -> Ruling:  # never reached the cluster: a memory fix is fitted next
    return Ruling("unfit", ctx.outcome.error or "does not fit", line=f"{ctx.outcome.error}")


def _measured(analysis: dict | None) -> tuple[dict, str]:
    """A kept run's recorded figures (the judged step time the next trials are compared with, the
    profiled mean beside it, throughput at the judged step; analysis/figures.py) and their line."""
    f = figures.run_figures(analysis)
    ev = {"step_time_ms": f["step_time_ms"], "step_time_std_ms": f["step_time_std_ms"],
          "judged_by": f["source"], "profiled_step_time_ms": f["profiled_ms"],
          "tokens_per_s": f["tokens_per_s"], "tflops_per_gpu": f["tflops_per_gpu"]}
    rate = figures.throughput_text(f)
    return ev, figures.step_text(f) + (f", {rate.removesuffix(' at the judged step')}" if rate else "")


def _keep_baseline(ctx: OutcomeContext) -> Ruling:
    ev, text = _measured(ctx.outcome.analysis)
    return Ruling("keep", "baseline", ev, f"baseline {text}, wall {(ctx.outcome.analysis or {}).get('wall')}")


def _revert_baseline(ctx: OutcomeContext) -> Ruling:
    out = ctx.outcome
    return Ruling("revert", f"baseline {out.state}: {out.error}", {"last_lines": out.last_lines})


def _skip(ctx: OutcomeContext) -> Ruling:
    return Ruling("skip", ctx.outcome.error or "skipped", line=f"skipped ({ctx.outcome.error})")


def _keep_first_fit(ctx: OutcomeContext) -> Ruling:
    ev, text = _measured(ctx.outcome.analysis)
    return Ruling("keep", f"the first layout that fits: {ctx.fix} on top of trial {ctx.parent_number}",
                  ev, f"{ctx.fix} fits, {text}")


def _revert_failed(ctx: OutcomeContext) -> Ruling:
    out = ctx.outcome
    log = (out.analysis or {}).get("log") or {}
    return Ruling("revert", f"{out.state}: {out.error}",
                  {"last_lines": out.last_lines, "failure": log.get("failure"),
                   "failure_line": log.get("failure_line")}, f"{out.state}, reverted")


def _compare_with_parent(ctx: OutcomeContext) -> Ruling:
    """A completed change on a measured parent: not applied where its trace does not show the
    fix (decide/applied.py), else kept only if faster beyond the noise (decide/judge.py)."""
    rid, new_an = ctx.fix, ctx.outcome.analysis
    verdict = applied.verify(ctx.verify, new_an, ctx.parent_analysis)
    ev = {"verify": verdict.status, "verify_reason": verdict.reason, "verify_evidence": verdict.evidence}
    if not verdict.applied:
        return Ruling("not_applied", verdict.reason, {"cluster": ctx.cluster, "image": ctx.image, **ev},
                      f"{rid} not applied ({verdict.reason})")
    c = compare(ctx.parent_analysis, new_an, ctx.rel_noise, ctx.alpha)
    if c.keep:
        return Ruling("keep", c.why(), {**ev, **c.evidence()},
                      f"{rid} kept, {c.parent_ms:.1f} -> {c.new_ms:.1f} ms/step")
    return Ruling("revert", c.why(), {**ev, **c.evidence()}, f"{rid} reverted, {c.why()}")


# What a trial's outcome decides, as data: (the trial's state, parent_kind, the ruling), the first
# row that matches deciding. A baseline that did not complete is reverted whatever its state; a
# change that did not complete is reverted unless it measured nothing (stage_error), never reached
# the cluster (no_fit) or was skipped.
OUTCOME_RULINGS: tuple[tuple[str, str, Callable[[OutcomeContext], Ruling]], ...] = (
    ("stage_error", ANY, _stage_error),
    ("no_fit", ANY, _unfit),
    ("completed", "baseline", _keep_baseline),
    (ANY, "baseline", _revert_baseline),
    ("skipped", ANY, _skip),
    ("completed", "unfit", _keep_first_fit),
    ("completed", "ran", _compare_with_parent),
    (ANY, ANY, _revert_failed),
)


def _row(state: str, kind: str) -> Callable[[OutcomeContext], Ruling]:
    return next(ruling for s, of, ruling in OUTCOME_RULINGS if s in (state, ANY) and of in (kind, ANY))


def reads_parent_analysis(state: str, kind: str) -> bool:
    """Whether the ruling of a trial in `state` over a parent of `kind` compares it with the
    parent's analysis (the tuner reads that file only then)."""
    return _row(state, kind) is _compare_with_parent


def common_evidence(ctx: OutcomeContext) -> dict:
    """What every judged trial's decision records: its parent, its state, and the fit that let it
    onto the cluster or kept it off."""
    out = ctx.outcome
    ev: dict = {"parent": ctx.parent_hash, "state": out.state}
    if out.fit:
        ev["fit"] = {k: out.fit.get(k) for k in ("fits", "reason", "peak_gb", "headroom_gb",
                                                 "capacity_gb", "failure")}
    return ev


def rule_outcome(ctx: OutcomeContext) -> Ruling:
    """The decision a trial's outcome takes: the first row of OUTCOME_RULINGS that matches, its
    evidence after what every judged trial records (common_evidence)."""
    r = _row(ctx.outcome.state, ctx.parent)(ctx)
    return Ruling(r.kind, r.reason, {**common_evidence(ctx), **r.evidence}, r.line)
