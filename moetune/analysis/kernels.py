"""Kernel classes: one table of name patterns (data), first match wins, each anchored to what a
kernel is (its namespace, prefix or a whole token of its name).

Classes and what they mean:
  a2a          expert all-to-all through NCCL: `all_to_all_single` runs as ncclDevKernel_SendRecv
  nccl_other   every other NCCL collective (AllReduce, AllGather, ReduceScatter, Broadcast)
  deepep       DeepEP dispatch/combine kernels (not NCCL: a `nccl` prefix test misses them)
  hybridep     HybridEP dispatch/combine kernels
  gemm         cuBLAS/cuBLASLt/CUTLASS matrix multiplies (Hopper: nvjet_sm90_*)
  grouped_gemm grouped expert GEMMs by name (CUTLASS grouped kernels). TE 2.20 on Hopper runs its
               grouped GEMM as one cuBLAS GEMM per expert: those are `gemm`, on extra streams
               (metrics.gemm_streams)
  attention    flash / fused attention (cuDNN SDPA, TE), the attention scores' fused softmax
  moe_permute  token permute / unpermute kernels written for MoE dispatch (TE's, Megatron's);
               PyTorch's generic gather / scatter / index_select are `other`
  moe_router   the router's own kernels: top-k, TE's fused router and aux loss
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

# A kernel is classed by what it is: its library's namespace or prefix, or a whole token of its
# name (tokens are split by `_` and `::`), never by a substring anywhere. TorchInductor's fused
# kernels (`triton_poi_fused_add_cat_mul_rsub_sigmoid_silu_split_0`, a SwiGLU backward) list the ops
# they fuse, not what they are for: a `sigmoid` or `gather` in them is not the router's or dispatch's.
# PyTorch's generic kernels (gather, index_select, scatter_add, sort) run in dense layers as well as in
# the MoE path, so a name alone cannot give them to MoE: they are `other`. Every name of a recorded
# trace is in tests/data/kernel_classes.tsv with its class (benchmarks/kernel_names.py).
_T0, _T1 = r"(?:^|[_:])", r"(?=[_:]|$)"  # a token's start and end


def _tokens(*words: str) -> str:
    return _T0 + "(?:" + "|".join(words) + ")" + _T1


# (class, regex searched in the kernel's name, qualified by its namespace). The first match wins.
KERNEL_PATTERNS: tuple[tuple[str, str], ...] = (
    ("other", r"^triton_(?:poi|red|per)_fused_"),  # inductor's elementwise and reduction fusions
    # all_to_all_single runs as NCCL's SendRecv kernel
    ("a2a", r"^nccl(?:Dev)?Kernel_(?:SendRecv|AllToAll)" + _T1),
    ("nccl_other", r"^nccl"),
    ("hybridep", r"^hybrid_?ep(?:::|_)"),
    ("deepep", r"^deep_?ep(?:::|_)|^(?:intra|inter)node::(?:dispatch|combine|notify)"),
    ("fp8_cast", _tokens("fp8", "mxfp8", "cast_transpose", "quantize", "dequantize", "amax", "e4m3", "e5m2")),
    ("grouped_gemm", _tokens("grouped_gemm", "multi_tensor_gemm", "grouped_matmul") + r"|GroupedGemm"),
    # flash attention, cuDNN's SDPA and its backward helpers, TE's fused attention, the scaled masked
    # softmax of attention scores (Megatron's, TE's); PyTorch's own softmax (softmax_warp_forward at
    # global scope, cunn_SoftMax*) serves the router and the loss as much: `other`
    ("attention", r"^flash(?:::|_)|^cudnn_generated_\w*_sdpa_|(?:^|::)fmha_|^cudnn::fusion::"
                  r"|^(?:compute_dot_do_o|convert_dq_to)_|^transformer_engine::fused_attn::"
                  r"|(?:^|::)scaled_\w*softmax_warp_(?:forward|backward)"),
    ("gemm", r"^nvjet_|^sm\d+_xmma_gemm_|^(?:cutlass|cublas\w*)::|^splitKreduce_kernel$"
             + "|" + _tokens("gemm", "Gemm", "wgmma", "matmul")),
    # token permutation written for MoE: TE's Triton permutation (row-id map, permute, unpermute,
    # chunk sort) and its CUDA permute kernels
    ("moe_permute", r"^_?(?:un)?permute_kernel$|^_row_id_map_pass_\d+_kernel$|^_sort_chunks_by_\w+_kernel$"
                    r"|(?:^|::)moe_(?:un)?permute\w*|" + _tokens("moe_sort", "permute", "unpermute")),
    # the router's own: top-k (PyTorch's sbtopk/mbtopk namespaces, gatherTopK) and TE's fused router
    ("moe_router", r"(?:^|::)(?:sb|mb)topk::|(?:^|::)gatherTopK$"
                   + "|" + _tokens("topk", "router", "aux_loss")),
    ("te", r"^transformer_engine::|^te_|^rmsnorm_(?:fwd|bwd)_|^fused_rope_(?:forward|backward)_kernel$"),
)
# Every class name, stable: kernel_class_ms / kernel_class_count carry each of them (0 when absent).
CLASSES: tuple[str, ...] = tuple(dict.fromkeys(c for c, _ in KERNEL_PATTERNS if c != "other")) + \
    ("memcpy", "memset", "other")
_COMPILED = tuple((cls, re.compile(p)) for cls, p in KERNEL_PATTERNS)


_SIGNATURE = re.compile(r"^void\s+|\(anonymous namespace\)::|[(<].*$")


def base_name(name: str) -> str:
    """A kernel's name without what a demangled name adds around it (`void `, template arguments,
    the parameter list): `void deep_ep::intranode::dispatch<8, 768>(...)` -> `deep_ep::intranode::dispatch`."""
    return _SIGNATURE.sub("", name.strip())


def classify_name(name: str) -> str:
    name = base_name(name)
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
