"""Where moetune's own files are. A checkout and an installed wheel lay them out alike:
pipeline/ (moetune.pipeline) sits beside experiments/ and sbatch_templates/, so both are found
from this file, wherever the package lives."""
from __future__ import annotations

import os
from pathlib import Path

PIPELINE = Path(__file__).resolve().parent
ROOT = PIPELINE.parent  # the checkout (or site-packages/moetune when installed)
EXPERIMENTS = ROOT / "experiments"
TEMPLATES = ROOT / "sbatch_templates"
# the fixes the tuner may try; a team may keep its own table ($MOETUNE_RULES)
RULES_FILE = Path(os.environ.get("MOETUNE_RULES") or PIPELINE / "decide" / "rules.yaml")
WORKLOADS = PIPELINE / "job"  # scripts that run inside the job, by path (the image lacks moetune)
TRIAL_BANK = ROOT / "benchmarks" / "trial_bank"  # in a checkout only: the demo's recorded trials


def trial_folder(runs_root, study_name: str, trial) -> Path:
    """A trial's files: the folder its render stage recorded, else <runs>/<study>/<trial id>/
    (runs: the runs_root given, else $MOETUNE_RUNS, else runs/ here)."""
    if getattr(trial, "folder", None):
        return Path(trial.folder)
    root = Path(runs_root or os.environ.get("MOETUNE_RUNS", "runs"))
    return (root / study_name / str(trial.id)).resolve()
