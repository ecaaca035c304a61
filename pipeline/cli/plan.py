"""`moetune plan MODEL [--gpus N --gpu-type T] [--format text|json]`: memory-feasible layouts."""
from __future__ import annotations

import argparse
import json
import sys

from moetune.pipeline.cli.common import add_gpu_args, exit_code
from moetune.pipeline.spec.experiment import ConfigError, load_experiment
from moetune.pipeline.spec.memory import plan


def main(argv: list[str]) -> int:
    return exit_code(_main, argv)


def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="moetune plan",
                                description="List the layouts whose estimated per-GPU memory fits, least "
                                            "model parallelism first (fit first: moe-optimization-workflow.md).")
    p.add_argument("model", help="experiment name (experiments/NAME.yaml) or path")
    add_gpu_args(p, "GPU count (default: the experiment's cluster)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--limit", type=int, default=10)
    args = p.parse_args(argv)
    try:
        exp = load_experiment(args.model)
    except ConfigError as e:
        print(f"moetune plan: {e}", file=sys.stderr)
        return 2
    per_node = exp.cluster.gpus_per_node
    if args.gpus is not None and (args.gpus < 1 or (args.gpus > per_node and args.gpus % per_node)):
        p.error(f"--gpus {args.gpus}: give 1..{per_node} GPUs of one node or a multiple of "
                f"{per_node} (the experiment's GPUs per node)")
    layouts = plan(exp, args.gpus, args.gpu_type, limit=args.limit)
    if args.format == "json":
        print(json.dumps([l.to_dict() for l in layouts], indent=1))
        return 0
    if not layouts:
        print(f"no layout of {exp.name} fits; add GPUs, or consider offloading and full recompute")
        return 1
    gpus = args.gpus or exp.cluster.nodes * per_node
    print(f"{exp.name} on {gpus}x {args.gpu_type or exp.cluster.gpu_type}: {len(layouts)} feasible layouts shown (--limit {args.limit}), "
          "least model parallelism first")
    print(f"{'TP':>3} {'PP':>3} {'EP':>4} {'recompute':<18} {'GB/GPU':>7}")
    for l in layouts:
        c = l.config
        print(f"{c.tp:>3} {c.pp:>3} {c.ep:>4} {','.join(c.recompute_modules) or '-':<18} {l.memory_gb:>7.1f}")
    return 0
