"""`moetune render MODEL [--gpus N] [--fix RULE ...] [--one-gpu] --out DIR`: exactly what a trial of
the experiment's baseline (with the named fixes applied) would submit, written without a store or
a job: job.sbatch and job.sh (trial/stages.py trial_spec, the render stage's own function) and
export.sh, the post-processing job sbatch'ed after it (job/postprocess.py sbatch_argv). An
engineer reads them before the first submission; `sbatch DIR/job.sbatch` runs the trial by hand."""
from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

from moetune.analysis.usage import Parser
from moetune.cli.common import (
    add_gpu_args,
    baseline_misfit,
    exit_code,
    experiment_for_gpus,
    refusal_line,
    refuse_bad_extra_args,
)
from moetune.decide import one_gpu as one_gpu_step
from moetune.decide.rules import load_rules
from moetune.estimate.memory import plan_cluster
from moetune.experiment import constraints, fit
from moetune.experiment.placement import Placement
from moetune.experiment.schema import ConfigError
from moetune.job import postprocess, render, slurm
from moetune.trial import stages

JOB_ID = "@JOB@"  # the trial job's id in export.sh: its first argument


def main(argv: list[str]) -> int:
    return exit_code(_main, argv)


def _fail(line: str) -> int:
    print(f"moetune render: {line}", file=sys.stderr)
    return 2


def _main(argv: list[str]) -> int:
    p = Parser(prog="moetune render", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="experiment name (experiments/NAME.yaml) or a YAML path")
    add_gpu_args(p, "GPU count (default: the experiment's cluster)")
    p.add_argument("--fix", action="append", default=[], metavar="RULE",
                   help="apply this rule's change to the baseline (rules.yaml ids; repeatable, in order)")
    p.add_argument("--one-gpu", action="store_true",
                   help="the one-GPU trial: a rank of the layout alone under the fake process "
                        "group (rank 0 here; a study runs the slowest MoE stage its fit measured)")
    p.add_argument("--launcher", choices=("srun", "local"), default="srun",
                   help="srun: the cluster's job (default); local: the job without Slurm")
    p.add_argument("--out", required=True, help="folder for the job's files (made if absent)")
    a = p.parse_args(argv)
    try:
        exp = experiment_for_gpus(a.model, a.gpus)
        refuse_bad_extra_args(exp)
    except ConfigError as e:
        return _fail(str(e))
    cluster, _, _ = plan_cluster(exp, a.gpus, a.gpu_type)
    config = exp.baseline
    rules = {r.id: r for r in load_rules()}
    for rule_id in a.fix:
        if rule_id not in rules:
            near = difflib.get_close_matches(rule_id, rules, n=1)
            return _fail(f"--fix {rule_id}: no such rule" + (f" (did you mean {near[0]}?)" if near else "")
                         + f"; rules: {', '.join(sorted(rules))}")
        changed = rules[rule_id].apply(config)
        if changed is None:
            return _fail(f"--fix {rule_id}: its change {rules[rule_id].change} cannot be made to this config")
        config = changed
    refused = constraints.check(config, exp.model, cluster)
    if refused:
        return _fail(refusal_line(refused))
    if not a.fix:  # said before anything is written; a fix changes the layout the estimate judged
        misfit = baseline_misfit(exp, a.gpus, a.gpu_type)
        if misfit:
            print(f"moetune render: warning: {misfit}", file=sys.stderr)
    tuning = exp.tuning.model_copy(update={"one_gpu": a.one_gpu or exp.tuning.one_gpu})
    samples = None
    if tuning.one_gpu:  # the step a one-GPU study of this config would plan (decide/one_gpu.py)
        try:
            samples = one_gpu_step.plan_samples(config, exp.model, cluster, tuning, list(rules.values()))
        except one_gpu_step.StepError as e:
            return _fail(f"{exp.path}: {e}")
    placement = Placement.decide(tuning, cluster.world, samples)
    out = Path(a.out).resolve()
    cpus, where = node_cpus(cluster, a.launcher)
    try:
        spec = stages.trial_spec(name=f"moetune.{exp.name}.render", folder=out, config=config,
                                 model=exp.model, cluster=cluster, placement=placement,
                                 launcher=a.launcher, node_cpus=cpus, extra_args=exp.extra_args)
        written = stages.write_trial_job(spec, config.to_dict())
    except (fit.OneGpuError, render.RenderError, ConfigError) as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"{out}: cannot write there ({e.strerror})")
    if spec.nsys and a.launcher == "srun" and not a.one_gpu:
        written.append(write_export(out, spec, cluster))
    print(f"{exp.name}: {spec.nodes} node(s) x {spec.ntasks_per_node} rank(s), {spec.cpus_per_task} "
          f"CPUs per rank ({where}), {'exclusive' if spec.exclusive else 'shared'} nodes, "
          f"--mem={spec.mem if spec.mem is not None else '(none)'}"
          + (f", fixes: {', '.join(a.fix)}" if a.fix else ""))
    for path in written:
        print(path)
    return 0


def node_cpus(cluster, launcher: str) -> tuple[int | None, str]:
    """(CPUs of one compute node, where that figure comes from) for sharing out among its ranks."""
    if cluster.cpus_per_task:
        return None, "cluster.cpus_per_task"
    if launcher == "local":  # the job runs on this machine
        return os.cpu_count(), f"this machine's {os.cpu_count()} CPUs"
    if slurm.available():
        found = slurm.node_cpus(cluster.partition)
        if found:
            return found, f"Slurm's {found} CPUs per node"
    return None, f"the {cluster.gpu_type} reference node's share"


def write_export(out: Path, spec: render.JobSpec, cluster) -> Path:
    """export.sh: the post-processing job as the tuner submits it, for the trial job's id ($1)."""
    ranks = [r for r in spec.nsys.ranks if r < spec.ntasks]
    argv = postprocess.sbatch_argv(out, ranks, cluster, after=JOB_ID, name=spec.name + ".post")
    words = []
    for w in argv:
        quoted = render.shell_word(w)
        # the id goes in as "$1": outside quotes as it is, inside single quotes closing them
        words.append(quoted.replace(JOB_ID, "'\"$1\"'" if quoted.startswith("'") else '"$1"'))
    path = spec.paths.export_script
    usage = f"bash {path.name} TRIAL_JOB_ID"
    path.write_text("#!/bin/bash\n# the trial's export and per-rank metrics, a CPU job array after the "
                    f"trial's job ends:\n#   {usage}\n"
                    f"set -euo pipefail\n[ $# -eq 1 ] || {{ echo \"usage: {usage}\" >&2; exit 2; }}\n"
                    + " \\\n  ".join(words) + "\n")
    path.chmod(0o755)
    return path
