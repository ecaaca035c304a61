"""The trace files of what a user names: files as given, folders expanded into their traces."""
from __future__ import annotations

import re
from pathlib import Path

from moetune.analysis.errors import TraceError

TRACE_SUFFIXES = (".sqlite", ".sqlite.xz", ".nsys-rep")


def _natural(path: Path) -> list:
    """trace_2 before trace_10."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", path.name)]


def trace_files(paths) -> list[Path]:
    """Expand directories into their trace files (one per rank or node); keep file order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted((f for f in p.iterdir() if f.name.endswith(TRACE_SUFFIXES)), key=_natural)
            # prefer a .sqlite over the .nsys-rep / .xz it was made from
            stems = {f.name.split(".")[0] for f in found if f.name.endswith(".sqlite")}
            found = [f for f in found if f.name.endswith(".sqlite") or f.name.split(".")[0] not in stems]
            if not found:
                raise TraceError(f"{p}: no trace files (*.sqlite, *.nsys-rep) in this directory")
            out += found
        else:
            out.append(p)
    return out
