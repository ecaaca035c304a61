"""`moetune`: the command line. Each subcommand is a thin call into one module."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from moetune import __version__, settings
from moetune.analysis import cli as analysis_cli
from moetune.analysis.usage import Parser
from moetune.cli.common import (
    LAYOUT_OPTIONS,
    add_fit_arguments,
    add_preflight_arguments,
    baseline_misfit,
    positive_int,
    refusal_line,
    refuse_bad_extra_args,
)
from moetune.errors import MoetuneError
from moetune.job import executors  # its registry only: submitit loads when a job is submitted

# Each command's module is imported inside the function that runs it: they load pandas, SQLAlchemy,
# pydantic and submitit (seconds), and `moetune --help` or a usage error needs none of them.

# the stage names `moetune stage` takes, in their order (trial/stages.py FIT and STAGE_ORDER; a
# test keeps them equal, since importing the stages here would load the whole pipeline for `--help`)
STAGE_NAMES = ("fit", "render", "submit", "collect", "export", "analyze", "decide")


class UserError(MoetuneError):
    """A command's own refusal (a folder it cannot write, nothing to report); one line, exit 2."""


def _store(args, read_only: bool = False):
    from moetune.store import Store  # SQLAlchemy: only for the commands that open the store
    return Store(getattr(args, "db", None), read_only=read_only)


def cmd_plan(args, rest):
    from moetune.cli import plan as plan_cli  # not for `moetune --help` (above)
    return plan_cli.main(rest, db=args.db)


def cmd_predict(args, rest):
    from moetune.cli import predict as predict_cli
    return predict_cli.main(rest, db=args.db)


def cmd_calibrate(args, rest):
    from moetune.cli import calibrate as calibrate_cli
    return calibrate_cli.main(rest, db=args.db)


def cmd_new(args, rest):
    from moetune.cli import new as new_cli  # not for `moetune --help` (above)
    return new_cli.main(rest, db=args.db)


def cmd_render(args, rest):
    from moetune.cli import render as render_cli  # not for `moetune --help` (above)
    return render_cli.main(rest)


def cmd_check(args, rest):
    from moetune.cli import check as check_cli  # not for `moetune --help` (above)
    return check_cli.main(rest)


def cmd_export(args, rest):
    from moetune.cli import export as export_cli  # not for `moetune --help` (above)
    return export_cli.main(rest, db=args.db)


def cmd_analyze(args, rest):
    return analysis_cli.main(rest)


def writable_folder(path, what: str) -> None:
    """Make the folder a command will write to and prove it takes a file, before any work is done."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise UserError(f"{path}: the {what} folder cannot be written ({e.strerror or e}); "
                        f"give another with --{'runs' if what == 'runs' else 'out'}") from None


def refused_layout(model, layout=None):
    """The constraint table on the layout a tune or fit would submit first: one line, no job.
    `model`: the experiment's name or path, or the experiment loaded; `layout`: that layout (None:
    the baseline); the experiment back."""
    from moetune.experiment import constraints  # pydantic: not for `moetune --help`
    from moetune.experiment import schema as experiment
    exp = model if isinstance(model, experiment.Experiment) else experiment.load_experiment(model)
    refuse_bad_extra_args(exp)
    config = layout or exp.baseline
    refused = constraints.check(config, exp.model, exp.cluster)
    if refused:  # the rule's line as `moetune check` prints it
        raise UserError(f"{exp.path}: the layout TP{config.tp} PP{config.pp} EP{config.ep} is refused "
                        "before any job: " + refusal_line(refused))
    return exp


def cmd_fit(args, _rest):
    from moetune.cli import fit  # not for `moetune --help` (above)
    from moetune.experiment.schema import load_experiment
    notes: list[str] = []
    exp = load_experiment(args.model)
    config = fit.fit_config(exp, args, notes)
    refused_layout(exp, config)
    for note in notes:  # a recomputed pipeline split, as predict and plan say it
        print(f"moetune fit: {note}", file=sys.stderr)
    writable_folder(args.runs, "runs")
    fitted, tid = fit.run(_store(args), args, exp, config)
    layout = ", ".join(f"{k}={getattr(args, k)}" for k in LAYOUT_OPTIONS if getattr(args, k) is not None)
    print(fit.render(fitted, f"{args.model} ({layout or 'baseline layout'}), trial {tid}"))
    return fit.exit_code(fitted)


def _dry_run(args, exp) -> int:
    """`--dry-run`: the study's first trials, their predicted step and GPU-hours, and the budget;
    the store only read (none is created), no folder made, no lock taken."""
    from moetune.estimate import StoreReadings
    from moetune.job import executors
    from moetune.tune import dryrun
    lacking = None
    if args.executor == "replay":  # the demo proposes only what its bank recorded
        from moetune.job.replay import find
        lacking = executors.of_kind("replay", args.bank).not_proposed
        entry = find(exp.baseline, args.bank)
        args.one_gpu = args.one_gpu or bool(entry and entry.get("one_gpu"))
        exp.tuning = exp.tuning.model_copy(update={"fit_first": False})  # a replay fits nothing
    if args.one_gpu:
        exp.tuning = exp.tuning.model_copy(update={"one_gpu": True})
    plan = dryrun.dry_run(exp, StoreReadings(args.db), max_trials=args.max_trials,
                          max_gpu_hours=args.max_gpu_hours, lacking=lacking)
    print(dryrun.render(plan))
    return 0


def cmd_tune(args, _rest):
    from moetune.tune import loop as tuner  # not for `moetune --help` (above)
    exp = refused_layout(args.model)  # the experiment's YAML, loaded once for the whole run
    misfit = baseline_misfit(exp)
    if misfit and not (args.force or args.dry_run):
        raise UserError(f"{misfit}; set the experiment's baseline to one, or --force to tune from it")
    if misfit:
        print(f"moetune {args.command}: warning: {misfit}", file=sys.stderr)
    if args.dry_run:
        return _dry_run(args, exp)
    writable_folder(args.runs, "runs")
    writable_folder(args.out, "reports")
    summary = tuner.tune(exp, _store(args), executor=args.executor,
                         runs_root=Path(args.runs), max_trials=args.max_trials,
                         max_gpu_hours=args.max_gpu_hours,
                         progress=not args.no_progress, one_gpu=args.one_gpu,
                         bank_dir=getattr(args, "bank", None))
    md, html = _write_reports(args, summary.get("study", args.model))

    def judged(key: str) -> str:
        return "?" if summary.get(key) is None else f"{summary[key]:.1f}"

    if summary.get("note"):  # a study stopped before this run, not resumed: why
        print(summary["note"])

    ran = bool(summary.get("trials_total"))  # none: stopped before its first trial (the preflight)
    if ran:
        print(f"study {summary.get('study')}: {summary.get('trials', '?')} trials, best "
              f"{judged('best_judged_step_time_ms')} ms/step (baseline "
              f"{judged('baseline_judged_step_time_ms')} ms, judged)")
    print(f"report: {md}\nreport: {html}")
    if not ran:
        print(f"moetune {args.command}: study {summary.get('study')}: no trial ran; stopped: "
              f"{summary.get('stop_reason')}", file=sys.stderr)
        return 1
    if summary.get("best_judged_step_time_ms") is None:  # stopped before any trial measured
        print(f"moetune {args.command}: no trial measured a step time; stopped: {summary.get('stop_reason')}",
              file=sys.stderr)
        return 1
    return 0


def cmd_demo(args, _rest):
    from moetune.job.replay import load_bank  # not for `moetune --help`
    args.executor = "replay"
    args.model = args.model or "moe_proxy"
    args.bank = args.bank or settings.bank()
    load_bank(args.bank)  # no bank (an installed wheel): one line naming --bank, before any folder is made
    return cmd_tune(args, _rest)


def _write_reports(args, study, store=None):
    from moetune.report import study as report  # not for `moetune --help` (above)
    return report.write_reports(store or _store(args), study, Path(args.out))


def _study_argument(args) -> None:
    """A study named on the command line is a name (it names report files): checked before use."""
    if args.study is not None:
        from moetune.experiment.schema import check_name  # pydantic: not for `moetune --help`
        check_name(args.study, "study")


def cmd_report(args, _rest):
    _study_argument(args)
    store = _store(args, read_only=True)
    names = [args.study] if args.study else [s.name for s in store.studies()]
    if not names:
        raise UserError(f"no studies in {store.url}; run `moetune tune MODEL` first")
    writable_folder(args.out, "reports")
    for name in names:
        md, html = _write_reports(args, name, store)
        print(f"{name}: {md}\n{name}: {html}")
    return 0


def cmd_status(args, _rest):
    from moetune.report import status  # not for `moetune --help` (above)
    _study_argument(args)
    print(status.show(getattr(args, "db", None), args.study))
    return 0


def cmd_preflight(args, _rest):
    from moetune.cli import preflight  # not for `moetune --help` (above)
    return preflight.main(_store(args), args)


def cmd_stage(args, _rest):
    from moetune.trial import stages  # not for `moetune --help` (above)
    extra = {"local": True} if args.local else {}
    store = _store(args)
    before = store.last_stage(args.trial, args.stage)
    out = stages.run_stage(store, args.trial, args.stage, force=args.force, **extra)
    after = store.last_stage(args.trial, args.stage)
    ran = after is not None and (before is None or after.id != before.id)
    if ran:
        print(f"stage {args.stage} of trial {args.trial} ran; it wrote {len(out or [])} "
              f"file{'' if len(out or []) == 1 else 's'}" + (":" if out else ""))
    else:
        print(f"stage {args.stage} of trial {args.trial} is current (its inputs have not changed); "
              "nothing ran (--force runs it again). Its outputs:")
    for path in out or []:
        print(f"  {path}")
    if args.stage == stages.FIT:
        from moetune.cli.fit import exit_code
        fitted = stages.load_fit(stages.TrialContext(store, args.trial))
        print(f"fit: {fitted.get('reason')}")
        return exit_code(fitted)
    return 0


def _positive(text: str) -> float:
    """A GPU-hour budget: a number above 0 (argparse: a usage error, exit 2)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give more than 0") from None
    if not 0 < x < float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: give more than 0")
    return x


def build_parser() -> Parser:
    p = Parser(
        prog="moetune",
        description="Automatic performance tuner for Megatron MoE training on Slurm: profile "
                    "short runs under Nsight Systems, find the wall, apply the next fix, repeat.")
    p.add_argument("--version", action="version", version=f"moetune {__version__}")
    p.add_argument("--db", default=None,  # the store reads MOETUNE_DB when the command runs
                   help="store: a SQLite path or any SQLAlchemy URL (env MOETUNE_DB; "
                        "default .moetune/moetune.db)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, fn, help_, passthrough=False):
        sp = sub.add_parser(name, help=help_, description=help_, add_help=not passthrough)
        sp.set_defaults(fn=fn, passthrough=passthrough)
        return sp

    add("plan", cmd_plan, "list memory-feasible layouts for a model, fastest predicted first "
        "(moetune plan MODEL [--gpus N --gpu-type T] [--order speed|memory] [--format text|json])", True)
    add("predict", cmd_predict, "a layout's predicted step time and tokens/s/GPU, term by term "
        "(moetune predict MODEL [--gpus N] [--tp N --pp N --ep N ...] [--format text|json])", True)
    add("calibrate", cmd_calibrate, "measure the cluster's links and a GPU's rates in one short job; "
        "stored, predict and plan use them (moetune calibrate MODEL [--gpus N] [--nodes N])", True)
    add("render", cmd_render, "write exactly what a trial would submit (job.sbatch, job.sh, the "
        "export job), without a store (moetune render MODEL [--gpus N] [--fix RULE ...] --out DIR)", True)
    add("check", cmd_check, "check a Megatron command line against Megatron's and the MoE "
        "guidance's constraints (moetune check [--gpus N --gpu-type T] -- ARGS...)", True)
    add("new", cmd_new, "write an experiment YAML for a MoE model from its Hugging Face config.json, "
        "its baseline the fastest fitting layout (moetune new NAME --from-hf PATH [--gpus N --gpu-type T] "
        "[--out FILE]), or from a Megatron command line (moetune new NAME --from-megatron [FILE] [-- ARGS...])",
        True)
    add("analyze", cmd_analyze, "classify the wall of nsys traces and/or a training log "
        "(moetune analyze PATH... [--log FILE] [--format text|json|markdown])", True)
    add("export", cmd_export, "a study's tuned configuration to paste: Megatron arguments, Megatron-Bridge "
        "overrides or the diff against its baseline (moetune export STUDY [--trial N] "
        "[--format megatron|bridge|diff] [--out FILE])", True)

    for name, fn, help_ in (("tune", cmd_tune, "run the tuning loop for an experiment"),
                            ("demo", cmd_demo, "the tuning loop replaying the recorded GPU "
                                               "trial bank (no GPU needed)")):
        sp = add(name, fn, help_)
        sp.add_argument("model", nargs="?" if name == "demo" else None,
                        help="experiment name (experiments/NAME.yaml) or a YAML path")
        sp.add_argument("--executor", default="auto", choices=("auto", *executors.KINDS),
                        help="auto: Slurm when sbatch is on PATH, else submitit's local executor")
        sp.add_argument("--runs", default="runs", help="folder for trial files (default runs/)")
        sp.add_argument("--out", default="reports", help="folder for reports (default reports/)")
        sp.add_argument("--max-trials", type=positive_int, default=None, metavar="N",
                        help="override the experiment's trial budget (raised: a study its budget "
                             "stopped goes on)")
        sp.add_argument("--max-gpu-hours", type=_positive, default=None, metavar="H",
                        help="override the experiment's GPU-hour budget (whole jobs: fits and "
                             "preflight included)")
        sp.add_argument("--no-progress", action="store_true", help="no progress bar")
        sp.add_argument("--dry-run", action="store_true",
                        help="print the first trials the study would try, their predicted step time and "
                             "GPU-hours, and the budget; run and write nothing")
        sp.add_argument("--force", action="store_true",
                        help="tune from a baseline that does not fit by the memory estimate (refused otherwise)")
        sp.add_argument("--one-gpu", action="store_true",
                        help="every trial on one GPU: one rank of the layout alone under Megatron's fake "
                             "process group (tuning.one_gpu; study NAME-1gpu)")
        if name == "demo":
            sp.add_argument("--bank", help="the trial bank folder (default: this checkout's "
                                           "data/trial_bank, env MOETUNE_BANK; a wheel ships none)")

    sp = add("fit", cmd_fit, "measure a layout's memory-bounding ranks on one GPU each (Megatron's "
             "fake process group) and say whether it fits; exit 1 when it does not, 2 when a rank "
             "could not measure (its log's error named)")
    add_fit_arguments(sp)

    sp = add("preflight", cmd_preflight, "probe what the trials will meet on the cluster (Megatron, "
             "TE, DeepEP, nsys, GPUs, CPUs, NUMA, the runs folder) in one job of their image; exit 1 "
             "when something blocks them")
    add_preflight_arguments(sp)

    sp = add("stage", cmd_stage, "re-run one stage of one trial by hand")
    sp.add_argument("stage", choices=STAGE_NAMES)
    sp.add_argument("--trial", type=int, required=True, help="trial id (moetune status lists them)")
    sp.add_argument("--force", action="store_true", help="re-run even when outputs are current")
    sp.add_argument("--local", action="store_true",
                    help="export/analyze: in this process, not as the cluster's post-processing job")

    sp = add("report", cmd_report, "write Markdown and HTML reports of a study (default: all)")
    sp.add_argument("study", nargs="?")
    sp.add_argument("--out", default="reports", help="folder for reports (default reports/)")

    sp = add("status", cmd_status, "studies, trials and decisions in the store")
    sp.add_argument("study", nargs="?")
    p.subcommands = dict(sub.choices)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # plan, check and analyze own their arguments (check takes a raw Megatron argv after --)
    head = _first_command(argv)
    try:
        if head is not None and argv[head] in PASSTHROUGH:
            args = parser.parse_args(argv[:head + 1])
            rest = argv[head + 1:]
        else:
            args, extra = parser.parse_known_args(argv)
            if extra:  # the subcommand's own parser says it, with the flag meant
                parser.subcommands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
            rest = []
    except SystemExit as e:  # a usage error (its one line printed) or --help, --version
        return e.code if isinstance(e.code, int) else 2
    try:
        code = args.fn(args, rest) or 0
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # `moetune plan ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(f"moetune {args.command}: interrupted; the store keeps what was measured, run the same command "
              "again to resume", file=sys.stderr)
        return 130
    except Exception as e:  # one line for anything an engineer can act on
        if not _is_user_error(e):
            raise
        # one prefix for every error line: the subcommand's, as its own parser's lines have it
        print(f"moetune {args.command}: {e}", file=sys.stderr)
        return 2


PASSTHROUGH = ("plan", "predict", "calibrate", "render", "check", "analyze", "export", "new")


def _first_command(argv: list[str]) -> int | None:
    """Index of the subcommand in argv (skipping the global --db VALUE)."""
    i = 0
    while i < len(argv):
        if argv[i] == "--db":
            i += 2
        elif argv[i].startswith("--db="):
            i += 1
        elif argv[i].startswith("-"):
            return None
        else:
            return i
    return None


def _is_user_error(e: Exception) -> bool:
    return isinstance(e, (MoetuneError, FileNotFoundError, PermissionError))


if __name__ == "__main__":
    sys.exit(main())
