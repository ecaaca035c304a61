"""Where moetune's own files are. A checkout and an installed wheel lay them out alike:
pipeline/ (moetune.pipeline) sits beside experiments/ and sbatch_templates/, so both are found
from this file, wherever the package lives."""
from __future__ import annotations

from pathlib import Path

PIPELINE = Path(__file__).resolve().parent
ROOT = PIPELINE.parent  # the checkout (or site-packages/moetune when installed)
EXPERIMENTS = ROOT / "experiments"
TEMPLATES = ROOT / "sbatch_templates"
WORKLOADS = PIPELINE / "job"  # scripts that run inside the job, by path (the image lacks moetune)
TRIAL_BANK = ROOT / "benchmarks" / "trial_bank"  # in a checkout only: the demo's recorded trials
SHIPPED_RULES = PIPELINE / "decide" / "rules.yaml"  # the fixes the tuner may try (settings: a team's own)


def trial_folder(runs_root, study_name: str, trial) -> Path:
    """A trial's files: the folder its render stage recorded, else <runs_root>/<study>/<trial id>/
    (a caller without a runs folder of its own passes settings.runs())."""
    if getattr(trial, "folder", None):
        return Path(trial.folder)
    return (Path(runs_root) / study_name / str(trial.id)).resolve()
