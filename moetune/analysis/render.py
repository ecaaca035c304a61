"""Text and Markdown views of an analysis result."""
from __future__ import annotations

from moetune.analysis import figures

# the step time, throughput and memory come first, worded by analysis/figures.py (figure_rows)
HEADLINE = ("steps", "gpu_busy_share", "gpu_idle_share",
            "sm_util_estimate", "comm_share", "exposed_comm_share", "exposed_a2a_ms",
            "a2a_wait_ms", "a2a_transfer_ms", "kernels_per_step", "median_kernel_us", "cuda_graph_launches")


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def figure_rows(r: dict) -> list[tuple[str, str]]:
    """(label, value) of an analysis's step time (judged), the mean beside it, throughput at the
    judged step and peak memory with its unit and source; then a warning where the steps are
    unstable. Rows without a figure are left out."""
    f = figures.run_figures(r)
    rows = []
    if f["step_time_ms"] is not None:
        rows.append(("step time", figures.step_text(f)))
    if f["profiled_ms"] is not None:
        if r.get("log_only"):  # the log's mean after warm-up: no traced steps
            rows.append(("mean step", f"{f['profiled_ms']:.1f} ± {_ms(f['profiled_std_ms'])} ms (after 2 "
                                      "warm-up iterations; a stall inflates it)"))
        elif f["source"] != "trace steps":
            rows.append(("profiled step", figures.profiled_text(f) or ""))
    rate = figures.throughput_text(f)
    if rate:
        rows.append(("throughput", rate))
    if f["peak_memory_gib"] is not None:
        text = figures.memory_text(f["peak_memory_gib"], f["peak_memory_source"])
        allocated = (r.get("log") or {}).get("max_allocated_gb")
        if f["peak_memory_source"] == "trace" and allocated is not None:  # both measures, each labelled
            text += f"; {figures.memory_text(allocated, 'log')}"
        rows.append(("peak memory", text))
    warn = figures.unstable_text(f)
    if warn:
        rows.append(("warning", warn))
    return rows


def _ms(v) -> str:
    return "?" if v is None else f"{v:.1f}"


def render_text(r: dict) -> str:
    c = r["metrics"]["combined"]
    lines = [f"wall: {r['wall']} (confidence {r['confidence']:.2f})"]
    for e in r["evidence"][:4]:
        lines.append(f"  {'limit' if e.get('limits') else 'because'} {e.get('metric')} = "
                     f"{_fmt(e.get('value'))} (threshold {_fmt(e.get('threshold'))}; rule {e['rule']})"
                     + (f": {e['limits']}" if e.get("limits") else ""))
    lines += [f"  {label:<22} {value}" for label, value in figure_rows(r)]
    for key in HEADLINE:
        if key in c:
            lines.append(f"  {key:<22} {_fmt(c[key])}")
    top = sorted(c.get("kernel_class_ms", {}).items(), key=lambda kv: -kv[1])[:6]
    if top:
        lines.append("  time by kernel class (ms, mean per rank): " +
                     ", ".join(f"{k} {_fmt(v)}" for k, v in top))
    if r.get("log") and r["log"].get("failure"):
        lines.append(f"  log: {r['log']['failure']}")
    lines += [f"  warning: {w}" for w in r.get("warnings") or []]
    return "\n".join(lines)


def render_markdown(r: dict) -> str:
    c = r["metrics"]["combined"]
    out = [f"**Wall: {r['wall']}** (confidence {r['confidence']:.2f})", "",
           "| rule | metric | value | threshold |", "|---|---|---|---|"]
    out += [f"| {e['rule']} | {e.get('metric')} | {_fmt(e.get('value'))} | {_fmt(e.get('threshold'))} |"
            for e in r["evidence"]]
    out += ["", "| metric | value |", "|---|---|"]
    out += [f"| {label} | {value} |" for label, value in figure_rows(r)]
    out += [f"| {k} | {_fmt(c[k])} |" for k in HEADLINE if k in c]
    return "\n".join(out)
