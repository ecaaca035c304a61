"""An experiment's YAML as the GPU machine runs it (no Slurm there), written for the device scripts
(tune.sh, calibrate.sh); moetune must import (they put this checkout on PYTHONPATH):

    python3 benchmarks/device/local_experiment.py EXPERIMENT OUT [--nsys PATH] [--local] [--one-gpu ITERS]

--nsys: nsys named by its path there. --local: the jobs run there (submitit's local executor, the
venv template); the cluster keeps its name, so what is stored under it (a calibration) is found
for the shipped experiment. --one-gpu ITERS: a one-GPU study's too: local, no apex, rank 0
profiled, ITERS iterations with the last two profiled.
"""
from __future__ import annotations

import argparse
import sys

import yaml

from moetune.experiment.schema import experiment_path

LOCAL = {"executor": "local", "template": "venv"}
ONE_GPU = {**LOCAL, "has_apex": False, "profile_ranks": [0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("experiment")
    p.add_argument("out")
    p.add_argument("--nsys")
    p.add_argument("--local", action="store_true")
    p.add_argument("--one-gpu", type=int, metavar="ITERS")
    a = p.parse_args(argv)
    d = yaml.safe_load(experiment_path(a.experiment).read_text())
    if a.nsys:
        d["cluster"]["nsys"] = a.nsys
    if a.local:
        d["cluster"].update(LOCAL)
    if a.one_gpu:
        d["cluster"].update(ONE_GPU)
        d["baseline"].update(train_iters=a.one_gpu, profile_step_start=a.one_gpu - 1, profile_step_end=a.one_gpu)
    with open(a.out, "w") as f:
        f.write(yaml.safe_dump(d, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
