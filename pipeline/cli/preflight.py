"""`moetune preflight MODEL [--executor auto|slurm|local] [--runs DIR] [--format text|json]`: the
preflight job of the experiment's cluster, run now (trial/preflight.py), stored, and shown as a
table of what was found with its problems. Exit 0 when nothing blocks trials, 1 when something
does (each blocking line names what and the fix)."""
from __future__ import annotations

import json
from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("model", help="experiment name (experiments/NAME.yaml) or a YAML path")
    p.add_argument("--executor", default="auto", choices=("auto", "slurm", "local"),
                   help="auto: Slurm when sbatch is on PATH, else submitit's local executor")
    p.add_argument("--runs", default="runs", help="runs folder, shared with the compute nodes "
                                                  "(default runs/); the job's files go under _preflight/")
    p.add_argument("--format", default="text", choices=("text", "json"))
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for the job (default: as long as it queues)")


def run(store, args):
    from moetune.pipeline.spec.experiment import load_experiment  # not for `moetune --help`
    from moetune.pipeline.trial import preflight
    exp = load_experiment(args.model)
    return exp, preflight.run(exp.cluster, executor=args.executor, runs_root=Path(args.runs), store=store,
                              timeout_s=args.timeout)


def render(exp, out) -> str:
    from moetune.pipeline.spec import preflight as spec
    rows = spec.summary_rows(out.record)
    width = max(len(k) for k, _ in rows)
    lines = [f"preflight of {exp.name} on cluster {exp.cluster.name} ({spec.image_key(exp.cluster)}): "
             f"{out.folder}"]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    if out.capabilities:
        lines.append("  capabilities  " + ", ".join(f"{k}={v}" for k, v in out.capabilities.items()))
    for title, found in (("blocking", out.blocking), ("notes", [p for p in out.problems if not p.blocking])):
        if found:
            lines.append(f"{title}:")
            lines += [f"  - {p.line}" for p in found]
    if not out.blocking:
        lines.append("nothing blocks the trials")
    return "\n".join(lines)


def main(store, args) -> int:
    exp, out = run(store, args)
    if args.format == "json":
        print(json.dumps(out.to_dict(), indent=1, sort_keys=True, default=str))
    else:
        print(render(exp, out))
    return 1 if out.blocking else 0
