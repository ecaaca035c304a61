"""Render the fit-lease layouts into layouts.json: for each production experiment, its baseline
and `moetune plan`'s first choice (the experiment's own GPU count and type), each as the argv (and the
environment, moetune/experiment/environment.py ENV_RULES) a trial gets (TrainingConfig.to_args + run_args, no apex on the GPU machine) with the fit's flags
(moetune/experiment/fit.py): static routing (capacity factor 1.0, padded: the fake process group skips the token-count
exchange of dropless alltoall, ../shared/device-notes.md) and 3 iterations (Megatron reports
memory after iteration 2, when the optimizer states exist). Per layout, the ranks that bound
memory: rank 0 (first pipeline stage) and, where PP > 1, the first rank of the last stage (data-
and tensor-parallel rank 0, so Megatron's memory report, which only DP rank 0 prints, appears).

    python benchmarks/fit_lease/layouts.py > benchmarks/fit_lease/layouts.json

The committed layouts.json is the one measured on 2026-11-23 (docs/memory.md): its "plan" entries
are plan's first choices by the estimate before it was calibrated on these runs; re-rendering now
picks qwen3_30b_a3b's baseline itself (no recompute) as that model's first choice.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import checkout  # noqa: E402,F401  (moetune from this checkout)

from moetune.experiment import fit  # noqa: E402
from moetune.experiment.config import run_args  # noqa: E402
from moetune.experiment.schema import load_experiment  # noqa: E402
from moetune.estimate.memory import plan  # noqa: E402
from moetune.experiment.environment import config_env  # noqa: E402

MODELS = ("qwen3_235b", "qwen3_30b_a3b", "deepseek_v3", "mixtral_8x7b", "mixtral_8x22b")
def entry(name: str, kind: str, model, cfg, fitted, world: int, rank: int, gpu_type: str) -> dict:
    """One rank's fit entry: `cfg` as planned, run as `fitted` (fit.fit_config of it)."""
    return {"name": f"{name}-{kind}-r{rank}", "model": name, "kind": kind, "world_size": world,
            "rank": rank, "gpu_type": gpu_type, "config": cfg.to_dict(),
            "env": config_env(fitted.to_dict()),
            "argv": fitted.to_args(model, has_apex=False) + run_args() + list(fit.FAKE_GROUP_ARGS)}


def entries(name: str, kind: str, model, cfg, world: int, gpu_type: str) -> list[dict]:
    """One layout's fit entries, a rank each of those that bound its memory (fit.bounding_ranks)."""
    fitted = fit.fit_config(cfg)
    return [entry(name, kind, model, cfg, fitted, world, rank, gpu_type) for rank in fit.bounding_ranks(cfg, world)]


def layouts() -> list[dict]:
    out = []
    for name in MODELS:
        exp = load_experiment(name)
        first = plan(exp)[0].config
        for kind, cfg in (("baseline", exp.baseline), ("plan", first)):
            out += entries(name, kind, exp.model, cfg, exp.cluster.world, exp.cluster.gpu_type)
    return sorted(out, key=lambda l: l["rank"] > 0)


if __name__ == "__main__":
    json.dump(layouts(), sys.stdout, indent=1)
    print()
