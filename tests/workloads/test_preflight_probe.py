"""workloads/preflight_probe.py, run here as the job runs it (by its path, no moetune needed): one JSON
record after its marker, also written to --out; this machine's CPUs and NUMA nodes as the kernel
lists them; the installed nsys with its version and whether `nsys recipe` answers; the runs folder's
token read back, or why not. (Through Slurm, with the login side's checks: tests/experiment/test_preflight.py.)"""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from moetune.workloads import preflight_probe as probe

PROBE = probe.__file__


def test_the_probe_run_by_its_path_writes_one_record(tmp_path):
    """Run as a script with a token and nsys off: the record after MARKER equals the --out file, and
    it holds the token, the CPUs, Python and the nsys it was told to skip."""
    token = tmp_path / "token"
    token.write_text("abc123\n")
    out = tmp_path / "record.json"
    r = subprocess.run([sys.executable, PROBE, "--out", str(out), "--token-file", str(token), "--nsys", "off"],
                       capture_output=True, text=True, timeout=600, cwd="/")
    assert r.returncode == 0, r.stderr[-500:]
    (line,) = [x for x in r.stdout.splitlines() if x.startswith(probe.MARKER)]
    rec = json.loads(line[len(probe.MARKER):])
    assert rec == json.loads(out.read_text())
    assert rec["runs_folder"] == {"path": str(token), "seen": "abc123"}
    assert rec["cpus"]["node"] == os.cpu_count() and rec["nsys"] == {"binary": "off", "off": True}
    assert rec["python"]["executable"] == sys.executable and "megatron" in rec


def test_cpus_and_numa_nodes_are_the_kernels():
    """The node's CPUs, this task's affinity and one entry per NUMA node of /sys."""
    c = probe.cpus()
    assert c["node"] == os.cpu_count() and c["task"] == len(os.sched_getaffinity(0))
    assert len(c["numa_nodes"]) == len(glob.glob("/sys/devices/system/node/node[0-9]*"))


@pytest.mark.skipif(not shutil.which("nsys"), reason="no nsys installed")
def test_the_installed_nsys_with_its_version_and_recipes():
    """The installed nsys: its path, its release as `nsys --version` prints it, and `recipe` true
    exactly where `nsys recipe --help` succeeds."""
    found = probe.nsys("nsys")
    assert found["path"] == shutil.which("nsys")
    line = subprocess.run(["nsys", "--version"], capture_output=True, text=True).stdout
    assert found["version"] and found["version"] in line
    rc = subprocess.run(["nsys", "recipe", "--help"], capture_output=True, text=True).returncode
    assert found["recipe"] is (rc == 0)


def test_a_missing_nsys_and_an_unreadable_token_are_said_not_raised(tmp_path):
    """An nsys not on PATH and a token file that is not there each come back as an error entry."""
    assert probe.nsys("no-such-nsys-here")["error"] == "no-such-nsys-here: not found on PATH"
    missing = probe.token(str(tmp_path / "none"))
    assert missing["seen"] is None and missing["error"].startswith("FileNotFoundError")
    assert probe.token(None) == {"path": None}
