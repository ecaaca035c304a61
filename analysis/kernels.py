"""Kernel classes: one table of name patterns (data), first match wins.

Classes and what they mean:
  a2a          expert all-to-all through NCCL: `all_to_all_single` runs as ncclDevKernel_SendRecv
  nccl_other   every other NCCL collective (AllReduce, AllGather, ReduceScatter, Broadcast)
  deepep       DeepEP dispatch/combine kernels (not NCCL: a `nccl` prefix test misses them)
  hybridep     HybridEP dispatch/combine kernels
  gemm         cuBLAS/cuBLASLt/CUTLASS matrix multiplies (Hopper: nvjet_sm90_*)
  grouped_gemm grouped expert GEMMs by name (CUTLASS grouped kernels). TE 2.20 on Hopper runs its
               grouped GEMM as one cuBLAS GEMM per expert: those are `gemm`, on extra streams
               (metrics.gemm_streams)
  attention    flash / fused attention, softmax
  moe_permute  token permute / unpermute / sort / scatter of MoE dispatch
  moe_router   router top-k, aux loss, scores
  fp8_cast     FP8 quantize / cast / amax kernels
  te           other Transformer Engine kernels
  memcpy       copies (from the memcpy table) ; memset: memsets
  other        everything else (elementwise, norms, optimizer, ...)

These names are stable: the tuning loop reads `kernel_class_count` to check that a fix took effect
(`deepep` > 0 after switching the dispatcher, `a2a` == 0 once NCCL SendRecv is gone, `fp8_cast` > 0
with FP8). Every name in `CLASSES` is a key of `kernel_class_ms` / `kernel_class_count`, 0 when absent.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

COMM_CLASSES = ("a2a", "nccl_other", "deepep", "hybridep")
A2A_CLASSES = ("a2a", "deepep", "hybridep")
NON_COMPUTE = COMM_CLASSES + ("memcpy", "memset")

# (class, regex on the kernel's name). Order matters: the first match wins.
KERNEL_PATTERNS: tuple[tuple[str, str], ...] = (
    ("a2a", r"ncclDevKernel_SendRecv|ncclKernel_SendRecv|AllToAll|alltoall"),
    ("nccl_other", r"^nccl|ncclDevKernel|ncclKernel"),
    ("hybridep", r"hybrid_ep|hybridep|HybridEP"),
    ("deepep", r"deep_ep|deepep|intranode::(dispatch|combine|notify)|internode::(dispatch|combine|notify)"),
    ("fp8_cast", r"fp8|cast_transpose|quantize|amax|e4m3|e5m2|mxfp8|blockwise_fp8"),
    ("grouped_gemm", r"grouped_gemm|GroupedGemm|grouped_matmul|multi_tensor_gemm"),
    ("attention", r"flash|fmha|attention|attn|softmax"),
    ("gemm", r"nvjet|gemm|Gemm|sm90_xmma|sm80_xmma|cutlass|cublas|wgmma|matmul"),
    ("moe_permute", r"permute|unpermute|moe_sort|scatter_add|index_select|indexSelect|gather"),
    ("moe_router", r"topk|TopK|router|aux_loss|sigmoid|bitonicSort"),
    ("te", r"transformer_engine|^te_|::te::|rmsnorm|layernorm|rope"),
)
# Every class name, stable: kernel_class_ms / kernel_class_count carry each of them (0 when absent).
CLASSES: tuple[str, ...] = tuple(c for c, _ in KERNEL_PATTERNS) + ("memcpy", "memset", "other")
_COMPILED = tuple((cls, re.compile(p)) for cls, p in KERNEL_PATTERNS)


def classify_name(name: str) -> str:
    for cls, rx in _COMPILED:
        if rx.search(name):
            return cls
    return "other"


def classify(names: pd.Series) -> pd.Series:
    """Class of each kernel name, a categorical of CLASSES (class tests compare small codes, not
    strings); each distinct name is matched once."""
    if names.empty:
        return pd.Series(pd.Categorical([], categories=CLASSES), index=names.index)
    codes, uniques = pd.factorize(names)
    classes = np.array([CLASSES.index(classify_name(str(u))) for u in uniques], dtype=np.int64)
    return pd.Series(pd.Categorical.from_codes(classes[codes], categories=CLASSES), index=names.index)
