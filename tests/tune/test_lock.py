"""tune/lock.py: one tuner per study. A second tuner on a study is refused in one line naming the
holder; the lock of a tuner killed by SIGKILL is free again at once (the kernel drops the flock)."""
import signal
import subprocess
import sys

import pytest

from moetune.tune import lock
from tests.conftest import REPO


def test_second_tuner_on_a_study_is_refused(tmp_path):
    """A second acquire of a held study lock fails naming the holder's pid; released, it is free."""
    with lock.study_lock(tmp_path, "qwen"):
        with pytest.raises(lock.LockError, match=r"study 'qwen' is already being tuned by pid \d+"):
            lock.study_lock(tmp_path, "qwen").acquire()
    lock.study_lock(tmp_path, "qwen").acquire().release()  # free again


def test_lock_of_a_killed_tuner_is_free(tmp_path):
    """A lock held by another process refuses this one; once that process is SIGKILLed it is free."""
    code = ("import sys, time; from moetune.tune import lock; "
            "lock.study_lock(sys.argv[1], 'qwen').acquire(); print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                         text=True, cwd=REPO)
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(lock.LockError):
        lock.study_lock(tmp_path, "qwen").acquire()
    p.send_signal(signal.SIGKILL)
    p.wait()
    lock.study_lock(tmp_path, "qwen").acquire().release()


def test_the_lock_file_says_who_holds_it_and_is_emptied_on_release(tmp_path):
    """The lock file names the holder (pid and host) while held, and is empty once released, so a
    stale name never blames a tuner that has gone."""
    held = lock.study_lock(tmp_path, "qwen").acquire()
    path = tmp_path / "qwen" / ".tuner.lock"
    assert path.read_text().startswith("pid ") and " since " in path.read_text()
    held.release()
    assert path.read_text() == ""
