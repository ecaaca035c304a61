"""The ranks' keys of plain .sqlite traces, read in a thread while the analysis imports pandas.

ranks.plan() lists each file's ranks with a DISTINCT query over the whole kernel table (0.13 s on
benchmarks/analysis.py's 2M-kernel file) and imports take 0.3-0.4 s; SQLite releases the GIL while
it scans, so analyze() starts the scan first and plan() takes its answer (one each, keyed by path,
size and mtime). Anything unusual (.xz, .nsys-rep, no kernel table, an SQLite error) is left to
plan(), which reads the file itself and says what is wrong.

    start(files)  -> begins the scan in a thread
    take(path)    -> (rows, total) or None: the DISTINCT (globalPid, deviceId) rows and count(*)
    wait()        -> the scan's thread has ended (plan() ends with it, before any worker starts)
"""
from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"  # as analysis.load names it (load imports pandas)

_found: dict[tuple, tuple] = {}
_thread: threading.Thread | None = None


def _key(path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def rank_keys(con) -> tuple[list, int]:
    """(DISTINCT (globalPid, deviceId) rows, kernel count) of an open trace with a kernel table."""
    rows = con.execute(f"SELECT DISTINCT globalPid, deviceId FROM {KERNEL_TABLE}").fetchall()
    total = con.execute(f"SELECT count(*) FROM {KERNEL_TABLE}").fetchone()[0]
    return rows, total


def _scan(paths) -> None:
    for path in paths:
        key = _key(path)
        if key is None:
            continue
        try:
            con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
            try:
                has = con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                                  (KERNEL_TABLE,)).fetchone()
                if has:
                    _found[key] = rank_keys(con)
            finally:
                con.close()
        except sqlite3.Error:  # plan() reads it again and gives the one-line TraceError
            continue


def start(files) -> None:
    global _thread
    paths = [str(p) for p in files if str(p).endswith(".sqlite")]
    if paths:
        _thread = threading.Thread(target=_scan, args=(paths,), daemon=True)
        _thread.start()


def wait() -> None:
    """The scan ended: none of its threads runs (a process forked beside it would copy SQLite's locks
    as that thread holds them)."""
    global _thread
    if _thread is not None:
        _thread.join()
        _thread = None


def take(path) -> tuple | None:
    """The scan's answer for this file (waiting for the scan), once; None if it has none."""
    wait()
    key = _key(path)
    return _found.pop(key, None) if key else None
