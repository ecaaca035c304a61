"""Metric functions against hand-computed values on tiny hand-built SQLite files."""
import numpy as np
import pytest

from moetune import analysis
from moetune.analysis.kernels import CLASSES, classify_name
from tests.nsys_fixture import PID, TraceBuilder

GEMM = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


@pytest.mark.parametrize("name, cls", [
    (GEMM, "gemm"), (SENDRECV, "a2a"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl_other"),
    ("void deep_ep::intranode::dispatch<8, 768>(...)", "deepep"),
    ("hybrid_ep::dispatch_kernel<...>", "hybridep"),
    ("flash_fwd_kernel", "attention"),
    ("void transformer_engine::cast_transpose_kernel<fp8e4m3>", "fp8_cast"),
    ("moe_unpermute_kernel", "moe_permute"),
    ("vectorized_elementwise_kernel", "other"),
])
def test_kernel_classes(name, cls):
    """Each sample kernel name is classified as its expected class."""
    assert classify_name(name) == cls


def test_exposed_comm_busy_idle_hand_computed(tmp_path):
    """On a three-kernel trace, busy, idle, communication, exposed communication, SM estimate, class
    counts and gaps equal the hand-computed figures."""
    # GEMM 0-100us, SendRecv 50-150us, GEMM 200-300us; window = GPU span 0-300us
    path = (TraceBuilder().kernel(GEMM, 0, 100).kernel(SENDRECV, 50, 150)
            .kernel(GEMM, 200, 300).write(tmp_path / "t.sqlite"))
    r = analysis.analyze([path])
    m = r["metrics"]["per_rank"][0]
    assert m["window_ms"] == pytest.approx(0.3)
    assert m["gpu_busy_share"] == pytest.approx(250 / 300, abs=1e-4)
    assert m["gpu_idle_share"] == pytest.approx(50 / 300, abs=1e-4)
    assert m["comm_share"] == pytest.approx(100 / 300, abs=1e-4)
    assert m["exposed_comm_share"] == pytest.approx(50 / 300, abs=1e-4)
    assert m["exposed_a2a_share"] == pytest.approx(50 / 300, abs=1e-4)
    assert m["sm_util_estimate"] == pytest.approx(200 / 300, abs=1e-4)
    assert {c: n for c, n in m["kernel_class_count"].items() if n} == {"gemm": 2, "a2a": 1}
    assert set(m["kernel_class_count"]) == set(CLASSES)  # stable keys, 0 when absent
    assert m["kernel_class_ms"]["gemm"] == pytest.approx(0.2)
    assert m["gaps_over_10us"] == 1 and m["gaps_over_10us_ms"] == pytest.approx(0.05)
    assert m["gaps_over_100us"] == 0


def test_nvtx_steps_define_window_and_step_time(tmp_path):
    """NVTX iteration ranges set the window and the step time (mean and spread); kernels after the last
    step are outside."""
    b = TraceBuilder()
    for i in range(3):  # steps of 1000, 1100, 1200 us on the host
        t0 = sum((1000, 1100, 1200)[:i])
        b.range(f"iteration {i + 10}", t0, t0 + (1000, 1100, 1200)[i])
        b.kernel(GEMM, t0 + 20, t0 + 900, launch_us=(t0 + 1, t0 + 5))
    b.kernel(GEMM, 5000, 6000, launch_us=(4990, 4995))  # after the steps: outside the window
    path = b.write(tmp_path / "t.sqlite")
    m = analysis.analyze([path])["metrics"]["per_rank"][0]
    assert m["steps"] == 3 and m["window_source"] == "nvtx"
    assert m["step_time_ms"] == pytest.approx(1.1)
    assert m["step_time_std_ms"] == pytest.approx(0.1)
    assert m["window_ms"] == pytest.approx((2100 + 900 - 20) / 1000)
    assert m["kernels_per_step"] == pytest.approx(1.0)


def test_nvtx_text_inline_in_2022_schema(tmp_path):
    """nsys 2022's schema, with NVTX text inline rather than by id, gives the same steps and step time."""
    b = TraceBuilder().range("iteration 1", 0, 500, via_id=False).kernel(GEMM, 10, 400, launch_us=(1, 2))
    m = analysis.analyze([b.write(tmp_path / "t.sqlite", schema="2022")])["metrics"]["per_rank"][0]
    assert m["steps"] == 1 and m["step_time_ms"] == pytest.approx(0.5)


def test_idle_causes_launch_starved_vs_sync(tmp_path):
    """An idle gap whose next launch comes late is launch-starved; one covered by a stream synchronize
    is sync-blocked."""
    b = TraceBuilder()
    b.kernel(GEMM, 0, 100, launch_us=(0, 1))
    # gap 100-200: the next launch call ends at 150 (> gap start): launch-starved
    b.kernel(GEMM, 200, 300, launch_us=(140, 150))
    # gap 300-500: next kernel launched long before; a cudaStreamSynchronize covers it
    b.kernel(GEMM, 500, 600, launch_us=(10, 12))
    b.call("cudaStreamSynchronize_v3020", 290, 510)
    m = analysis.analyze([b.write(tmp_path / "t.sqlite")])["metrics"]["per_rank"][0]
    assert m["launch_starved_ms"] == pytest.approx(0.1)
    assert m["sync_blocked_ms"] == pytest.approx(0.2)
    assert m["other_wait_ms"] == pytest.approx(0.0)


def test_peak_memory_from_events(tmp_path):
    """Peak memory is the highest running total of allocations minus frees."""
    b = TraceBuilder().kernel(GEMM, 0, 10)
    b.alloc(0, 2 * 2**30).alloc(1, 3 * 2**30).alloc(2, 2 * 2**30, free=True).alloc(3, 2**30)
    m = analysis.analyze([b.write(tmp_path / "t.sqlite")])["metrics"]["per_rank"][0]
    assert m["peak_memory_gb"] == pytest.approx(5.0)


def test_two_ranks_skew_is_waiting_not_transfer(tmp_path):
    """With two ranks, all-to-all time one rank spends waiting for the other is counted as wait, not
    transfer, and the net exposed share is lower."""
    b = TraceBuilder()
    other = PID + (1 << 24)
    b.kernel(GEMM, 0, 100, device=0).kernel(SENDRECV, 100, 900, device=0)      # rank 0 waits
    b.kernel(GEMM, 0, 700, device=1, pid=other).kernel(SENDRECV, 700, 900, device=1, pid=other)
    r = analysis.analyze([b.write(tmp_path / "t.sqlite")])
    c = r["metrics"]["combined"]
    assert c["ranks"] == 2
    assert c["a2a_transfer_ms"] == pytest.approx(0.2)
    assert c["a2a_wait_ms"] == pytest.approx((0.8 + 0.2) / 2 - 0.2)
    assert c["exposed_comm_share_net"] < c["exposed_comm_share"]


def test_combined_uses_slowest_step_and_means(tmp_path):
    """Ranks combine with the slowest rank's step time and means of the shares."""
    f0 = TraceBuilder().range("iteration 1", 0, 1000).kernel(GEMM, 0, 900, launch_us=(0, 1)).write(tmp_path / "r0.sqlite")
    f1 = TraceBuilder().range("iteration 1", 0, 1200).kernel(GEMM, 0, 600, launch_us=(0, 1)).write(tmp_path / "r1.sqlite")
    r = analysis.analyze([tmp_path])
    c = r["metrics"]["combined"]
    assert set(r["metrics"]["per_rank"]) == {0, 1}
    assert c["step_time_ms"] == pytest.approx(1.2)
    assert c["sm_util_estimate"] == pytest.approx(1.0)  # each rank's window is its kernel span
