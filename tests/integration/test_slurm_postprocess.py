"""Post-processing as Slurm jobs, on the real Slurm of scripts/slurm-up and
nsys 2022.4: a tuner study of the CPU stand-in whose trials each profile two ranks. After each
trial's job, a CPU job of its own (`--dependency=afterany:<trial job>`, one task per profiled
rank, as an array) exports the reports and writes each rank's summary beside it; the tuner process reads only
those summaries. That it opened no SQLite and no report, and ran no nsys, is watched by a
Python audit hook in this process (the tuner runs in it)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moetune import analysis
from moetune.experiment.schema import cluster_section
from moetune.job import postprocess
from moetune.store import Store
from moetune.trial import stages
from moetune.tune import loop as tuner
from tests.conftest import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.nsys]

WATCH = {"on": False, "seen": []}
HEAVY = (".sqlite", ".nsys-rep", ".qdstrm")


def _hook(event, args):
    if not WATCH["on"]:
        return
    if event in ("open", "sqlite3.connect") and args and isinstance(args[0], (str, Path)):
        name = Path(str(args[0])).name  # sqlite3 may get a URI: file:.../trace_0.sqlite?mode=ro
        if name.startswith("trace_") and any(h in name for h in HEAVY):
            WATCH["seen"].append((event, str(args[0])))
    elif event == "subprocess.Popen" and any("nsys" in str(a) or "QdstrmImporter" in str(a)
                                             for a in (args[1] or [])):
        WATCH["seen"].append((event, " ".join(map(str, args[1]))))


sys.addaudithook(_hook)


def experiment(tmp_path, **postprocess) -> str:
    exp = yaml.safe_load((REPO / "experiments" / "moe_proxy.yaml").read_text())
    exp["name"] = "postprocess_as_jobs"
    exp["cluster"] = {"name": "cpu-2node", "template": "venv", "workload": "cpu_stand_in",
                      "nodes": 2, "gpus_per_node": 1, "ntasks_per_node": 1, "cpus_per_task": 1,
                      "mem": "500M", "gpu_type": "H100", "time_limit": "00:05:00",
                      "python": sys.executable, "has_transformer_engine": False,
                      "profile_ranks": [0, 1], "stand_in": {"ms_per_iter": 40, "busy": 0.2},
                      "postprocess": {"time_limit": "00:10:00", "mem": "1G", **postprocess}}
    exp["tuning"] = {"budget_trials": 2, "patience": 3, "hang_timeout_s": 300, "allow_token_drop": True}
    exp["baseline"] = dict(exp["baseline"], train_iters=12, profile_step_start=4, profile_step_end=8)
    path = tmp_path / "postprocess_as_jobs.yaml"
    path.write_text(yaml.safe_dump(exp))
    return str(path)


def sacct(job_id: str, fields: str) -> list[str]:
    return subprocess.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", fields], capture_output=True,
                          text=True, check=True).stdout.strip().split("|")


def test_trials_are_post_processed_by_dependent_jobs_and_the_tuner_reads_no_sqlite(slurm, nsys_bin, tmp_path):
    """Each trial's traces are exported and summarised by a dependent Slurm array job, one element a
    profiled rank after the trial ends; the tuner opens no SQLite and runs no nsys itself."""
    runs, store = tmp_path / "runs", Store(str(tmp_path / "db.sqlite"))
    WATCH.update(on=True, seen=[])
    try:
        s = tuner.tune(experiment(tmp_path), store, executor="slurm", runs_root=runs, progress=False)
    finally:
        WATCH["on"] = False
    assert WATCH["seen"] == []  # no report, no SQLite opened and no nsys run by the tuner process
    trials = store.trials(store.study(s["study"]).id)
    assert len(trials) == 2 and trials[0].state == "completed"
    for tr in trials:
        folder = Path(tr.folder)
        post = json.loads((folder / "postprocess.json").read_text())
        assert post["for_job"] == tr.job_id and post["ranks"] == [0, 1]
        state, submit_line = sacct(post["job_id"], "State,SubmitLine")[:2]
        assert state == "COMPLETED", [p.read_text() for p in folder.glob("postprocess_*.out")]
        assert f"--dependency=afterany:{tr.job_id}" in submit_line and "--array=0-1" in submit_line
        # one array element per profiled rank, each run after the trial's job had ended
        rows = subprocess.run(["sacct", "-X", "-n", "-P", "-j", post["job_id"], "-o", "JobID,State,Start"],
                              capture_output=True, text=True, check=True).stdout.split()
        elements = [r.split("|") for r in rows]
        assert sorted(e[0] for e in elements) == [f"{post['job_id']}_0", f"{post['job_id']}_1"]
        assert all(e[1] == "COMPLETED" and e[2] >= sacct(tr.job_id, "End")[0] for e in elements)
        result = json.loads((folder / "analysis.json").read_text())
        assert [Path(p).name for p in result.get("summaries", [])] == \
            ["trace_0.metrics.json", "trace_1.metrics.json"], result.get("warnings")
        for r in (0, 1):
            summary = json.loads((folder / f"trace_{r}.metrics.json").read_text())
            assert summary["for_job"] == tr.job_id and summary["ranks"][0]["metrics"]["steps"] > 0
        # the combined summaries are the whole analysis of the exported SQLite, read here now
        here = analysis.analyze([str(folder / "trace_0.sqlite"), str(folder / "trace_1.sqlite")],
                                log=str(folder / "log.txt"))
        # (beside the analysis, the stage keeps what the export said of NVIDIA's recipes)
        strip = lambda d: json.loads(json.dumps({k: v for k, v in d.items() if k not in ("summaries", "recipes")},
                                                sort_keys=True, default=str))
        assert strip(result) == strip(here)

    # by hand, through the CLI: `moetune stage export --trial N` again as a job, then
    # `moetune stage analyze --trial N --local` in this process from the SQLite
    tr = trials[0]
    before = json.loads((Path(tr.folder) / "postprocess.json").read_text())["job_id"]
    first = json.loads((Path(tr.folder) / "analysis.json").read_text())
    cli = [sys.executable, "-m", "moetune.cli.main", "--db", str(tmp_path / "db.sqlite"), "stage"]
    r = subprocess.run(cli + ["export", "--trial", str(tr.id), "--force"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    again = json.loads((Path(tr.folder) / "postprocess.json").read_text())["job_id"]
    assert again != before and postprocess.state(again, 2) == "COMPLETED"
    assert "trace_0.metrics.json" in r.stdout
    r = subprocess.run(cli + ["analyze", "--trial", str(tr.id), "--force", "--local"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    local = json.loads((Path(tr.folder) / "analysis.json").read_text())
    assert "summaries" not in local  # read from the SQLite here
    assert strip(local) == strip(first)  # the same analysis as the tuner's, from the summaries


def test_postprocess_where_login_runs_in_the_tuner(slurm, nsys_bin, tmp_path):
    """cluster.postprocess.where: login keeps export and analysis in the tuner's process."""
    runs, store = tmp_path / "runs", Store(str(tmp_path / "db.sqlite"))
    exp = experiment(tmp_path, where="login")
    data = yaml.safe_load(Path(exp).read_text())
    data["tuning"]["budget_trials"] = 1
    Path(exp).write_text(yaml.safe_dump(data))
    WATCH.update(on=True, seen=[])
    try:
        s = tuner.tune(exp, store, executor="slurm", runs_root=runs, progress=False)
    finally:
        WATCH["on"] = False
    # the hook sees what the first test says did not happen: the SQLite read here (the job exported
    # it with its own nsys; this process may still ask nsys its version and recipes, once per process)
    seen = {e for e, _ in WATCH["seen"]}
    assert {"sqlite3.connect", "open"} <= seen <= {"subprocess.Popen", "sqlite3.connect", "open"}
    tr = store.trials(store.study(s["study"]).id)[0]
    assert tr.state == "completed"
    folder = Path(tr.folder)
    assert not (folder / "postprocess.json").exists() and not list(folder.glob("*.metrics.json"))
    assert "summaries" not in json.loads((folder / "analysis.json").read_text())


def test_post_processing_job_under_a_hostile_folder_name(slurm, tmp_path):
    """Every word reaching sbatch and the job's shell is quoted: a folder named with spaces, $(),
    backquotes, quotes, ; and % runs the job there, and nothing else runs."""
    import lzma
    evil = "a b $(touch pwned) `touch pwned` 'q\" ;x %j"
    folder = tmp_path / f"trial {evil}"
    folder.mkdir()
    (folder / "trace_0.sqlite").write_bytes(lzma.decompress(
        (REPO / "tests" / "data" / "gpu" / "skew.sqlite.xz").read_bytes()))
    trial_job = subprocess.run(["sbatch", "--parsable", "--time=1", "--mem=50M", "--wrap", "true",
                                f"--output={tmp_path}/trial.out"], capture_output=True, text=True,
                               check=True).stdout.strip()
    post = postprocess.submit(folder, [0], cluster_section({"name": "c", "postprocess": {"mem": "1G"}}),
                              after=trial_job, name="moetune.hostile.post")
    assert postprocess.wait(post, 1, timeout_s=120) == "COMPLETED", list(folder.iterdir())
    written = json.loads((folder / "trace_0.metrics.json").read_text())
    assert written["for_job"] == trial_job and written["source"] == str(folder / "trace_0.sqlite")
    assert "rank 0: trace_0.sqlite, trace_0.metrics.json in" in (folder / "postprocess_0.out").read_text()
    assert not [p for p in [tmp_path, REPO, Path.cwd(), Path("/tmp")] if (p / "pwned").exists()] + \
        list(tmp_path.rglob("pwned"))
