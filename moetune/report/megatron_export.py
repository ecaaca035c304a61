"""The exported trial (`choose`) as a clean Megatron argument list (`megatron_text`) and as a
flag-by-flag diff against the baseline with the decision and evidence behind each change
(`diff_text`); report/export.py is the front, report/bridge.py the Megatron-Bridge overrides.

The trials ran with what a measurement needs and a real run must not keep (mock data, a short run,
nsys's window, a stand-in learning rate): `MEASURING_FLAGS` (experiment/measuring.py) is the one
table of those flags, each with why, and `PLACEHOLDERS` the lines a real run fills in where the
trials had a stand-in."""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from moetune.errors import MoetuneError
from moetune.experiment.config import FLAGS, TE_LESS_FLAGS, TrainingConfig, run_args
from moetune.experiment.environment import ENV_RULES, config_env
from moetune.experiment.measuring import MEASURING
from moetune.experiment.megatron_import import groups
from moetune.experiment.schema import Experiment
from moetune.report.gather import TrialView, gather, is_baseline
from moetune.report.overview import headline
from moetune.store import Store, Study
from moetune.trial.framework import TrialContext


class ExportError(MoetuneError):
    """A study or trial that cannot be exported (none such, never completed); one line, exit 2."""


# what a real run must set where the trials had a stand-in (or nothing): (flag, metavar, what)
PLACEHOLDERS: tuple[tuple[str, str, str], ...] = (
    ("--data-path", "PATH", "your dataset's prefix(es)"),
    ("--tokenizer-type", "TYPE", "your tokenizer"),
    ("--tokenizer-model", "PATH", "your tokenizer's model"),
    ("--train-iters", "N", "your run's length"),
    ("--lr", "LR", "your peak learning rate"),
    ("--min-lr", "LR", "your schedule's floor"),
    ("--lr-decay-style", "STYLE", "your schedule"),
    ("--lr-warmup-iters", "N", "your warm-up"),
    ("--weight-decay", "WD", "your optimizer's"),
    ("--clip-grad", "CG", "your optimizer's"),
    ("--init-method-std", "STD", "your initialisation"),
    ("--save", "DIR", "where checkpoints go"),
    ("--save-interval", "N", "steps between checkpoints (Megatron asks for it with --save)"),
    ("--load", "DIR", "where a run resumes from"),
)

# flags a config field renders besides its own (TrainingConfig.to_args): the field that decides them
DERIVED = {"--recompute-method": "recompute_granularity", "--fine-grained-activation-offloading": "offload_modules",
           "--seq-length": "seq_length", "--max-position-embeddings": "seq_length",
           **{f: "transformer_impl" for f in TE_LESS_FLAGS}}
FIELD_OF = {f.flag: f.field for f in FLAGS}


@dataclass
class Chosen:
    """The trial an export is of, with its study's other trials."""
    study: Study
    """The study's store row."""
    exp: Experiment
    """The study's experiment, typed (its stored record)."""
    views: list[TrialView]
    """Every trial of the study, as the report sees it."""
    view: TrialView
    """The trial exported."""
    base: TrialView
    """The study's baseline (its first trial)."""
    best: bool
    """The trial is the one the report names best."""

    @property
    def config(self) -> TrainingConfig:
        """The exported trial's configuration."""
        return TrainingConfig.from_dict(self.view.trial.config)


def choose(store: Store, study_name: str, number: int | None = None) -> Chosen:
    """The study's best kept trial (the one its report names best), or trial `number`;
    ExportError (one line) where there is none such or it never completed."""
    study, views, _ = gather(store, study_name)
    if not views or not is_baseline(views[0]):
        raise ExportError(f"study {study_name}: no trial ran; nothing to export")
    best = headline(views, None)[2]
    if number is None:
        if best is None or best.judged_ms is None:
            raise ExportError(f"study {study_name}: no trial has a judged step time yet; nothing to export "
                              "(`moetune status` lists its trials; --trial N picks a completed one)")
        view = best
    else:
        found = [v for v in views if v.trial.number == number]
        if not found:
            raise ExportError(f"study {study_name} has no trial {number}; its trials are 1..{len(views)}")
        view = found[0]
        if view.trial.state != "completed":
            raise ExportError(f"study {study_name}: trial {number} never completed (state {view.trial.state}); "
                              "export a completed trial (`moetune status` lists them)")
    exp = TrialContext(store, view.trial.id).exp
    return Chosen(study, exp, views, view, views[0], best is view)


def measured_argv(exp: Experiment, config: TrainingConfig) -> list[str]:
    """The argv a trial of this config ran (stages.trial_spec: the model, the config, the fixed
    measuring part), before any flag is left out."""
    return config.to_args(exp.model, has_apex=exp.cluster.has_apex is not False) + run_args()


def split_argv(argv: list[str]) -> tuple[list[tuple[str, list[str]]], list[tuple[str, list[str]]]]:
    """(kept, left out): the argv's flags, those of MEASURING_FLAGS apart."""
    kept: list[tuple[str, list[str]]] = []
    dropped: list[tuple[str, list[str]]] = []
    for flag, values in groups(argv):
        (dropped if flag in MEASURING else kept).append((flag, values))
    return kept, dropped


def clean_argv(exp: Experiment, config: TrainingConfig) -> list[str]:
    """The Megatron argv of a real run of this config: the model, the layout and every fix, without
    the measuring flags (and without the placeholders a real run fills in)."""
    return [t for flag, values in split_argv(measured_argv(exp, config))[0] for t in (flag, *values)]


def one_line(text: str) -> str:
    """Text for a comment line: a newline in a name or value would end the comment and run the rest."""
    return " ".join(str(text).splitlines())


def _title(c: Chosen) -> str:
    t = c.view.trial
    what = "the best kept configuration" if c.best else ("the baseline" if c.view is c.base else "a trial")
    judged = f", judged {c.view.judged_ms:.1f} ms a step" if c.view.judged_ms else ""
    return one_line(f"study {c.study.name}, trial {t.number} ({what}{judged}; model {c.exp.model.name})")


def megatron_text(c: Chosen) -> str:
    """The trial as a shell snippet: the environment its job exported, then Megatron-LM's
    pretrain_gpt.py with one flag a line (shell-quoted, `\\` continued), then the commented
    placeholder lines a real run fills in."""
    config = c.config
    kept, dropped = split_argv(measured_argv(c.exp, config))
    world = c.exp.cluster.world
    lines = [f"# moetune export: {_title(c)}",
             f"# Measured on {world} GPU{'s' if world != 1 else ''} ({c.exp.cluster.gpu_type}); data parallel "
             f"{config.data_parallel(world) or '?'} there.",
             "# Left out (the trials' measuring flags; moetune/experiment/measuring.py MEASURING_FLAGS):"]
    lines += ["#   " + one_line(f"{shlex.join([flag, *values])}: {MEASURING[flag].why}") for flag, values in dropped]
    lines += ["# Fill in the placeholder lines at the end, uncommenting them top to bottom (each ends in \\):"]
    lines += [f"#   {flag} {meta}: {what}" for flag, meta, what in PLACEHOLDERS]
    cl = c.exp.cluster
    lines += [f"# Launch: your launcher before pretrain_gpt.py (e.g. torchrun --nnodes {cl.nodes} --nproc-per-node "
              f"{cl.gpus_per_node or 1} ... pretrain_gpt.py, from Megatron-LM's folder).", ""]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(config_env(config.to_dict(), c.exp.cluster).items())]
    lines += ["pretrain_gpt.py \\"]
    lines += [f"  {shlex.join([flag, *values])} \\" for flag, values in kept]
    lines += [f"# {flag} {meta} \\" for flag, meta, _ in PLACEHOLDERS]
    lines += ["# (end of the list)"]
    return "\n".join(lines) + "\n"


def _ancestry(c: Chosen) -> list[TrialView]:
    """The trials from the baseline's child down to the exported one, in order."""
    by_id: dict[int | None, TrialView] = {v.trial.id: v for v in c.views}
    out: list[TrialView] = []
    v: TrialView | None = c.view
    while v is not None and v is not c.base:
        out.append(v)
        v = by_id.get(v.trial.parent_id)
    return out[::-1]


def _shown(values: list[str] | None) -> str:
    if values is None:
        return "(not set)"
    return shlex.join(values) if values else "(on)"


def _evidence(v: TrialView, number: dict[int | None, int]) -> str:
    ev = (v.verdict.evidence or {}) if v.verdict else {}
    before, after = ev.get("parent_step_time_ms"), ev.get("step_time_ms")
    parent = number.get(v.trial.parent_id, "?")
    if before is None or after is None:
        return f"trial {parent} → {v.trial.number}: no judged step time ({v.trial.state})"
    p = f", p={ev['p_faster']:.3g}" if ev.get("p_faster") is not None else ""
    kind = v.verdict.kind if v.verdict else "?"
    return f"trial {parent} → {v.trial.number}: {before:.1f} → {after:.1f} ms ({kind}{p})"


def _decision(v: TrialView) -> str:
    ev = (v.apply.evidence or {}) if v.apply else {}
    reason = (v.apply.reason if v.apply else "") or "no apply decision recorded"
    return f"{v.trial.fix or 'no rule'}: {reason} (source: {ev.get('source') or 'not recorded'})"


def _env_source(var: str, config: dict, cluster) -> str:
    rows = [src for applies, values, src in ENV_RULES if var in values and applies(config, cluster)]
    return rows[-1] if rows else "moetune/experiment/environment.py"


def diff_rows(c: Chosen) -> list[tuple[str, str, str, str, str]]:
    """(flag, baseline's value, the trial's, decisions, evidence) for each flag and environment
    variable that differs, the trials on the way that changed it named."""
    old = dict(split_argv(measured_argv(c.exp, TrainingConfig.from_dict(c.base.trial.config)))[0])
    new = dict(split_argv(measured_argv(c.exp, c.config))[0])
    number: dict[int | None, int] = {v.trial.id: v.trial.number for v in c.views}
    path = _ancestry(c)
    rows = []
    for flag in [*new, *(f for f in old if f not in new)]:
        if old.get(flag) == new.get(flag):
            continue
        field = FIELD_OF.get(flag) or DERIVED.get(flag)
        made = [v for v in path if field and field in ((v.apply.evidence or {}).get("change") or {} if v.apply else {})]
        rows.append((flag, _shown(old.get(flag)), _shown(new.get(flag)),
                     "; ".join(f"trial {v.trial.number} {_decision(v)}" for v in made) or "no recorded decision",
                     "; ".join(_evidence(v, number) for v in made) or "–"))
    cluster = c.exp.cluster
    base_cfg, cfg = c.base.trial.config, c.view.trial.config
    env_old, env_new = config_env(base_cfg, cluster), config_env(cfg, cluster)
    for var in sorted(set(env_old) | set(env_new)):
        if env_old.get(var) != env_new.get(var):
            rows.append((f"env {var}", env_old.get(var, "(not set)"), env_new.get(var, "(not set)"),
                         "follows the flags above: " + _env_source(var, cfg if var in env_new else base_cfg, cluster),
                         "–"))
    return rows


def diff_text(c: Chosen) -> str:
    """The flag-by-flag diff against the baseline as Markdown: each change, the decision that made
    it (its rule and the rule's source) and its evidence (judged step time before → after)."""
    base, v = c.base, c.view
    head = [f"# moetune export: {_title(c)} against the baseline (trial {base.trial.number})", ""]
    if base.judged_ms and v.judged_ms:
        head.append(f"Judged step time: {base.judged_ms:.1f} ms (trial {base.trial.number}) → {v.judged_ms:.1f} ms "
                    f"(trial {v.trial.number}), {base.judged_ms / v.judged_ms:.2f}x.")
        head.append("")
    rows = diff_rows(c)
    if not rows:
        return "\n".join(head + ["No flag differs from the baseline.", ""])

    def cell(x: str) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")
    table = ["| flag | baseline | this trial | decision (rule: why, source) | evidence (judged step time) |",
             "|---|---|---|---|---|"]
    table += ["| " + " | ".join([f"`{cell(r[0])}`", *(cell(x) for x in r[1:])]) + " |" for r in rows]
    return "\n".join(head + table) + "\n"
