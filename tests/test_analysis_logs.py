"""Megatron logs: compressed logs as the trial bank and tests/data keep them, tokens/s from the
argument dump, and the real Megatron log recorded on the GPU machine."""
import lzma
from pathlib import Path

import pytest

from moetune.analysis import TraceError
from moetune.analysis.logs import parse_log

GPU_DATA = Path(__file__).parent / "data" / "gpu"
ARGS = ("------------------------ arguments ------------------------\n"
        "  global_batch_size ............................... 8\n"
        "  seq_length ...................................... 4096\n")


def _iter_line(i, ms):
    return (f" [2026-11-22 10:00:0{i}] iteration {i:>8}/      20 | consumed samples: {8 * i:>12} | "
            f"elapsed time per iteration (ms): {ms} | throughput per GPU (TFLOP/s/GPU): {30 + i}.0 | "
            "learning rate: 1.0E-04 | global batch size:     8 | lm loss: 1.0E+01 |\n")


def test_tokens_per_s_from_global_batch_and_seq_length(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(ARGS + "".join(_iter_line(i, ms) for i, ms in ((1, 5000.0), (2, 900.0), (3, 500.0),
                                                                   (4, 700.0))))
    r = parse_log(log)
    assert r["step_time_ms"] == pytest.approx(600.0)  # iterations 3 and 4 (first two are warm-up)
    assert r["tokens_per_s"] == pytest.approx(8 * 4096 / 0.6, rel=1e-3)
    assert r["tflops_per_gpu"] == pytest.approx(33.5)


def test_xz_log_reads_like_plain(tmp_path):
    text = ARGS + "".join(_iter_line(i, 600.0) for i in range(1, 5)) + \
        "[Rank 0] (after 4 iterations) memory (MB) | allocated: 1000.0 | max allocated: 2048.0 | " \
        "reserved: 3000.0 | max reserved: 3000.0\n"
    (tmp_path / "log.txt").write_text(text)
    with lzma.open(tmp_path / "log.txt.xz", "wt") as f:
        f.write(text)
    plain, packed = parse_log(tmp_path / "log.txt"), parse_log(tmp_path / "log.txt.xz")
    assert packed == plain and packed["iterations"] == 4 and packed["max_allocated_gb"] == 2.0


def test_broken_xz_log_is_one_line_error(tmp_path):
    bad = tmp_path / "log.txt.xz"
    bad.write_bytes(b"\xfd7zXZ\x00not really")
    with pytest.raises(TraceError) as e:
        parse_log(bad)
    assert "log.txt.xz" in str(e.value) and "\n" not in str(e.value)


def test_real_megatron_log():
    r = parse_log(GPU_DATA / "megatron_moe_proxy_ep2.log.xz")
    assert r["iterations"] == 16 and r["failure"] is None
    assert r["tflops_per_gpu"] > 1 and r["max_allocated_gb"] > 1
    # 16 sequences of 2048 tokens a step (its argument dump)
    assert r["tokens_per_s"] == pytest.approx(16 * 2048 / (r["step_time_ms"] / 1e3), rel=1e-3)


def test_native_crash_is_named_from_torchruns_summary():
    """The recorded HybridEP run: both ranks died of SIGSEGV, no Python traceback."""
    from pathlib import Path
    bank = Path(__file__).resolve().parents[1] / "benchmarks" / "trial_bank" / "logs"
    assert parse_log(bank / "flex_hybridep.log.xz")["failure"] == "crash"
    assert parse_log(bank / "baseline.log.xz")["failure"] is None


# Recorded: a job over its --mem on this machine's Slurm 22.05.8 (cgroup v1, ConstrainRAMSpace),
# tests/test_slurm_failures.py: the last lines of its log
SLURM_CGROUP_OOM = ("srun: error: n2: task 0: Out Of Memory\n"
                    "srun: launch/slurm: _step_signal: Terminating StepId=24.0\n"
                    "slurmstepd-n2: error: Detected 1 oom-kill event(s) in StepId=24.0. Some of your "
                    "processes may have been killed by the cgroup out-of-memory handler.\n")


@pytest.mark.parametrize("text, failure", [
    (SLURM_CGROUP_OOM, "host_oom"),
    ("slurmstepd-n2: error: Detected 1 oom-kill event(s) in StepId=24.0.\n", "host_oom"),
    # the kernel's OOM killer (a node without Slurm's cgroup), as dmesg words it
    ("Out of memory: Killed process 4242 (python) total-vm:81234567kB, anon-rss:79123456kB\n", "host_oom"),
    # torch's message for a data-loader worker the OOM killer took
    ("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed. \n", "host_oom"),
    ("MemoryError\n", "host_oom"),  # Python's own: malloc failed on the host
    ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 0 has a "
     "total capacity of 79.18 GiB of which 172.12 MiB is free.\n", "oom"),
    ("RuntimeError: CUDA error: out of memory\n", "oom"),
    ("RuntimeError: CUDA driver error: CUDA_ERROR_OUT_OF_MEMORY\n", "oom"),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n", "oom"),
])
def test_host_memory_and_gpu_memory_are_told_apart(tmp_path, text, failure):
    """The node's memory (Slurm's cgroup, the kernel, Python) is `host_oom`; the GPU's is `oom`,
    CUDA's own out-of-memory error included."""
    log = tmp_path / "log.txt"
    log.write_text(ARGS + _iter_line(1, 900.0) + text)
    assert parse_log(log)["failure"] == failure


def test_host_oom_names_slurms_first_line(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(ARGS + _iter_line(1, 900.0) + SLURM_CGROUP_OOM)
    r = parse_log(log)
    assert r["failure_line"] == "srun: error: n2: task 0: Out Of Memory" and r["iterations"] == 1
