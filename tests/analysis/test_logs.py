"""moetune/analysis/logs.py, the Megatron log parser: iteration times, TFLOP/s and memory lines; the
failures it names (NCCL, time limit, cancel, native crash, GPU vs host memory); compressed logs as
the trial bank and tests/data keep them; tokens/s from the argument dump; the real Megatron log
recorded on the GPU machine; and the fit lease's real fit logs (one H200, megatron-core 0.19.2
`--fake-process-group`, TE 2.20.2, benchmarks/fit_lease/) parsed to the figures of the device's own
summary (benchmarks/device/fit.py, its own regexes, results.jsonl)."""
import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from moetune.analysis import TraceError
from moetune.analysis.logs import parse_log, steady_iterations

GPU_DATA = Path(__file__).resolve().parents[1] / "data" / "gpu"
FIT = Path(__file__).resolve().parents[2] / "benchmarks" / "fit_lease"
ARGS = ("------------------------ arguments ------------------------\n"
        "  global_batch_size ............................... 8\n"
        "  seq_length ...................................... 4096\n")


def _iter_line(i, ms):
    return (f" [2026-11-22 10:00:0{i}] iteration {i:>8}/      20 | consumed samples: {8 * i:>12} | "
            f"elapsed time per iteration (ms): {ms} | throughput per GPU (TFLOP/s/GPU): {30 + i}.0 | "
            "learning rate: 1.0E-04 | global batch size:     8 | lm loss: 1.0E+01 |\n")


def test_tokens_per_s_from_global_batch_and_seq_length(tmp_path):
    """Tokens/s is global batch × sequence length over the judged step time (the steady steps'
    median: with four iterations, the fourth alone), not over the mean after warm-up."""
    log = tmp_path / "log.txt"
    log.write_text(ARGS + "".join(_iter_line(i, ms) for i, ms in ((1, 5000.0), (2, 900.0), (3, 500.0),
                                                                   (4, 700.0))))
    r = parse_log(log)
    assert r["step_time_ms"] == pytest.approx(600.0)  # the mean of iterations 3 and 4, secondary
    assert r["tokens_per_step"] == 8 * 4096
    assert r["tokens_per_s"] == pytest.approx(8 * 4096 / 0.7, rel=1e-3)
    # the work of a step (rate x time: 155000, 28800, 16500, 23800) by its median, over 700 ms
    assert r["tflops_per_gpu"] == pytest.approx((28800 + 23800) / 2 / 700, rel=1e-3)


def test_xz_log_reads_like_plain(tmp_path):
    """An .xz-compressed log parses exactly like the plain one."""
    text = ARGS + "".join(_iter_line(i, 600.0) for i in range(1, 5)) + \
        "[Rank 0] (after 4 iterations) memory (MB) | allocated: 1000.0 | max allocated: 2048.0 | " \
        "reserved: 3000.0 | max reserved: 3000.0\n"
    (tmp_path / "log.txt").write_text(text)
    with lzma.open(tmp_path / "log.txt.xz", "wt") as f:
        f.write(text)
    plain, packed = parse_log(tmp_path / "log.txt"), parse_log(tmp_path / "log.txt.xz")
    assert packed == plain and packed["iterations"] == 4 and packed["max_allocated_gb"] == 2.0


def test_broken_xz_log_is_one_line_error(tmp_path):
    """A corrupt .xz log is a one-line TraceError naming the file."""
    bad = tmp_path / "log.txt.xz"
    bad.write_bytes(b"\xfd7zXZ\x00not really")
    with pytest.raises(TraceError) as e:
        parse_log(bad)
    assert "log.txt.xz" in str(e.value) and "\n" not in str(e.value)


def test_real_megatron_log():
    """A recorded Megatron log gives 16 iterations, no failure, and tokens/s consistent with its 16 ×
    2048-token batch and step time."""
    r = parse_log(GPU_DATA / "megatron_moe_proxy_ep2.log.xz")
    assert r["iterations"] == 16 and r["failure"] is None
    assert r["tflops_per_gpu"] > 1 and r["max_allocated_gb"] > 1
    # 16 sequences of 2048 tokens a step (its argument dump)
    judged = float(np.median(steady_iterations(r)))
    assert r["tokens_per_s"] == pytest.approx(16 * 2048 / (judged / 1e3), rel=1e-3)


def test_throughput_is_at_the_judged_step_not_the_mean_of_rates():
    """The bank's baseline (2x H200): stalls of seconds among steps of ~450 ms. Its judged step is
    461.7 ms, at which Megatron itself printed 58.9 TFLOP/s/GPU (iteration 6); the mean of its
    per-iteration rates (41.5, stalls in it) is not what is reported."""
    r = parse_log(Path(__file__).resolve().parents[2] / "data" / "trial_bank" / "logs" / "baseline.log.xz")
    assert float(np.median(steady_iterations(r))) == pytest.approx(461.7)
    assert r["tflops_per_gpu"] == pytest.approx(58.9, abs=0.1)
    rates = [t for t in r["iteration_tflops"][2:] if t is not None]
    assert float(np.mean(rates)) < 45  # what the old figure was
    assert r["tokens_per_s"] == pytest.approx(16 * 2048 / 0.4617, rel=1e-3)


def test_native_crash_is_named_from_torchruns_summary():
    """The recorded HybridEP run: both ranks died of SIGSEGV, no Python traceback."""
    from pathlib import Path
    bank = Path(__file__).resolve().parents[2] / "data" / "trial_bank" / "logs"
    assert parse_log(bank / "flex_hybridep.log.xz")["failure"] == "crash"
    assert parse_log(bank / "baseline.log.xz")["failure"] is None


def test_a_python_exception_tagged_by_rank_is_a_python_error():
    """The bank's tp2_sp_ep2 run: Megatron's AssertionError on every rank, each line tagged
    `[rankN]: ` by torchrun, reads as a python_error naming the assertion."""
    bank = Path(__file__).resolve().parents[2] / "data" / "trial_bank" / "logs"
    r = parse_log(bank / "tp2_sp_ep2.log.xz")
    assert r["failure"] == "python_error"
    assert r["failure_line"] == "[rank0]: AssertionError: sequence parallel not supported by torch LayerNorm"


@pytest.mark.parametrize("line, failure", [
    ("[rank3]: ModuleNotFoundError: No module named 'megatron'\n", "python_error"),
    ("[rank0]:[W1123 00:06:30] ProcessGroupNCCL.cpp:5188] Guessing device ID based on global rank.\n", None),
    # the workload's own refusal to start names the exception inside its line
    ("moetune: this Megatron cannot run the entry: megatron cannot be looked up: ModuleNotFoundError: "
     "No module named 'megatron'; make the image's Megatron importable\n", "python_error"),
    ("moetune: Transformer Engine absent or not asked for: local layer spec\n", None),
])
def test_rank_tagged_lines(tmp_path, line, failure):
    """A tagged exception line is a python_error; a tagged warning is no failure."""
    log = tmp_path / "log.txt"
    log.write_text(ARGS + _iter_line(1, 900.0) + line)
    assert parse_log(log)["failure"] == failure


# Recorded: a job over its --mem on this machine's Slurm 22.05.8 (cgroup v1, ConstrainRAMSpace),
# tests/integration/test_slurm_failures.py: the last lines of its log
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
    """A host (cgroup) out-of-memory kill is reported with Slurm's first error line."""
    log = tmp_path / "log.txt"
    log.write_text(ARGS + _iter_line(1, 900.0) + SLURM_CGROUP_OOM)
    r = parse_log(log)
    assert r["failure_line"] == "srun: error: n2: task 0: Out Of Memory" and r["iterations"] == 1


def test_parse_megatron_log(tmp_path):
    """The steady step time, its spread, TFLOP/s and peak allocated memory are read from Megatron's
    iteration and memory lines."""
    log = tmp_path / "log.txt"
    lines = [f" [2026-11-22 10:00:0{i}] iteration        {i}/      10 | consumed samples:   {8*i} | "
             f"elapsed time per iteration (ms): {ms} | throughput per GPU (TFLOP/s/GPU): {tf} | "
             f"learning rate: 1.0E-04 | global batch size:     8 | lm loss: 1.0E+01 |"
             for i, ms, tf in ((1, 2000.0, 10.0), (2, 700.0, 30.0), (3, 600.0, 35.0), (4, 620.0, 34.0))]
    lines.append("[Rank 0] (after 4 iterations) memory (MB) | allocated: 1000.0 | max allocated: 3072.0 | reserved: 4000.0")
    log.write_text("\n".join(lines) + "\n")
    p = parse_log(log)
    assert p["iterations"] == 4
    assert p["step_time_ms"] == pytest.approx(610.0)
    assert p["step_time_std_ms"] == pytest.approx(14.142, abs=1e-2)
    # at the judged step (620 ms, the one steady iteration): the median work of a step over it
    assert p["tflops_per_gpu"] == pytest.approx(21000 / 620, rel=1e-3)
    assert p["max_allocated_gb"] == pytest.approx(3.0)
    assert p["failure"] is None


@pytest.mark.parametrize("text, failure", [
    ("RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1, unhandled system error", "nccl_error"),
    ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)", "nccl_timeout"),
    ("slurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-11-22T10:00:00 DUE TO TIME LIMIT ***", "time_limit"),
    ("slurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-11-22T10:00:00 ***", "cancelled"),
])
def test_log_failures(tmp_path, text, failure):
    """Each known failure text in a log is classified as its failure kind."""
    log = tmp_path / "log.txt"
    log.write_text(text + "\n")
    assert parse_log(log)["failure"] == failure


RESULTS = {r["name"]: r for r in map(json.loads, (FIT / "results.jsonl").read_text().splitlines())}


def test_every_layout_has_its_log():
    """The recorded fit bank holds one log for each of its 15 layouts, no more."""
    logs = {p.name.removesuffix(".log.xz") for p in (FIT / "logs").glob("*.log.xz")}
    assert logs == set(RESULTS) and len(logs) == 15


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_fit_log_parses_like_the_device_summary(name):
    """Each recorded fit log parses to the peak memory and iteration time the device run's own summary
    gives."""
    row = RESULTS[name]
    got = parse_log(FIT / "logs" / f"{name}.log.xz")
    assert got["failure"] is None
    assert got["max_allocated_gb"] == pytest.approx(row["max_allocated_mb"] / 1024, abs=1e-3)
    assert got["max_reserved_gb"] == pytest.approx(row["max_reserved_mb"] / 1024, abs=1e-3)
    assert got["iteration_ms"] == row["iteration_ms"] and got["iterations"] == 3
    assert got["max_reserved_gb"] >= got["max_allocated_gb"]


def test_qwen3_235b_baseline_rank0_figures():
    """TP2 PP2 EP32 of 256 GPUs, rank 0: 83.9 GB allocated at its peak, more than an 80 GB H100 holds."""
    got = parse_log(FIT / "logs" / "qwen3_235b-baseline-r0.log.xz")
    assert got["max_allocated_gb"] == pytest.approx(85919.27 / 1024, abs=1e-3)
    assert got["max_reserved_gb"] == pytest.approx(86702.0 / 1024, abs=1e-3)
    assert got["iteration_ms"] == [13371.1, 10507.2, 8375.9]
    assert got["step_time_ms"] == pytest.approx(8375.9)  # iterations after the first 2


def test_max_reserved_absent_in_older_logs(tmp_path):
    """A memory line without max reserved (older Megatron) gives max allocated and None for reserved."""
    log = tmp_path / "log.txt"
    log.write_text("[Rank 0] (after 2 iterations) memory (MB) | allocated: 10.0 | max allocated: 2048.0\n")
    got = parse_log(log)
    assert got["max_allocated_gb"] == 2.0 and got["max_reserved_gb"] is None
