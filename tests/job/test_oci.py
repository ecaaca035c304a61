"""job/oci.py and template "oci": trials of the CPU stand-in inside a real OCI container, through the real Slurm: template "oci"
(Slurm's own `srun --container`, Debian's runc, the image of scripts/oci-bundle with only what
the job needs, read-only). What a cluster's container breaks breaks here too: a variable not
passed in, a folder not mounted, a path only the host has, a write into the image. pyxis cannot
run here; the `srun` line of template "container" is checked against pyxis's own option table."""
from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from moetune.job import oci, render
from moetune.job import scheduler as jobs
from moetune.trial import stages
from tests.conftest import REPO, stand_in_cluster

pytestmark = pytest.mark.e2e  # trials in real OCI containers: make test runs them, make unit leaves them out

BUNDLE = os.environ.get("MOETUNE_OCI_BUNDLE", "/var/lib/moetune-oci/standin")
NVTX_LIB = "/usr/local/lib/libnvToolsExt.so"  # inside the image (scripts/oci-bundle)


@pytest.fixture(scope="module")
def image(slurm, nsys_bin):
    """The stand-in's OCI image (scripts/oci-bundle: ~1 s when up to date); runc and oci.conf
    come with scripts/slurm-up."""
    r = subprocess.run(["bash", str(REPO / "scripts/oci-bundle"), BUNDLE], capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, f"scripts/oci-bundle failed:\n{r.stdout}\n{r.stderr}"
    return BUNDLE


def oci_cluster(tmp_path, **overrides) -> dict:
    """Two nodes, one rank each (Slurm 22.05 runs one container task per node), both profiled;
    the workdir a folder of its own, so the workload folder is seen only through its own mount."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    c = dict(name="test-oci", template="oci", container_bundle=BUNDLE, python="python3", nodes=2,
             ntasks_per_node=1, profile_ranks=[0, 1], workdir=str(work), env={"MOETUNE_NVTX_LIB": NVTX_LIB})
    return stand_in_cluster(**{**c, **overrides})


def run_trial(make_trial, cluster, study, edit=None):
    """render, then `edit` the rendered job.sh (a template's slip), submit, collect."""
    store, tid = make_trial(cluster=cluster, study=study)
    stages.run_stage(store, tid, "render")
    job_sh = Path(store.trial(tid).folder) / "job.sh"
    if edit:
        before = job_sh.read_text()
        job_sh.write_text(edit(before))
        assert job_sh.read_text() != before, "the edit changed nothing"
    stages.run_stage(store, tid, "submit")
    stages.run_stage(store, tid, "collect", poll_s=1, timeout_s=300)
    return store, tid


def failed_with(store, tid, pattern: str) -> str:
    tr = store.trial(tid)
    assert jobs.slurm_state(tr.job_id).state == "FAILED"
    assert tr.state != "completed"
    log = (Path(tr.folder) / "log.txt").read_text(errors="replace")
    assert re.search(pattern, log), log[-3000:]
    return log


def test_container_trial_completes_with_traces_in_the_trial_folder(image, make_trial, tmp_path):
    """A 2-node trial inside the container ends COMPLETED; each rank's rendezvous, its report
    (nsys inside the image) and the log land in the trial folder through its mount, and the
    analysis reads them. The ranks saw only the environment passed by name."""
    store, tid = run_trial(make_trial, oci_cluster(tmp_path), "oci")
    stages.run_stages(store, tid, through="analyze", poll_s=1, timeout_s=300)
    tr = store.trial(tid)
    folder = Path(tr.folder)
    assert jobs.slurm_state(tr.job_id).state == "COMPLETED" and tr.state == "completed"
    seen = {r: json.loads((folder / f"rank_{r}.json").read_text()) for r in (0, 1)}
    for r, s in seen.items():
        assert (s["rank"], s["world_size"]) == (r, 2) and s["profiled"]
        assert [m["rank"] for m in s["met"]] == [0, 1]
    # Slurm 22.05 hands the container the step's environment, not the task's: SLURMD_NODENAME
    # is the batch shell's, wrong on the second node (the rank comes from srun --multi-prog)
    assert seen[1]["hostname"] != seen[0]["hostname"] and seen[1]["slurm_node"] == seen[0]["hostname"]
    assert sorted(p.name for p in folder.glob("trace_*.nsys-rep")) == ["trace_0.nsys-rep", "trace_1.nsys-rep"]
    for r in (0, 1):
        with sqlite3.connect(folder / f"trace_{r}.sqlite") as db:
            n = db.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE 'iteration %'").fetchone()[0]
        assert n == 8, f"rank {r}"
    assert "iteration        8/       8" in (folder / "log.txt").read_text()
    analysis = json.loads((folder / "analysis.json").read_text())
    assert sorted(analysis["metrics"]["per_rank"], key=int) == ["0", "1"]
    # the container's environment is the names the job passes, no more
    config = json.loads((folder / "bundle" / "config.json").read_text())
    assert config["root"] == {"path": "rootfs", "readonly": True}
    job_sh = (folder / "job.sh").read_text()
    exported = re.search(r"--export=(\S+)", job_sh).group(1).split(",")
    assert {"MOETUNE_NVTX_LIB", "MASTER_ADDR", "MASTER_PORT"} <= set(exported)


def test_container_without_master_addr_passed_fails(image, make_trial, tmp_path):
    """MASTER_ADDR left out of the names passed in: the ranks cannot meet, the trial fails and
    the log says why (as torch's env:// rendezvous would)."""
    store, tid = run_trial(make_trial, oci_cluster(tmp_path), "oci-env",
                           edit=lambda s: s.replace(",MASTER_ADDR,", ","))
    failed_with(store, tid, r"MASTER_ADDR/MASTER_PORT not set \(None, '\d+'\)")


def test_container_without_the_workload_mount_fails(image, make_trial, tmp_path):
    """The workload folder not mounted: the workload's path does not exist inside."""
    workload = str(render.WORKLOAD_DIR)

    def unmount(text: str) -> str:
        entry = json.dumps(oci._bind(workload, workload, "ro"), separators=(",", ":"))
        return text.replace("," + entry, "")

    store, tid = run_trial(make_trial, oci_cluster(tmp_path), "oci-mount", edit=unmount)
    failed_with(store, tid, r"can't open file '" + re.escape(workload) + r"/cpu_workload.py'")


def test_container_with_a_host_only_python_fails(image, make_trial, tmp_path):
    """The job's python a login venv's (a path only the host has): not found inside."""
    venv = tmp_path / "login-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    store, tid = run_trial(make_trial, oci_cluster(tmp_path, python=python), "oci-host-path")
    failed_with(store, tid, "No such file or directory: " + re.escape(python))


def test_container_write_into_the_image_fails(image, make_trial, tmp_path):
    """A rank that writes beside the image's files (its HOME, /root) and not into a mount: the
    root is read-only."""
    store, tid = run_trial(make_trial, oci_cluster(tmp_path, profile_ranks=[]), "oci-ro",
                           edit=lambda s: s.replace('export MOETUNE_TRIAL_DIR="$FOLDER"',
                                                    "export MOETUNE_TRIAL_DIR=/root"))
    failed_with(store, tid, r"Read-only file system: '/root/rank_\d\.json")


# pyxis's srun options (NVIDIA/pyxis args.c, its spank_opts table): name -> takes a value
PYXIS_OPTIONS = {
    "container-image": True, "container-mounts": True, "container-workdir": True,
    "container-name": True, "container-save": True, "container-mount-home": False,
    "no-container-mount-home": False, "container-remap-root": False,
    "no-container-remap-root": False, "container-entrypoint": False,
    "no-container-entrypoint": False, "container-entrypoint-log": False,
    "container-writable": False, "container-readonly": False, "container-env": True,
}


def container_flags(job_sh: str) -> list[str]:
    """The --container-* words of the srun command of a rendered job.sh."""
    srun = re.search(r"^srun .*?(?<!\\)\n(?!\s)", job_sh + "\n", re.S | re.M).group(0)
    words = shlex.split(srun.replace("\\\n", " "))
    return [w for w in words if re.match(r"--(no-)?container", w)]


def check_pyxis_flags(flags: list[str]) -> None:
    for flag in flags:
        name, eq, value = flag[2:].partition("=")
        assert name in PYXIS_OPTIONS, f"{flag}: not an option of pyxis"
        assert bool(eq) == PYXIS_OPTIONS[name], f"{flag}: pyxis's {name} " + \
            ("takes a value" if PYXIS_OPTIONS[name] else "takes no value")
        if name == "container-mounts":  # SRC:DST[:FLAGS], FLAGS joined by +
            for m in value.split(","):
                assert re.fullmatch(r"[^:,]+:[^:,]+(:[a-z+]+)?", m), f"{m}: not SRC:DST[:FLAGS]"
        if name == "container-env":
            assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) for n in value.split(",")), value


def test_container_template_srun_uses_only_pyxis_options(tmp_path):
    """Template "container"'s srun line names only options pyxis has, each with a value where
    pyxis takes one: a typo'd --container-* flag fails here, not on the cluster."""
    cluster = {"template": "container", "container_image": "nvcr.io/nvidia/pytorch:25.01-py3",
               "container_mounts": ["/lustre/data:/data:ro"], "gpus_per_node": 4,
               "env": {"NCCL_DEBUG": "WARN"}}
    spec = render.job_spec(name="t", folder=tmp_path / "trial", config={}, argv=[], cluster=cluster)
    flags = container_flags(render.render_job(spec)["job.sh"])
    assert any(f.startswith("--container-image=") for f in flags)
    check_pyxis_flags(flags)
    with pytest.raises(AssertionError, match="not an option of pyxis"):
        check_pyxis_flags(["--container-mount=/a:/a"])
    with pytest.raises(AssertionError, match="takes no value"):
        check_pyxis_flags(["--container-writable=yes"])
