"""analysis.keys: a file's ranks listed in a thread while pandas is imported, used by ranks.plan."""
import os
import sqlite3

from moetune import analysis
from moetune.analysis import keys
from moetune.analysis.ranks import plan
from tests.nsys_fixture import PID, TraceBuilder

GEMM = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def _four_ranks(path):
    b = TraceBuilder()
    for r in range(4):
        pid = PID + (r << 24)
        for i in range(3):
            t = i * 1000
            b.range(f"iteration {i}", t, t + 1000, pid=pid)
            b.kernel(GEMM, t + 10, t + 500, device=r, pid=pid, launch_us=(t + 1, t + 5))
            b.kernel(SENDRECV, t + 500 + 50 * r, t + 900, device=r, pid=pid, stream=9,
                     launch_us=(t + 495 + 50 * r, t + 498 + 50 * r))
    return b.write(path)


def test_scan_gives_what_plan_reads_itself_and_only_once(tmp_path):
    """The background scan yields the same rank keys the planner would read from the file, and hands
    them out once."""
    one = _four_ranks(tmp_path / "all.sqlite")
    keys.start([one])
    got = keys.take(one)
    with sqlite3.connect(one) as con:
        assert got == keys.rank_keys(con)
    assert sorted(got[0]) == [(PID + (r << 24), r) for r in range(4)] and got[1] == 24
    assert keys.take(one) is None  # taken: plan would read the file itself


def test_a_file_changed_after_the_scan_is_read_again(tmp_path):
    """A file changed after the scan is not planned from the stale scan: the rank added later is found."""
    one = _four_ranks(tmp_path / "all.sqlite")
    keys.start([one])
    keys.take(tmp_path / "other.sqlite")  # waits for the scan; the entry for `one` stays
    with sqlite3.connect(one) as con:  # one rank more, written after the scan
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, \"end\", deviceId, streamId, correlationId, "
                    "globalPid, demangledName, shortName) SELECT start, \"end\", 7, streamId, correlationId, "
                    f"{PID + (7 << 24)}, demangledName, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1")
    st = os.stat(one)
    os.utime(one, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert [k for _, k, _ in plan([one])[0].ranks][-1] == (PID + (7 << 24), 7)


def test_analysis_same_with_and_without_the_scan(tmp_path, monkeypatch):
    """The analysis of a four-rank file is the same with and without the background key scan."""
    one = _four_ranks(tmp_path / "all.sqlite")
    with_scan = analysis.analyze([one], workers=2)
    monkeypatch.setattr(keys, "start", lambda files: None)
    without = analysis.analyze([one], workers=2)
    assert with_scan["metrics"] == without["metrics"] and with_scan["wall"] == without["wall"]
    assert with_scan["metrics"]["combined"]["ranks"] == 4
