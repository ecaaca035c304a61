"""Where moetune's own files are. In a checkout, experiments/ and sbatch_templates/ sit beside the
package folder; an installed wheel puts them in <prefix>/share/moetune/ (pyproject's data-files).
The trial bank the demo replays is data of a checkout (data/trial_bank), named by MOETUNE_BANK
elsewhere: a wheel ships none."""
from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent  # the checkout (or site-packages when installed)
_SHARE = Path(sys.prefix) / "share" / "moetune"
_HOME = ROOT if (ROOT / "experiments").is_dir() else _SHARE
EXPERIMENTS = _HOME / "experiments"
TEMPLATES = _HOME / "sbatch_templates"
WORKLOADS = PACKAGE / "workloads"  # programs that run inside the job, by path (the image lacks moetune)
TRIAL_BANK = ROOT / "data" / "trial_bank"  # in a checkout only: the demo's recorded trials
SHIPPED_RULES = PACKAGE / "decide" / "rules.yaml"  # the fixes the tuner may try (settings: a team's own)


def trial_folder(runs_root, study_name: str, trial) -> Path:
    """A trial's files: the folder its render stage recorded, else <runs_root>/<study>/<trial id>/
    (a caller without a runs folder of its own passes settings.runs())."""
    if getattr(trial, "folder", None):
        return Path(trial.folder)
    return (Path(runs_root) / study_name / str(trial.id)).resolve()


def write_whole(path, text: str, mode: int | None = None) -> None:
    """`text` into `path` whole or not at all: written beside it, then renamed over it, so that a
    process killed mid-write (a tuner, a node) leaves the earlier file or none, never half of one
    for a restart to read."""
    path = Path(path)
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_text(text)
    if mode is not None:
        part.chmod(mode)
    os.replace(part, path)
