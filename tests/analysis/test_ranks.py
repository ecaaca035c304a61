"""moetune/analysis/ranks.py, the per-rank map: one file of four ranks gives what four files give, with any
worker count and tasks split by key; rows before the first step are not read but its all-to-all
pairs still count; a window that begins before the first step is read again whole; analysis inside
a pool's worker runs its ranks in that process."""
import pytest

from moetune import analysis
from moetune.analysis.ranks import map_ranks, plan
from tests.nsys_fixture import PID, TraceBuilder
from tests.analysis.test_columnar import GEMM, SENDRECV, three_steps


def test_one_file_of_four_ranks_equals_four_files_and_any_worker_count(tmp_path, monkeypatch):
    """Four ranks in one file, read by 1, 2 or 3 workers in tasks of two ranks, and the same ranks
    in four files, give the same metrics and wall; the early all-to-all waits 150 us."""
    b = TraceBuilder()
    files = []
    for r in range(4):
        three_steps(b, PID + (r << 24), r, 500 + 50 * r)
        files.append(three_steps(TraceBuilder(), PID + (r << 24), r, 500 + 50 * r).write(tmp_path / f"r{r}.sqlite"))
    one = b.write(tmp_path / "all.sqlite")
    monkeypatch.setattr("moetune.analysis.ranks.ROWS_PER_TASK", 12)  # 2 ranks a task: groups are split by key
    assert [len(t.ranks) for t in plan([one], workers=1)] == [2, 2]
    results = [analysis.analyze([one], workers=w) for w in (1, 2, 3)] + [analysis.analyze(files, workers=2)]
    per_rank = results[0]["metrics"]["per_rank"]
    assert sorted(per_rank) == [0, 1, 2, 3]
    assert per_rank[3]["a2a_wait_ms"] == 0 and per_rank[0]["a2a_wait_ms"] == pytest.approx(0.15)  # started 150 us early
    for r in results[1:]:
        assert r["metrics"] == results[0]["metrics"] and r["wall"] == results[0]["wall"]


def test_rows_before_the_first_step_are_not_read_but_its_all_to_all_pairs_still_count(tmp_path):
    """Launches before the first step are not read; kernels are, so the all-to-all pairs by order."""
    b = TraceBuilder()
    for r, pid in enumerate((PID, PID + (1 << 24))):
        b.kernel(SENDRECV, 0, 100, device=r, pid=pid, launch_us=(-10, -5))  # before iteration 0
        three_steps(b, pid, r, 600 if r else 400)
    p = b.write(tmp_path / "t.sqlite")
    sums = list(map_ranks([p], workers=1))
    assert [s.rows_read for s in sums] == [{"kernels": 7, "runtime": 6}] * 2  # the early launch is not read
    assert [len(s.a2a[SENDRECV][0]) for s in sums] == [4, 4]  # the early all-to-all is in the summary
    c = analysis.analyze([p])["metrics"]
    assert c["per_rank"][0]["a2a_wait_ms"] == pytest.approx(0.2) and c["per_rank"][1]["a2a_wait_ms"] == 0


def test_a_window_that_begins_before_the_first_step_is_read_again_whole(tmp_path):
    """Clocks out of step: a kernel launched in the step starts before it (50 us, step at 100 us). The
    window begins with that kernel, so the launch at 60 us, cut by the row filter, is read again."""
    b = TraceBuilder().range("iteration 0", 100, 1000)
    b.kernel(GEMM, 70, 80, launch_us=(60, 65))  # launched before the step, inside the window
    b.kernel(GEMM, 50, 200, launch_us=(110, 115))  # launched in the step, starts before it
    b.kernel(GEMM, 400, 900, launch_us=(300, 305))
    p = b.write(tmp_path / "skewed.sqlite")
    (s,) = map_ranks([p], workers=1)
    assert (s.window.start, s.window.end) == (50_000, 900_000)
    assert s.rows_read == {"kernels": 3, "runtime": 3}  # all three launches
    assert s.metrics["launch_rate_per_ms"] == pytest.approx(3 / 0.85, abs=1e-3)


def _analyze_in_a_daemon(path):
    return analysis.analyze([path], workers=2)["metrics"]


def test_analysis_inside_a_pool_worker_runs_its_ranks_in_that_process(tmp_path):
    """A daemonic process (a multiprocessing pool's worker) may not start workers of its own."""
    import multiprocessing as mp
    b = TraceBuilder()
    for r in range(2):
        three_steps(b, PID + (r << 24), r, 500 + 100 * r)
    p = b.write(tmp_path / "two.sqlite")
    with mp.get_context("spawn").Pool(1) as pool:
        inside = pool.apply(_analyze_in_a_daemon, (p,))
    assert inside == analysis.analyze([p], workers=2)["metrics"]


def test_workers_beside_a_thread_busy_in_sqlite_start_clean_and_finish(tmp_path):
    """A fork copies the locks other threads hold as they stand: a tuner's store thread inside SQLite
    once left a forked worker waiting forever on SQLite's allocator mutex. With such a thread running,
    the workers start from a fork server, not a fork, and four ranks read by two workers give what one
    process gives."""
    import sqlite3
    import threading

    from moetune.analysis import ranks
    files = [three_steps(TraceBuilder(), PID + (r << 24), r, 500 + 50 * r).write(tmp_path / f"r{r}.sqlite")
             for r in range(4)]
    stop = threading.Event()

    def busy():  # opens and closes connections (SQLite's allocator at work) until told to stop
        while not stop.is_set():
            sqlite3.connect(str(tmp_path / "store.db")).close()

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    try:
        assert threading.active_count() >= 2 and ranks._context().get_start_method() != "fork"
        two = analysis.analyze(files, workers=2)
    finally:
        stop.set()
        t.join()
    one = analysis.analyze(files, workers=1)
    assert two["metrics"] == one["metrics"] and two["wall"] == one["wall"]


def test_plan_ends_the_rank_scan_even_where_no_file_has_kernels(tmp_path):
    """The rank scan's thread (analysis.keys, begun while the analysis imports pandas) has ended when
    plan() returns, also where no file has a kernel table to take its answer (a CPU stand-in's
    trace): workers fork next, and a fork beside that thread would copy SQLite's locks as it holds
    them."""
    import sqlite3

    from moetune.analysis import keys
    files = []
    for r in range(3):
        p = three_steps(TraceBuilder(), PID + (r << 24), r, 500).write(tmp_path / f"r{r}.sqlite")
        with sqlite3.connect(p) as con:
            con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
        con.close()
        files.append(p)
    keys.start(files)
    scan = keys._thread
    assert scan is not None
    plan(files)
    assert keys._thread is None and not scan.is_alive()
