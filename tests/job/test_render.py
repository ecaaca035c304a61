"""job/render.py, job scripts from sbatch_templates/: what each template holds, the nsys line, quoting, and bad
values refused in one line. Scripts are checked by bash itself (`bash -n`, and run locally)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from moetune.errors import MoetuneError
from moetune.job import render
from tests.conftest import stand_in_cluster

ARGV = ["--train-iters", "6", "--micro-batch-size", "2"]


def spec_of(tmp_path, cluster, config=None, launcher="srun", name="t1", node_cpus=None):
    """A trial's job spec; the venv template unless the cluster names one (the schema's default
    is the container template, which needs an image)."""
    return render.job_spec(name=name, folder=tmp_path / "trial", config=config or {}, argv=ARGV,
                           cluster={"template": "venv", **cluster}, launcher=launcher,
                           node_cpus=node_cpus)


def bash_parses(text: str) -> None:
    r = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_gpu_nsys_line_has_capture_range_and_per_rank_output(tmp_path):
    """A 2-node GPU job: the nsys line has the CUDA profiler capture range and graph-node tracing,
    one report per rank, only the ranks asked for profiled, and the sbatch header asks for the nodes
    and GPUs; the script parses in bash."""
    spec = spec_of(tmp_path, {"gpus_per_node": 8, "nodes": 2, "profile_ranks": [0, 8]})
    sh = render.render_job(spec)["job.sh"]
    bash_parses(sh)
    line = next(ln for ln in sh.splitlines() if "local profile=(" in ln)
    for part in ("-t cuda,nvtx", "-s none", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
                 "--cuda-graph-trace=node"):
        assert part in line
    assert "-o " + shlex.quote(f"{spec.folder}/trace_%q{{SLURM_PROCID}}") in sh
    assert "local profile_ranks='0 8'" in sh
    assert "srun --nodes=2 --ntasks=16 --ntasks-per-node=8" in sh
    assert "moetune/workloads/train_moe.py --train-iters 6" in " ".join(spec.command)
    sbatch = render.render_job(spec)["job.sbatch"]
    assert "#SBATCH --gpus-per-node=8" in sbatch and "#SBATCH --nodes=2" in sbatch


def test_cpu_stand_in_has_no_capture_range(tmp_path):
    """The CPU stand-in's job traces NVTX only, with no capture range, and runs the stand-in by its
    path."""
    spec = spec_of(tmp_path, stand_in_cluster())
    sh = render.render_job(spec)["job.sh"]
    assert "--capture-range" not in sh and "-t nvtx -s none" in sh
    assert "/moetune/workloads/cpu_workload.py\n" in sh
    assert "moetune/workloads/cpu_workload.py --train-iters 6" in " ".join(spec.command)
    assert " ".join(spec.command).endswith("--stand-in-ms-per-iter=40")


def test_container_template_uses_pyxis(tmp_path):
    """Template container gives pyxis the image and mounts the trial folder, workdir, workload
    folder and the cluster's own mounts, and sources no venv; template venv loads its modules and
    venv and names no image."""
    cluster = {"template": "container", "container_image": "nvcr.io/nvidia/pytorch:25.01-py3",
               "container_mounts": ["/lustre/data:/data"], "gpus_per_node": 4}
    spec = spec_of(tmp_path, cluster)
    sh = render.render_job(spec)["job.sh"]
    bash_parses(sh)
    assert "--container-image=nvcr.io/nvidia/pytorch:25.01-py3" in sh
    # the trial folder, where the job runs, and the workload scripts (they run by their path)
    assert (f"--container-mounts={spec.folder}:{spec.folder},{spec.workdir}:{spec.workdir},"
            f"{spec.workload_dir}:{spec.workload_dir},/lustre/data:/data") in sh
    assert spec.command[2].startswith(spec.workload_dir + "/")
    assert "source " not in sh  # no venv inside a container
    venv = render.render_job(spec_of(tmp_path, {"venv": "/opt/venv", "modules": ["cuda/12.8"]}))["job.sh"]
    assert "module load cuda/12.8" in venv and "source /opt/venv/bin/activate" in venv
    assert "--container-image" not in venv


def test_environment_follows_the_config(tmp_path):
    """The job exports the environment its config needs: 32 device connections under EP overlap, 1
    under sequence parallelism."""
    sh = render.render_job(spec_of(tmp_path, {}, config={"overlap_ep_a2a": True}))["job.sh"]
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=32" in sh
    sh = render.render_job(spec_of(tmp_path, {}, config={"sequence_parallel": True}))["job.sh"]
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in sh
    assert "export NCCL_NVLS_ENABLE=0" in sh


@pytest.mark.parametrize("cluster, message", [
    ({"template": "docker"}, r"cluster.template: 'docker' is not allowed; use one of 'container', 'venv' or 'oci'"),
    ({"template": "container"}, "cluster.container_image is required"),
    ({"workload": "gpu"}, "cluster.workload: 'gpu' is not allowed"),
    ({"cpus_per_task": 0}, "cluster.cpus_per_task: Input should be greater than 0"),
    ({"time_limit": "soon"}, "cluster.time_limit 'soon'"),
    ({"env": {"BAD NAME": "1"}}, "cluster.env: 'BAD NAME' is not a shell variable name"),
])
def test_bad_cluster_values_are_one_line(tmp_path, cluster, message):
    """Each bad cluster value is refused with a message naming its key and what is wrong."""
    with pytest.raises(MoetuneError, match=message):
        render.render_job(spec_of(tmp_path, cluster))


def test_newline_in_a_value_is_refused(tmp_path):
    """A value with a newline (a job name here) is refused before it reaches a script."""
    with pytest.raises(render.RenderError, match="newline"):
        render.render_job(spec_of(tmp_path, {}, name="x\nrm -rf /"))


@pytest.mark.parametrize("value, minutes", [(30, 30), ("00:20:00", 20), ("1:30", 2),
                                            ("1-00:00:00", 1440), ("45", 45)])
def test_time_limits(value, minutes):
    """Slurm's time-limit forms become whole minutes."""
    assert render.time_minutes(value) == minutes


def test_hostile_argv_reaches_the_program_unchanged(tmp_path):
    """The launch line passes every argument as one literal word (run by bash, no Slurm)."""
    hostile = ["a b", "$(touch pwned)", "`id`", "'q'\"", "*", "%q{X}"]
    cluster = stand_in_cluster(nsys="off", python=sys.executable)
    spec = render.job_spec(name="h", folder=tmp_path / "tr $(x)", config={},
                           argv=hostile, cluster=cluster, launcher="local")
    spec = spec.__class__(**{**spec.__dict__, "command": (sys.executable, "-c",
                          "import sys, json; print(json.dumps(sys.argv[1:]))", *hostile)})
    render.write_job(spec)
    r = subprocess.run(["bash", f"{spec.folder}/job.sh"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import json
    assert json.loads(r.stdout) == hostile
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()


@pytest.mark.nsys
def test_only_the_ranks_asked_for_are_profiled(tmp_path, nsys_bin):
    """Two local ranks under the real nsys, rank 1 alone profiled: one report, named by its rank."""
    cluster = stand_in_cluster(ntasks_per_node=2, profile_ranks=[1], stand_in={"ms_per_iter": 20})
    spec = spec_of(tmp_path, cluster, launcher="local")
    render.write_job(spec)
    r = subprocess.run(["bash", f"{spec.folder}/job.sh"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    made = sorted(p.name for p in Path(spec.folder).glob("trace_*"))
    assert made and all(n.startswith("trace_1.") for n in made), made
    assert shlex.quote(spec.folder) in (Path(spec.folder) / "job.sh").read_text()


FAKE_NSYS = """#!/bin/bash
# stands in for nsys 2022.4's failure to reach its daemon: fails the first time, then runs the program
here=$(dirname "$0")
case "$1" in  # the job asks the nsys that recorded for its version and exports with it
  --version) echo "NVIDIA Nsight Systems version 2022.4.2.1-stand-in"; exit 0 ;;
  export) exit 0 ;;
esac
if [ ! -e "$here/tried" ]; then
  touch "$here/tried"
  echo "[QuadDCommon::tag_message*] = Local Endpoint is not available." >&2
  exit STATUS
fi
while [ "$1" != "--force-overwrite=true" ]; do shift; done; shift
echo run >> "$here/runs"
exec "$@"
"""


@pytest.mark.parametrize("error, status, retried", [("Local Endpoint is not available.", 1, True),
                                                    ("Connection to the Agent lost", 0, True),
                                                    ("some other failure", 1, False)])
def test_nsys_that_cannot_reach_its_daemon_is_started_once_more(tmp_path, error, status, retried):
    """Seen in CI with nsys 2022.4: the profiler fails before the program runs, once even with exit
    status 0 ("Connection to the Agent lost"). Where it left no report, the job starts it once more;
    any other failure of a profiled rank is the job's result. (A script stands in for nsys: its
    failures cannot be called up at will.)"""
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(FAKE_NSYS.replace("Local Endpoint is not available.", error).replace("STATUS", str(status)))
    fake.chmod(0o755)
    cluster = stand_in_cluster(nsys=str(fake), profile_ranks=[0], stand_in={"ms_per_iter": 5},
                               python=sys.executable)
    spec = spec_of(tmp_path, cluster, launcher="local")
    render.write_job(spec)
    r = subprocess.run(["bash", f"{spec.folder}/job.sh"], capture_output=True, text=True, timeout=120)
    runs = fake.parent / "runs"
    if retried:
        assert r.returncode == 0, r.stderr[-2000:]
        assert "once more" in r.stderr and runs.read_text() == "run\n"
    else:
        assert r.returncode != 0 and "once more" not in r.stderr and not runs.exists()



# stands in for nsys 2022.4 failing to reach its daemon, at its least convenient: its message comes
# last, after more stderr than the copy to the log has taken when it exits, and a child it leaves behind keeps stderr open for a
# while (the real `nsys --start-agent` lingers so); it writes no report. Started again, it runs.
SLOW_FAKE_NSYS = """#!/bin/bash
here=$(dirname "$0")
case "$1" in --version) echo "NVIDIA Nsight Systems version 2022.4.2.1-stand-in"; exit 0 ;; export) exit 0 ;; esac
if [ -e "$here/tried" ]; then echo run >> "$here/runs"; exit 0; fi
touch "$here/tried"
(sleep 10) &
head -c 100000 /dev/zero | tr '\\0' x >&2
echo "[QuadDCommon::tag_message*] = Local Endpoint is not available." >&2
exit 1
"""


def read_all(pipe, into: list, delay_s: float) -> None:
    """A slow reader of the job's output (srun's forwarding, a busy disk): starts after delay_s."""
    time.sleep(delay_s)
    while chunk := os.read(pipe.fileno(), 65536):
        into.append(chunk)


@pytest.mark.e2e
def test_nsys_retry_sees_the_daemon_message_every_time(tmp_path):
    """The retry's check greps the profiled rank's stderr only once all of it is in the copy, every
    time, even when whoever reads the job's output is slow (the copy to the log is then stalled
    when nsys exits), and without waiting for a child of nsys that keeps stderr open. 10 runs of a
    stand-in nsys whose daemon message ends 100 kB of stderr, read 1 s late: each starts it once
    more, each ends well before the child does, and the output holds the message."""
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text(SLOW_FAKE_NSYS)
    fake.chmod(0o755)
    cluster = stand_in_cluster(nsys=str(fake), profile_ranks=[0], python=sys.executable)
    spec = spec_of(tmp_path, cluster, launcher="local")
    render.write_job(spec)
    for i in range(10):
        for f in ("tried", "runs"):
            (fake.parent / f).unlink(missing_ok=True)
        t0 = time.monotonic()
        p = subprocess.Popen(["bash", f"{spec.folder}/job.sh"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        got: list[bytes] = []
        threading.Thread(target=read_all, args=(p.stdout, got, 1.0), daemon=True).start()
        rc = p.wait(timeout=60)
        took = time.monotonic() - t0
        deadline = time.monotonic() + 5
        while b"once more" not in b"".join(got) and time.monotonic() < deadline:
            time.sleep(0.05)
        text = b"".join(got).decode(errors="replace")
        assert rc == 0 and "once more" in text, f"run {i}: rc {rc}, {text[-300:]!r}"
        assert "Local Endpoint is not available" in text
        assert (fake.parent / "runs").read_text() == "run\n" and took < 8, (i, took)
