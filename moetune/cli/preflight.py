"""`moetune preflight MODEL [--executor auto|slurm|local] [--runs DIR] [--format text|json]`: the
preflight job of the experiment's cluster, run now (trial/preflight.py), stored, and shown as a
table of what was found with its problems. Exit 0 when nothing blocks trials, 1 when something
does (each blocking line names what and the fix). Its arguments are in cli/common.py
(add_preflight_arguments), so that `moetune --help` does not load this module."""
from __future__ import annotations

import json
from pathlib import Path

from moetune.experiment import preflight as spec
from moetune.experiment.schema import load_experiment
from moetune.trial import preflight


def run(store, args):
    exp = load_experiment(args.model)
    return exp, preflight.run(exp.cluster, executor=args.executor, runs_root=Path(args.runs), store=store,
                              timeout_s=args.timeout)


def render(exp, out) -> str:
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
