"""One tuner per study: an exclusive `flock` on a lock file beside the study's runs. The kernel
drops it when the holder dies (even by SIGKILL), so a killed tuner never blocks its resume."""
from __future__ import annotations

import fcntl
import os
import socket
from datetime import UTC, datetime
from pathlib import Path

from moetune.errors import MoetuneError


class LockError(MoetuneError):
    """Another tuner holds this study (one line: who, since when, what to do)."""


class StudyLock:
    def __init__(self, path: str | Path, study: str = ""):
        self.path = Path(path)
        self.study = study or self.path.parent.name
        self._fd: int | None = None

    def acquire(self) -> StudyLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise LockError(f"study {self.study!r} is already being tuned by {holder} (lock "
                            f"{self.path}); wait for it or stop that tuner") from None
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StudyLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def study_lock(runs_root: str | Path, study: str) -> StudyLock:
    """The lock of a study whose trials live under runs_root/study/."""
    return StudyLock(Path(runs_root) / study / ".tuner.lock", study)
