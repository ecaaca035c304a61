"""moetune's trace analysis: nsys SQLite → per-rank metrics → the dominant wall, with evidence.

Public API (this module is the front door: the work is done in its submodules)
    analyze(paths, log=None, gpu_memory_gb=None, workers=None) -> dict   # wall, confidence, evidence,
                                                            # metrics, log, warnings (what the capture
                                                            # leaves out: CUDA graphs traced whole);
                                                            # ranks in `workers` processes
    TraceError                                              # one-line message naming the file
    trace_files(paths) -> [Path]                            # folders expanded into their traces
    ranks.rank_frames(paths)                                # each rank's rows (kernels, runtime, ...)
    logs.parse_log(path) -> dict                            # Megatron log (plain or .xz)

`paths`: .sqlite, .sqlite.xz or .nsys-rep files, or folders of them; one file per rank or node, and
within a file one rank per (globalPid, deviceId). `wall` is memory | communication | host_overhead |
compute | unknown (walls.THRESHOLDS is the rule table). `metrics` = {"combined": {...},
"per_rank": {rank: {...}}}; metric names (shares are fractions of the profiled window):
    window_ms steps step_time_ms step_time_std_ms window_source
    gpu_busy_share gpu_idle_share sm_util_estimate comm_share exposed_comm_share
    exposed_a2a_share exposed_other_comm_share a2a_ms exposed_a2a_ms exposed_comm_ms (per step)
    kernels_per_step median_kernel_us launch_rate_per_ms cuda_graph_launches peak_memory_gb
    gemm_streams (streams that ran GEMMs: above 1 where TE's grouped GEMM spreads the experts)
    sm_active_share (only with GPU metrics sampling: mean "SMs Active" in the window, 0..1)
    gaps_over_{10,100,1000}us and gaps_over_{..}us_ms     idle-gap histogram: count, total ms
    launch_starved_ms sync_blocked_ms other_wait_ms        idle time by cause
    kernel_class_ms kernel_class_count                     {class: ms | count}, every class of
        kernels.CLASSES (gemm grouped_gemm attention moe_permute moe_router a2a nccl_other deepep
        hybridep te fp8_cast memcpy memset other), 0 when absent; stable names
combined only: ranks, max_gpu_idle_share, max_exposed_comm_share, a2a_transfer_ms (all-to-all
cost of the fastest rank), a2a_wait_ms / a2a_wait_share (the rest: waiting for a late peer),
exposed_comm_share_net / exposed_a2a_share_net (exposed communication, and exposed all-to-all, less
that waiting: what overlap could hide), and from the log
tflops_per_gpu / tokens_per_s.
"""
from __future__ import annotations

from moetune.analysis import keys
from moetune.analysis.errors import TraceError
from moetune.analysis.files import TRACE_SUFFIXES, trace_files

__all__ = ["analyze", "TraceError", "trace_files", "TRACE_SUFFIXES"]


def analyze(paths=(), log=None, gpu_memory_gb: float | None = None, workers: int | None = None) -> dict:
    """`workers`: processes that compute ranks' metrics at once (None: one per core; 1: in this
    process). The measuring is analysis.verdict.measure."""
    if not paths and not log:
        raise TraceError("nothing to analyze: give trace files and/or --log")
    files = trace_files(paths)
    keys.start(files)
    # imported here, not at the top: pandas loads while keys.start lists the files' ranks (analysis.keys)
    from moetune.analysis import verdict
    return verdict.measure(files, log, gpu_memory_gb, workers)
