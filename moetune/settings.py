"""Every environment variable the pipeline reads, named once with its default and what it sets.

Each is read when asked, never at import, so a variable set after moetune is imported still
counts (a command-line option, where there is one, wins over its variable). Unset or empty means
the default. The analysis keeps its own (nsys, the trace reader, the trace cache) in
moetune/analysis/settings.py, in the same form; `environ()` is the environment a child process gets.
The jobs' own environment is not here: experiment/environment.py renders it into the job script."""
from __future__ import annotations

import os
from pathlib import Path

from moetune.analysis.settings import Setting, table
from moetune.paths import ROOT, SHIPPED_RULES, TRIAL_BANK

SETTINGS = table(
    Setting("MOETUNE_DB", ".moetune/moetune.db", "the store: a SQLite path or any SQLAlchemy URL "
            "(--db wins)"),
    Setting("MOETUNE_RUNS", "runs", "the runs folder of a trial whose folder the store does not "
            "record (--runs wins)"),
    Setting("MOETUNE_RULES", str(SHIPPED_RULES), "the table of fixes the tuner may try; a team "
            "may keep its own"),
    Setting("MOETUNE_BANK", str(TRIAL_BANK), "the recorded GPU trials `moetune demo` replays "
            "(--bank wins); a checkout has one, an installed wheel none"),
    Setting("MEGATRON_VENV", str(ROOT / ".venv-megatron"), "the venv whose megatron-core checks "
            "an argv on the CPU (scripts/megatron-venv builds it)"),
    Setting("CUDA_VISIBLE_DEVICES", None, "the GPUs this process may use; a local job gets the "
            "first of them it needs"),
)


def db() -> str:
    return SETTINGS["MOETUNE_DB"].value()


def runs() -> Path:
    return Path(SETTINGS["MOETUNE_RUNS"].value())


def rules_file() -> Path:
    return Path(SETTINGS["MOETUNE_RULES"].value())


def bank() -> Path:
    return Path(SETTINGS["MOETUNE_BANK"].value())


def megatron_venv() -> Path:
    return Path(SETTINGS["MEGATRON_VENV"].value())


def visible_gpus() -> str | None:
    return SETTINGS["CUDA_VISIBLE_DEVICES"].read()


def environ(**changes: str) -> dict[str, str]:
    """This process's environment with `changes`: what a child process of moetune's gets."""
    return {**os.environ, **changes}
