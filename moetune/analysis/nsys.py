"""Where Nsight Systems' tools are: the one lookup every part of moetune uses.

`nsys` is $MOETUNE_NSYS, else the `nsys` on PATH. Its QdstrmImporter (which turns a raw .qdstrm
into a .nsys-rep when nsys could not run it inside the job) is $MOETUNE_QDSTRM_IMPORTER, else the
host tools beside that nsys (Debian: /usr/lib/nsight-systems/host-linux-x64)."""
from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

from moetune.analysis import settings
from moetune.analysis.errors import TraceError


def nsys_binary() -> str:
    found = settings.nsys() or shutil.which("nsys")
    if not found:
        raise TraceError("nsys not found: install Nsight Systems (scripts/nsys-up) or set MOETUNE_NSYS")
    return found


def qdstrm_importer() -> str | None:
    candidates = [settings.qdstrm_importer()]
    real = Path(os.path.realpath(nsys_binary()))
    candidates += [str(real.parent.parent / "host-linux-x64" / "QdstrmImporter"),
                   "/usr/lib/nsight-systems/host-linux-x64/QdstrmImporter"]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@cache
def has_recipes(nsys: str) -> bool:
    """Whether this nsys runs `nsys recipe` (Nsight Systems 2023.x and later; Debian's 2022.4 does not)."""
    try:
        r = subprocess.run([nsys, "recipe", "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = (r.stdout + r.stderr).lower()
    return r.returncode == 0 and "unknown command" not in text and "recipe" in text


@cache  # asked once per report otherwise
def version(nsys: str) -> str:
    try:
        r = subprocess.run([nsys, "--version"], capture_output=True, text=True, timeout=60)
        return (r.stdout.strip().splitlines() or ["nsys"])[-1]
    except (OSError, subprocess.TimeoutExpired):
        return "nsys"
