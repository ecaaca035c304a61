"""moetune/analysis/columnar.py, the columnar reader: every recorded trace gets the same wall and the same
metrics through connectorx in worker processes as through Python's sqlite3 in this process; a
truncated or foreign file is still the one-line TraceError from either reader."""
import json
from pathlib import Path

import pytest

from moetune import analysis
from moetune.analysis import TraceError
from moetune.analysis.columnar import reader
from tests.nsys_fixture import PID, TraceBuilder, foreign_sqlite

REPO = Path(__file__).resolve().parents[2]
RECORDED = sorted([*(REPO / "tests/data/gpu").glob("*.sqlite.xz"), *(REPO / "tests/data/cpu").glob("*.sqlite.xz"),
                   *(REPO / "data/trial_bank/traces").glob("*.sqlite.xz")])
BANK = {json.loads(line)["trace"]: json.loads(line) for line in (REPO / "data/trial_bank/bank.jsonl").open()
        if json.loads(line).get("trace")}
GEMM = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def test_connectorx_is_the_reader_here():
    """connectorx (a dependency) is the reader in use here, so the comparison with sqlite3 below
    compares two readers."""
    assert reader() == "connectorx"  # a pyproject dependency: the comparison below compares two readers


@pytest.mark.parametrize("trace", RECORDED, ids=lambda p: p.name.split(".")[0])
def test_recorded_trace_same_wall_and_metrics_with_either_reader(trace, monkeypatch):
    """The invariant of the new reader: the wall (and every metric) of each recorded trace, tests/data
    (the scenarios and Megatron runs, 2025.3; the CPU trace, 2022.4) and data/trial_bank."""
    new = analysis.analyze([trace], workers=2)
    monkeypatch.setenv("MOETUNE_TRACE_READER", "sqlite3")
    old = analysis.analyze([trace], workers=1)
    assert new["wall"] == old["wall"]
    assert new["metrics"] == old["metrics"]
    entry = BANK.get(f"traces/{trace.name}")
    if entry:  # the bank's recorded analysis was made with the trial's log
        log = REPO / "data/trial_bank" / entry["log"]
        monkeypatch.delenv("MOETUNE_TRACE_READER")
        assert analysis.analyze([trace], log=log)["wall"] == entry["analysis"]["wall"]


def three_steps(b, pid, dev, a2a_start):
    """Three iterations of one rank: a GEMM, then an all-to-all starting `a2a_start` us in."""
    for i in range(3):
        t = i * 1000
        b.range(f"iteration {i}", t, t + 1000, pid=pid)
        b.kernel(GEMM, t + 10, t + 500, device=dev, pid=pid, launch_us=(t + 1, t + 5))
        b.kernel(SENDRECV, t + a2a_start, t + 900, device=dev, pid=pid, stream=9,
                 launch_us=(t + a2a_start - 5, t + a2a_start - 2))
    return b


def test_a_trace_cut_inside_its_kernel_table_is_one_line_error_from_any_reader(tmp_path, monkeypatch):
    """A report cut off inside its kernel table fails in one line naming the file, from either
    reader and with one or two workers."""
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
    """A SQLite file of another program, read in a worker process, fails in one line naming it."""
    p = foreign_sqlite(tmp_path / "foreign.sqlite")
    good = three_steps(TraceBuilder(), PID, 0, 500).write(tmp_path / "g.sqlite")
    with pytest.raises(TraceError, match="foreign.sqlite: not an Nsight Systems export"):
        analysis.analyze([good, p], workers=2)


