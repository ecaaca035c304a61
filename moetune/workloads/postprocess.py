"""The post-processing job's body, run on a compute node by its path (job/postprocess.py submits
it, one array element a profiled rank): the rank's report is imported (QdstrmImporter, where a bare
.qdstrm came back), exported to SQLite (`nsys export`) and reduced to its per-rank summary
(analysis.summary.rank_summary), written beside the report as trace_R.metrics.json, with NVIDIA's
recipes beside moetune's figures (trace_R.recipes.json). The login node reads only those small files.

    python moetune/workloads/postprocess.py FOLDER --ranks 0,2 --task I --for-job ID
    process_report(folder, rank, for_job) -> [paths written]            (what one task does)

It runs in the Python that runs moetune (the login node's install, on a shared filesystem) and
reads only moetune.analysis: a trial folder's per-rank names are spelt here from the analysis's
report prefix, as job/paths.py TrialPaths spells them (a test holds the two equal).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from moetune.analysis import recipes
from moetune.analysis.errors import MoetuneError
from moetune.analysis.nsys import nsys_binary, qdstrm_importer
from moetune.analysis.nsys import version as nsys_version
from moetune.analysis.ranks import RANK_IN_NAME, REPORT_PREFIX
from moetune.analysis.summary import rank_summary, summary_path


class PostprocessError(MoetuneError):
    """The post-processing job could not be submitted or one rank's report could not be processed."""


def rank_file(folder: str | Path, rank: int | str, suffix: str) -> Path:
    """A profiled rank's file in the trial folder: trace_<rank><suffix> (TrialPaths' names)."""
    return Path(folder) / f"{REPORT_PREFIX}{rank}{suffix}"


def rank_of(path: Path) -> str:
    """The rank a per-rank report's file is named for."""
    m = RANK_IN_NAME.match(Path(path).name)
    if not m:
        raise ValueError(f"{path}: not a profiled rank's file ({REPORT_PREFIX}<rank>.*)")
    return m.group(1)


def _tool(cmd: list[str], what: str) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        raise PostprocessError(f"{what} did not finish in an hour") from None
    if r.returncode:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PostprocessError(f"{what} failed: {tail[0][:200]}")


def rank_report(folder: Path, rank: int | str) -> Path | None:
    """The rank's report to read: the SQLite the job exported where it is newer than the report
    (exported by the nsys that recorded it), else the report itself (exported again, fresh)."""
    found = [p if p.exists() else None for p in (rank_file(folder, rank, ".nsys-rep"),
                                                 rank_file(folder, rank, ".qdstrm"),
                                                 rank_file(folder, rank, ".sqlite"))]
    rep, sqlite = found[0] or found[1], found[2]
    if sqlite and (rep is None or sqlite.stat().st_mtime >= rep.stat().st_mtime):
        return sqlite
    return rep


def nsys_release(text: str) -> tuple[int, ...]:
    """'NVIDIA Nsight Systems version 2025.3.2.474-...' -> (2025, 3, 2, 474)."""
    m = re.search(r"(\d{4})\.(\d+)(?:\.(\d+))?(?:\.(\d+))?", text or "")
    return tuple(int(x) for x in m.groups() if x is not None) if m else ()


def check_recorder(report: Path, nsys: str) -> None:
    """An older nsys cannot open a newer report, and may write a corrupt export where it tries:
    refuse, in one line, a report recorded by a newer nsys than this one."""
    recorded = rank_file(report.parent, rank_of(report), ".nsys-version")
    if not recorded.exists():
        return
    theirs, ours = nsys_release(recorded.read_text(errors="replace")), nsys_release(nsys_version(nsys))
    if theirs and ours and theirs > ours:
        raise PostprocessError(
            f"{report.name} was recorded by nsys {'.'.join(map(str, theirs))}; this nsys ({nsys}) "
            f"is {'.'.join(map(str, ours))} and cannot open it: export in the job (nsys in the "
            "image, cluster.nsys) or set MOETUNE_NSYS to an nsys at least as new")


def export(report: Path) -> Path:
    """A rank's report (its .qdstrm, .nsys-rep or .sqlite) -> its SQLite export, beside it."""
    folder, rank = report.parent, rank_of(report)
    qdstrm, rep = rank_file(folder, rank, ".qdstrm"), rank_file(folder, rank, ".nsys-rep")
    if report in (qdstrm, rep):
        check_recorder(report, nsys_binary())
    if report == qdstrm:
        if not rep.exists():
            importer = qdstrm_importer()
            if not importer:
                raise PostprocessError(f"{report.name} needs nsys's QdstrmImporter; set MOETUNE_QDSTRM_IMPORTER")
            _tool([importer, "-i", str(report)], f"QdstrmImporter on {report.name}")
        report = rep
    if report == rep:
        sqlite = rank_file(folder, rank, ".sqlite")
        _tool([nsys_binary(), "export", "--type", "sqlite", "--force-overwrite", "true",
               "-o", str(sqlite), str(report)], f"nsys export of {report.name}")
        return sqlite
    return report


def _plain(o):  # numpy scalars as numbers, not strings
    return o.item() if hasattr(o, "item") else str(o)


def write_summary(sqlite: Path, for_job: str | None = None) -> Path:
    """The rank's summary (analysis.summary.rank_summary) beside its SQLite, for the job `for_job`."""
    summary = rank_summary(sqlite)
    summary["for_job"] = for_job
    out = summary_path(sqlite)
    tmp = out.with_name(out.name + ".tmp")
    # sorted keys: `for_job` comes first, read from the file's head (trial/traces.py _for_job)
    tmp.write_text(json.dumps(summary, sort_keys=True, separators=(",", ":"), default=_plain) + "\n")
    os.replace(tmp, out)  # the reader never sees half a file
    return out


def write_recipes(nsys: str, report: Path, sqlite: Path) -> Path:
    """<report>.recipes.json: NVIDIA's recipes beside moetune's figures of this report, or why not
    (analysis.recipes.check_report); small, so the login node reads it instead of the report."""
    path = rank_file(report.parent, rank_of(report), ".recipes.json")
    path.write_text(json.dumps(recipes.check_report(nsys, report, sqlite), indent=1, sort_keys=True) + "\n")
    return path


def process_report(folder: str | Path, rank: int, for_job: str | None = None) -> list[Path]:
    """What one task does: the rank's SQLite, its summary and its recipes ([] without a report)."""
    report = rank_report(Path(folder), rank)
    if report is None:
        return []  # the rank wrote no report (the job died before it); the reader says so
    sqlite = export(report)
    rep = rank_file(folder, rank, ".nsys-rep")
    checked = [write_recipes(nsys_binary(), rep, sqlite)] if rep.exists() else []
    return [sqlite, write_summary(sqlite, for_job), *checked]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="postprocess.py",
                                 description="export and summarise profiled ranks' reports")
    ap.add_argument("folder")
    ap.add_argument("--ranks", required=True, help="comma-separated profiled ranks")
    ap.add_argument("--for-job", default=None, help="the trial job whose reports these are")
    ap.add_argument("--task", type=int, default=None,
                    help="which of --ranks this task does (the job passes its array index; all without it)")
    a = ap.parse_args(argv)
    ranks = [int(r) for r in a.ranks.split(",") if r.strip()]
    task = a.task
    mine = [ranks[task]] if task is not None and task < len(ranks) else ([] if task is not None else ranks)
    t0 = time.monotonic()
    for rank in mine:
        try:
            written = process_report(a.folder, rank, a.for_job)
        except Exception as e:  # one line per failed rank, in postprocess.out
            print(f"rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return 1
        print(f"rank {rank}: {', '.join(p.name for p in written) or 'no report'} "
              f"in {time.monotonic() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
