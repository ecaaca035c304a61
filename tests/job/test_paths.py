"""moetune/job/paths.py TrialPaths owns every file name in a trial folder: no other module of the
pipeline or the analysis, and no job template outside its comments, spells one of those names
where it could make a path of it (two have their home in the analysis, which TrialPaths reuses;
prose may name a file to its reader); and a real local trial, fitted,
profiled by the real nsys and run through every stage, leaves a folder whose every entry is a name
TrialPaths lists, holding each file the stages say they write."""
from __future__ import annotations

import ast
import fnmatch
import re
import sys
from pathlib import Path

from moetune.analysis.ranks import REPORT_PREFIX
from moetune.job.paths import TrialPaths
from moetune.trial import stages
from tests.conftest import REPO, stand_in_cluster

HOME = REPO / "moetune" / "job" / "paths.py"
# where the analysis keeps the two names it reads back itself (a report's rank, its summary)
ANALYSIS_HOMES = {"trace_": REPO / "moetune" / "analysis" / "ranks.py", ".metrics.json": REPO / "moetune" / "analysis" / "summary.py"}
# a name spelled elsewhere for a reason of its own: the OCI runtime's config.json inside the bundle
# (not the trial's), the CPU stand-in's rank file (the workload runs without moetune), and the
# post-processing job's body's per-rank names (it reads the analysis only; tests/workloads holds
# them equal to TrialPaths')
ELSEWHERE = {("config.json", "oci.py"), ("config.json", "oci.sh.j2"), ("rank_", "cpu_workload.py"),
             (".nsys-version", "postprocess.py"), (".recipes.json", "postprocess.py")}


# file types used everywhere, and the part every rank-numbered name shares: not names of a trial's own
GENERIC = {".txt", ".json", ".sqlite", ".nsys-rep", ".qdstrm", ".out", "rank_"}


def spelled_names() -> set[str]:
    """What would give a trial file's name away in source: each single name with a dot, and each
    part of a per-rank name but the rank that is not a mere file type."""
    out = set()
    for name in TrialPaths("/t").names():
        parts = name.split("*") if "*" in name else [name] if "." in name else []
        out |= {p for p in parts if p not in GENERIC}
    return out


def strings(path: Path) -> list[str]:
    """Every string constant of a module but its docstrings (comments are not in the tree)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_each_file_name_is_spelled_in_one_place():
    names = spelled_names()
    assert {"job.json", "log.txt", "trace_", "log_rank_", ".recipes.json", ".nsys-version",
            "analysis.json", "decision.json", "fit.json", "one_gpu_rank.json"} <= names
    # a name, not the start of a longer word (trace_files is a function)
    spelled = {name: re.compile(re.escape(name) + r"(?![A-Za-z])") for name in names}
    found = []
    for path in sorted((REPO / "moetune").rglob("*.py")):
        if path == HOME:
            continue
        for text in strings(path):
            if not re.search(r"\s", text):  # prose (a message, a help line) may name a file to its reader
                found += [(name, path) for name, at in spelled.items() if at.search(text)]
    for path in sorted((REPO / "sbatch_templates").glob("*.j2")):
        code = [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith(("#", "{#"))]
        found += [(name, path) for ln in code for name, at in spelled.items() if at.search(ln)]
    stray = sorted({(name, str(path.relative_to(REPO))) for name, path in found
                    if ANALYSIS_HOMES.get(name) != path and (name, path.name) not in ELSEWHERE})
    assert stray == []
    assert REPORT_PREFIX == "trace_" and TrialPaths("/t").trace(3).name == "trace_3"


def test_per_rank_names_split_where_the_shell_puts_the_rank():
    p = TrialPaths("/runs/a b/7")
    assert TrialPaths.around_rank(p.rank_log) == ("/runs/a b/7/log_rank_", ".txt")
    assert p.metrics(2).name == "trace_2.metrics.json" and TrialPaths.rank_of(p.recipes(12)) == "12"
    assert p.each(p.sqlite) == []  # a glob of a folder that is not there: nothing


def test_a_real_local_trial_leaves_only_the_names_trial_paths_lists(make_trial, nsys_bin):
    """The CPU stand-in profiled by Debian's nsys on submitit's local executor: fit, then every
    stage through decide. Every entry of the folder and of its fit/ matches a TrialPaths name, and
    the files each stage writes are where TrialPaths says."""
    store, tid = make_trial(cluster=stand_in_cluster(nsys=nsys_bin, profile_ranks=[0],
                                                     python=sys.executable, gpu_type="H100",
                                                     stand_in={"ms_per_iter": 5}),
                            executor="local")
    stages.run_stage(store, tid, stages.FIT, poll_s=0.3)
    stages.run_stages(store, tid, through="decide", poll_s=0.3, timeout_s=300)
    paths = TrialPaths(store.trial(tid).folder)
    listed = paths.names()
    for folder in (paths.folder, paths.fit.folder):
        unlisted = [p.name for p in folder.iterdir() if not any(fnmatch.fnmatch(p.name, g) for g in listed)]
        assert unlisted == [], folder
    expected = [paths.sbatch, paths.job_script, paths.spec, paths.config, paths.command, paths.job,
                paths.submitit, paths.log, paths.state, paths.analysis, paths.decision,
                paths.report(0), paths.sqlite(0), paths.nsys_version(0), paths.recipes(0),
                paths.stand_in_rank(0), paths.fit.job_script, paths.fit.fit_result,
                paths.fit.rank_log(0), paths.fit.submitit]
    assert [p for p in expected if not p.exists()] == []


def test_an_attempt_is_what_one_submission_leaves(tmp_path):
    """What a forced re-submit sets aside under previous/<job id>/: the job's record, state, log,
    reports and what was made of them, submitit's folder and the post-processing's files; not the
    rendered job, its spec or the fit."""
    p = TrialPaths(tmp_path)
    made = [p.job, p.state, p.log, p.analysis, p.decision, p.report(0), p.sqlite(0), p.metrics(0),
            p.recipes(0), p.nsys_version(0), p.postprocess, p.postprocess_out(0)]
    kept = [p.sbatch, p.job_script, p.spec, p.config, p.command, p.rank_log(1)]
    for f in made + kept:
        f.write_text("x")
    p.submitit.mkdir()
    p.fit.folder.mkdir()
    assert p.attempt() == sorted(made + [p.submitit])
