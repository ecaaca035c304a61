"""`moetune calibrate MODEL [--gpus N] [--nodes N] [--executor auto|slurm|local] [--runs DIR]
[--timeout S] [--format text|json]`: one short job on the experiment's cluster measures its links
(all-to-all, all-gather, reduce-scatter, all-reduce inside a node and across nodes), a GPU's copy
and GEMM rates and DeepEP where the image has it (trial/calibrate.py); the rows are stored per
cluster, and `moetune predict` and `plan` use them over the published rates, naming which."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from moetune.analysis.usage import Parser
from moetune.cli.common import exit_code
from moetune.errors import MoetuneError
from moetune.experiment.schema import load_experiment
from moetune.store import Store
from moetune.trial import calibrate
from moetune.workloads import link_probe


def render(exp, out) -> str:
    r = out.record
    head = (f"calibration {out.stored_id} of cluster {exp.cluster.name}: job {out.job_id}, {r['world_size']} rank(s) "
            f"on {len(set(r['nodes']))} node(s), {r['backend']}, {r['device']}; {out.folder}")
    tail = "predict and plan on this cluster now use these rows over the published rates"
    return "\n".join([head, *link_probe.table(r), tail])


def main(argv: list[str], db: str | None = None) -> int:
    return exit_code(lambda a: _main(a, db), argv)


def _main(argv: list[str], db: str | None) -> int:
    p = Parser(prog="moetune calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="experiment name (experiments/NAME.yaml) or a YAML path")
    p.add_argument("--gpus", type=int, help="ranks in all (default: a node's GPUs on each node)")
    p.add_argument("--nodes", type=int, help=f"nodes (default: {calibrate.DEFAULT_NODES}, or the cluster's fewer)")
    p.add_argument("--executor", default="auto", choices=("auto", "slurm", "local"),
                   help="auto: Slurm when sbatch is on PATH, else submitit's local executor")
    p.add_argument("--runs", default="runs", help="runs folder, shared with the compute nodes (default runs/); "
                                                  "the job's files go under _calibrate/")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for the job (default: as long as it queues)")
    p.add_argument("--format", default="text", choices=("text", "json"))
    a = p.parse_args(argv)
    try:
        exp = load_experiment(a.model)
        out = calibrate.run(exp, gpus=a.gpus, nodes=a.nodes, executor=a.executor, runs_root=Path(a.runs),
                            store=Store(db), timeout_s=a.timeout)
    except MoetuneError as e:
        print(f"moetune calibrate: {e}", file=sys.stderr)
        return 2
    if a.format == "json":
        print(json.dumps({"id": out.stored_id, "job_id": out.job_id, "folder": out.folder, **out.record},
                         indent=1, sort_keys=True))
    else:
        print(render(exp, out))
    return 0
