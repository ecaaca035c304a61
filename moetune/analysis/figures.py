"""One definition of a run's step time, throughput and peak memory, with their units: what the
tuner compares and what every printer shows (the tuner's progress lines, `moetune status`,
`moetune analyze`, the study reports, the decisions' evidence).

    steady_iterations(log)            -> the log's iteration times a step time is judged on
    judged_step(analysis)             -> the step time: the steady steps' median (the trace's mean
                                         where the log has too few), its spread and source
    throughput(log, step_ms)          -> tokens/s and TFLOP/s per GPU at that step time
    run_figures(analysis)             -> all of it for one analysis, the profiled mean beside
    step_text, throughput_text, memory_text -> the figures as printed, units included

Step time: short trainings stall now and then (a garbage collection, the profiler's stop, a late
rank), so a mean is swamped by a few steps of seconds; the median of the steady steps is not, and
is what keep or revert decides by. The mean of the traced steps is secondary, labelled profiled.

Throughput follows the step time, not the mean of Megatron's per-iteration rates (which carry the
stalls): Megatron's TFLOP/s of an iteration is that iteration's floating-point work per GPU over
its time, so rate x time is the work of a step, the same for every iteration; it is divided by the
judged step time. Tokens per step are the global batch times the sequence length.

Memory: a trace's peak (CUDA allocations less frees, what the process held through CUDA,
allocator cache included) and a log's max allocated (PyTorch's `max allocated`, printed in MiB)
are both in GiB (2^30 bytes); a data sheet's capacity is in GB (10^9 bytes).
"""
from __future__ import annotations

import numpy as np

MIN_STEADY_STEPS = 6  # steady iterations a log needs before its median judges a step time
UNSTABLE_SPREAD = 0.25  # a spread above this share of the step time: the steps are no fair speed

# where a peak's bytes came from -> how it is worded (both are GiB: 2^30 bytes)
MEMORY_SOURCES = {
    "trace": "held through CUDA (trace)",
    "log": "max allocated by PyTorch (log)",
}


def steady_iterations(log: dict | None) -> list[float]:
    """A parsed log's iteration times without warm-up (the first fifth, at least 3) and without the
    iterations it names unsteady; where that leaves fewer than MIN_STEADY_STEPS, only without
    warm-up. What a step time is judged by (moetune/decide/judge.py) and a log alone reports."""
    log = log or {}
    its = log.get("iteration_ms") or []
    skip = max(3, len(its) // 5)
    first = log.get("first_iteration") or 1
    unsteady = set(log.get("unsteady_iterations") or ())
    quiet = [ms for i, ms in enumerate(its) if i >= skip and first + i not in unsteady]
    return quiet if len(quiet) >= MIN_STEADY_STEPS else list(its[skip:])


def _combined(analysis: dict | None) -> dict:
    return ((analysis or {}).get("metrics") or {}).get("combined") or {}


def judged_step(analysis: dict | None) -> dict:
    """The step time of an analysis: the median of the log's steady iterations with its spread
    (the median absolute deviation, scaled to a standard deviation); with too few of them, the
    trace's NVTX steps (mean and standard deviation). Keys: step_time_ms, step_time_std_ms,
    steps, source ("log median" | "trace steps")."""
    steady = np.array(steady_iterations((analysis or {}).get("log")), dtype=float)
    if steady.size >= MIN_STEADY_STEPS:
        med = float(np.median(steady))
        return {"step_time_ms": round(med, 3), "steps": int(steady.size), "source": "log median",
                "step_time_std_ms": round(float(np.median(np.abs(steady - med))) * 1.4826, 3)}
    c = _combined(analysis)
    return {"step_time_ms": c.get("step_time_ms"), "step_time_std_ms": c.get("step_time_std_ms"),
            "steps": c.get("steps"), "source": "trace steps"}


def throughput(log: dict | None, step_ms: float | None) -> dict:
    """Tokens/s and TFLOP/s per GPU of a run at `step_ms` (the judged step time): the log's work
    per step (see the module's docstring) over it. None where the log does not give the work."""
    log = log or {}
    out: dict = {"tokens_per_s": None, "tflops_per_gpu": None}
    if not step_ms or step_ms <= 0:
        return out
    tokens = log.get("tokens_per_step")
    if tokens:
        out["tokens_per_s"] = round(tokens / (step_ms / 1e3), 1)
    work = [ms * t for ms, t in zip(log.get("iteration_ms") or [], log.get("iteration_tflops") or [], strict=False)
            if t is not None]
    if work:  # rounding of the printed rate makes rate x time vary a little: its median
        out["tflops_per_gpu"] = round(float(np.median(work)) / step_ms, 3)
    return out


def run_figures(analysis: dict | None) -> dict:
    """An analysis's figures as printed everywhere: the judged step (step_time_ms, its spread,
    steps, source), the profiled mean and spread of the traced steps (profiled_ms,
    profiled_std_ms, profiled_steps), tokens_per_s and tflops_per_gpu at the judged step, and the
    peak memory in GiB with where it came from (peak_memory_gib, peak_memory_source)."""
    j, c = judged_step(analysis), _combined(analysis)
    log = (analysis or {}).get("log") or {}
    peak, source = c.get("peak_memory_gb"), c.get("peak_memory_source")
    if peak is None and log.get("max_allocated_gb") is not None:
        peak, source = log["max_allocated_gb"], "log"
    return {**j, "profiled_ms": c.get("step_time_ms"), "profiled_std_ms": c.get("step_time_std_ms"),
            "profiled_steps": c.get("steps"), **throughput(log, j["step_time_ms"]),
            "peak_memory_gib": peak, "peak_memory_source": source or ("trace" if peak is not None else None)}


def _ms(v) -> str:
    return "?" if v is None else f"{v:.1f}"


def step_text(f: dict) -> str:
    """The judged step time with its spread and source, e.g. '461.7 ms/step (median of 9 steady
    log steps ± 64.9 ms)'."""
    if f.get("step_time_ms") is None:
        return "? ms/step"
    head = f"{_ms(f['step_time_ms'])} ms/step"
    if f.get("source") == "log median":
        return head + f" (median of {f['steps']} steady log steps ± {_ms(f.get('step_time_std_ms'))} ms)"
    return head + f" (mean of {f.get('steps') or '?'} traced steps ± {_ms(f.get('step_time_std_ms'))} ms)"


def profiled_text(f: dict) -> str | None:
    """The profiled mean of the traced steps, secondary: None where the trace has none."""
    if f.get("profiled_ms") is None:
        return None
    return (f"{_ms(f['profiled_ms'])} ± {_ms(f.get('profiled_std_ms'))} ms, mean of "
            f"{f.get('profiled_steps') or '?'} traced steps (a stall inflates it)")


def unstable_text(f: dict) -> str | None:
    """Why the figures are no fair speed (a spread over UNSTABLE_SPREAD of its step), or None."""
    mean, std = f.get("profiled_ms"), f.get("profiled_std_ms")
    if mean and std and std > UNSTABLE_SPREAD * mean:
        return (f"the steps' mean is unstable: {_ms(mean)} ± {_ms(std)} ms (judged "
                f"{_ms(f.get('step_time_ms'))} ms); compare runs by the judged step time")
    step, spread = f.get("step_time_ms"), f.get("step_time_std_ms")
    if f.get("source") == "log median" and step and spread and spread > UNSTABLE_SPREAD * step:
        return f"the steady log steps are unstable: median {_ms(step)} ± {_ms(spread)} ms; gains are uncertain"
    return None


def throughput_text(f: dict) -> str | None:
    """Tokens/s and TFLOP/s per GPU at the judged step, e.g. '70972 tokens/s, 58.9 TFLOP/s/GPU'."""
    parts = ([f"{f['tokens_per_s']:.0f} tokens/s"] if f.get("tokens_per_s") else []) + \
            ([f"{f['tflops_per_gpu']:.1f} TFLOP/s/GPU"] if f.get("tflops_per_gpu") else [])
    return ", ".join(parts) + " at the judged step" if parts else None


def memory_text(gib: float | None, source: str | None = "trace") -> str:
    """A peak in GiB with what it measures, e.g. '16.59 GiB held through CUDA (trace)'."""
    if gib is None:
        return "?"
    return f"{gib:.2f} GiB " + MEMORY_SOURCES.get(source or "trace", MEMORY_SOURCES["trace"])
