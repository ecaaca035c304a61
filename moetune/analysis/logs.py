"""Parse a Megatron training log (and what Slurm and torch print into it)."""
from __future__ import annotations

import lzma
import re
from pathlib import Path

import numpy as np

from moetune.analysis.errors import TraceError
from moetune.analysis.figures import MIN_STEADY_STEPS, steady_iterations, throughput

__all__ = ["MIN_STEADY_STEPS", "parse_log", "read_log_text", "steady_iterations"]

ITER = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|.*?elapsed time per iteration \(ms\):\s*([\d.]+)")
TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([\d.]+)")
TOKENS = re.compile(r"tokens per (?:sec|second)[^:]*:\s*([\d.]+)", re.IGNORECASE)
MAX_ALLOC = re.compile(r"max allocated:\s*([\d.]+)")
# the caching allocator's peak (what nvidia-smi sees, less context)
MAX_RESERVED = re.compile(r"max reserved:\s*([\d.]+)")
GLOBAL_BATCH = re.compile(r"global batch size:\s*(\d+)")
SEQ_LENGTH = re.compile(r"^\s*seq_length\s*\.+\s*(\d+)\s*$", re.MULTILINE)  # Megatron's argument dump


def dumped_arg(text: str, name: str) -> str | None:
    """One value of Megatron's argument dump (`  name ........ value`) at the log's start."""
    m = re.search(rf"^\s*{name}\s\.+\s(\S+)\s*$", text, re.MULTILINE)
    return m.group(1) if m else None


def unsteady_iterations(text: str) -> list[int]:
    """Iterations whose time is not the training's own, from Megatron's argument dump: the profiled
    window (nsys starts and stops its capture inside it: 3.1 and 8.1 s against 2.5 s on an H100,
    benchmarks/one_gpu_tuning) and, with CUDA graphs, the iterations up to and with the capture
    (Megatron captures after --cuda-graph-warmup-steps; 4.7 s against 1.6 s there)."""
    out: set[int] = set()
    start, end = dumped_arg(text, "profile_step_start"), dumped_arg(text, "profile_step_end")
    if start and end and start.isdigit() and end.isdigit():
        out.update(range(int(start), int(end) + 1))
    impl, warmup = dumped_arg(text, "cuda_graph_impl"), dumped_arg(text, "cuda_graph_warmup_steps")
    if impl not in (None, "none", "None") and warmup and warmup.isdigit():
        out.update(range(1, int(warmup) + 2))
    return sorted(out)


# (failure, pattern). First match in file order of this table wins.
FAILURES: tuple[tuple[str, re.Pattern], ...] = (
    # the GPU's memory: the caching allocator, the CUDA runtime or driver, cuBLAS could not allocate
    ("oom", re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|"
                       r"CUDA error: out of memory|CUDA_ERROR_OUT_OF_MEMORY|CUBLAS_STATUS_ALLOC_FAILED")),
    # the node's memory: Slurm's cgroup ("srun: error: n2: task 0: Out Of Memory", "slurmstepd-n2:
    # error: Detected 1 oom-kill event(s) in StepId=24.0"), the kernel's OOM killer, a data-loader
    # worker killed so, Python's own MemoryError. No GPU memory fix answers it
    ("host_oom", re.compile(r"oom-kill|oom_kill|Out Of Memory|\bOUT_OF_MEMORY\b|Out of memory: Kill|"
                            r"DataLoader worker \(pid[^)]*\) is killed by signal: Killed|"
                            r"\bMemoryError\b")),
    ("time_limit", re.compile(r"DUE TO TIME LIMIT|TIMEOUT")),
    ("nccl_timeout", re.compile(r"Watchdog caught collective operation timeout|NCCL.*[Tt]imeout|"
                                r"ProcessGroupNCCL.*timed out")),
    ("nccl_error", re.compile(r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|"
                              r"ncclRemoteError")),
    ("cancelled", re.compile(r"\*\*\* (JOB|STEP) \S+ ON \S+ CANCELLED AT")),
    # a native crash: torchrun reports the signal (HybridEP's SIGSEGV on the device), Python prints
    # "Fatal Python error: Segmentation fault" where faulthandler is on
    ("crash", re.compile(r"Signal (?:11|6|7) \(SIG(?:SEGV|ABRT|BUS)\)|Fatal Python error|"
                         r"Segmentation fault")),
    # a CUDA error that is not memory: local CUDA graphs on the device ("operation not permitted on
    # an event last recorded in a capturing stream"); the tuner does not try such a fix again
    ("cuda_error", re.compile(r"CUDA error: |torch\.AcceleratorError|illegal memory access")),
    # a Python exception that ended the run: Megatron refusing its arguments at start-up
    # (TransformerConfig's AssertionError on the device: "attention dropout is not supported with
    # graphed attention recomputation"), a missing module; the traceback's last line names it,
    # bare or tagged by torchrun with its rank ("[rank0]: AssertionError: ..."), or inside the
    # workload's own refusal to start ("moetune: this Megatron cannot run the entry: ...
    # ModuleNotFoundError: No module named 'megatron'; ...", moetune/workloads/train_moe.py)
    ("python_error", re.compile(r"^(?:\[rank\d+\]:\s*)?(?:[\w.]+\.)?\w+(?:Error|Exception): \S.*$|"
                                r"^moetune: .*\b\w+(?:Error|Exception): \S.*$", re.M)),
)


def read_log_text(path: Path) -> str:
    """The log's text; `.xz` logs (as the trial bank and tests/data keep them) are decompressed."""
    try:
        if path.name.endswith(".xz"):
            with lzma.open(path, "rt", errors="replace") as f:
                return f.read()
        return path.read_text(errors="replace")
    except OSError as e:
        raise TraceError(f"{path}: cannot read log ({e.strerror or e})") from None
    except (lzma.LZMAError, EOFError) as e:
        raise TraceError(f"{path}: broken xz log ({e})") from None


def parse_log(path: str | Path, steady_skip: int = 2) -> dict:
    """Iteration times, throughput, memory and the failure (if any) of one training log.

    The first `steady_skip` iterations (warm-up, compilation) are left out of the mean.
    """
    path = Path(path)
    text = read_log_text(path)
    iters, tflops, tokens = [], [], []
    gbs = None
    for line in text.splitlines():
        m = ITER.search(line)
        if m:
            iters.append((int(m.group(1)), float(m.group(3))))
            t = TFLOPS.search(line)
            tflops.append(float(t.group(1)) if t else None)
            g = GLOBAL_BATCH.search(line)
            if g:
                gbs = int(g.group(1))
        t = TOKENS.search(line)
        if t:
            tokens.append(float(t.group(1)))
    alloc = [float(x) for x in MAX_ALLOC.findall(text)]
    reserved = [float(x) for x in MAX_RESERVED.findall(text)]
    failure = failure_line = None
    for name, rx in FAILURES:
        m = rx.search(text)
        if m:
            failure = name
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            failure_line = text[start:end if end >= 0 else None].strip()[:300]
            break
    steady = [ms for it, ms in iters if it > steady_skip] or [ms for _, ms in iters]
    seq = SEQ_LENGTH.search(text)
    per_step = None
    if gbs and seq:
        per_step = gbs * int(seq.group(1))
    elif tokens and len(tokens) == len(iters):  # Megatron's own tokens/s of each iteration
        per_step = round(float(np.median([t * ms / 1e3 for t, (_, ms) in zip(tokens, iters, strict=True)])))
    out: dict = {
        "iterations": len(iters),
        "iteration_ms": [ms for _, ms in iters],
        "iteration_tflops": tflops if any(t is not None for t in tflops) else [],
        "tokens_per_step": per_step,
        "first_iteration": iters[0][0] if iters else None,
        "unsteady_iterations": unsteady_iterations(text),
        # the mean after warm-up: secondary (a stall inflates it), the judged median is the step time
        "step_time_ms": round(float(np.mean(steady)), 3) if steady else None,
        "step_time_std_ms": round(float(np.std(steady, ddof=1)), 3) if len(steady) > 1 else None,
        "max_allocated_gb": round(max(alloc) / 1024, 3) if alloc else None,
        "max_reserved_gb": round(max(reserved) / 1024, 3) if reserved else None,
        "failure": failure,
        "failure_line": failure_line,  # the first line that names it
        "last_lines": text.splitlines()[-10:],
    }
    # tokens/s and TFLOP/s/GPU at the steady steps' median, the step time a log alone is judged by
    # (too short a log for steady steps: at its mean, as judged_step falls back to it)
    its = steady_iterations(out)
    out.update(throughput(out, float(np.median(its)) if its else out["step_time_ms"]))
    return out
