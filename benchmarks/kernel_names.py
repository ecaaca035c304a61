"""Every kernel name the recorded traces hold, with its class: tests/data/kernel_classes.tsv.

Reads each Nsight Systems SQLite trace in the checkout (the trial bank, the device tuning run, the
test data) through the analysis loader, so the names are the ones the analysis classifies (qualified
by their namespace), and the kernel names of the NVIDIA recipes' outputs kept beside the one-GPU runs
(benchmarks/one_gpu_tuning, benchmarks/near_capacity: their traces were not kept, the recipes' short
names were). The table is written with today's classes; review it by eye, then
tests/analysis/test_kernels.py holds moetune/analysis/kernels.py to it.

    python benchmarks/kernel_names.py            # rewrite the table (minutes: ~50 traces)
    python benchmarks/kernel_names.py --names-only  # classify the names already in the table again
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "tests" / "data" / "kernel_classes.tsv"
TRACE_GLOBS = ("benchmarks/**/*.sqlite.xz", "tests/data/**/*.sqlite.xz")
RECIPE_GLOBS = ("benchmarks/**/trace_*.recipes.json",)
HEADER = "# kernel name\tclass\twhere it was seen (first file)\n"


def trace_names(path: Path) -> set[str]:
    from moetune.analysis.load import open_trace
    return {str(n) for n in open_trace(path).kernels["name"].unique()}


def recipe_names(path: Path) -> set[str]:
    return {k["name"] for k in json.loads(path.read_text()).get("kernels") or []}


def read_table(path: Path = TABLE) -> dict[str, tuple[str, str]]:
    """{name: (class, where)} of the table."""
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, cls, where = line.split("\t")
        out[name] = (cls, where)
    return out


def write_table(rows: dict[str, str], path: Path = TABLE) -> None:
    from moetune.analysis.kernels import classify_name
    lines = [f"{n}\t{classify_name(n)}\t{w}\n" for n, w in sorted(rows.items())]
    path.write_text(HEADER + "".join(lines))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--names-only", action="store_true", help="keep the table's names, classify again")
    args = p.parse_args(argv)
    if args.names_only:
        write_table({n: w for n, (_, w) in read_table().items()})
        return 0
    seen: dict[str, str] = {}
    for pattern, read in [(g, trace_names) for g in TRACE_GLOBS] + [(g, recipe_names) for g in RECIPE_GLOBS]:
        for path in sorted(REPO.glob(pattern)):
            rel = str(path.relative_to(REPO))
            names = read(path)
            print(f"{rel}: {len(names)} names", file=sys.stderr, flush=True)
            for n in names:
                seen.setdefault(n, rel)
    write_table(seen)
    print(f"{len(seen)} names -> {TABLE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
