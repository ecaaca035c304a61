"""Did the fix take effect? Read the new trial's trace before judging its step time.

A dependency missing in the image can make Megatron fall back silently (DeepEP absent: the
alltoall path runs; TE absent: no FP8). Each rule names what its trace must show (`verify` in
rules.yaml); `CHECKS` maps that name to a test of the new analysis against the parent's.

    verify(kind, new_analysis, parent_analysis) -> Verdict(status, reason, evidence)
    status: applied | not_applied | unverified (the trace cannot tell: no kernel metrics)
"""
from __future__ import annotations

from dataclasses import dataclass, field

COMPUTE_CLASSES = ("gemm", "grouped_gemm", "attention", "te", "other", "moe_permute", "moe_router",
                   "fp8_cast")
OVERLAP_MIN_DROP = 0.10  # exposed all-to-all must fall by at least this fraction


@dataclass
class Verdict:
    status: str
    reason: str
    evidence: dict = field(default_factory=dict)

    @property
    def applied(self) -> bool:
        return self.status != "not_applied"


def _combined(a: dict | None) -> dict:
    return ((a or {}).get("metrics") or {}).get("combined") or {}


def _counts(a: dict | None) -> dict:
    return _combined(a).get("kernel_class_count") or {}


def _per_step(a: dict | None, classes) -> float | None:
    c = _combined(a)
    counts = c.get("kernel_class_count")
    if not counts:
        return None
    return sum(counts.get(k, 0) for k in classes) / max(c.get("steps") or 1, 1)


def check_flex_dispatch(new, parent):
    counts = _counts(new)
    flex = counts.get("deepep", 0) + counts.get("hybridep", 0)
    sendrecv = counts.get("a2a", 0)
    ev = {"deepep_or_hybridep_kernels": flex, "nccl_sendrecv_kernels": sendrecv}
    if flex > 0 and sendrecv == 0:
        return Verdict("applied", "DeepEP/HybridEP kernels run and NCCL SendRecv is gone", ev)
    if flex == 0:
        return Verdict("not_applied", "no DeepEP/HybridEP kernels in the trace; the all-to-all "
                                      "still runs as NCCL SendRecv", ev)
    return Verdict("not_applied", "NCCL SendRecv all-to-all still runs beside the flex kernels", ev)


def check_cuda_graphs(new, parent):
    n = int(_combined(new).get("cuda_graph_launches") or 0)
    ev = {"cuda_graph_launches": n}
    if n > 0:
        return Verdict("applied", f"{n} CUDA graph launches in the window", ev)
    return Verdict("not_applied", "no cudaGraphLaunch in the trace: graphs were not captured", ev)


def check_fp8(new, parent):
    n = _counts(new).get("fp8_cast", 0)
    ev = {"fp8_kernels": n}
    if n > 0:
        return Verdict("applied", f"{n} FP8 cast/quantize kernels in the window", ev)
    return Verdict("not_applied", "no FP8 kernels in the trace: the run stayed in BF16", ev)


def check_recompute(new, parent):
    a, b = _per_step(parent, COMPUTE_CLASSES), _per_step(new, COMPUTE_CLASSES)
    ev = {"parent_compute_kernels_per_step": a, "compute_kernels_per_step": b}
    if a is None or b is None:
        return Verdict("unverified", "kernel counts missing; recompute not checked", ev)
    if b > a * 1.01:
        return Verdict("applied", f"forward kernels per step up {b - a:.0f} (recompute runs)", ev)
    return Verdict("not_applied", "no extra forward kernels per step: nothing is recomputed", ev)


def check_overlap(new, parent):
    a = _combined(parent).get("exposed_a2a_share")
    b = _combined(new).get("exposed_a2a_share")
    ev = {"parent_exposed_a2a_share": a, "exposed_a2a_share": b}
    if a is None or b is None:
        return Verdict("unverified", "exposed all-to-all not measured; overlap not checked", ev)
    if a <= 0.0 or b <= a * (1 - OVERLAP_MIN_DROP):
        return Verdict("applied", f"exposed all-to-all share {a:.3f} -> {b:.3f}", ev)
    return Verdict("not_applied", f"exposed all-to-all share did not fall ({a:.3f} -> {b:.3f}): "
                                  "communication is not hidden under compute", ev)


def check_grouped_gemm(new, parent):
    a, b = _combined(parent).get("gemm_streams"), _combined(new).get("gemm_streams")
    grouped = _counts(new).get("grouped_gemm", 0)
    ev = {"grouped_gemm_kernels": grouped, "parent_gemm_streams": a, "gemm_streams": b}
    if grouped > 0:
        return Verdict("applied", f"{grouped} grouped GEMM kernels in the window", ev)
    if not a or not b:
        return Verdict("unverified", "no stream ids in the traces; grouped GEMM not checked", ev)
    if b > a:
        return Verdict("applied", f"expert GEMMs spread over {b:.0f} streams (was {a:.0f})", ev)
    return Verdict("not_applied", f"GEMMs on {b:.0f} stream(s) as before and no grouped kernels: "
                                  "the experts still run one after another", ev)


def check_none(new, parent):
    return Verdict("applied", "nothing to verify in the trace", {})


CHECKS = {"flex_dispatch": check_flex_dispatch, "cuda_graphs": check_cuda_graphs, "fp8": check_fp8,
          "recompute": check_recompute, "overlap": check_overlap, "grouped_gemm": check_grouped_gemm,
          "none": check_none}


def verify(kind: str, new: dict | None, parent: dict | None) -> Verdict:
    if kind != "none" and not _combined(new).get("kernel_class_count"):
        return Verdict("unverified", "the new trial has no trace metrics; the fix is not checked", {})
    return CHECKS[kind](new, parent)
