"""moetune/job/slurm.py is the one client of Slurm's commands: no other module of moetune runs
sbatch, sacct, squeue, scancel or sinfo (read from the code: calls and argv lists, not prose); its
sacct watcher answers for many jobs with one sacct and reads its cache between calls; and Slurm is
here by one rule (sbatch and sacct on PATH). The commands are stand-ins on PATH here: they record
how they were called."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from moetune.job import slurm
from tests.conftest import REPO

COMMANDS = {"sbatch", "sacct", "squeue", "scancel", "sinfo"}
# what starts a process or finds a program: a command named to one of them is a call of it
CALLERS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput",
           "system", "popen", "spawnlp", "execvp", "execlp", "which",
           "create_subprocess_exec", "create_subprocess_shell"}


def _command(node) -> str | None:
    """The Slurm command a node starts with: a string whose first word is one, or a list/tuple
    whose first item is such a string."""
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
        node = node.elts[0]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split():
        word = node.value.split()[0]
        return word if Path(word).name in COMMANDS else None
    return None


def slurm_calls(source: str) -> list[tuple[int, str]]:
    """(line, command) of every place a source runs a Slurm command or builds its argv."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple)) and _command(node):
            found.append((node.lineno, _command(node)))
        elif isinstance(node, ast.Call) and node.args:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in CALLERS and isinstance(node.args[0], ast.Constant) and _command(node.args[0]):
                found.append((node.lineno, _command(node.args[0])))
    return sorted(set(found))


def test_only_slurm_py_runs_slurms_commands():
    """Every module of moetune but job/slurm.py is free of calls of Slurm's commands."""
    home = REPO / "moetune" / "job" / "slurm.py"
    stray = [f"{path.relative_to(REPO)}:{line}: {cmd}"
             for path in sorted((REPO / "moetune").rglob("*.py")) if path != home
             for line, cmd in slurm_calls(path.read_text())]
    assert stray == []
    assert {cmd for _, cmd in slurm_calls(home.read_text())} == COMMANDS  # the walk sees calls


def test_the_check_tells_calls_from_prose():
    """Calls and argv lists are found; a docstring, a help line, a comment or a sentence are not."""
    source = '''
"""sbatch the job, then sacct it."""
import subprocess, shutil, os
subprocess.run(["scancel", job])
subprocess.check_output("squeue -h -j 1", shell=True)
os.system("sinfo -h")
cmd = ("sbatch", "--parsable")
shutil.which("sacct")
# sacct -j 1
print("sbatch failed: see sacct")
help_ = "auto: Slurm when sbatch is on PATH"
x = ["--wrap", "sbatch"]
'''
    assert slurm_calls(source) == [(4, "scancel"), (5, "squeue"), (6, "sinfo"), (7, "sbatch"), (8, "sacct")]


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sacct, squeue and sbatch stand-ins on PATH: each appends its argv to calls.txt; sacct
    prints the rows in sacct.txt."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for cmd in ("sacct", "squeue", "sbatch"):
        (bin_ / cmd).write_text(f'#!/bin/sh\necho "{cmd} $*" >> {tmp_path}/calls.txt\n'
                                f'[ -f {tmp_path}/{cmd}.txt ] && cat {tmp_path}/{cmd}.txt\nexit 0\n')
        (bin_ / cmd).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    calls = tmp_path / "calls.txt"
    return tmp_path, lambda: calls.read_text().splitlines() if calls.exists() else []


def rows(*lines: str) -> str:
    return "".join(f"{line}|name|{state}|0:0|||||n1|None\n" for line, state in
                   (entry.split(" ") for entry in lines))


def test_one_sacct_answers_for_every_watched_job_and_the_cache_between(fake_slurm):
    """A new job is asked at once, with every job still watched (an array while an element is
    pending); within delay_s the cache answers; a job that ended drops out of the next call."""
    tmp, calls = fake_slurm
    (tmp / "sacct.txt").write_text(rows("11 RUNNING", "11.batch RUNNING", "12 COMPLETED", "12.0 COMPLETED",
                                        "13_0 COMPLETED", "13_[1-2] PENDING"))
    now = [0.0]
    w = slurm.SacctWatcher(delay_s=5.0, clock=lambda: now[0])
    assert [r["JobID"] for r in w.rows("11")] == ["11", "11.batch"]
    assert [r["State"] for r in w.rows(12)] == ["COMPLETED", "COMPLETED"]
    assert [r["JobID"] for r in w.rows("13")] == ["13_0", "13_[1-2]"]
    asked = lambda: [c.split(" -j ")[1].split()[0] for c in calls()]
    assert asked() == ["11", "11,12", "11,13"]  # 12 ended at its first answer
    assert calls()[-1].endswith(" -o " + ",".join(slurm.SACCT_FIELDS))
    now[0] = 1.0
    w.rows("11"), w.rows("13")
    assert w.calls == 3  # the cache: no sacct within delay_s
    now[0] = 6.0
    assert w.rows("11")[0]["State"] == "RUNNING"
    assert w.calls == 4 and asked()[-1] == "11,13"  # one call for both, the ended 12 not in it


def test_a_job_accounting_does_not_know_has_no_rows_and_a_failing_sacct_is_one_line(fake_slurm):
    tmp, _ = fake_slurm
    assert slurm.SacctWatcher().rows("99") == []
    (tmp / "bin" / "sacct").write_text("#!/bin/sh\necho 'sacct: error: slurmdbd down' >&2\nexit 1\n")
    with pytest.raises(slurm.JobError, match="sacct -n failed: sacct: error: slurmdbd down") as e:
        slurm.SacctWatcher().rows("5")
    assert "\n" not in str(e.value)


def test_queue_reads_states_and_reasons_and_nothing_where_squeue_fails(fake_slurm):
    tmp, calls = fake_slurm
    (tmp / "squeue.txt").write_text("PENDING|(Priority)\nRUNNING|n1\n")
    assert slurm.queue("7", array=True) == [("PENDING", "(Priority)"), ("RUNNING", "n1")]
    assert calls()[-1] == "squeue -h -r -j 7 -o %T|%R"
    (tmp / "bin" / "squeue").write_text("#!/bin/sh\nexit 1\n")
    assert slurm.queue("7") == []


def test_sbatch_retries_without_a_dependency_slurm_forgot(fake_slurm):
    """sbatch refuses a --dependency on a job slurmctld forgot: submitted again without it."""
    tmp, _ = fake_slurm
    (tmp / "bin" / "sbatch").write_text(
        f'#!/bin/sh\necho "sbatch $*" >> {tmp}/calls.txt\ncase "$*" in *--dependency*) '
        'echo "sbatch: error: Job dependency problem" >&2; exit 1;; esac\necho "42;cluster"\n')
    assert slurm.sbatch(["--dependency=afterany:1", "--wrap", "true"], retry_without_dependency=True) == "42"
    with pytest.raises(slurm.JobError, match="dependency problem"):
        slurm.sbatch(["--dependency=afterany:1", "--wrap", "true"])


def test_slurm_is_here_when_sbatch_and_sacct_are(tmp_path, monkeypatch):
    """The one rule: sbatch alone (or sinfo) is not Slurm here; sbatch and sacct are."""
    for cmd in ("sbatch", "sinfo", "sacct"):
        (tmp_path / cmd).write_text("#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    (tmp_path / "sbatch").chmod(0o755)
    (tmp_path / "sinfo").chmod(0o755)
    assert not slurm.available()
    (tmp_path / "sacct").chmod(0o755)
    assert slurm.available()


@pytest.mark.parametrize("nodelist", ["n1", "n[1-2]", "n[1-2,5],gpu[08-10]", "nid[001-003]", "a[1-2]-ib[0-1]"])
def test_hostnames_expands_a_node_list_as_scontrol_does(nodelist):
    """slurm.hostnames: the names `scontrol show hostnames` gives (checked against it where it is here)."""
    expected = {"n1": ["n1"], "n[1-2]": ["n1", "n2"],
                "n[1-2,5],gpu[08-10]": ["n1", "n2", "n5", "gpu08", "gpu09", "gpu10"],
                "nid[001-003]": ["nid001", "nid002", "nid003"],
                "a[1-2]-ib[0-1]": ["a1-ib0", "a1-ib1", "a2-ib0", "a2-ib1"]}[nodelist]
    assert slurm.hostnames(nodelist) == expected
    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        assert out.returncode != 0 or out.stdout.split() == expected
    assert slurm.hostnames("None assigned") == [] and slurm.hostnames("") == []


# Real sacct rows (Slurm 22.05 of scripts/slurm-up, -P -o JobID,JobName,State,ExitCode,Submit,
# Start,End,Elapsed,NodeList,Reason,ElapsedRaw,NNodes) of a 2-node job, read under load before
# slurmdbd had the job's own start record: its row came from the batch step's (NodeList n1) and
# still said n1 once COMPLETED with NNodes 2; a second later it said n[1-2].
BATCH_FIRST = """\
1166|j|COMPLETED|0:0|2026-11-28T20:12:52|2026-11-28T20:12:53|2026-11-28T20:12:55|00:00:02|n1|None|2|2
1166.batch|batch|COMPLETED|0:0|2026-11-28T20:12:53|2026-11-28T20:12:53|2026-11-28T20:12:55|00:00:02|n1||2|1
1166.0|bash|COMPLETED|0:0|2026-11-28T20:12:53|2026-11-28T20:12:53|2026-11-28T20:12:55|00:00:02|n[1-2]||2|2
"""


def _parse(text: str) -> list[dict]:
    return [dict(zip(slurm.SACCT_FIELDS, line.split("|"), strict=True)) for line in text.splitlines()]


def test_a_job_row_recorded_from_its_batch_step_gives_all_the_jobs_nodes():
    """A job row naming fewer nodes than it counts (recorded from its batch step) is not taken as
    the job's nodes: they are its row's and its steps' together; a complete row is taken as it is."""
    rows = _parse(BATCH_FIRST)
    assert not slurm.nodes_recorded(rows[0])
    assert slurm.job_nodes(rows, "1166") == "n1,n2"
    assert slurm.job_nodes(list(reversed(rows)), 1166) == "n1,n2"  # whatever the rows' order
    done = _parse(BATCH_FIRST.replace("|n1|None|2|2", "|n[1-2]|None|2|2"))
    assert slurm.nodes_recorded(done[0]) and slurm.job_nodes(done, "1166") == "n[1-2]"
    pending = _parse("1167|j|PENDING|0:0|2026-11-28T20:12:52|Unknown|Unknown|00:00:00|None assigned|Resources|0|2")
    assert slurm.nodes_recorded(pending[0]) and slurm.job_nodes(pending, "1167") is None
    assert slurm.job_nodes(rows[1:], "1166") is None  # no row of the job itself


def test_the_watcher_asks_again_for_an_ended_job_until_its_row_names_all_its_nodes(fake_slurm):
    """An ended job whose row does not name all its nodes yet stays in the next sacct (its cached
    row would otherwise keep the batch step's node for good); once it does, it drops out."""
    tmp, calls = fake_slurm
    (tmp / "sacct.txt").write_text(BATCH_FIRST)
    now = [0.0]
    w = slurm.SacctWatcher(delay_s=1.0, clock=lambda: now[0])
    assert w.rows("1166")[0]["NodeList"] == "n1"
    (tmp / "sacct.txt").write_text(BATCH_FIRST.replace("|n1|None|2|2", "|n[1-2]|None|2|2"))
    now[0] = 2.0
    assert slurm.job_nodes(w.rows("1167"), "1167") is None
    assert calls()[-1].split(" -j ")[1].split()[0] == "1166,1167"  # 1166 asked again
    now[0] = 4.0
    w.rows("1167")
    assert calls()[-1].split(" -j ")[1].split()[0] == "1167"  # 1166 recorded: no longer asked
    assert w.rows("1166")[0]["NodeList"] == "n[1-2]"  # its cached row, the complete one
