"""Pieces the subcommands' argument parsers share, and the arguments of `moetune fit` and `moetune
preflight`, which main.py's parser defines without loading those commands."""
from __future__ import annotations

import argparse
from collections.abc import Callable

from moetune.experiment import constraints, megatron_validate
from moetune.experiment.config import TrainingConfig
from moetune.experiment.gpus import GPU_TYPES
from moetune.experiment.schema import ConfigError, Experiment, load_experiment


def exit_code(fn: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run a subcommand; argparse's usage errors and --help become exit codes, not SystemExit."""
    try:
        return fn(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2


def positive_int(text: str) -> int:
    """argparse type: a whole number of 1 or more (a usage error, exit 2, otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give 1 or more") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return value


def add_gpu_args(p: argparse.ArgumentParser, gpus_help: str) -> None:
    p.add_argument("--gpus", type=int, help=gpus_help)
    p.add_argument("--gpu-type", choices=GPU_TYPES)


def experiment_for_gpus(model: str, gpus: int | None) -> Experiment:
    """The experiment named, with a --gpus count its cluster can hold: part of one node or whole
    nodes (ConfigError, one line, otherwise)."""
    exp = load_experiment(model)
    per_node = exp.cluster.gpus_per_node
    if gpus is not None and not per_node:
        raise ConfigError(f"--gpus {gpus}: {exp.path}: cluster.gpus_per_node is 0 (the CPU stand-in's nodes), "
                          "there are no GPUs to price; use an experiment whose cluster has GPUs")
    if gpus is not None and (gpus < 1 or (gpus > per_node and gpus % per_node)):
        raise ConfigError(f"--gpus {gpus}: give 1..{per_node} GPUs of one node or a multiple of {per_node} "
                          "(the experiment's GPUs per node)")
    return exp


def refuse_unknown_values(exp: Experiment, config: TrainingConfig) -> None:
    """ConfigError (one line) where the config names a value no Megatron takes (a dispatcher, a
    flex backend, a recompute module): the constraint table's unknown_* rows, refused before any
    layout is searched or priced, each naming what is allowed."""
    unknown = [v for v in constraints.check(config, exp.model, exp.cluster) if v.code.startswith("unknown_")]
    if unknown:
        raise ConfigError(f"{exp.path or exp.name}: baseline: " + "; ".join(v.message for v in unknown))


def refuse_bad_extra_args(exp: Experiment) -> None:
    """ConfigError (one line) where Megatron would not take the experiment's extra_args: an option
    its parser lacks, or its parser's own refusal where .venv-megatron exists."""
    why = megatron_validate.check_extra_args(list(exp.extra_args)) if exp.extra_args else None
    if why:
        raise ConfigError(f"{exp.path or exp.name}: extra_args: {why}")


def refusal_line(violations: list) -> str:
    """The one line predict, plan, render and tune give for a layout the constraint table refuses:
    its first rule as `moetune check` prints it (code: message [source]), and how many more."""
    more = f" (and {len(violations) - 1} more: {', '.join(v.code for v in violations[1:])})" if violations[1:] else ""
    return f"the constraint table refuses this layout: {violations[0]}{more}"


LAYOUT_OPTIONS = {"tp": "tensor parallel", "pp": "pipeline parallel", "ep": "expert parallel",
                  "etp": "expert tensor parallel", "micro_batch": "micro batch size"}


def add_fit_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="experiment name (experiments/NAME.yaml) or a YAML path")
    for key, what in LAYOUT_OPTIONS.items():
        p.add_argument("--" + key.replace("_", "-"), type=positive_int, metavar="N",
                       help=f"{what} (default: the baseline's)")
    p.add_argument("--executor", default="auto", choices=("auto", "slurm", "local"),
                   help="auto: Slurm when sbatch is on PATH, else submitit's local executor")
    p.add_argument("--runs", default="runs", help="folder for trial files (default runs/)")


def add_preflight_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="experiment name (experiments/NAME.yaml) or a YAML path")
    p.add_argument("--executor", default="auto", choices=("auto", "slurm", "local"),
                   help="auto: Slurm when sbatch is on PATH, else submitit's local executor")
    p.add_argument("--runs", default="runs", help="runs folder, shared with the compute nodes "
                                                  "(default runs/); the job's files go under _preflight/")
    p.add_argument("--format", default="text", choices=("text", "json"))
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for the job (default: as long as it queues)")


def baseline_misfit(exp, gpus: int | None = None, gpu_type: str | None = None, offered: int = 3) -> str | None:
    """One line where the experiment's baseline does not fit its GPUs by the memory estimate (nor
    by a measured peak), with the plan's fastest fitting layouts offered; None where it fits, or
    where the cluster has no GPUs to estimate (a CPU stand-in) or cannot hold the layout (the
    constraint table says that)."""
    from moetune.estimate import StoreReadings
    from moetune.estimate.memory import PLAN_HEADROOM_SHARE, TooFewGPUs, baseline_layout
    from moetune.estimate.search import search
    if not exp.cluster.gpus_per_node:
        return None
    try:
        base = baseline_layout(exp, gpus, gpu_type)
    except TooFewGPUs:
        return None
    if base.fits or base.refused:
        return None
    found = search(exp, StoreReadings(None), gpus, gpu_type, "speed", offered)
    best = "; ".join(_layout_words(lay.config) + f" {lay.memory_gb:.1f} GB" for lay in found.layouts)
    c = base.config
    offer = (f"fitting layouts (moetune plan {exp.name}): {best}" if best else
             "no layout fits, full recompute included; add GPUs, or consider offloading")
    usable = (1 - PLAN_HEADROOM_SHARE) * (base.capacity_gb or 0)
    return (f"{exp.path or exp.name}: the baseline {_layout_words(c)} does not fit by the estimate "
            f"({base.memory_gb:.1f} of {base.capacity_gb:g} GB, {usable:.1f} usable); {offer}")


def _layout_words(c: TrainingConfig) -> str:
    split = ""
    if c.pp_layout:
        split = f" layout {c.pp_layout}"
    elif c.first_pp_layers is not None or c.last_pp_layers is not None:
        split = f" first/last {c.first_pp_layers or '-'}/{c.last_pp_layers or '-'}"
    elif c.account_for_embedding or c.account_for_loss:
        split = " embedding/loss accounted"
    recompute = (" full recompute" if c.recompute_granularity == "full" else
                 f" recompute {','.join(c.selective_modules)}" if c.recompute_granularity == "selective" else "")
    return (f"TP{c.tp} PP{c.pp}" + (f" VPP{c.vpp}" if c.vpp else "") + split + f" EP{c.ep}"
            + (f" ETP{c.etp}" if c.etp else "") + f" MB{c.micro_batch}" + recompute)
