"""moetune/paths.py write_whole: a stage's output is the earlier file or the new one, never half of
one, whatever kills the writer between its bytes and the rename (a tuner killed mid-submit once left
an empty job.json that its restart could not read)."""
import os
import signal
import subprocess
import sys

from moetune.paths import write_whole


def test_a_writer_killed_before_the_rename_leaves_the_earlier_file(tmp_path):
    """A process that has written every byte but not yet renamed, killed there, leaves the
    earlier job.json whole and readable."""
    job = tmp_path / "job.json"
    write_whole(job, '{"job_id": "1"}\n')
    code = ("import os, signal, sys\n"
            "from moetune import paths\n"
            "os.replace = lambda a, b: os.kill(os.getpid(), signal.SIGKILL)\n"
            f"paths.write_whole({str(job)!r}, '{{\"job_id\": \"2\"}}\\n')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL
    assert job.read_text() == '{"job_id": "1"}\n'


def test_the_file_is_replaced_whole_with_its_mode(tmp_path):
    script = tmp_path / "job.sh"
    write_whole(script, "echo one\n", mode=0o755)
    write_whole(script, "echo two\n", mode=0o755)
    assert script.read_text() == "echo two\n" and os.access(script, os.X_OK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh"]  # no part left behind
