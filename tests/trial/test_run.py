"""trial/run.py: a trial's job watched and ended. A job whose log stops showing iteration lines is
cancelled as hung; the one error line of a traceback is found; a failed submitit job's error is read
from its own result pickle, else from its stderr."""
import pytest
import time
from pathlib import Path

import submitit

from moetune.job import scheduler as jobs
from moetune.trial import run as runner


def _silent_job(log_path):
    Path(log_path).write_text(" iteration        1/      10 | elapsed time per iteration (ms): 5.0 |\n")
    time.sleep(120)


@pytest.mark.e2e
def test_watch_cancels_a_job_without_iteration_lines(tmp_path):
    """A real local job that prints one iteration line and then nothing is cancelled as hung after
    the hang timeout, and it is gone soon after."""
    ex = submitit.LocalExecutor(folder=tmp_path / "submitit")
    log = tmp_path / "log.txt"
    job = ex.submit(_silent_job, str(log))
    ref = jobs.JobRef(job_id=str(job.job_id), kind="local", folder=str(tmp_path / "submitit"),
                      name="silent")
    status, msg = runner.watch(ref, log, hang_timeout_s=3, poll_s=0.2)
    assert status == "hung" and "no iteration line" in msg
    for _ in range(50):
        if job.done():
            break
        time.sleep(0.2)
    assert job.done()


def test_error_line_is_the_last_error_of_a_traceback():
    """The last `XError: message` line, without its module path; none where no line is an error."""
    tb = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
          "ValueError: first\nDuring handling...\n"
          "moetune.job.replay.ReplayError: config ab12 is not in the trial bank\n")
    assert runner.error_line(tb) == "ReplayError: config ab12 is not in the trial bank"
    assert runner.error_line("iteration 1 | elapsed 5.0\nall fine\n") is None


def _fails():
    raise KeyError("no such rank")


def test_a_failed_jobs_error_is_read_from_its_result_pickle(tmp_path):
    """A real submitit local job that raised: its error line comes from the job's result pickle."""
    ex = submitit.LocalExecutor(folder=tmp_path / "submitit")
    job = ex.submit(_fails)
    for _ in range(300):
        if job.done():
            break
        time.sleep(0.2)
    assert job.done()
    assert runner.job_error(job) == "KeyError: 'no such rank'"
