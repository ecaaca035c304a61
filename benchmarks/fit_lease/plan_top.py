"""Render, as fit-lease entries (layouts.json's format), one experiment's first layouts by `moetune
plan`'s default order (predicted speed, with the searched settings) and its baseline, each as the
first rank of the pipeline stage the estimate puts highest (data- and tensor-parallel rank 0, so
Megatron's memory report appears), with and without TP-comm overlap
(whose userbuffers the fake process group may not set up): whether the plan's leaders fit as the
estimate says they do, measured by benchmarks/device/fit.sh with FIT_LAYOUTS pointing at the file.

    python benchmarks/fit_lease/plan_top.py qwen3_235b 1 > benchmarks/fit_lease/plan_top.json

Each entry carries the estimate of that stage's peak (`estimate_gb`: Megatron's max allocated plus
the estimate's fixed part), beside what the fit measures. A step of fit.fit_micro_batches() a
data-parallel rank, as `moetune fit` runs it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import checkout  # noqa: E402,F401  (moetune from this checkout)

from layouts import entry as rank_entry  # noqa: E402

from moetune.errors import MoetuneError  # noqa: E402
from moetune.estimate import StoreReadings  # noqa: E402
from moetune.estimate.memory import estimate  # noqa: E402
from moetune.estimate.search import search  # noqa: E402
from moetune.experiment import fit  # noqa: E402
from moetune.experiment.schema import load_experiment  # noqa: E402


def entry(name: str, kind: str, exp, cfg) -> dict:
    world = exp.cluster.world
    by_stage = [estimate(exp.model, cfg, world, stage=s).total_gb for s in range(max(cfg.pp, 1))]
    stage = by_stage.index(max(by_stage))
    e = rank_entry(name, kind, exp.model, cfg, fit.fit_config(cfg, world), world,
                   fit.stage_rank(stage, cfg, world), exp.cluster.gpu_type)
    return {**e, "stage": stage, "estimate_gb": round(by_stage[stage], 1)}


def plan_top(name: str, n: int) -> list[dict]:
    exp = load_experiment(name)
    found = search(exp, StoreReadings.empty(), limit=n)
    chosen = [(f"plan{i + 1}", lay.config) for i, lay in enumerate(found.layouts[:n])]
    chosen.append(("baseline", exp.baseline))
    out = []
    for kind, cfg in chosen:
        out.append(entry(name, kind, exp, cfg))
        if cfg.tp_comm_overlap:
            out.append(entry(name, f"{kind}_notpov", exp, cfg.replace(tp_comm_overlap=False)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", help="experiment name (experiments/NAME.yaml)")
    p.add_argument("n", nargs="?", type=int, default=1, help="the plan's first N layouts (default 1)")
    a = p.parse_args(argv)
    try:
        got = plan_top(a.experiment, a.n)
    except MoetuneError as e:
        print(f"plan_top: {e}", file=sys.stderr)
        return 2
    json.dump(got, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
