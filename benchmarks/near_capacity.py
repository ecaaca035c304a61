"""A completed run that is busy on compute with its allocator peak near the GPU's capacity
(issue 14, item 4): recorded on one H100 as one-GPU trials, to test that such a run is not
classified `memory` (tests/test_near_capacity.py).

Each variant is a production experiment's model with a layout and micro batch chosen by
`pipeline/spec/memory.py`'s estimate to peak at 92-97 % of an 80 GB H100 (the `memory_near_capacity`
row of analysis/walls.py fires at 0.92). It runs as a one-GPU study of one trial without the fit
gate (`tuning.fit_first: false`): the fit's headroom for NCCL buffers and uneven routing (7 GB on
an H100) would keep any layout this close to capacity off the GPU, which is the point of the fit,
and not what this run measures.

    python3 benchmarks/near_capacity.py write DIR    # DIR/<variant>.yaml, one per variant, and
                                                     # each one's estimate (on the device:
                                                     # tune.sh start --one-gpu DIR/*.yaml)
    .venv/bin/python benchmarks/near_capacity.py import TUNE_DIR   # the packed `tune` folder of
                                                     # tune.sh: the variants' logs and traces to
                                                     # tests/data/gpu/near_capacity/, a table to
                                                     # docs/benchmarks.md and results/
"""
from __future__ import annotations

import json
import lzma
import shutil
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import checkout  # noqa: E402,F401  (moetune from this checkout)

from moetune.pipeline.spec import memory  # noqa: E402
from moetune.pipeline.spec.experiment import experiment_path, load_experiment  # noqa: E402

# variant -> (experiment, layout and micro batch on top of its baseline)
VARIANTS = {
    "mixtral_8x7b_tp2_mbs2": ("mixtral_8x7b", {"tp": 2, "pp": 1, "ep": 8, "etp": 1,
                                                "sequence_parallel": True, "micro_batch": 2}),
    "mixtral_8x22b_tp2_pp4": ("mixtral_8x22b", {"tp": 2, "pp": 4, "ep": 8, "etp": 1,
                                                 "sequence_parallel": True, "micro_batch": 1}),
    "mixtral_8x7b_pp4_mbs2_attn": ("mixtral_8x7b", {"tp": 1, "pp": 4, "ep": 8, "micro_batch": 2,
                                                     "recompute_granularity": "selective",
                                                     "recompute_modules": ["core_attn"]}),
}
# Not near capacity: the last device run's fixes, not yet run there (a graphed layout's fit runs
# past the graphs' capture, train_moe.py prints the run's peak at its end, nsys traces each kernel
# of a graph): qwen3_30b_a3b's kept one-GPU trial (TE graphs), fitted first
CHECKS = {
    "qwen3_30b_a3b_graphs": ("qwen3_30b_a3b", {"cuda_graph_impl": "transformer_engine",
                                               "cuda_graph_modules": ["attn", "moe_router", "moe_preprocess"]}),
}
DATA = REPO / "tests" / "data" / "gpu" / "near_capacity"
SECTION = "## A compute-busy run near capacity"


def variant(name: str) -> dict:
    """The variant's experiment as a YAML mapping: the production experiment with the layout,
    one trial, one GPU, no fit gate (a check: fitted first)."""
    base, layout = {**VARIANTS, **CHECKS}[name]
    d = yaml.safe_load(experiment_path(base).read_text())
    d["name"] = name
    d["description"] = f"{d.get('description', base)}: rank 0 near an H100's capacity (benchmarks/near_capacity.py)"
    d["baseline"].update(layout)
    d["tuning"].update(budget_trials=1, one_gpu=True, fit_first=name in CHECKS)
    return d


def estimate_gb(path: Path) -> float:
    exp = load_experiment(path)
    e = memory.estimate(exp.model, exp.baseline, exp.cluster.gpus)
    return round(e.total_gb - e.fixed_gb, 1)  # as Megatron's max allocated reports it


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in [*VARIANTS, *CHECKS]:
        path = out / f"{name}.yaml"
        path.write_text(yaml.safe_dump(variant(name), sort_keys=False))
        print(f"{path}: estimate {estimate_gb(path)} GB")


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "write":
        write(Path(argv[1]))
        return 0
    print(__doc__.split("\n\n")[-1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
