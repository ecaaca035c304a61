"""moetune/workloads/postprocess.py, the post-processing job's body, with the job's own export: a
profiled rank's report is exported to SQLite inside the job by the nsys that recorded it (its version written beside it), the
post-processing reads that export instead of exporting again, and a report recorded by a newer
nsys than the one at hand is refused in one line instead of being opened (an older nsys cannot
read a newer report)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from moetune.job import render
from moetune.job.paths import TrialPaths
from moetune.workloads import postprocess
from tests.conftest import stand_in_cluster


def test_the_job_exports_each_profiled_rank_with_its_own_nsys(nsys_bin, tmp_path):
    """A real run of the CPU stand-in under Debian's nsys, launched by the rendered job.sh (no
    Slurm): the rank's SQLite and the recording nsys's version are in the trial folder when the job
    ends, and the post-processing picks that SQLite."""
    cluster = stand_in_cluster(nsys=nsys_bin, profile_ranks=[0], python=sys.executable,
                               stand_in={"ms_per_iter": 5})
    spec = render.job_spec(name="export", folder=tmp_path / "trial", config={},
                           argv=["--train-iters", "4"], cluster=cluster, launcher="local")
    render.write_job(spec)
    r = subprocess.run(["bash", f"{spec.folder}/job.sh"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    folder = Path(spec.folder)
    sqlite, rep = folder / "trace_0.sqlite", folder / "trace_0.nsys-rep"
    assert rep.exists() and sqlite.exists(), sorted(p.name for p in folder.iterdir())
    recorded = TrialPaths(folder).nsys_version(0).read_text()
    assert postprocess.nsys_release(recorded)[:2] == (2022, 4), recorded
    assert postprocess.rank_report(folder, 0) == sqlite
    written = postprocess.process_report(folder, 0, for_job="1")
    assert written[0] == sqlite and written[1].name == "trace_0.metrics.json"


def test_a_report_from_a_newer_nsys_is_refused_in_one_line(nsys_bin, tmp_path):
    """The version file names a newer nsys than this one: no export is tried, the line says which
    versions and what to do."""
    rep = tmp_path / "trace_3.nsys-rep"
    rep.write_bytes(b"not opened")
    TrialPaths(tmp_path).nsys_version(3).write_text(
        "NVIDIA Nsight Systems version 2025.3.2.474-253236389321v0\n")
    with pytest.raises(postprocess.PostprocessError) as e:
        postprocess.export(rep)
    line = str(e.value)
    assert "\n" not in line and "2025.3.2" in line and "2022.4" in line and "export in the job" in line
    assert not (tmp_path / "trace_3.sqlite").exists()


def test_an_older_recording_nsys_is_read_here(nsys_bin, tmp_path):
    """A report recorded by an older (or the same) nsys passes the check; only newer is refused."""
    rep = tmp_path / "trace_1.nsys-rep"
    rep.write_bytes(b"x")
    TrialPaths(tmp_path).nsys_version(1).write_text("NVIDIA Nsight Systems version 2021.5.1.77\n")
    postprocess.check_recorder(rep, nsys_bin)  # no error


@pytest.mark.parametrize("text, release", [
    ("NVIDIA Nsight Systems version 2025.3.2.474-253236389321v0", (2025, 3, 2, 474)),
    ("NVIDIA Nsight Systems version 2022.4.2.1-df9881f", (2022, 4, 2, 1)),
    ("nsys: command not found", ()),
])
def test_release_numbers(text, release):
    """nsys's release number is read from each form of its version text."""
    assert postprocess.nsys_release(text) == release


def test_the_bodys_file_names_are_the_trial_folders(tmp_path):
    """The body reads moetune.analysis only, so it spells a rank's file names itself: each equals
    job/paths.py TrialPaths' name, and the rank reads back from it."""
    paths = TrialPaths(tmp_path)
    for suffix, name_of in ((".nsys-rep", paths.report), (".qdstrm", paths.qdstrm), (".sqlite", paths.sqlite),
                            (".nsys-version", paths.nsys_version), (".recipes.json", paths.recipes)):
        assert postprocess.rank_file(tmp_path, 7, suffix) == name_of(7)
        assert postprocess.rank_of(name_of(12)) == "12"


def test_the_body_runs_by_its_path_and_picks_its_rank_by_the_array_index(tmp_path):
    """The job runs the file by its path (no `-m`): array element 1 of ranks 0,3 does rank 3, which
    wrote no report, and says so; an index past the ranks does nothing."""
    body = Path(postprocess.__file__)
    r = subprocess.run([sys.executable, str(body), str(tmp_path), "--ranks", "0,3", "--task", "1",
                        "--for-job", "9"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("rank 3: no report"), r.stderr[-2000:]
    r = subprocess.run([sys.executable, str(body), str(tmp_path), "--ranks", "0", "--task", "4"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "", r.stderr[-2000:]
