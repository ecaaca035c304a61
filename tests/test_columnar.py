"""The columnar reader and the per-rank map (issue 17): every recorded trace gets the same wall and
the same metrics through connectorx in worker processes as through Python's sqlite3 in this
process; a truncated or foreign file is still the one-line TraceError; ranks of one file and ranks
of one file each agree; the summaries a worker sends back are small."""
import json
from pathlib import Path

import pytest

from moetune import analysis
from moetune.analysis import TraceError
from moetune.analysis.columnar import reader
from moetune.analysis.ranks import map_ranks, plan
from tests.nsys_fixture import PID, TraceBuilder, foreign_sqlite

REPO = Path(__file__).resolve().parents[1]
RECORDED = sorted([*(REPO / "tests/data/gpu").glob("*.sqlite.xz"), *(REPO / "tests/data/cpu").glob("*.sqlite.xz"),
                   *(REPO / "benchmarks/trial_bank/traces").glob("*.sqlite.xz")])
BANK = {json.loads(line)["trace"]: json.loads(line) for line in (REPO / "benchmarks/trial_bank/bank.jsonl").open()
        if json.loads(line).get("trace")}
GEMM = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def test_connectorx_is_the_reader_here():
    assert reader() == "connectorx"  # a pyproject dependency: the comparison below compares two readers


@pytest.mark.parametrize("trace", RECORDED, ids=lambda p: p.name.split(".")[0])
def test_recorded_trace_same_wall_and_metrics_with_either_reader(trace, monkeypatch):
    """The invariant of the new reader: the wall (and every metric) of each recorded trace, tests/data
    (the scenarios and Megatron runs, 2025.3; the CPU trace, 2022.4) and benchmarks/trial_bank."""
    new = analysis.analyze([trace], workers=2)
    monkeypatch.setenv("MOETUNE_TRACE_READER", "sqlite3")
    old = analysis.analyze([trace], workers=1)
    assert new["wall"] == old["wall"]
    assert new["metrics"] == old["metrics"]
    entry = BANK.get(f"traces/{trace.name}")
    if entry:  # the bank's recorded analysis was made with the trial's log
        log = REPO / "benchmarks/trial_bank" / entry["log"]
        monkeypatch.delenv("MOETUNE_TRACE_READER")
        assert analysis.analyze([trace], log=log)["wall"] == entry["analysis"]["wall"]


def _rank(b, pid, dev, a2a_start):
    for i in range(3):
        t = i * 1000
        b.range(f"iteration {i}", t, t + 1000, pid=pid)
        b.kernel(GEMM, t + 10, t + 500, device=dev, pid=pid, launch_us=(t + 1, t + 5))
        b.kernel(SENDRECV, t + a2a_start, t + 900, device=dev, pid=pid, stream=9,
                 launch_us=(t + a2a_start - 5, t + a2a_start - 2))
    return b


def test_one_file_of_four_ranks_equals_four_files_and_any_worker_count(tmp_path, monkeypatch):
    b = TraceBuilder()
    files = []
    for r in range(4):
        _rank(b, PID + (r << 24), r, 500 + 50 * r)
        files.append(_rank(TraceBuilder(), PID + (r << 24), r, 500 + 50 * r).write(tmp_path / f"r{r}.sqlite"))
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
        _rank(b, pid, r, 600 if r else 400)
    p = b.write(tmp_path / "t.sqlite")
    sums = list(map_ranks([p], workers=1))
    assert [s.rows_read for s in sums] == [{"kernels": 7, "runtime": 6}] * 2  # the early launch is not read
    assert [len(s.a2a[SENDRECV][0]) for s in sums] == [4, 4]  # the early all-to-all is in the summary
    c = analysis.analyze([p])["metrics"]
    assert c["per_rank"][0]["a2a_wait_ms"] == pytest.approx(0.2) and c["per_rank"][1]["a2a_wait_ms"] == 0


def test_a_trace_cut_inside_its_kernel_table_is_one_line_error_from_any_reader(tmp_path, monkeypatch):
    b = TraceBuilder()
    for i in range(20_000):
        b.kernel(GEMM, i * 10, i * 10 + 5, launch_us=(i * 10 - 3, i * 10 - 1))
    good = b.write(tmp_path / "good.sqlite")
    data = good.read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(data[: len(data) * 2 // 3])
    for env in (None, "sqlite3"):
        if env:
            monkeypatch.setenv("MOETUNE_TRACE_READER", env)
        for workers in (1, 2):
            with pytest.raises(TraceError) as e:
                analysis.analyze([good, cut], workers=workers)
            assert "cut.sqlite" in str(e.value) and len(str(e.value).splitlines()) == 1


def test_foreign_sqlite_in_a_worker_is_one_line_error(tmp_path):
    p = foreign_sqlite(tmp_path / "foreign.sqlite")
    good = _rank(TraceBuilder(), PID, 0, 500).write(tmp_path / "g.sqlite")
    with pytest.raises(TraceError, match="foreign.sqlite: not an Nsight Systems export"):
        analysis.analyze([good, p], workers=2)


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
        _rank(b, PID + (r << 24), r, 500 + 100 * r)
    p = b.write(tmp_path / "two.sqlite")
    with mp.get_context("spawn").Pool(1) as pool:
        inside = pool.apply(_analyze_in_a_daemon, (p,))
    assert inside == analysis.analyze([p], workers=2)["metrics"]
