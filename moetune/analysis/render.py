"""Text and Markdown views of an analysis result."""
from __future__ import annotations

HEADLINE = ("step_time_ms", "step_time_std_ms", "steps", "gpu_busy_share", "gpu_idle_share",
            "sm_util_estimate", "comm_share", "exposed_comm_share", "exposed_a2a_ms",
            "a2a_wait_ms", "a2a_transfer_ms", "kernels_per_step", "median_kernel_us", "cuda_graph_launches",
            "peak_memory_gb", "tflops_per_gpu")


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def render_text(r: dict) -> str:
    c = r["metrics"]["combined"]
    lines = [f"wall: {r['wall']} (confidence {r['confidence']:.2f})"]
    for e in r["evidence"][:4]:
        lines.append(f"  {'limit' if e.get('limits') else 'because'} {e.get('metric')} = "
                     f"{_fmt(e.get('value'))} (threshold {_fmt(e.get('threshold'))}; rule {e['rule']})"
                     + (f": {e['limits']}" if e.get("limits") else ""))
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
    out += [f"| {k} | {_fmt(c[k])} |" for k in HEADLINE if k in c]
    return "\n".join(out)
